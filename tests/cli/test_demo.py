#!/usr/bin/env python3
"""The demo learns recall: scripts/demo, run in full (its 128-token warmup, then the main run of
configs/demo.toml at 1024 tokens, the memory story and the report), ends with a recall accuracy >= 0.9
at train.seq_len = 1024. About 40 s on 2 idle cores.

usage: test_demo.py --bin build/flatpeak --root .
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--root", required=True, help="the repository (scripts/demo, configs/demo.toml)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="flatpeak_demo_") as tmp:
        out = os.path.join(tmp, "demo")
        env = dict(os.environ, FLATPEAK_BIN=os.path.abspath(args.bin), FLATPEAK_DEMO_OUT=out)
        t0 = time.time()
        p = subprocess.run([os.path.join(args.root, "scripts", "demo")], env=env, capture_output=True, text=True)
        wall = time.time() - t0
        if p.returncode != 0:
            sys.exit(f"FAILED: scripts/demo exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        warm, main_run = metrics(os.path.join(out, "warmup")), metrics(out)
        cfg = json.load(open(os.path.join(out, "checkpoint", "trainer_state.json")))["run_config"]
        acc = [m["recall_accuracy"] for m in main_run]
        last10 = sum(acc[-10:]) / len(acc[-10:])
        print(f"scripts/demo: {wall:.0f} s; warmup {len(warm)} steps (recall {warm[-1]['recall_accuracy']:.3f}), "
              f"main run {len(main_run)} steps: recall {acc[0]:.3f} -> {acc[-1]:.3f} (last 10 steps {last10:.3f}), "
              f"loss {main_run[0]['loss']:.3f} -> {main_run[-1]['loss']:.3f}")
        # The main run is the config's: 1024 tokens per sequence, the packed recall task.
        assert cfg["train"]["seq_len"] >= 1024, f"the main run is not at >= 1024 tokens: {cfg['train']}"
        assert cfg["data"].get("task") == "recall_packed", f"the main run is not on the packed task: {cfg['data']}"
        assert acc[-1] >= 0.9, f"the demo's recall accuracy ends at {acc[-1]:.3f} < 0.9: {acc}"
        assert last10 >= 0.9, f"the demo's recall accuracy over its last 10 steps is {last10:.3f} < 0.9: {acc}"
        for f in ("report.html", "memory_story.svg", "memory_trace.json"):
            assert os.path.isfile(os.path.join(out, f)), f"scripts/demo did not write {f}"


if __name__ == "__main__":
    main()
