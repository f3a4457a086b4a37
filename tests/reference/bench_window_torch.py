"""PyTorch's answer to sliding-window attention on CPU, the anchor of docs/benchmarks.md's
"Sliding-window attention" table: F.scaled_dot_product_attention forward + backward at the shape of
Attention.DISABLED_BenchSlidingWindow (B 1, T 4096, nh 4, nkv 2, hd 64), causal (is_causal, the flash
kernel) and with a window mask (i - w < j <= i), windows timed in turn in each repeat, medians.
Needs PyTorch 2.x (.venv-interop/bin/python after scripts/interop); not part of scripts/test.

usage: bench_window_torch.py [THREADS]
"""
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
B, T, nh, nkv, hd = 1, 4096, 4, 2, 64
WINDOWS = (0, 2048, 512, 128)
g = torch.Generator().manual_seed(0)
q = torch.randn(B, nh, T, hd, generator=g, requires_grad=True)
k = torch.randn(B, nkv, T, hd, generator=g, requires_grad=True)
v = torch.randn(B, nkv, T, hd, generator=g, requires_grad=True)
i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]


def run(w):
    kk, vv = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)  # GQA
    if w == 0:
        o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
    else:
        o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=(j <= i) & (j > i - w))
    o.sum().backward()


times = {w: [] for w in WINDOWS}
for r in range(8):
    for w in WINDOWS:
        t0 = time.perf_counter()
        run(w)
        times[w].append(time.perf_counter() - t0)
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, cpu capability "
      f"{torch.backends.cpu.get_cpu_capability()}; medians of 7 after one warm-up")
for w in WINDOWS:
    ts = sorted(times[w][1:])
    print(f"window {w}: fwd+bwd {ts[len(ts) // 2]:.4f} s")
