#!/usr/bin/python3
"""Checks the PyTorch twin itself, so that the model-vs-twin test does not rest on trust:

  (a) its attention equals a naive per-(batch, head, position) loop with explicit RoPE pairs;
  (b) its MoE block equals a per-token loop (sorted top-k, explicit SwiGLU), and its aux loss and
      whole forward (logits, ce, aux, loss) equal loop versions built from those naive blocks;
  (c) torch.autograd.gradcheck (float64) of the whole loss w.r.t. several parameters, tiny config;
  (d) safetensors_io roundtrips every dtype, a scalar, an empty tensor and metadata, and lays the
      file out as the format says;
  (e) check_case.py passes a case made from the twin's own outputs and fails (exit 1, naming the
      tensor) a perturbed gradient, a NaN, a missing gradient, and a case without an empty expert;
  (f) the bf16 twin's cast points (Note [The bf16 twin's cast points]): bf16_round is round-to-nearest-
      even (against the bit formula, ties included), store / store_grad / fan round what they say in
      the order they say, the FlashAttention-style attention is exact attention and its exact gradient
      when unrounded, and check_case.py passes a bf16 case made from the bf16 twin and fails a
      perturbed gradient and unrounded weights;
  (g) gpt_oss (read from a config.json in transformers' spelling): its attention (biases, sinks, a
      window on the sliding layers) equals a per-row softmax loop with the sink in the denominator, its
      MoE (router bias, top-k of the logits, biased experts, clamped SwiGLU) a per-token loop, and its
      whole forward a loop version; the clamped SwiGLU equals its elementwise formula, passes gradcheck
      (float64) and has a zero gradient wherever a clamp is active; the attention kernel with sinks
      (_Attention) equals a loop and passes gradcheck (q, k, v and the sinks; its rounded form's sink
      gradient is -sum exp(sink - lse') rowsum(round(dO) round(o))); gptoss_flat_to_hf lays out
      transformers' fused experts element by element and gptoss_hf_to_flat inverts it; gradcheck of the
      whole loss; the bf16 twin; check_case.py on gpt_oss cases (fp32 and bf16).

Run with /usr/bin/python3 (torch); exits non-zero on any failure.
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen3_moe_twin as twin  # noqa: E402
import safetensors_io  # noqa: E402

torch.set_default_dtype(torch.float64)

TINY = dict(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=6, vocab_size=11, rope_theta=10000.0,
            rms_norm_eps=1e-6, norm_topk_prob=True, router_aux_loss_coef=0.05)
# A wider GQA config (2 query heads per kv head, odd T) for the block comparisons.
GQA = dict(hidden_size=12, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
           num_experts=5, num_experts_per_tok=3, moe_intermediate_size=7, vocab_size=13, rope_theta=500.0,
           rms_norm_eps=1e-5, norm_topk_prob=False, router_aux_loss_coef=0.1)


# gpt_oss as a config.json in transformers' spelling (num_local_experts, intermediate_size the expert
# width, layer_types absent: sliding on even layers, full on odd; rope_parameters). swiglu_limit 0.6 makes
# both clamps active on unit-scale activations.
GPTOSS = dict(model_type="gpt_oss", hidden_size=12, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              head_dim=6, num_local_experts=5, num_experts_per_tok=2, intermediate_size=7, vocab_size=13,
              sliding_window=3, rms_norm_eps=1e-5, router_aux_loss_coef=0.1, swiglu_alpha=1.702, swiglu_limit=0.6,
              rope_parameters={"rope_type": "default", "rope_theta": 500.0})


def batch(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    targets.view(-1)[::4] = twin.IGNORE_INDEX
    return ids, targets


def assert_close(name, got, want, tol=1e-11):
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    assert torch.isfinite(got).all() and torch.isfinite(want).all(), f"{name}: not finite"
    err = (got - want).abs().max().item() if got.numel() else 0.0
    scale = max(want.abs().max().item() if want.numel() else 0.0, 1e-300)
    assert err <= tol * max(scale, 1.0), f"{name}: max abs err {err:.3e} (scale {scale:.3e})"
    print(f"  {name}: max abs err {err:.2e}")


# --- naive versions, written from the description rather than from the twin -------------------------

def rms_vec(v, w, eps):
    return v / math.sqrt(float((v * v).sum()) / v.numel() + eps) * w


def rope_vec(v, pos, theta):
    """Rotates the pairs (i, i + hd/2) of one head vector by pos * theta^(-2i/hd)."""
    hd = v.numel()
    half = hd // 2
    r = v.clone()
    for i in range(half):
        a = pos * theta ** (-2.0 * i / hd)
        c, s = math.cos(a), math.sin(a)
        r[i] = v[i] * c - v[i + half] * s
        r[i + half] = v[i + half] * c + v[i] * s
    return r


def attention_naive(x, p, layer, cfg):
    B, T, H = x.shape
    nh, nkv, hd, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
    pre = f"model.layers.{layer}.self_attn."
    Wq, Wk, Wv = p[pre + "q_proj.weight"], p[pre + "k_proj.weight"], p[pre + "v_proj.weight"]
    qn, kn = p[pre + "q_norm.weight"], p[pre + "k_norm.weight"]
    heads = torch.zeros(B, T, nh * hd)
    for b in range(B):
        for h in range(nh):
            g = h // (nh // nkv)
            rows_q, rows_kv = slice(h * hd, (h + 1) * hd), slice(g * hd, (g + 1) * hd)
            qs = [rope_vec(rms_vec(Wq[rows_q] @ x[b, t], qn, eps), t, cfg.rope_theta) for t in range(T)]
            ks = [rope_vec(rms_vec(Wk[rows_kv] @ x[b, s], kn, eps), s, cfg.rope_theta) for s in range(T)]
            vs = [Wv[rows_kv] @ x[b, s] for s in range(T)]
            for t in range(T):
                scores = [float(qs[t] @ ks[s]) / math.sqrt(hd) for s in range(t + 1)]
                m = max(scores)
                w = [math.exp(a - m) for a in scores]
                z = sum(w)
                heads[b, t, rows_q] = sum(w[s] / z * vs[s] for s in range(t + 1))
    return heads @ p[pre + "o_proj.weight"].T


def moe_naive(x, p, layer, cfg):
    B, T, H = x.shape
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    pre = f"model.layers.{layer}.mlp."
    out = torch.zeros(B, T, H)
    logits_all = torch.zeros(B * T, E)
    counts = [0] * E
    for n in range(B * T):
        b, t = divmod(n, T)
        v = x[b, t]
        logits = [float(p[pre + "gate.weight"][e] @ v) for e in range(E)]
        logits_all[n] = torch.tensor(logits)
        m = max(logits)
        z = sum(math.exp(a - m) for a in logits)
        probs = [math.exp(a - m) / z for a in logits]
        chosen = sorted(range(E), key=lambda e: -probs[e])[:k]
        w = [probs[e] for e in chosen]
        if cfg.norm_topk_prob:
            w = [a / sum(w) for a in w]
        for e, we in zip(chosen, w):
            counts[e] += 1
            q = f"{pre}experts.{e}."
            a = p[q + "gate_proj.weight"] @ v
            silu = a / (1.0 + torch.exp(-a))
            out[b, t] += we * (p[q + "down_proj.weight"] @ (silu * (p[q + "up_proj.weight"] @ v)))
    return out, logits_all, counts


def aux_naive(router_logits, E, k):
    """E * sum_e (fraction of rows with e in their top k) * (mean router probability of e)."""
    rows = torch.cat(router_logits, dim=0)
    n = rows.shape[0]
    frac, mean_p = [0.0] * E, [0.0] * E
    for r in rows:
        probs = torch.softmax(r, dim=0).tolist()
        for e in sorted(range(E), key=lambda e: -probs[e])[:k]:
            frac[e] += 1.0 / n
        for e in range(E):
            mean_p[e] += probs[e] / n
    return E * sum(f * q for f, q in zip(frac, mean_p))


def softmax_row(scores, sink=None, with_sink=False):
    """Probabilities of a list of scores, with a sink logit in the denominator (and no output) if given;
    with_sink: also the sink's own probability."""
    m = max(scores + ([sink] if sink is not None else []))
    w = [math.exp(a - m) for a in scores]
    z = sum(w) + (math.exp(sink - m) if sink is not None else 0.0)
    P = [a / z for a in w]
    return (P, math.exp(sink - m) / z) if with_sink else P


def visible_keys(t, window):
    """The keys query t sees: s <= t, and with a window the last `window` of them (s > t - window)."""
    return [s for s in range(t + 1) if window is None or s > t - window]


def gptoss_window(cfg, layer):
    return cfg.sliding_window if cfg.layer_types[layer] == "sliding_attention" else None


def attention_naive_gptoss(x, p, layer, cfg):
    """gpt_oss attention by loops: biased projections, RoPE, no q/k norm, per-row softmax over the
    visible keys with the head's sink logit in the denominator, biased o_proj."""
    B, T, H = x.shape
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pre = f"model.layers.{layer}.self_attn."
    W = lambda n: p[pre + n]  # noqa: E731
    window = gptoss_window(cfg, layer)
    heads = torch.zeros(B, T, nh * hd)
    for b in range(B):
        for h in range(nh):
            g = h // (nh // nkv)
            rq, rkv = slice(h * hd, (h + 1) * hd), slice(g * hd, (g + 1) * hd)
            qs = [rope_vec(W("q_proj.weight")[rq] @ x[b, t] + W("q_proj.bias")[rq], t, cfg.rope_theta)
                  for t in range(T)]
            ks = [rope_vec(W("k_proj.weight")[rkv] @ x[b, s] + W("k_proj.bias")[rkv], s, cfg.rope_theta)
                  for s in range(T)]
            vs = [W("v_proj.weight")[rkv] @ x[b, s] + W("v_proj.bias")[rkv] for s in range(T)]
            for t in range(T):
                keys = visible_keys(t, window)
                P = softmax_row([float(qs[t] @ ks[s]) / math.sqrt(hd) for s in keys], float(W("sinks")[h]))
                heads[b, t, rq] = sum(w * vs[s] for w, s in zip(P, keys))
    return heads @ W("o_proj.weight").T + W("o_proj.bias")


def clamped_swiglu_naive(a, c, alpha, limit):
    """One element: g = min(a, limit), u = min(max(c, -limit), limit), (u + 1) g sigmoid(alpha g)."""
    g, u = min(a, limit), min(max(c, -limit), limit)
    return (u + 1.0) * g / (1.0 + math.exp(-alpha * g))


def moe_naive_gptoss(x, p, layer, cfg, stats=None):
    """gpt_oss MoE by a per-token loop: logits with the router bias, the k largest (ties to the lower
    index), softmax over those k, each expert's biased projections and clamped SwiGLU elementwise."""
    B, T, H = x.shape
    E, k = cfg.num_experts, cfg.num_experts_per_tok
    pre = f"model.layers.{layer}.mlp."
    out = torch.zeros(B, T, H)
    logits_all = torch.zeros(B * T, E)
    counts = [0] * E
    for n in range(B * T):
        b, t = divmod(n, T)
        v = x[b, t]
        logits = [float(p[pre + "router.weight"][e] @ v) + float(p[pre + "router.bias"][e]) for e in range(E)]
        logits_all[n] = torch.tensor(logits)
        chosen = sorted(range(E), key=lambda e: -logits[e])[:k]
        for e, we in zip(chosen, softmax_row([logits[e] for e in chosen])):
            counts[e] += 1
            q = f"{pre}experts.{e}."
            a = (p[q + "gate_proj.weight"] @ v + p[q + "gate_proj.bias"]).tolist()
            c = (p[q + "up_proj.weight"] @ v + p[q + "up_proj.bias"]).tolist()
            act = torch.tensor([clamped_swiglu_naive(ai, ci, cfg.swiglu_alpha, cfg.swiglu_limit)
                                for ai, ci in zip(a, c)])
            if stats is not None:
                stats["gate"] += sum(ai > cfg.swiglu_limit for ai in a)
                stats["up"] += sum(abs(ci) > cfg.swiglu_limit for ci in c)
                stats["n"] += len(a)
            out[b, t] += we * (p[q + "down_proj.weight"] @ act + p[q + "down_proj.bias"])
    return out, logits_all, counts


def forward_naive(p, cfg, ids, targets):
    eps = cfg.rms_norm_eps
    attention_fn, moe_fn = (attention_naive_gptoss, moe_naive_gptoss) if cfg.gptoss() else (attention_naive, moe_naive)
    B, T = ids.shape
    x = torch.stack([torch.stack([p["model.embed_tokens.weight"][int(ids[b, t])] for t in range(T)])
                     for b in range(B)])
    norm = lambda y, w: torch.stack([torch.stack([rms_vec(y[b, t], w, eps) for t in range(T)]) for b in range(B)])
    router = []
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        x = x + attention_fn(norm(x, p[pre + "input_layernorm.weight"]), p, i, cfg)
        y, logits, _ = moe_fn(norm(x, p[pre + "post_attention_layernorm.weight"]), p, i, cfg)
        x = x + y
        router.append(logits)
    logits = norm(x, p["model.norm.weight"]) @ p["lm_head.weight"].T
    total, count = 0.0, 0
    for b in range(B):
        for t in range(T):
            y = int(targets[b, t])
            if y == twin.IGNORE_INDEX:
                continue
            row = logits[b, t].tolist()
            m = max(row)
            total += m + math.log(sum(math.exp(a - m) for a in row)) - row[y]
            count += 1
    ce = total / count
    aux = aux_naive(router, cfg.num_experts, cfg.num_experts_per_tok)
    return logits, ce, aux, ce + cfg.router_aux_loss_coef * aux


# --- the checks ----------------------------------------------------------------------------------

def check_attention():
    print("(a) attention vs a per-head loop")
    for d, B, T in ((TINY, 2, 5), (GQA, 2, 9)):
        cfg = twin.Config(**d)
        p = twin.init_params(cfg, seed=1)
        x = torch.randn(B, T, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
        for layer in range(cfg.num_hidden_layers):
            assert_close(f"attention heads {cfg.num_attention_heads}/{cfg.num_key_value_heads} layer {layer}",
                         twin.attention(x, p, layer, cfg), attention_naive(x, p, layer, cfg))


def check_moe_and_forward():
    print("(b) MoE vs a per-token loop; aux loss and whole forward vs loop versions")
    for d, B, T in ((TINY, 2, 5), (GQA, 2, 9)):
        cfg = twin.Config(**d)
        p = twin.init_params(cfg, seed=3)
        x = torch.randn(B, T, cfg.hidden_size, generator=torch.Generator().manual_seed(4))
        for layer in range(cfg.num_hidden_layers):
            out, logits, counts, _ = twin.moe(x, p, layer, cfg)
            out_n, logits_n, counts_n = moe_naive(x, p, layer, cfg)
            assert counts == counts_n, f"tokens per expert {counts} vs {counts_n}"
            assert sum(counts) == B * T * cfg.num_experts_per_tok
            assert_close(f"moe E={cfg.num_experts} k={cfg.num_experts_per_tok} layer {layer}", out, out_n)
            assert_close(f"router logits layer {layer}", logits, logits_n)
        ids, targets = batch(cfg, B, T, seed=5)
        ref = twin.forward(p, cfg, ids, targets)
        logits, ce, aux, loss = forward_naive(p, cfg, ids, targets)
        assert_close("logits", ref["logits"], logits, 1e-10)
        assert_close("ce_loss", ref["ce_loss"], torch.tensor(ce), 1e-10)
        assert_close("aux_loss", ref["aux_loss"], torch.tensor(aux), 1e-10)
        assert_close("loss", ref["loss"], torch.tensor(loss), 1e-10)
        assert_close("aux by one-hot formula", ref["aux_loss"], twin.load_balancing_loss(
            [r.detach() for r in ref["router_logits"]], cfg.num_experts, cfg.num_experts_per_tok), 1e-12)


def check_gradcheck():
    print("(c) gradcheck of the whole loss (float64, tiny config)")
    cfg = twin.Config(**TINY)
    p = twin.init_params(cfg, seed=6)
    ids, targets = batch(cfg, 2, 5, seed=7)
    names = ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
             "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
             "model.layers.0.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
             "model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
             "model.layers.1.post_attention_layernorm.weight", "model.layers.0.mlp.gate.weight",
             "model.layers.1.mlp.gate.weight", "model.layers.0.mlp.experts.1.gate_proj.weight",
             "model.layers.1.mlp.experts.2.up_proj.weight", "model.layers.1.mlp.experts.3.down_proj.weight",
             "model.norm.weight", "lm_head.weight"]

    def loss_of(*ws):
        q = dict(p)
        q.update(zip(names, ws))
        return twin.forward(q, cfg, ids, targets)["loss"]

    inputs = tuple(p[n].clone().requires_grad_(True) for n in names)
    # The top-k choice is piecewise constant; the margins here are far larger than eps, so the loss
    # is smooth around this point and central differences apply.
    assert torch.autograd.gradcheck(loss_of, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)
    print(f"  gradcheck passed for {len(names)} parameters")
    # And forward_backward's grads are the same autograd grads.
    grads = twin.forward_backward(p, cfg, ids, targets)["grads"]
    direct = torch.autograd.grad(loss_of(*inputs), inputs)
    for n, g in zip(names, direct):
        assert torch.equal(grads[n], g), n
    # An aux coefficient of 0 removes the aux term exactly.
    cfg0 = twin.Config(**dict(TINY, router_aux_loss_coef=0.0))
    out0 = twin.forward(p, cfg0, ids, targets)
    assert out0["loss"].item() == out0["ce_loss"].item()


def check_safetensors_io():
    print("(d) safetensors_io roundtrip")
    g = torch.Generator().manual_seed(8)
    ts = {
        "a.f32": torch.randn(3, 5, generator=g).float(),
        "b.f64": torch.randn(2, 1, 2, 3, generator=g),
        "c.bf16": torch.randn(7, generator=g).bfloat16(),
        "d.f16": torch.randn(3, generator=g).half(),  # 6 bytes: would misalign what follows in name order
        "e.i32": torch.randint(-1000, 1000, (4, 2), generator=g, dtype=torch.int32),
        "f.i64": torch.tensor(-(1 << 40)),  # scalar
        "g.empty": torch.zeros(0, 4),
    }
    meta = {"config": json.dumps({"x": 1}), "format": "pt"}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.safetensors")
        safetensors_io.save(path, ts, meta)
        got, got_meta = safetensors_io.load(path)
        assert got_meta == meta, got_meta
        assert sorted(got) == sorted(ts)
        for n, t in ts.items():
            assert got[n].dtype == t.dtype and got[n].shape == t.shape, (n, got[n].dtype, got[n].shape)
            assert torch.equal(got[n], t), n
        raw = open(path, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        assert n % 8 == 0
        header = json.loads(raw[8:8 + n])
        end = 0
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, f = e["data_offsets"]
            assert b % ts[name].element_size() == 0, (name, b)
            end = max(end, f)
        assert end == len(raw) - 8 - n
        # No metadata, and damaged files raise.
        safetensors_io.save(path, {"x": torch.ones(2)})
        assert safetensors_io.load(path)[1] == {}
        open(path, "wb").write(raw[:-3])
        try:
            safetensors_io.load(path)
            raise AssertionError("a truncated file loaded")
        except safetensors_io.FormatError as e:
            print(f"  truncated file rejected: {e}")
    print("  roundtrip exact for F32 F64 BF16 F16 I32 I64, scalar, empty, metadata")


def case_write(path, cfg, p32, ids, targets, *, drop=None, perturb=None, nan=None, config_json=None):
    """A case file as dump_case.cpp writes it, with the twin's own outputs standing in for flatpeak's.
    config_json: the "config" metadata (default: the twin's Config fields)."""
    ref = twin.forward_backward({n: t.double() for n, t in p32.items()}, cfg, ids, targets)
    ts = dict(p32)
    ts["input_ids"], ts["targets"] = ids.int(), targets.int()
    ts["out.logits"] = ref["logits"].detach().float()
    for n in ("loss", "ce_loss", "aux_loss"):
        ts["out." + n] = ref[n].detach().float().reshape(1)
    for n, g in ref["grads"].items():
        ts["grad." + n] = g.float()
    if perturb:
        g = ts[perturb].clone()
        i = int(g.abs().reshape(-1).argmax())
        g.view(-1)[i] *= 1.0 + 1e-3
        ts[perturb] = g
    if nan:
        ts[nan] = ts[nan].clone()
        ts[nan].view(-1)[1] = float("nan")
    if drop:
        del ts[drop]
    safetensors_io.save(path, ts, {"config": config_json or json.dumps(cfg.__dict__)})
    return ref


def run_check(path, *extra):
    r = subprocess.run([sys.executable, os.path.join(HERE, "check_case.py"), path, *extra], capture_output=True,
                       text=True)
    return r.returncode, r.stdout + r.stderr


def check_check_case():
    print("(e) check_case.py on cases made from the twin")
    cfg = twin.Config(**TINY)
    p = {n: t.float() for n, t in twin.init_params(cfg, seed=9).items()}
    ids, targets = batch(cfg, 2, 7, seed=10)
    # Note [An expert with no tokens] (as in dump_case.cpp): dimension 0 of every embedding is large
    # and positive, and the last expert's router row strongly negative there.
    p["model.embed_tokens.weight"][:, 0] += 3.0
    for i in range(cfg.num_hidden_layers):
        p[f"model.layers.{i}.mlp.gate.weight"][-1, 0] = -20.0
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "case.safetensors")
        ref = case_write(path, cfg, p, ids, targets)
        assert ref["expert_counts"][0][-1] == 0, ref["expert_counts"]
        rc, out = run_check(path)
        assert rc == 0 and "FAIL" not in out, out
        print("  clean case: exit 0")
        g = "grad.model.layers.1.self_attn.q_norm.weight"
        case_write(path, cfg, p, ids, targets, perturb=g)
        rc, out = run_check(path)
        assert rc == 1 and any(g in line and "FAIL" in line for line in out.splitlines()), out
        print("  gradient off by 1e-3 relative: exit 1, named")
        case_write(path, cfg, p, ids, targets, nan="out.logits")
        rc, out = run_check(path)
        assert rc == 1 and any(line.startswith("logits") and "FAIL" in line for line in out.splitlines()), out
        print("  NaN in logits: exit 1")
        rc, out = run_check(path, "--rtol", "1e30")
        assert rc == 1, "a NaN passed a huge tolerance:\n" + out
        g = "grad.model.layers.0.mlp.experts.3.down_proj.weight"
        case_write(path, cfg, p, ids, targets, drop=g)
        rc, out = run_check(path)
        assert rc == 1 and "missing tensor " + g in out, out
        print("  missing gradient: exit 1, named")
        for i in range(cfg.num_hidden_layers):  # undo the arrangement: every expert gets tokens
            p[f"model.layers.{i}.mlp.gate.weight"][-1, 0] = 0.0
        ref = case_write(path, cfg, p, ids, targets)
        assert all(c > 0 for counts in ref["expert_counts"] for c in counts), ref["expert_counts"]
        rc, out = run_check(path)
        assert rc == 1 and "no expert went without tokens" in out, out
        rc, out = run_check(path, "--allow-no-empty-expert")
        assert rc == 0, out
        print("  no empty expert: exit 1 (0 with --allow-no-empty-expert)")


def bf16_bits_round(x):
    """float32 x -> the nearest bf16 (ties to even) by the bit formula flatpeak uses (core/dtype.h)."""
    u = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return torch.where(u >= 1 << 31, u - (1 << 32), u).to(torch.int32).view(torch.float32)


def check_bf16_casts():
    print("(f) the bf16 twin's cast points")
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(100000, generator=g) * 10.0 ** torch.randint(-6, 6, (100000,), generator=g)).float()
    hi = x.view(torch.int32) & ~0xFFFF
    ties = torch.cat([(hi | 0x8000).view(torch.float32), (hi | 0x7FFF).view(torch.float32),
                      (hi | 0x8001).view(torch.float32)])  # exactly halfway, and one ulp of f32 either side
    for v in (x, ties):
        assert torch.equal(twin.bf16_round(v), bf16_bits_round(v)), "bf16_round is not round-to-nearest-even"
        assert torch.equal(twin.bf16_round(v.double()), bf16_bits_round(v).double())
    print(f"  bf16_round = the RNE bit formula on {x.numel() + ties.numel()} values (ties and their neighbours)")
    c = twin.BF16_CASTS
    a = torch.tensor([1.0 + 2 ** -9, 3.0], requires_grad=True)  # 1 + 2^-9: a tie, rounds to 1
    y = c.store(a)
    assert torch.equal(y, torch.tensor([1.0, 3.0]))
    (gy,) = torch.autograd.grad(y, a, torch.tensor([1.0 + 2 ** -9, 1.0 + 3 * 2 ** -9]))
    assert torch.equal(gy, torch.tensor([1.0, 1.0 + 2 ** -7])), gy  # gradients rounded: 1 + 3 2^-9 -> 1 + 2^-7
    y = c.store_grad(a)
    assert torch.equal(y, a.detach())
    (gy,) = torch.autograd.grad(y, a, torch.tensor([1.0 + 2 ** -9, 5.0]))
    assert torch.equal(gy, torch.tensor([1.0, 5.0])), gy
    # fan: round(round(round(g0) + g1) + g2), in output order (bf16's ulp is 2^-7 on [1, 2)).
    # g = (1, 2^-9, 2^-8): 1 + 2^-9 rounds to 1, 1 + 2^-8 (a tie) to even 1; one rounding of the sum,
    # 1 + 0.75 2^-7, would give 1 + 2^-7.
    u = torch.tensor([0.5], requires_grad=True)
    ones = [torch.ones(1)] * 3
    outs = c.fan(u, 3)
    (gu,) = torch.autograd.grad([outs[0] * 1.0, outs[1] * 2 ** -9, outs[2] * 2 ** -8], u, ones)
    assert torch.equal(gu, torch.tensor([1.0])), gu
    outs = c.fan(u, 2)  # (1 + 2^-9, 2^-8) gives 1; the other order 2^-8 + (1 + 2^-9) gives 1 + 2^-7
    (gu,) = torch.autograd.grad([outs[0] * (1.0 + 2 ** -9), outs[1] * 2 ** -8], u, ones[:2])
    assert torch.equal(gu, torch.tensor([1.0])), gu
    outs = c.fan(u, 2)
    (gu,) = torch.autograd.grad([outs[0] * 2 ** -8, outs[1] * (1.0 + 2 ** -9)], u, ones[:2])
    assert torch.equal(gu, torch.tensor([1.0 + 2 ** -7])), gu
    print("  store rounds the value and the gradient, store_grad the gradient, fan each partial sum in order")
    # The FlashAttention-style attention without rounding is exact attention with its exact gradient.
    B, nh, nkv, T, dqk, dv = 2, 4, 2, 9, 6, 5
    q = torch.randn(B, nh, T, dqk, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, nkv, T, dqk, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, nkv, T, dv, generator=g, dtype=torch.float64, requires_grad=True)
    dO = torch.randn(B, nh, T, dv, generator=g, dtype=torch.float64)
    for window in (None, 4):
        o = twin._Attention.apply(q, k, v, 0.37, window, False)
        want = twin.causal_softmax_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), 0.37, window)
        assert_close(f"attention window={window}", o, want, 1e-13)
        grads, grads_want = torch.autograd.grad(o, (q, k, v), dO), torch.autograd.grad(want, (q, k, v), dO)
        for name, got, ref in zip("qkv", grads, grads_want):
            assert_close(f"  d{name}", got, ref, 1e-12)
    o = twin._Attention.apply(q, k, v, 0.37, 4, True)
    assert torch.equal(o, twin.bf16_round(want.detach())), "rounded attention: o is not the rounded output"
    # The bf16 twin on bf16 weights: bf16 gradients, near the plain twin's (a sanity bound: on this tiny
    # case bf16 alone moves some by 4%), and check_case.py's bf16 mode.
    cfg = twin.Config(**TINY)
    p = {n: t.float() for n, t in twin.init_params(cfg, seed=12).items()}
    p["model.embed_tokens.weight"][:, 0] += 3.0  # Note [An expert with no tokens], as in check (e)
    for i in range(cfg.num_hidden_layers):
        p[f"model.layers.{i}.mlp.gate.weight"][-1, 0] = -20.0
    p = {n: twin.bf16_round(t) for n, t in p.items()}
    ids, targets = batch(cfg, 2, 7, seed=13)
    ref = twin.forward_backward({n: t.double() for n, t in p.items()}, cfg, ids, targets, twin.BF16_CASTS)
    plain = twin.forward_backward({n: t.double() for n, t in p.items()}, cfg, ids, targets)
    assert ref["expert_counts"] == plain["expert_counts"]
    for n, gr in ref["grads"].items():
        assert torch.equal(gr, twin.bf16_round(gr)), n
        err = (gr.double() - plain["grads"][n]).norm() / max(plain["grads"][n].norm(), 1e-30)
        assert err < 0.1, (n, err)
    assert abs(ref["loss"].item() - plain["loss"].item()) < 5e-3 * abs(plain["loss"].item())
    print("  bf16 twin: bf16 gradients within 0.1 of the plain twin's, loss within 5e-3")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "case.safetensors")

        def write(perturb=None, unrounded=False):
            ts = {n: t.clone() for n, t in p.items()}
            if unrounded:
                ts["model.norm.weight"] += 2 ** -12
            ts["input_ids"], ts["targets"] = ids.int(), targets.int()
            ts["out.logits"] = ref["logits"].detach().float()
            for n in ("loss", "ce_loss", "aux_loss"):
                ts["out." + n] = ref[n].detach().float().reshape(1)
            for n, gr in ref["grads"].items():
                ts["grad." + n] = gr.float() * (1.1 if n == perturb else 1.0)
            safetensors_io.save(path, ts, {"config": json.dumps(cfg.__dict__), "precision": "bf16"})

        write()
        rc, out = run_check(path)
        assert rc == 0 and "FAIL" not in out and "bf16 twin in float64" in out, out
        print("  bf16 case from the bf16 twin: exit 0")
        gname = "model.layers.1.self_attn.k_proj.weight"
        write(perturb=gname)
        rc, out = run_check(path)
        assert rc == 1 and any(gname in line and "FAIL" in line for line in out.splitlines()), out
        print("  a gradient 10% off: exit 1, named")
        write(unrounded=True)
        rc, out = run_check(path)
        assert rc == 1 and "not bf16 values" in out, out
        print("  weights that are not bf16 values: exit 1")


def gptoss_config(**over):
    """The twin's Config of GPTOSS (with `over`), read through Config.from_dict as check_case.py reads a
    case's config.json; returns (cfg, the JSON)."""
    text = json.dumps(dict(GPTOSS, **over))
    return twin.Config.from_dict(json.loads(text)), text


def check_gptoss_config():
    print("(g) gpt_oss: Config.from_dict of transformers' spelling")
    cfg, _ = gptoss_config()
    assert (cfg.num_experts, cfg.moe_intermediate_size, cfg.head_dim) == (5, 7, 6), cfg
    assert cfg.layer_types == ["sliding_attention", "full_attention"], cfg.layer_types
    assert [cfg.layer_window(i) for i in range(2)] == [3, None]
    assert cfg.rope_theta == 500.0 and cfg.rope_scaling["rope_type"] == "default" and cfg.attention_bias
    assert cfg.is_sparse(0) and cfg.is_sparse(1)
    # Absent keys take GptOssConfig's defaults: biases, theta 150000, the YaRN rope_parameters, SwiGLU 1.702 / 7.
    bare = {k: v for k, v in GPTOSS.items() if k not in ("rope_parameters", "swiglu_alpha", "swiglu_limit",
                                                          "rms_norm_eps")}
    d = twin.Config.from_dict(bare)
    assert d.rope_theta == 150000.0 and d.rope_scaling["rope_type"] == "yarn" and d.rope_scaling["factor"] == 32.0
    assert d.rope_scaling["truncate"] is False and d.rope_scaling["original_max_position_embeddings"] == 4096
    assert (d.swiglu_alpha, d.swiglu_limit, d.rms_norm_eps, d.attention_bias) == (1.702, 7.0, 1e-5, True)
    # rope_scaling (4.x) wins over rope_parameters; the top-level rope_theta is read when the dict has none.
    y = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "truncate": False}
    d = twin.Config.from_dict(dict(bare, rope_scaling=y, rope_theta=1000.0, layer_types=["full_attention"] * 2))
    assert d.rope_theta == 1000.0 and d.rope_scaling["factor"] == 4.0 and d.layer_window(0) is None
    # The twin's own fields read back as they are (what case_write's default metadata holds).
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "num_experts", "num_experts_per_tok", "moe_intermediate_size", "vocab_size", "model_type")
    for c in (cfg, d, twin.Config(**{k: getattr(cfg, k) for k in keys})):  # the last: default RoPE, rope_scaling None
        assert twin.Config.from_dict(json.loads(json.dumps(c.__dict__))) == c, c
    for bad in (dict(GPTOSS, num_experts=4), dict(GPTOSS, moe_intermediate_size=3)):
        try:
            twin.Config.from_dict(bad)
            raise AssertionError(f"a disagreeing config was read: {bad}")
        except ValueError:
            pass
    print("  experts, widths, layer types, windows, RoPE and defaults as GptOssConfig reads them")


def sink_attention_naive(q, k, v, scale, window, sinks):
    """q (B, nh, T, d), k, v (B, nkv, T, d) -> o (B, nh, T, dv) and the sink's probability (B, nh, T, 1),
    by per-row loops."""
    B, nh, T, _ = q.shape
    rep = nh // k.shape[1]
    o = torch.zeros(B, nh, T, v.shape[-1])
    ps = torch.zeros(B, nh, T, 1)
    for b in range(B):
        for h in range(nh):
            for t in range(T):
                keys = visible_keys(t, window)
                scores = [float(q[b, h, t] @ k[b, h // rep, s]) * scale for s in keys]
                P, ps[b, h, t, 0] = softmax_row(scores, float(sinks[h]), with_sink=True)
                o[b, h, t] = sum(w * v[b, h // rep, s] for w, s in zip(P, keys))
    return o, ps


def check_gptoss_attention():
    print("(g) gpt_oss attention: per-row loops with sinks and windows; _Attention with sinks")
    cfg, _ = gptoss_config()
    p = twin.init_params(cfg, seed=21)
    x = torch.randn(2, 9, cfg.hidden_size, generator=torch.Generator().manual_seed(22))
    for layer in range(cfg.num_hidden_layers):
        assert_close(f"attention layer {layer} (window {cfg.layer_window(layer)})", twin.attention(x, p, layer, cfg),
                     attention_naive_gptoss(x, p, layer, cfg))
    # The attention kernel with sinks: forward against the loop, gradcheck of q, k, v and the sinks.
    g = torch.Generator().manual_seed(23)
    B, nh, nkv, T, d = 2, 4, 2, 7, 3
    mk = lambda *shape: torch.randn(*shape, generator=g, requires_grad=True)  # noqa: E731
    q, k, v, sinks = mk(B, nh, T, d), mk(B, nkv, T, d), mk(B, nkv, T, d), mk(nh)
    for window in (None, 3):
        o = twin._Attention.apply(q, k, v, 0.41, window, False, sinks)
        want, _ = sink_attention_naive(q.detach(), k.detach(), v.detach(), 0.41, window, sinks.detach())
        assert_close(f"_Attention with sinks, window {window}", o, want, 1e-13)
        assert torch.autograd.gradcheck(lambda *a: twin._Attention.apply(a[0], a[1], a[2], 0.41, window, False, a[3]),
                                        (q, k, v, sinks), eps=1e-6, atol=1e-8, rtol=1e-6)
        print(f"  gradcheck of _Attention (q, k, v, sinks), window {window}: passed")
    # Rounded: o the rounded exact output; d sink = -sum_(b,i) exp(sink - lse') rowsum(round(dO) round(o)).
    dO = torch.randn(B, nh, T, d, generator=g)
    o = twin._Attention.apply(q, k, v, 0.41, 3, True, sinks)
    want, ps = sink_attention_naive(q.detach(), k.detach(), v.detach(), 0.41, 3, sinks.detach())
    assert torch.equal(o, twin.bf16_round(o)) and (o - want).abs().max() <= 2 ** -8 * want.abs().max()
    (dsinks,) = torch.autograd.grad(o, sinks, dO)
    D = (twin.bf16_round(dO) * o.detach()).sum(-1, keepdim=True)
    assert_close("rounded _Attention: d sinks", dsinks, -(ps * D).sum(dim=(0, 2, 3)), 1e-12)


def check_clamped_swiglu():
    print("(g) gpt_oss clamped SwiGLU: elementwise formula, gradcheck, zero gradient under a clamp")
    alpha, limit = 1.702, 0.6
    gen = torch.Generator().manual_seed(24)
    a = 3.0 * torch.randn(400, generator=gen)
    c = 3.0 * torch.randn(400, generator=gen)
    a[:3] = torch.tensor([limit, -limit, 0.0])  # on the kinks: torch.clamp's gradient passes there
    c[:3] = torch.tensor([limit, -limit, limit])
    act = twin.clamped_swiglu(a, c, alpha, limit)
    want = torch.tensor([clamped_swiglu_naive(x, y, alpha, limit) for x, y in zip(a.tolist(), c.tolist())])
    assert_close("clamped_swiglu against the formula", act, want, 1e-14)
    g_on, u_on = a > limit, c.abs() > limit
    assert g_on.sum() > 20 and u_on.sum() > 20 and (~g_on).sum() > 20 and (~u_on).sum() > 20
    ga, gc = a.clone().requires_grad_(True), c.clone().requires_grad_(True)
    w = torch.randn(400, generator=gen)
    da, dc = torch.autograd.grad((twin.clamped_swiglu(ga, gc, alpha, limit) * w).sum(), (ga, gc))
    assert torch.all(da[g_on] == 0) and torch.all(dc[u_on] == 0), "a gradient through an active clamp"
    # Elsewhere the derivative of the formula: d/dg = (u + 1)(s + alpha g s (1 - s)), d/du = g s.
    gc_, uc_ = a.clamp(max=limit), c.clamp(-limit, limit)
    sg = torch.sigmoid(alpha * gc_)
    assert_close("d act / d gate (unclamped)", da[~g_on], (w * (uc_ + 1) * (sg + alpha * gc_ * sg * (1 - sg)))[~g_on])
    assert_close("d act / d up (unclamped)", dc[~u_on], (w * gc_ * sg)[~u_on])
    # gradcheck away from the kinks (central differences straddle none there), both clamps active.
    away = ((a - limit).abs() > 1e-3) & ((c.abs() - limit).abs() > 1e-3)
    assert torch.autograd.gradcheck(lambda x, y: twin.clamped_swiglu(x, y, alpha, limit),
                                    (a[away].clone().requires_grad_(True), c[away].clone().requires_grad_(True)),
                                    eps=1e-6, atol=1e-9, rtol=1e-7)
    print(f"  gradcheck passed on {int(away.sum())} points ({int(g_on.sum())} gate and {int(u_on.sum())} up clamped)")


def check_gptoss_conversion():
    print("(g) gpt_oss: gptoss_flat_to_hf / gptoss_hf_to_flat")
    cfg, _ = gptoss_config()
    flat = twin.init_params(cfg, seed=25)
    assert all(flat[n].abs().min() > 0 for n in flat if n.endswith(".bias") or n.endswith(".sinks"))
    hf = twin.gptoss_flat_to_hf(flat, cfg)
    E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}.mlp.experts."
        assert not any(n.startswith(pre + "0.") for n in hf)
        gu, gub, dp, dpb = (hf[pre + n] for n in twin.GPTOSS_FUSED)
        assert (gu.shape, gub.shape, dp.shape, dpb.shape) == ((E, H, 2 * I), (E, 2 * I), (E, I, H), (E, H))
        for e in range(E):
            f = lambda n: flat[f"{pre}{e}.{n}"]  # noqa: E731
            for j in range(I):  # column 2j is gate's row j, column 2j + 1 up's
                assert torch.equal(gu[e, :, 2 * j], f("gate_proj.weight")[j]), (i, e, j)
                assert torch.equal(gu[e, :, 2 * j + 1], f("up_proj.weight")[j]), (i, e, j)
                assert gub[e, 2 * j] == f("gate_proj.bias")[j] and gub[e, 2 * j + 1] == f("up_proj.bias")[j]
                assert torch.equal(dp[e, j, :], f("down_proj.weight")[:, j])
            assert torch.equal(dpb[e], f("down_proj.bias"))
    assert sorted(n for n in hf if ".experts." not in n) == sorted(n for n in flat if ".experts." not in n)
    back = twin.gptoss_hf_to_flat(hf, cfg)
    assert list(back) == list(twin.param_shapes(cfg)), "names or order differ from param_shapes"
    assert all(torch.equal(back[n], flat[n]) for n in flat)
    print("  the fused layout element by element (gate even columns, up odd), and the round trip exact")


def gptoss_params(cfg, seed, empty_expert=True):
    p = twin.init_params(cfg, seed=seed)
    if empty_expert:  # the last expert's router bias far below: it gets no tokens
        for i in range(cfg.num_hidden_layers):
            p[f"model.layers.{i}.mlp.router.bias"][-1] = -30.0
    return p


def check_gptoss_moe_and_forward():
    print("(g) gpt_oss MoE vs a per-token loop; whole forward vs the loop version; gradcheck")
    cfg, _ = gptoss_config()
    p = gptoss_params(cfg, seed=26, empty_expert=False)
    x = torch.randn(2, 9, cfg.hidden_size, generator=torch.Generator().manual_seed(27))
    stats = {"gate": 0, "up": 0, "n": 0}
    for layer in range(cfg.num_hidden_layers):
        out, logits, counts, _ = twin.moe(x, p, layer, cfg)
        out_n, logits_n, counts_n = moe_naive_gptoss(x, p, layer, cfg, stats)
        assert counts == counts_n, f"tokens per expert {counts} vs {counts_n}"
        assert_close(f"moe layer {layer}", out, out_n)
        assert_close(f"router logits layer {layer}", logits, logits_n)
    assert 0 < stats["gate"] < stats["n"] and 0 < stats["up"] < stats["n"], stats
    print(f"  clamps active on {stats['gate']} gate and {stats['up']} up values of {stats['n']}")
    ids, targets = batch(cfg, 2, 9, seed=28)
    ref = twin.forward(p, cfg, ids, targets)
    logits, ce, aux, loss = forward_naive(p, cfg, ids, targets)
    assert_close("logits", ref["logits"], logits, 1e-10)
    assert_close("ce_loss", ref["ce_loss"], torch.tensor(ce), 1e-10)
    assert_close("aux_loss", ref["aux_loss"], torch.tensor(aux), 1e-10)
    assert_close("loss", ref["loss"], torch.tensor(loss), 1e-10)
    # gradcheck of the whole loss (T = 5 is longer than layer 0's window of 3).
    ids, targets = batch(cfg, 2, 5, seed=29)
    names = ["model.layers.0.self_attn.sinks", "model.layers.1.self_attn.sinks", "model.layers.0.self_attn.q_proj.bias",
             "model.layers.1.self_attn.k_proj.bias", "model.layers.0.self_attn.v_proj.bias",
             "model.layers.1.self_attn.o_proj.bias", "model.layers.0.self_attn.k_proj.weight",
             "model.layers.0.mlp.router.weight", "model.layers.1.mlp.router.bias",
             "model.layers.0.mlp.experts.1.gate_proj.bias", "model.layers.1.mlp.experts.2.up_proj.bias",
             "model.layers.0.mlp.experts.3.down_proj.bias", "model.layers.1.mlp.experts.0.gate_proj.weight",
             "model.layers.0.post_attention_layernorm.weight", "model.embed_tokens.weight"]

    def loss_of(*ws):
        q = dict(p)
        q.update(zip(names, ws))
        return twin.forward(q, cfg, ids, targets)["loss"]

    inputs = tuple(p[n].clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(loss_of, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)
    print(f"  gradcheck passed for {len(names)} parameters")


def check_gptoss_bf16_and_cases():
    print("(g) gpt_oss: the bf16 twin; check_case.py on gpt_oss cases")
    cfg, text = gptoss_config()
    p32 = {n: t.float() for n, t in gptoss_params(cfg, seed=30).items()}
    ids, targets = batch(cfg, 2, 7, seed=31)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "case.safetensors")
        ref = case_write(path, cfg, p32, ids, targets, config_json=text)
        assert all(counts[-1] == 0 for counts in ref["expert_counts"]), ref["expert_counts"]
        rc, out = run_check(path)
        assert rc == 0 and "FAIL" not in out and "type=gpt_oss" in out, out
        print("  fp32 case: exit 0")
        gname = "grad.model.layers.1.self_attn.sinks"
        case_write(path, cfg, p32, ids, targets, perturb=gname, config_json=text)
        rc, out = run_check(path)
        assert rc == 1 and any(gname in line and "FAIL" in line for line in out.splitlines()), out
        print("  a sink gradient off by 1e-3 relative: exit 1, named")
    # bf16: bf16 weights, the bf16 twin's gradients bf16 values near the plain twin's.
    p = {n: twin.bf16_round(t) for n, t in p32.items()}
    ref = twin.forward_backward({n: t.double() for n, t in p.items()}, cfg, ids, targets, twin.BF16_CASTS)
    plain = twin.forward_backward({n: t.double() for n, t in p.items()}, cfg, ids, targets)
    assert ref["expert_counts"] == plain["expert_counts"]
    for n, gr in ref["grads"].items():
        assert torch.equal(gr, twin.bf16_round(gr)), n
        err = (gr.double() - plain["grads"][n]).norm() / max(plain["grads"][n].norm(), 1e-30)
        assert err < 0.1, (n, err)
    assert abs(ref["loss"].item() - plain["loss"].item()) < 5e-3 * abs(plain["loss"].item())
    print("  bf16 twin: bf16 gradients within 0.1 of the plain twin's, loss within 5e-3")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "case.safetensors")

        def write(perturb=None):
            ts = {n: t.clone() for n, t in p.items()}
            ts["input_ids"], ts["targets"] = ids.int(), targets.int()
            ts["out.logits"] = ref["logits"].detach().float()
            for n in ("loss", "ce_loss", "aux_loss"):
                ts["out." + n] = ref[n].detach().float().reshape(1)
            for n, gr in ref["grads"].items():
                ts["grad." + n] = gr.float() * (1.1 if n == perturb else 1.0)
            safetensors_io.save(path, ts, {"config": text, "precision": "bf16"})

        write()
        rc, out = run_check(path)
        assert rc == 0 and "FAIL" not in out and "bf16 twin in float64" in out, out
        print("  bf16 case from the bf16 twin: exit 0")
        gname = "model.layers.0.mlp.experts.1.up_proj.bias"
        write(perturb=gname)
        rc, out = run_check(path)
        assert rc == 1 and any(gname in line and "FAIL" in line for line in out.splitlines()), out
        print("  an expert bias gradient 10% off: exit 1, named")


def main():
    checks = [check_attention, check_moe_and_forward, check_gradcheck, check_safetensors_io, check_check_case,
              check_bf16_casts, check_gptoss_config, check_gptoss_attention, check_clamped_swiglu,
              check_gptoss_conversion, check_gptoss_moe_and_forward, check_gptoss_bf16_and_cases]
    failed = []
    for c in checks:
        try:
            c()
        except Exception as e:  # report every failing check, not only the first
            import traceback
            traceback.print_exc()
            failed.append(c.__name__)
    if failed:
        print(f"FAILED: {failed}")
        return 1
    print(f"all {len(checks)} twin self-checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
