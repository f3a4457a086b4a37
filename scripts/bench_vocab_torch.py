#!/usr/bin/python3
"""PyTorch's vocabulary projection and loss on flatpeak's `bench vocab` shapes, for comparison.

loss = F.cross_entropy(F.linear(x, W), targets, ignore_index=-100) and its backward to x and W, in
float32 on the CPU with every core (torch.set_num_threads(os.cpu_count())). Legend: N tokens, H hidden,
V vocabulary.

Reports the median forward+backward seconds over --repeats (after --warmup untimed runs), the
process's max RSS, and the RSS once the inputs exist, so max_rss - rss_inputs is what the projection,
the loss and their gradients added (PyTorch keeps the (N, V) logits and their gradient alive together).
`flatpeak bench vocab` runs this as a subprocess and folds the JSON into its own.

    /usr/bin/python3 scripts/bench_vocab_torch.py --tokens 8192 --vocab 32768 --hidden 1024 --json out.json
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
import torch.nn.functional as F


def rss_now_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--hidden", type=int, required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(a.seed)
    N, H, V = a.tokens, a.hidden, a.vocab
    x = torch.randn(N, H, generator=g, dtype=torch.float32).requires_grad_()  # (N, H)
    W = (0.02 * torch.randn(V, H, generator=g, dtype=torch.float32)).requires_grad_()  # (V, H)
    targets = torch.randint(0, V, (N,), generator=g)  # (N)
    targets[N - 1] = -100  # the last position has no next token, as in flatpeak's batches
    rss_inputs = rss_now_bytes()

    times, cpu_times = [], []
    loss_value = float("nan")
    for i in range(a.warmup + a.repeats):
        x.grad = None
        W.grad = None
        t0, c0 = time.perf_counter(), time.process_time()
        loss = F.cross_entropy(F.linear(x, W), targets, ignore_index=-100)
        loss.backward()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        loss_value = loss.item()
        del loss
        if i >= a.warmup:
            times.append(dt)
            cpu_times.append(dc)
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {
        "engine": "pytorch",
        "torch": torch.__version__,
        "threads": threads,
        "tokens": N,
        "vocab": V,
        "hidden": H,
        "loss": loss_value,
        "seconds": statistics.median(times),
        "seconds_all": times,
        "cpu_seconds": statistics.median(cpu_times),  # process CPU time, every thread
        "cpu_seconds_all": cpu_times,
        "max_rss_bytes": max_rss,
        "rss_inputs_bytes": rss_inputs,
        "peak_bytes": max_rss,
        "vocab_peak_bytes": max_rss - rss_inputs,
    }
    with open(a.json, "w") as f:
        json.dump(out, f, indent=2)
    print(f"pytorch F.linear + F.cross_entropy: {out['seconds']:.4f} s median of {len(times)}, "
          f"max RSS {max_rss / 2**20:.1f} MiB ({(max_rss - rss_inputs) / 2**20:.1f} MiB over the inputs)")


if __name__ == "__main__":
    main()
