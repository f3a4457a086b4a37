#!/usr/bin/python3
"""Checks a model case written by flatpeak (tests/reference/dump_case.cpp) against the PyTorch twin.

    /usr/bin/python3 check_case.py CASE.safetensors [--rtol 1e-5] [--allow-no-empty-expert]

The case file holds every parameter under its Hugging Face name (F32), "input_ids" and "targets"
(B, T) I32, flatpeak's outputs "out.logits" (B, T, V), "out.loss", "out.ce_loss", "out.aux_loss"
(1), "grad.<param>" for every parameter, and metadata "config" (the Hugging Face config JSON).

The twin runs in float64 on the same (float32) parameter values. Per tensor, the error is
max|cpp - ref| / max(max|ref|, tiny); every tensor must be within --rtol. Exit status: 0 when all
pass, 1 on any mismatch, missing tensor, or (unless --allow-no-empty-expert) when no expert of any
layer went without tokens: the case is built so that one does, to exercise that path.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_moe_twin as twin  # noqa: E402
import safetensors_io  # noqa: E402

TINY = 1e-30  # a reference that is all zeros must be matched by zeros


def unravel(flat, shape):
    """Flat row-major index -> index tuple."""
    out = []
    for d in reversed(shape):
        out.append(flat % d)
        flat //= d
    return tuple(reversed(out))


def compare(name, cpp, ref):
    """Returns (name, max abs err, max |ref|, rel err, worst index, cpp there, ref there).
    rel err is inf when cpp holds a NaN or Inf (the worst index then points at it)."""
    ref = ref.detach().to(torch.float64)
    cpp = cpp.to(torch.float64).reshape(ref.shape)
    if ref.numel() == 0:
        return (name, 0.0, 0.0, 0.0, "-", 0.0, 0.0)
    bad = ~torch.isfinite(cpp.reshape(-1))
    if bad.any():
        flat = int(bad.nonzero()[0, 0])
        err = float("inf")
    else:
        diff = (cpp - ref).abs().reshape(-1)
        flat = int(diff.argmax())
        err = diff[flat].item()
    max_ref = ref.abs().max().item()
    return (name, err, max_ref, err / max(max_ref, TINY), str(unravel(flat, tuple(ref.shape))),
            cpp.reshape(-1)[flat].item(), ref.reshape(-1)[flat].item())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--allow-no-empty-expert", action="store_true")
    args = ap.parse_args(argv)

    try:
        tensors, meta = safetensors_io.load(args.case)
    except (OSError, safetensors_io.FormatError) as e:
        print(f"FAIL: cannot read case: {e}")
        return 1
    if "config" not in meta:
        print(f"FAIL: {args.case} has no 'config' metadata")
        return 1
    try:
        cfg = twin.Config.from_dict(json.loads(meta["config"]))
    except (ValueError, KeyError) as e:
        print(f"FAIL: the 'config' metadata of {args.case} is unusable: {e}")
        return 1
    shapes = twin.param_shapes(cfg)
    problems = []
    for name in ["input_ids", "targets", "out.logits", "out.loss", "out.ce_loss", "out.aux_loss"]:
        if name not in tensors:
            problems.append(f"missing tensor {name}")
    for name, shape in shapes.items():
        for n in (name, "grad." + name):
            if n not in tensors:
                problems.append(f"missing tensor {n}")
            elif tuple(tensors[n].shape) != tuple(shape):
                problems.append(f"{n} has shape {tuple(tensors[n].shape)}, expected {tuple(shape)}")
    known = set(shapes) | {"grad." + n for n in shapes} | {"input_ids", "targets", "out.logits", "out.loss",
                                                           "out.ce_loss", "out.aux_loss"}
    extra = sorted(set(tensors) - known)
    if extra:
        print(f"note: {len(extra)} tensors the twin does not check: {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    if problems:
        for p in problems:
            print("FAIL:", p)
        return 1

    params = {n: tensors[n].to(torch.float64) for n in shapes}
    ids, targets = tensors["input_ids"], tensors["targets"]
    B, T = ids.shape
    print(f"case {args.case}: B={B} T={T} H={cfg.hidden_size} L={cfg.num_hidden_layers} "
          f"heads={cfg.num_attention_heads}/{cfg.num_key_value_heads} hd={cfg.head_dim} "
          f"E={cfg.num_experts} k={cfg.num_experts_per_tok} I={cfg.moe_intermediate_size} V={cfg.vocab_size} "
          f"norm_topk_prob={cfg.norm_topk_prob} aux_coef={cfg.router_aux_loss_coef} bias={cfg.attention_bias} "
          f"tied={cfg.tie_word_embeddings} window={cfg.window()} "
          f"dense={[i for i in range(cfg.num_hidden_layers) if not cfg.is_sparse(i)]} type={cfg.model_type}")
    ref = twin.forward_backward(params, cfg, ids, targets)

    # Routing: tokens per expert, empty experts, and how close the top-k choice came to a tie (a tie
    # broken differently in float32 would route a token elsewhere and no tolerance would help).
    empty_total = 0
    sparse = [i for i in range(cfg.num_hidden_layers) if cfg.is_sparse(i)]
    for i, choice in zip(sparse, ref["choice_scores"]):
        counts = ref["expert_counts"][i]
        empty = sum(1 for c in counts if c == 0)
        empty_total += empty
        # The scores the top-k chose on: softmax probabilities, or DeepSeek's sigmoid + bias within the
        # chosen groups (-inf elsewhere: an excluded expert is never near a tie).
        probs = choice.sort(dim=-1, descending=True).values
        k = cfg.num_experts_per_tok
        margin = (probs[:, k - 1] - probs[:, k]).min().item() if k < cfg.num_experts else float("inf")
        print(f"layer {i}: tokens per expert {counts}, {empty} experts with no tokens, "
              f"smallest top-k margin {margin:.3g}{'  (WARNING: near a tie)' if margin < 1e-5 else ''}")

    rows = [compare("logits", tensors["out.logits"], ref["logits"])]
    for n in ("loss", "ce_loss", "aux_loss"):
        rows.append(compare(n, tensors["out." + n], ref[n].reshape(1)))
    for n in shapes:
        rows.append(compare("grad." + n, tensors["grad." + n], ref["grads"][n]))

    width = max(len(r[0]) for r in rows)
    print(f"{'tensor':<{width}}  {'max abs err':>11}  {'max |ref|':>10}  {'rel err':>9}  {'worst at':<14}"
          f"  {'cpp':>12}  {'ref':>12}  result")
    failures = 0
    for name, err, mref, rel, idx, c, r in rows:
        ok = rel <= args.rtol  # False for NaN
        failures += not ok
        print(f"{name:<{width}}  {err:11.3e}  {mref:10.3e}  {rel:9.2e}  {idx:<14}  {c:12.5e}  {r:12.5e}  "
              f"{'OK' if ok else 'FAIL'}")
    print(f"{len(rows) - failures}/{len(rows)} tensors within rtol {args.rtol:g}; "
          f"{empty_total} (layer, expert) pairs with no tokens")
    if empty_total == 0 and not args.allow_no_empty_expert:
        print("FAIL: no expert went without tokens; the case must exercise an empty expert")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
