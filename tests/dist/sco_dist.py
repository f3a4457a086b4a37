#!/usr/bin/env python3
"""SCO on W ranks (issue 7): `flatpeak train` under mpirun -np 2 with ckpt.schedule = "sco" gives the
same losses and gradient norms, bit for bit, as ckpt.schedule = "device" on the same 2 ranks over 10
steps, and the checkpoints-category peak of every rank is at most two boundaries.

usage: sco_dist.py --bin-dir BUILD --configs CONFIGS
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none",
           OMPI_MCA_rmaps_base_oversubscribe="1")
W, L, B, T, H = 2, 4, 2, 256, 64  # the tiny model's hidden size is 64 (configs/tiny.toml)


def train(a, out, sched):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(W), os.path.join(a.bin_dir, "flatpeak"),
           "train", "--config", os.path.join(a.configs, "tiny.toml"), "--steps", "10", "--quiet", "--out", out,
           "--set", f"model.num_hidden_layers={L}", "--set", f"train.batch_size={B}", "--set", f"train.seq_len={T}",
           "--set", f'ckpt.schedule="{sched}"']
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--configs", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dev = train(a, os.path.join(tmp, "device"), "device")
        sco = train(a, os.path.join(tmp, "sco"), "sco")
    assert len(dev) == len(sco) == 10, (len(dev), len(sco))
    for d, s in zip(dev, sco):
        for key in ("loss", "aux_loss", "grad_norm"):
            assert d[key] == s[key], f"step {d['step']}: {key} device {d[key]!r} != sco {s[key]!r}"
    # One boundary per rank: (B, T / W) tokens x H fp32.
    boundary = B * (T // W) * H * 4
    dev_peak = max(m["peak_bytes"]["checkpoints"] for m in dev)
    sco_peak = max(m["peak_bytes"]["checkpoints"] for m in sco)
    assert dev_peak == L * boundary, f"device: checkpoints peak {dev_peak}, expected {L} boundaries of {boundary}"
    assert 0 < sco_peak <= 2 * boundary, f"sco: checkpoints peak {sco_peak}, more than 2 boundaries of {boundary}"
    print(f"W={W}: sco equals device bit for bit over 10 steps (last loss {sco[-1]['loss']!r}); "
          f"checkpoints peak {dev_peak} -> {sco_peak} B ({dev_peak / sco_peak:.1f}x)")


if __name__ == "__main__":
    main()
