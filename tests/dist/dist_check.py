#!/usr/bin/env python3
"""Multi-process acceptance tests (ctest label mpi): W ranks against one process.

usage: dist_check.py --bin-dir BUILD --configs CONFIGS CASE
  grads      dist_case on W = 1, 2, 4: loss within 1e-5 relative, every gradient within 1e-4 norm-relative
  train      10 steps of flatpeak train on W = 2 and 4 track the single-process losses within 1e-4
  ckpt       a checkpoint written by 2 ranks resumes in one process and vice versa
  failure    a failing rank ends every rank non-zero within 30 s, the error printed once
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import safetensors_io  # noqa: E402

A = None
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def mpirun(np, args, **kw):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np)] + args if np > 1 else args
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, **kw)


def ok(p, what):
    if p.returncode != 0:
        sys.exit(f"FAILED: {what}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def case_grads(tmp):
    files = {}
    for w in (1, 2, 4):
        f = os.path.join(tmp, f"w{w}.safetensors")
        ok(mpirun(w, [os.path.join(A.bin_dir, "tests", "dist_case"), f]), f"dist_case W={w}")
        files[w], _ = safetensors_io.load(f)
    ref = files[1]
    worst = 0.0
    for w in (2, 4):
        got = files[w]
        lr, lg = ref["out.losses"].double(), got["out.losses"].double()
        rel = ((lg - lr).abs() / lr.abs()).max().item()
        print(f"W={w}: loss {lg[0].item():.9f} vs {lr[0].item():.9f} (max rel over loss/ce/aux {rel:.2e})")
        assert rel <= 1e-5, f"W={w} loss differs by {rel:.2e}"
        for name in ref:
            if not name.startswith("grad."):
                continue
            r, g = ref[name].double(), got[name].double()
            err = (g - r).norm().item() / max(r.norm().item(), 1e-30)
            worst = max(worst, err)
            assert err <= 1e-4, f"W={w} {name}: norm-relative error {err:.2e}"
    print(f"every gradient within 1e-4 (worst {worst:.2e})")


def train_args(out, steps, extra=()):
    return [os.path.join(A.bin_dir, "flatpeak"), "train", "--config", os.path.join(A.configs, "tiny.toml"),
            "--steps", str(steps), "--out", out, "--quiet", "--set", "train.seq_len=128",
            "--set", "train.batch_size=2"] + list(extra)


def losses(out):
    return [json.loads(l)["loss"] for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]


def case_train(tmp):
    single = os.path.join(tmp, "w1")
    ok(mpirun(1, train_args(single, 10)), "single-process training")
    ref = losses(single)
    for w in (2, 4):
        d = os.path.join(tmp, f"w{w}")
        ok(mpirun(w, train_args(d, 10)), f"training on {w} ranks")
        got = losses(d)
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        print(f"W={w}: 10 losses track one process within {rel:.2e}")
        assert len(got) == 10 and rel <= 1e-4, (got, ref)
        m = json.loads(open(os.path.join(d, "metrics.jsonl")).readline())
        assert m["ranks"] == w and "peak_rank" in m, m


def case_ckpt(tmp):
    ref_dir = os.path.join(tmp, "ref")
    ok(mpirun(1, train_args(ref_dir, 4)), "reference run")
    ref = losses(ref_dir)
    # 2 ranks write, one process resumes.
    a = os.path.join(tmp, "a")
    ok(mpirun(2, train_args(a, 4, ["--stop-after", "2"])), "2 ranks, first half")
    ok(mpirun(1, train_args(a, 4, ["--resume", a])), "one process resumes")
    # One process writes, 2 ranks resume.
    b = os.path.join(tmp, "b")
    ok(mpirun(1, train_args(b, 4, ["--stop-after", "2"])), "one process, first half")
    ok(mpirun(2, train_args(b, 4, ["--resume", b])), "2 ranks resume")
    for d in (a, b):
        got = losses(d)
        rel = max(abs(x - y) / abs(y) for x, y in zip(got, ref))
        print(f"{os.path.basename(d)}: losses {['%.6f' % x for x in got]} within {rel:.2e} of one process")
        assert len(got) == 4 and rel <= 1e-4


def case_failure(tmp):
    # A rank-local failure: rank 1 fails at step 2 (FLATPEAK_FAIL_RANK, a test hook), the other ranks
    # are inside collectives by then.
    for np_, spec in ((2, "1:2"), (4, "3:1")):
        env = dict(ENV, FLATPEAK_FAIL_RANK=spec)
        t0 = time.time()
        p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)] +
                           train_args(os.path.join(tmp, f"f{np_}"), 50), capture_output=True, text=True, env=env,
                           timeout=120)
        dt = time.time() - t0
        rank = spec.split(":")[0]
        print(f"np={np_}, rank {rank} fails: exit {p.returncode} after {dt:.1f} s")
        assert p.returncode != 0, p.stderr
        assert dt < 30, f"took {dt:.1f} s"
        assert p.stderr.count("injected failure") == 1, p.stderr
        assert f"[rank {rank}]" in p.stderr, p.stderr
    # The same error on every rank (a bad config key) is printed once.
    p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4"] +
                       train_args(os.path.join(tmp, "g"), 5, ["--set", "model.hiden_size=3"]),
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode != 0
    assert p.stderr.count("unknown key model.hiden_size") == 1, p.stderr
    print("a failed rank ends the run promptly; each error printed once")


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("case")
    A = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="flatpeak_dist_")
    try:
        globals()["case_" + A.case](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
