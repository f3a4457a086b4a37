#!/usr/bin/env python3
"""Times the PyTorch twin on the weights and batch of a flatpeak bench case (flatpeak bench step
--case FILE): forward, backward (autograd) and a torch.optim.AdamW step, in float32 with all
threads, median of repeats; reports tokens/s and the process's max RSS as JSON.

usage: bench_twin.py CASE.safetensors --json OUT [--repeats 5] [--warmup 1]
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_moe_twin as twin  # noqa: E402
import safetensors_io  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--json", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    tensors, meta = safetensors_io.load(a.case)
    cfg = twin.Config.from_dict(json.loads(meta["config"]))
    names = list(twin.param_shapes(cfg))
    p = {n: tensors[n].float().clone().requires_grad_(True) for n in names}
    opt = torch.optim.AdamW(list(p.values()), lr=1e-4)
    ids, tgt = tensors["input_ids"], tensors["targets"]
    times = []
    for i in range(a.warmup + a.repeats):
        t0 = time.perf_counter()
        opt.zero_grad()
        out = twin.forward(p, cfg, ids, tgt)
        out["loss"].backward()
        opt.step()
        t = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(t)
    med = statistics.median(times)
    n = ids.numel()
    res = {"engine": "pytorch-twin", "torch": torch.__version__, "threads": torch.get_num_threads(), "tokens": n,
           "step_seconds_median": med, "step_seconds": times, "tokens_per_s": n / med,
           "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=2)
    print(f"pytorch twin step: {med:.4f} s median of {len(times)} ({n / med:.0f} tokens/s); "
          f"max RSS {res['max_rss_bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
