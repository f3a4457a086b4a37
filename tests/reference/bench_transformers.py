"""What a user would run instead of flatpeak: transformers' Qwen3MoeForCausalLM (or GptOssForCausalLM, whose attention
has no sdpa path in transformers: take the eager modes) on PyTorch 2.x (CPU), on
the weights and batch of a flatpeak bench case (flatpeak bench step --case FILE), one training step
(forward, backward, torch.optim.AdamW) per repeat, in the modes a user would pick:
  fp32-eager   float32, attn_implementation="eager"
  fp32-sdpa    float32, attn_implementation="sdpa" (PyTorch's fused attention)
  bf16-sdpa    bf16 autocast over the forward (weights and optimizer in float32), sdpa
  fp32-sdpa-ckpt  fp32-sdpa with model.gradient_checkpointing_enable(): each decoder layer's input kept,
               the layer's forward recomputed in the backward, which is flatpeak's own plan (it keeps
               the checkpoint boundaries and recomputes the layers: Note [Per-layer checkpointing] in src/step/step.h), so
               this row compares the same work and the same memory plan
The loss is flatpeak's: mean cross-entropy of the logits against the case's (already shifted) targets
plus router_aux_loss_coef times transformers' load-balancing loss. Reports the median step seconds
over --repeats after --warmup, tokens/s and the process's max RSS, as JSON. Needs torch 2.x and
transformers (scripts/bench_step --transformers installs them into .venv-interop/).

usage: bench_transformers.py CASE.safetensors --json OUT [--repeats 5] [--warmup 1] [--modes ...]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time

import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, safe_open, save_file
from transformers import GptOssForCausalLM, Qwen3MoeForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_moe_twin as twin  # noqa: E402  # the gpt-oss case's per-expert tensors into transformers' fused layout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--json", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--modes", default="fp32-eager,fp32-sdpa,fp32-sdpa-ckpt,bf16-sdpa")
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    tensors = load_file(a.case)
    with safe_open(a.case, framework="pt") as f:
        cfg = json.loads(f.metadata()["config"])
    ids, tgt = tensors["input_ids"].long(), tensors["targets"].long()
    weights = {n: t for n, t in tensors.items() if n not in ("input_ids", "targets")}
    gpt_oss = cfg.get("model_type") == "gpt_oss"
    if gpt_oss:  # Note [gpt-oss's experts in files] (src/train/fused_experts.h): transformers' fused experts
        weights = {n: t.detach() for n, t in twin.gptoss_flat_to_hf(weights, twin.Config.from_dict(cfg)).items()}
    cls = GptOssForCausalLM if gpt_oss else Qwen3MoeForCausalLM
    model_dir = tempfile.mkdtemp(prefix="flatpeak_bench_tf_")
    save_file({n: t.contiguous() for n, t in weights.items()}, os.path.join(model_dir, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    results = {}
    for mode in a.modes.split(","):
        dtype, attn, *rest = mode.split("-")
        if dtype not in ("fp32", "bf16") or attn not in ("eager", "sdpa") or rest not in ([], ["ckpt"]):
            raise SystemExit(f"bench_transformers: unknown mode {mode!r} (DTYPE-ATTN[-ckpt], e.g. fp32-sdpa-ckpt)")
        # Loaded as a user would: from a Hugging Face directory (transformers maps the per-expert
        # tensors onto its own in-memory layout).
        model = cls.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn)
        config = model.config
        if rest == ["ckpt"]:
            model.gradient_checkpointing_enable()
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        times = []
        for i in range(a.warmup + a.repeats):
            t0 = time.perf_counter()
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                out = model(input_ids=ids, output_router_logits=True)
            logits = out.logits.float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)
            aux = load_balancing_loss_func(out.router_logits, config.num_local_experts if gpt_oss else config.num_experts,
                                           config.num_experts_per_tok)
            (loss + config.router_aux_loss_coef * aux).backward()
            opt.step()
            t = time.perf_counter() - t0
            if i >= a.warmup:
                times.append(t)
        med = statistics.median(times)
        results[mode] = {"step_seconds_median": med, "step_seconds": times, "tokens_per_s": ids.numel() / med,
                         "loss": loss.item()}
        print(f"transformers {mode}: {med:.4f} s median of {len(times)} ({ids.numel() / med:.0f} tokens/s), "
              f"loss {loss.item():.4f}")
    res = {"engine": "transformers", "torch": torch.__version__, "transformers": transformers.__version__,
           "threads": torch.get_num_threads(), "tokens": ids.numel(), "modes": results,
           "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=2)
    shutil.rmtree(model_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
