#!/usr/bin/python3
"""Checks a model case written by flatpeak (tests/reference/dump_case.cpp) against the PyTorch twin.

    /usr/bin/python3 check_case.py CASE.safetensors [--rtol 1e-5] [--allow-no-empty-expert]
    /usr/bin/python3 check_case.py CASE.safetensors [--bf16] [--loss-rtol 5e-3] [--grad-rtol 3e-2] ...

The case file holds every parameter under its Hugging Face name (F32), "input_ids" and "targets"
(B, T) I32, flatpeak's outputs "out.logits" (B, T, V), "out.loss", "out.ce_loss", "out.aux_loss"
(1), "grad.<param>" for every parameter, and metadata "config" (the Hugging Face config JSON). The
parameter names are the twin's param_shapes(cfg) for the config's model_type (qwen3_moe, deepseek_v3,
gpt_oss); gpt_oss's experts go by per-expert names (mlp.experts.{e}.{gate,up,down}_proj.{weight,bias},
qwen3_moe_twin.gptoss_hf_to_flat), beside self_attn.sinks and mlp.router.{weight,bias}.

The twin runs in float64 on the same (float32) parameter values. Per tensor, the error is
max|cpp - ref| / max(max|ref|, tiny); every tensor must be within --rtol. Exit status: 0 when all
pass, 1 on any mismatch, missing tensor, or (unless --allow-no-empty-expert) when no expert of any
layer went without tokens: the case is built so that one does, to exercise that path.

bf16 (metadata "precision": "bf16", written by `dump_case OUT CASE bf16`, or --bf16): flatpeak ran its
bf16 recipe; the weights in the file are its bf16 values and the outputs are widened. The reference
is then the bf16 twin (the twin with flatpeak's cast points, Note [The bf16 twin's cast points] in
qwen3_moe_twin.py), and each tensor's error is norm-relative, ||cpp - ref|| / ||ref||: the losses
within --loss-rtol (5e-3), every gradient within --grad-rtol (3e-2), the logits within --logits-rtol
(5e-3: like the loss they come from the forward alone, and one bf16 rounding moves a value by at most
2^-8 = 3.9e-3 of it; measured 3e-8 against the bf16 twin, 2.6e-3 against the plain one). For
information the table also gives the max-relative error and the norm-relative error of the plain
float64 twin (no casts) on the same weights: what the cast points account for.

Note [The bf16 twin computes in float64]: between its cast points the bf16 twin computes in float64
by default, like the plain twin: it rounds the exact value at each cast point, so it is the ideal
bf16-storage computation and owes nothing to flatpeak's f32 arithmetic. What separates it from
flatpeak is then flatpeak's f32 error alone: now and then flatpeak's f32 value and the exact one lie
on either side of a bf16 rounding boundary, and that value moves by a bf16 ulp (amplified where the
attention backward cancels, dS = P (dP - D)). --compute float32 mirrors flatpeak's arithmetic (its
elementwise kernels then give torch's f32 values, and more tensors come out bit-identical) but its
summation orders still differ, and measured it is not closer: on the four Qwen3 cases 206 of 283
gradients bit-identical against 200 in float64, pooled norm-relative rms 5.3e-4 against 4.5e-4, each
dtype ahead on two cases; both are noise of this kind. (Leaving out any one kind of cast point,
store's gradient rounding, store_grad, fan's partial sums, the rounded o in the attention backward's D
or the weight gradients' rounding, raises the rms 1.4-80x and makes fewer gradients bit-identical
in every case.)
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


def norm_rel(cpp, ref):
    """||cpp - ref||_2 / ||ref||_2 in float64 (inf when cpp is not finite; 0 when both are all zeros)."""
    ref = ref.detach().to(torch.float64).reshape(-1)
    cpp = cpp.to(torch.float64).reshape(-1)
    if not torch.isfinite(cpp).all():
        return float("inf")
    return (cpp - ref).norm().item() / max(ref.norm().item(), TINY)


BF16_UNIT_ROUNDOFF = 2.0 ** -8  # bf16 keeps 8 significant bits: a rounding moves a value by <= 2^-8 of it


def check_bf16(args, tensors, cfg, shapes, params32, ids, targets, docs=None):
    """The bf16 check (module docstring). Returns the exit status."""
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.compute]
    ref = twin.forward_backward({n: t.to(dtype) for n, t in params32.items()}, cfg, ids, targets, twin.BF16_CASTS,
                                docs)
    plain = twin.forward_backward({n: t.to(torch.float64) for n, t in params32.items()}, cfg, ids, targets,
                                  docs=docs)

    # Routing: a token whose top-k differs between flatpeak and the twin moves whole rows between experts
    # (no tolerance covers that). The bf16 twin forms the router's input h2 as flatpeak does (rounded
    # alike), so its choice differs only where a margin is within f32 noise (flagged, as in the fp32
    # check); in units of a bf16 rounding (2^-8 of the k-th score) the margin says how far a rounding
    # placed differently would move: the plain twin, which rounds nothing, routes differently where it
    # is below about 1.
    empty_total = 0
    sparse = [i for i in range(cfg.num_hidden_layers) if cfg.is_sparse(i)]
    margin_min = float("inf")
    for i, choice in zip(sparse, ref["choice_scores"]):
        counts = ref["expert_counts"][i]
        empty = sum(1 for c in counts if c == 0)
        empty_total += empty
        k = cfg.num_experts_per_tok
        scores = choice.sort(dim=-1, descending=True).values
        if k < cfg.num_experts:
            rel = (scores[:, k - 1] - scores[:, k]) / scores[:, k - 1].abs()  # relative top-k margin per token
            t = int(rel.argmin())
            margin, rel_min = (scores[t, k - 1] - scores[t, k]).item(), rel[t].item()
        else:
            margin = rel_min = float("inf")
        margin_min = min(margin_min, rel_min / BF16_UNIT_ROUNDOFF)
        same = "same" if plain["expert_counts"][i] == counts else f"plain twin: {plain['expert_counts'][i]}"
        print(f"layer {i}: tokens per expert {counts} ({same}), {empty} experts with no tokens, smallest top-k "
              f"margin {margin:.3g} = {rel_min:.3g} of the k-th score = {rel_min / BF16_UNIT_ROUNDOFF:.3g} bf16 "
              f"roundings{'  (WARNING: near a tie)' if rel_min < 1e-5 else ''}")

    rows = [("logits", tensors["out.logits"], ref["logits"], plain["logits"], args.logits_rtol)]
    for n in ("loss", "ce_loss", "aux_loss"):
        rows.append((n, tensors["out." + n], ref[n].reshape(1), plain[n].reshape(1), args.loss_rtol))
    for n in shapes:
        rows.append(("grad." + n, tensors["grad." + n], ref["grads"][n], plain["grads"][n], args.grad_rtol))
    width = max(len(r[0]) for r in rows)
    print(f"bf16 twin in {args.compute} against flatpeak's bf16 recipe; errors norm-relative ||cpp - ref|| / ||ref||")
    print(f"{'tensor':<{width}}  {'||ref||':>10}  {'bf16 twin':>9}  {'max-rel':>9}  {'fp64 twin':>9}  {'tol':>7}"
          "  result")
    failures = 0
    worst, worst_plain = {}, {}  # kind -> (error, tensor) of the bf16 twin, of the plain twin
    for name, cpp, r, r_plain, tol in rows:
        err, err_plain = norm_rel(cpp, r), norm_rel(cpp, r_plain)
        max_rel = compare(name, cpp, r)[3]
        ok = err <= tol  # False for NaN
        failures += not ok
        kind = "gradient" if name.startswith("grad.") else "logits" if name == "logits" else "loss"
        worst[kind] = max(worst.get(kind, (-1.0, "")), (err, name))
        worst_plain[kind] = max(worst_plain.get(kind, (-1.0, "")), (err_plain, name))
        print(f"{name:<{width}}  {r.detach().double().norm().item():10.3e}  {err:9.2e}  {max_rel:9.2e}  "
              f"{err_plain:9.2e}  {tol:7.0e}  {'OK' if ok else 'FAIL'}")
    for kind in worst:
        print(f"worst {kind}: bf16 twin {worst[kind][0]:.2e} ({worst[kind][1]}); plain fp64 twin "
              f"{worst_plain[kind][0]:.2e} ({worst_plain[kind][1]})")
    print(f"smallest top-k margin: {margin_min:.3g} bf16 roundings (relative to the k-th score)")
    print(f"{len(rows) - failures}/{len(rows)} tensors within tolerance (loss {args.loss_rtol:g}, gradients "
          f"{args.grad_rtol:g}, logits {args.logits_rtol:g}, norm-relative); {empty_total} (layer, expert) pairs "
          f"with no tokens")
    if empty_total == 0 and not args.allow_no_empty_expert:
        print("FAIL: no expert went without tokens; the case must exercise an empty expert")
        return 1
    return 1 if failures else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case")
    ap.add_argument("--rtol", type=float, default=1e-5, help="fp32 cases: max-relative tolerance per tensor")
    ap.add_argument("--allow-no-empty-expert", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="check as a bf16 case whatever the metadata says")
    ap.add_argument("--compute", choices=("float64", "float32"), default="float64",
                    help="bf16: the dtype the bf16 twin computes in (Note [The bf16 twin computes in float64])")
    ap.add_argument("--loss-rtol", type=float, default=5e-3, help="bf16: losses, relative")
    ap.add_argument("--grad-rtol", type=float, default=3e-2, help="bf16: every gradient, norm-relative")
    ap.add_argument("--logits-rtol", type=float, default=5e-3, help="bf16: logits, norm-relative")
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
        raw = json.loads(meta["config"])
        cfg = twin.Config.from_dict(raw)
    except (ValueError, KeyError) as e:
        print(f"FAIL: the 'config' metadata of {args.case} is unusable: {e}")
        return 1
    if cfg.gptoss() and not raw.get("rope_scaling") and raw.get("rope_parameters") is None:
        print("note: this gpt_oss config.json has neither a rope_scaling dict nor rope_parameters: transformers' "
              "GptOssConfig, and the twin with it, then take its YaRN default (factor 32, "
              "original_max_position_embeddings 4096); the default RoPE is rope_parameters {\"rope_type\": "
              "\"default\", \"rope_theta\": ...}")
    if cfg.gptoss() and raw.get("sliding_window") is None:
        print("note: sliding_window is null: transformers' GptOssModel refuses to build its masks (the twin "
              "computes full causal attention on every layer)")
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
    known = set(shapes) | {"grad." + n for n in shapes} | {"input_ids", "targets", "doc_start", "out.logits",
                                                           "out.loss", "out.ce_loss", "out.aux_loss"}
    extra = sorted(set(tensors) - known)
    if extra:
        print(f"note: {len(extra)} tensors the twin does not check: {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    if problems:
        for p in problems:
            print("FAIL:", p)
        return 1

    bf16 = args.bf16 or meta.get("precision", "fp32") == "bf16"
    params = {n: tensors[n].to(torch.float64) for n in shapes}
    ids, targets = tensors["input_ids"], tensors["targets"]
    B, T = ids.shape
    # Packed documents: the twin runs each document's attention alone (twin.per_document).
    docs = twin.document_spans(tensors["doc_start"]) if "doc_start" in tensors else None
    if docs is not None:
        print(f"documents per sequence: {[len(s) for s in docs]} (spans {docs})")
    # gpt_oss: a window per layer (layer_types), sinks, the clamped SwiGLU.
    windows = [cfg.layer_window(i) for i in range(cfg.num_hidden_layers)] if cfg.gptoss() else cfg.window()
    arch = (f" swiglu_alpha={cfg.swiglu_alpha} swiglu_limit={cfg.swiglu_limit} rope_theta={cfg.rope_theta} "
            f"rope={cfg.rope_scaling}") if cfg.gptoss() else ""
    print(f"case {args.case} ({'bf16' if bf16 else 'fp32'}): B={B} T={T} H={cfg.hidden_size} L={cfg.num_hidden_layers} "
          f"heads={cfg.num_attention_heads}/{cfg.num_key_value_heads} hd={cfg.head_dim} "
          f"E={cfg.num_experts} k={cfg.num_experts_per_tok} I={cfg.moe_intermediate_size} V={cfg.vocab_size} "
          f"norm_topk_prob={cfg.norm_topk_prob} aux_coef={cfg.router_aux_loss_coef} bias={cfg.attention_bias} "
          f"tied={cfg.tie_word_embeddings} window={windows} "
          f"dense={[i for i in range(cfg.num_hidden_layers) if not cfg.is_sparse(i)]} type={cfg.model_type}{arch}")
    if bf16:
        # DeepSeek-V3's routing bias may stay f32 (transformers keeps it so): it only moves the choice.
        unrounded = [n for n in shapes if not n.endswith("e_score_correction_bias")
                     and not torch.equal(twin.bf16_round(tensors[n]), tensors[n])]
        if unrounded:
            print(f"FAIL: a bf16 case holds weights that are not bf16 values: {unrounded[:3]}")
            return 1
        return check_bf16(args, tensors, cfg, shapes, {n: tensors[n] for n in shapes}, ids, targets, docs)
    ref = twin.forward_backward(params, cfg, ids, targets, docs=docs)

    # Routing: tokens per expert, empty experts, and how close the top-k choice came to a tie (a tie
    # broken differently in float32 would route a token elsewhere and no tolerance would help).
    empty_total = 0
    sparse = [i for i in range(cfg.num_hidden_layers) if cfg.is_sparse(i)]
    for i, choice in zip(sparse, ref["choice_scores"]):
        counts = ref["expert_counts"][i]
        empty = sum(1 for c in counts if c == 0)
        empty_total += empty
        # The scores the top-k chose on: softmax probabilities, DeepSeek's sigmoid + bias within the
        # chosen groups (-inf elsewhere: an excluded expert is never near a tie), or gpt_oss's router
        # logits (bias included).
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
