#!/usr/bin/env python3
"""End-to-end tests of `flatpeak train` / `flatpeak eval`: resume bit-exactness, atomic checkpoints
under kill -9, clear errors on bad input, the demo's falling loss.

usage: test_train.py --bin build/flatpeak --configs configs CASE
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

ARGS = None
SMALL = ["--set", "train.seq_len=64", "--set", "train.batch_size=2", "--set", "model.num_hidden_layers=2"]


def run(args, expect_ok=True, **kw):
    p = subprocess.run([ARGS.bin] + args, capture_output=True, text=True, **kw)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def tiny():
    return os.path.join(ARGS.configs, "tiny.toml")


def case_resume_bit_exact(tmp):
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    common = ["train", "--config", tiny(), "--steps", "10", "--quiet"] + SMALL
    run(common + ["--out", a])
    run(common + ["--out", b, "--stop-after", "4"])
    # The interrupted run wrote a checkpoint at step 4 and metrics for steps 1..4.
    assert [m["step"] for m in metrics(b)] == [1, 2, 3, 4], metrics(b)
    run(common + ["--out", b, "--resume", b])
    ma, mb = metrics(a), metrics(b)
    assert [m["step"] for m in mb] == list(range(1, 11)), [m["step"] for m in mb]
    for x, y in zip(ma, mb):
        for key in ("loss", "aux_loss", "grad_norm", "lr"):
            assert x[key] == y[key], f"step {x['step']} {key}: uninterrupted {x[key]!r} vs resumed {y[key]!r}"
    fa = open(os.path.join(a, "checkpoint", "model.safetensors"), "rb").read()
    fb = open(os.path.join(b, "checkpoint", "model.safetensors"), "rb").read()
    assert fa == fb, "final weights differ between the uninterrupted and the resumed run"
    # A different config is refused on resume.
    p = run(common + ["--out", b, "--resume", b, "--set", "optim.lr=0.1"], expect_ok=False)
    assert p.returncode == 1 and "another configuration" in p.stderr, p.stderr
    print("resumed losses equal the uninterrupted run bit for bit over 10 steps")


def case_kill_during_checkpoint(tmp):
    """kill -9 at random moments of a run that checkpoints every step: the checkpoint left behind
    always loads (resume works) and its step is consistent with its weights."""
    rng = random.Random(5)
    d = os.path.join(tmp, "k")
    # A larger model so that writing a checkpoint takes a while (more chances to kill mid-write).
    cfg = ["train", "--config", tiny(), "--steps", "1000", "--quiet", "--out", d, "--set", "train.checkpoint_every=1",
           "--set", "model.num_experts=32", "--set", "model.moe_intermediate_size=256", "--set", "train.seq_len=32",
           "--set", "train.batch_size=1"]
    kills = 0
    for i in range(6):
        args = cfg + (["--resume", d] if os.path.exists(os.path.join(d, "checkpoint")) else [])
        p = subprocess.Popen([ARGS.bin] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # Wait (on a loaded machine, start-up is slow) until this run writes checkpoints, then kill it at
        # a random moment, most likely in the middle of writing one.
        deadline = time.time() + 120
        while p.poll() is None and time.time() < deadline and not any(
                n.endswith(".tmp") or n.startswith("step-") for n in (os.listdir(d) if os.path.isdir(d) else [])):
            time.sleep(0.05)
        if i == 5 and not os.path.exists(os.path.join(d, "checkpoint")):
            # Every kill so far landed before the first checkpoint completed (a loaded machine writes
            # slowly): let this run complete one, so the resume below is exercised too.
            while p.poll() is None and time.time() < deadline and not os.path.exists(os.path.join(d, "checkpoint")):
                time.sleep(0.05)
        time.sleep(rng.uniform(0.1, 1.0))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait()
        if os.path.exists(os.path.join(d, "checkpoint")):
            # The checkpoint must load: evaluate it and resume one step from it.
            st = json.load(open(os.path.join(d, "checkpoint", "trainer_state.json")))
            r = run(cfg + ["--resume", d, "--stop-after", "1"])
            st2 = json.load(open(os.path.join(d, "checkpoint", "trainer_state.json")))
            assert st2["step"] == st["step"] + 1, (st, st2)
    assert kills >= 3, f"only {kills} kills landed"
    assert os.path.exists(os.path.join(d, "checkpoint")), "no checkpoint was ever completed"
    print(f"{kills} kills; every surviving checkpoint resumed")


def write_tokens(path, ids, magic=20240520, version=1, count=None):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(ids) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(ids)}H", *ids))


def expect_error(args, *fragments):
    p = run(args, expect_ok=False)
    assert p.returncode == 1, f"exit {p.returncode} for {args}\n{p.stderr}"
    for f in fragments:
        assert f in p.stderr, f"'{f}' not in stderr of {args}:\n{p.stderr}"
    assert "error:" in p.stderr and "hint:" in p.stderr, p.stderr


def case_bad_inputs(tmp):
    out = os.path.join(tmp, "o")
    base = ["train", "--config", tiny(), "--out", out, "--quiet"] + SMALL + ["--set", "train.steps=3"]
    bad_cfg = os.path.join(tmp, "bad.toml")
    open(bad_cfg, "w").write("[model\nhidden_size = 3\n")
    expect_error(["train", "--config", bad_cfg, "--out", out], "malformed TOML")
    expect_error(base + ["--set", "model.num_experts_per_tok=99"], "num_experts_per_tok")
    expect_error(base + ["--set", "model.hiden_size=3"], "unknown key model.hiden_size")
    expect_error(base + ["--device-mem", "12 parsecs"], "invalid size")
    # Out of memory names the category and the schedule that flattens it.
    expect_error(base + ["--device-mem", "3MiB"], "out of device memory in category")
    # Token files: wrong magic, truncated, out-of-range id.
    tf = os.path.join(tmp, "t.bin")
    write_tokens(tf, list(range(200)), magic=123)
    expect_error(base + ["--set", f"data.source={tf}"], "magic")
    write_tokens(tf, list(range(200)), count=300)
    expect_error(base + ["--set", f"data.source={tf}"], tf)
    write_tokens(tf, [5] * 500 + [300])
    expect_error(base + ["--set", f"data.source={tf}"], "300")
    # NaN: an absurd learning rate blows the weights up; the run stops with a clear error, exit 1.
    p = run(base + ["--set", "optim.lr=1e30", "--set", "optim.grad_clip=0", "--set", "optim.warmup_steps=0",
                    "--steps", "20"], expect_ok=False)
    assert p.returncode == 1 and ("loss is" in p.stderr or "non-finite" in p.stderr), p.stderr
    # Unreadable checkpoints.
    ck = os.path.join(tmp, "ck")
    os.makedirs(ck)
    expect_error(["eval", "--checkpoint", ck, "--data", tf], "no checkpoint")
    run(["train", "--config", tiny(), "--steps", "1", "--out", ck, "--quiet"] + SMALL)
    good = os.path.join(ck, "checkpoint", "model.safetensors")
    with open(good, "r+b") as f:
        f.write(b"\xff\xff\xff\xff\xff\xff\xff\x7f")
    write_tokens(tf, [5] * 500)
    p = run(["eval", "--checkpoint", ck, "--data", tf], expect_ok=False)
    assert p.returncode == 1 and "model.safetensors" in p.stderr, p.stderr
    print("every bad input gave its clear error")


def case_demo_loss_falls(tmp):
    d = os.path.join(tmp, "demo")
    run(["train", "--config", tiny(), "--steps", "40", "--out", d, "--quiet"])
    m = metrics(d)
    first = sum(x["loss"] for x in m[:5]) / 5
    last = sum(x["loss"] for x in m[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f} over 40 steps")
    assert last < first - 0.5, f"the loss did not fall clearly: {first:.3f} -> {last:.3f}"
    for key in ("step", "loss", "aux_loss", "grad_norm", "lr", "tokens_per_s", "device_peak_bytes", "peak_bytes"):
        assert key in m[0], key
    assert set(m[0]["peak_bytes"]) >= {"params", "grads", "optimizer", "activations", "checkpoints", "dispatch",
                                       "vocab", "comm", "workspace"}
    trace = json.load(open(os.path.join(d, "memory_trace.json")))
    assert any(e.get("ph") == "C" for e in trace["traceEvents"])


def case_eval_token_file(tmp):
    d = os.path.join(tmp, "ev")
    tf = os.path.join(tmp, "e.bin")
    rng = random.Random(1)
    write_tokens(tf, [rng.randrange(256) for _ in range(700)])
    run(["train", "--config", tiny(), "--steps", "2", "--out", d, "--quiet", "--set", f"data.source={tf}"] + SMALL)
    js = os.path.join(tmp, "e.json")
    run(["eval", "--checkpoint", d, "--data", tf, "--seq-len", "64", "--json", js])
    r = json.load(open(js))
    assert r["sequences"] == 10 and r["tokens"] == 640, r
    assert 4.0 < r["loss"] < 7.0, r  # near ln(256) = 5.55 for an almost untrained model
    print(f"eval loss {r['loss']:.4f} over {r['tokens']} tokens")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("case")
    ARGS = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="flatpeak_cli_")
    try:
        globals()["case_" + ARGS.case](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
