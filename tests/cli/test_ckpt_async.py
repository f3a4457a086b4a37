#!/usr/bin/env python3
"""End-to-end tests of train.checkpoint_async (Note [Checkpoints off the critical path] in
src/train/checkpoint_writer.h): the background checkpoints are the sync ones byte for byte (1 rank, bf16, 2
ranks), a resume from one trains on bit for bit, a kill -9 mid-write leaves the previous checkpoint as the
latest, and the host copy the plan reports is the one the run holds.

usage: test_ckpt_async.py --bin build/flatpeak --configs configs CASE
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ARGS = None
SMALL = ["--set", "train.seq_len=64", "--set", "train.batch_size=2", "--set", "model.num_hidden_layers=2"]
ASYNC = ["--set", "train.checkpoint_async=true"]
MPI_ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")


def run(args, expect_ok=True, mpi=0):
    pre = []
    if mpi:
        pre = [shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", str(mpi)]
    p = subprocess.run(pre + [ARGS.bin] + args, capture_output=True, text=True, env=MPI_ENV if mpi else None)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def tiny():
    return os.path.join(ARGS.configs, "tiny.toml")


def step_dirs(d):
    return sorted(n for n in os.listdir(d) if n.startswith("step-") and not n.endswith(".tmp"))


def same_checkpoints(sync_dir, async_dir):
    """Every file of every kept checkpoint cmp-equal, but for the one key the runs differ in:
    trainer_state.json's run_config records train.checkpoint_async (and so manifest.json that file's CRC)."""
    names = step_dirs(sync_dir)
    assert names and names == step_dirs(async_dir), (names, step_dirs(async_dir))
    assert os.readlink(os.path.join(sync_dir, "checkpoint")) == os.readlink(os.path.join(async_dir, "checkpoint"))
    files = 0
    for n in names:
        a, b = os.path.join(sync_dir, n), os.path.join(async_dir, n)
        assert sorted(os.listdir(a)) == sorted(os.listdir(b)), (n, os.listdir(a), os.listdir(b))
        for f in sorted(os.listdir(a)):
            fa, fb = open(os.path.join(a, f), "rb").read(), open(os.path.join(b, f), "rb").read()
            if f == "trainer_state.json":
                ja, jb = json.loads(fa), json.loads(fb)
                assert ja["run_config"]["train"]["checkpoint_async"] is False, ja["run_config"]["train"]
                assert jb["run_config"]["train"]["checkpoint_async"] is True, jb["run_config"]["train"]
                jb["run_config"]["train"]["checkpoint_async"] = False
                assert ja == jb, f"{n}/{f} differs beyond train.checkpoint_async"
            elif f == "manifest.json":
                ma, mb = json.loads(fa), json.loads(fb)
                ma["files"].pop("trainer_state.json")
                mb["files"].pop("trainer_state.json")
                assert ma == mb, f"{n}/manifest.json differs beyond trainer_state.json's entry"
            else:
                assert fa == fb, f"{n}/{f} differs between the sync and the async checkpoint"
            files += 1
    return files


def case_same_files(tmp):
    """1 rank (fp32 and bf16: weights rounded, the f32 master in optimizer.safetensors, and shards) and 2
    ranks (FSDP/EP shards gathered to rank 0): the async checkpoints are the sync ones."""
    total = 0
    variants = [("fp32", [], 0),
                ("bf16_shards", ["--set", "precision.recipe=bf16", "--shard-size", "40KB"], 0),
                ("mpi2", [], 2)]
    for name, extra, mpi in variants:
        if mpi and not shutil.which("mpirun"):
            sys.exit("mpirun not found (scripts/deps installs openmpi-bin)")
        common = ["train", "--config", tiny(), "--steps", "6", "--quiet", "--set", "train.checkpoint_every=2",
                  "--set", "train.keep_checkpoints=3"] + SMALL + extra
        s, a = os.path.join(tmp, name + "_sync"), os.path.join(tmp, name + "_async")
        run(common + ["--out", s], mpi=mpi)
        run(common + ["--out", a] + ASYNC, mpi=mpi)
        assert [m["loss"] for m in metrics(s)] == [m["loss"] for m in metrics(a)], name
        ma = metrics(a)
        assert all("checkpoint_writing" in m and m["host_checkpoint_copy_bytes"] > 0 for m in ma), ma[0]
        assert all("checkpoint_blocked_seconds" in m for m in ma if m["step"] in (3, 5)), ma
        total += same_checkpoints(s, a)
    print(f"async checkpoints equal the sync ones: {total} files of steps 2, 4, 6 on 1 rank (fp32; bf16 in shards) "
          f"and 2 ranks, byte for byte (trainer_state.json but for its train.checkpoint_async)")


def case_resume(tmp):
    """An async run stopped at step 4 and resumed (async, and sync from the async checkpoint) trains the
    uninterrupted sync run's losses and weights bit for bit."""
    common = ["train", "--config", tiny(), "--steps", "8", "--quiet", "--set", "train.checkpoint_every=2"] + SMALL
    u = os.path.join(tmp, "u")
    run(common + ["--out", u])
    for how, resume_extra in (("async", ASYNC), ("sync", [])):
        d = os.path.join(tmp, "r_" + how)
        run(common + ASYNC + ["--out", d, "--stop-after", "4"])
        assert json.load(open(os.path.join(d, "checkpoint", "trainer_state.json")))["step"] == 4
        run(common + resume_extra + ["--out", d, "--resume", d])
        mu, md = metrics(u), metrics(d)
        assert [m["step"] for m in md] == list(range(1, 9)), [m["step"] for m in md]
        for x, y in zip(mu, md):
            for key in ("loss", "grad_norm", "lr"):
                assert x[key] == y[key], f"{how}: step {x['step']} {key}: {x[key]!r} vs {y[key]!r}"
        fu = open(os.path.join(u, "checkpoint", "model.safetensors"), "rb").read()
        fd = open(os.path.join(d, "checkpoint", "model.safetensors"), "rb").read()
        assert fu == fd, f"{how}: final weights differ from the uninterrupted run's"
    print("resumed from an async checkpoint (async and sync): 8 steps' losses and the weights equal the "
          "uninterrupted sync run's bit for bit")


def case_kill_mid_write(tmp):
    """kill -9 while a background write is in flight (a step-N.tmp exists): "checkpoint" still names a
    complete earlier one, --resume works and trains on as the uninterrupted run did; SIGTERM mid-write ends
    with the stop step's checkpoint complete."""
    model = ["--set", "model.num_experts=32", "--set", "model.moe_intermediate_size=256", "--set", "train.seq_len=32",
             "--set", "train.batch_size=1"]
    cfg = ["train", "--config", tiny(), "--steps", "1000", "--quiet", "--set", "train.checkpoint_every=1"] + model
    d, u = os.path.join(tmp, "k"), os.path.join(tmp, "u")
    kills = 0
    for attempt in range(5):
        shutil.rmtree(d, ignore_errors=True)
        p = subprocess.Popen([ARGS.bin] + cfg + ASYNC + ["--out", d], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        # Wait for one complete checkpoint, then for a write in flight after it.
        while p.poll() is None and time.time() < deadline and not os.path.exists(os.path.join(d, "checkpoint")):
            time.sleep(0.005)
        while p.poll() is None and time.time() < deadline and not any(n.endswith(".tmp") for n in os.listdir(d)):
            time.sleep(0.001)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait()
        if kills:
            break
    assert kills, "the run never had a write in flight to kill"
    newest = os.readlink(os.path.join(d, "checkpoint"))
    state = json.load(open(os.path.join(d, "checkpoint", "trainer_state.json")))
    assert newest == f"step-{state['step']:08d}", (newest, state["step"])
    r = run(cfg + ASYNC + ["--out", d, "--resume", d, "--stop-after", "2"])
    last = json.load(open(os.path.join(d, "checkpoint", "trainer_state.json")))["step"]
    assert last == state["step"] + 2, (last, state["step"])
    run(["train", "--config", tiny(), "--steps", "1000", "--quiet", "--out", u, "--stop-after", str(last)] + model)
    md, mu = metrics(d), metrics(u)
    assert [m["step"] for m in md] == list(range(1, last + 1)), [m["step"] for m in md]
    assert all(x["loss"] == y["loss"] for x, y in zip(md, mu)), "losses differ after the kill and resume"
    # SIGTERM while a write is in flight: the run waits for it, then writes the stop step's, and says so.
    t = os.path.join(tmp, "t")
    p = subprocess.Popen([ARGS.bin] + cfg + ASYNC + ["--out", t], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 120
    while p.poll() is None and time.time() < deadline and not (
            os.path.isdir(t) and os.path.exists(os.path.join(t, "checkpoint")) and
            any(n.endswith(".tmp") for n in os.listdir(t))):
        time.sleep(0.001)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    stopped = len(metrics(t))
    assert f"stopped by SIGTERM after step {stopped}" in err, err
    assert json.load(open(os.path.join(t, "checkpoint", "trainer_state.json")))["step"] == stopped
    assert not any(n.endswith(".tmp") for n in os.listdir(t)), os.listdir(t)
    print(f"kill -9 mid-write: the checkpoint of step {state['step']} stayed the latest and resumed bit-exact to "
          f"step {last}; SIGTERM mid-write: stopped after step {stopped} with its checkpoint complete")


def case_plan_bytes(tmp):
    """The host copy `flatpeak plan` reports (rank 0's, by its category) is the run's, in fp32 and bf16, and
    on 2 ranks (rank 0 holds the whole checkpoint); a --host-mem that cannot hold it is refused by name."""
    for extra, mpi in (([], 0), (["--set", "precision.recipe=bf16"], 0), ([], 2)):
        d = os.path.join(tmp, f"p{len(os.listdir(tmp))}")
        base = ["--config", tiny()] + SMALL + ASYNC + extra
        j = os.path.join(tmp, "plan.json")
        run(["plan"] + base + ["--no-reach", "--json", j] + (["--ranks", str(mpi)] if mpi else []))
        planned = json.load(open(j))["host"]["by_category"]["checkpoint_copy"]
        run(["train"] + base + ["--steps", "2", "--quiet", "--out", d], mpi=mpi)
        held = metrics(d)[0]["host_checkpoint_copy_bytes"]
        assert planned == held, f"{extra} W={mpi or 1}: planned {planned} vs held {held}"
    p = run(["train"] + base + ["--steps", "2", "--quiet", "--out", os.path.join(tmp, "small"), "--host-mem", "1KB"],
            expect_ok=False)
    assert p.returncode != 0 and "train.checkpoint_async" in p.stderr, p.stderr
    # The issue's spelling, ckpt.async, is refused with the key's name ([ckpt] is the activation checkpoints').
    p = run(["train", "--config", tiny(), "--set", "ckpt.async=true", "--out", os.path.join(tmp, "x")],
            expect_ok=False)
    assert p.returncode != 0 and "train.checkpoint_async = true" in p.stderr, p.stderr
    print(f"planned host copy = held (fp32, bf16, 2 ranks; last {held} bytes); --host-mem 1KB refused by name")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("case")
    ARGS = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="flatpeak_ckpt_async_")
    try:
        globals()["case_" + ARGS.case](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
