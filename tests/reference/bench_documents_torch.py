"""PyTorch's answers to packed-document attention on CPU, the anchor of docs/benchmarks.md's "Attention falls with
the document length" table: forward + backward at the shape of AttentionDocuments.DISABLED_BenchDocumentLengths
(B 1, T 8192, nh 4, nkv 2, hd 64), documents of one length, in the ways a PyTorch 2.x user would write it:
  mask      F.scaled_dot_product_attention with a dense block-causal boolean mask (T x T), torchtitan's
            block_causal without FlexAttention
  per-doc   one causal F.scaled_dot_product_attention per document (is_causal: the flash kernel), the outputs
            concatenated: what varlen / cu_seqlens kernels do, as a loop
  flex      torch.nn.attention.flex_attention with a document block mask, compiled (skipped where it does not
            run on this CPU)
Layouts timed in turn in each repeat, medians of 5 after one warm-up. Needs PyTorch 2.x (.venv-interop/bin/python
after scripts/interop); not part of scripts/test.

usage: bench_documents_torch.py [THREADS]
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
B, T, nh, nkv, hd = 1, 8192, 4, 2, 64
LENGTHS = (8192, 2048, 512, 128)
g = torch.Generator().manual_seed(0)
q = torch.randn(B, nh, T, hd, generator=g, requires_grad=True)
k = torch.randn(B, nkv, T, hd, generator=g, requires_grad=True)
v = torch.randn(B, nkv, T, hd, generator=g, requires_grad=True)
pos = torch.arange(T)


def gqa(t):
    return t.repeat_interleave(nh // nkv, 1)


def run_mask(L):
    doc = pos // L
    mask = (pos[None, :] <= pos[:, None]) & (doc[None, :] == doc[:, None])
    F.scaled_dot_product_attention(q, gqa(k), gqa(v), attn_mask=mask).sum().backward()


def run_per_doc(L):
    kk, vv = gqa(k), gqa(v)
    outs = [F.scaled_dot_product_attention(q[:, :, s:s + L], kk[:, :, s:s + L], vv[:, :, s:s + L], is_causal=True)
            for s in range(0, T, L)]
    torch.cat(outs, dim=2).sum().backward()


def flex_runner():
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        compiled = torch.compile(flex_attention)
        masks = {}

        def run(L):
            if L not in masks:
                masks[L] = create_block_mask(lambda b, h, qi, ki: (ki <= qi) & (qi // L == ki // L), None, None, T, T,
                                             device="cpu")
            compiled(q, k, v, block_mask=masks[L], enable_gqa=True).sum().backward()

        run(LENGTHS[-1])  # compile once before timing; a failure here means flex does not run on this CPU
        return run
    except Exception as e:  # noqa: BLE001 (any failure: report and skip)
        print(f"flex_attention skipped: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        return None


ways = {"mask": run_mask, "per-doc": run_per_doc}
flex = flex_runner()
if flex is not None:
    ways["flex"] = flex
times = {(w, L): [] for w in ways for L in LENGTHS}
for r in range(6):
    for w, fn in ways.items():
        for L in LENGTHS:
            for t in (q, k, v):
                t.grad = None
            t0 = time.perf_counter()
            fn(L)
            if r > 0:
                times[(w, L)].append(time.perf_counter() - t0)
print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, cpu capability "
      f"{torch.backends.cpu.get_cpu_capability()}; B {B} T {T} nh {nh} nkv {nkv} hd {hd}; fwd+bwd s, median of 5")
print("| documents of | " + " | ".join(ways) + " |")
print("|---|" + "---|" * len(ways))
for L in LENGTHS:
    print(f"| {L} | " + " | ".join(f"{statistics.median(times[(w, L)]):.3f}" for w in ways) + " |")
