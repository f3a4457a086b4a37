"""The twin's gpt_oss (qwen3_moe_twin.py) against transformers' own GptOssForCausalLM, in float64.

    /work/main/.venv-interop/bin/python tests/reference/gptoss_twin_vs_transformers.py [--tol 1e-10]

Optional, not part of the test suite: it needs PyTorch 2.x and transformers 5.x (.venv-interop; written
against transformers 5.25). A tiny GptOssConfig (3 layers, sliding and full attention with a window of 8
shorter than the T = 40 tokens, GQA 4/2 heads, 4 experts top-2, YaRN with factor 8 and truncate false,
swiglu_limit 0.5 so that both clamps are active) with random weights, nonzero biases and sinks;
transformers runs it with eager attention and the eager experts loop (the code of modeling_gpt_oss.py),
labels and output_router_logits=True; the twin (plain casts) runs on gptoss_hf_to_flat of the same
weights with the labels' shifted targets. Compared, max-relative per tensor (max|a - b| / max|b|):
logits, every layer's router logits, loss, aux loss, and every parameter gradient (the twin's mapped
back by gptoss_flat_to_hf). Also: Config.from_dict against GptOssConfig on several config.json
spellings (rope_parameters, legacy rope_scaling + rope_theta, nothing: the YaRN default), the RoPE
frequencies and attention factor against transformers' YaRN, and the hf <-> flat round trip.

Note [transformers' float32 islands]: transformers computes some things in float32 whatever the model's
dtype: GptOssRMSNorm (hidden_states.to(torch.float32)), the RoPE frequencies and cos/sin tables
(dtype=torch.float, .float()), ForCausalLMLoss (logits.float()) and load_balancing_loss_func's
accumulators. In a float64 model these are downcasts that hold results to ~1e-7. float32_as_float64()
runs transformers' own code with those names read as float64 (the modules' `torch` a view of torch whose
float32 / float are float64, and Tensor.float() widening to float64); every operation is otherwise
transformers'. The run without it is reported too (its differences are float32's, ~1e-7).
"""
import argparse
import contextlib
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import qwen3_moe_twin as twin  # noqa: E402

import transformers  # noqa: E402
import transformers.loss.loss_utils as loss_utils  # noqa: E402
import transformers.modeling_rope_utils as rope_utils  # noqa: E402
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

CONFIG = dict(model_type="gpt_oss", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
              vocab_size=128, sliding_window=8, max_position_embeddings=32768, rms_norm_eps=1e-5,
              router_aux_loss_coef=0.05, swiglu_alpha=1.702, swiglu_limit=0.5, attention_bias=True,
              tie_word_embeddings=False,
              rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0, "beta_slow": 1.0,
                               "truncate": False, "original_max_position_embeddings": 4096, "rope_theta": 150000.0})
B, T = 2, 40


class _Float64Torch:
    """torch, with the names float32 and float read as float64 (Note [transformers' float32 islands])."""
    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def float32_as_float64():
    mods = (modeling_gpt_oss, rope_utils, loss_utils)
    saved = [m.torch for m in mods]
    tensor_float = torch.Tensor.float
    for m in mods:
        m.torch = _Float64Torch()
    torch.Tensor.float = lambda self, memory_format=torch.preserve_format: self.to(torch.float64,
                                                                                    memory_format=memory_format)
    try:
        yield
    finally:
        for m, t in zip(mods, saved):
            m.torch = t
        torch.Tensor.float = tensor_float


def max_rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-300)


def hf_config(d):
    return GptOssConfig(**dict(d), attn_implementation="eager", experts_implementation="eager")


def random_hf_weights(model, seed):
    """Random values for every parameter of a GptOssForCausalLM, by name: matrices ~ N(0, 1/fan_in),
    norm weights near 1, biases, the router bias and the sinks ~ N(0, 0.5^2)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, prm in model.named_parameters():
        shape = tuple(prm.shape)
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            out[name] = 1.0 + 0.2 * r
        elif name.endswith("bias") or name.endswith("sinks"):
            out[name] = 0.5 * r
        elif name == "model.embed_tokens.weight":
            out[name] = r
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            out[name] = r / shape[1] ** 0.5  # (E, in, out)
        else:
            out[name] = r / shape[1] ** 0.5  # nn.Linear (out, in)
    return out


def check_config_reading():
    """Config.from_dict against GptOssConfig: the RoPE (theta, scaling, frequencies, attention factor),
    layer types, window, experts, widths, SwiGLU constants, on several spellings of config.json."""
    print("Config.from_dict against GptOssConfig")
    base = {k: v for k, v in CONFIG.items() if k != "rope_parameters"}
    yarn = {k: v for k, v in CONFIG["rope_parameters"].items() if k != "rope_theta"}
    variants = {
        "rope_parameters with rope_theta": dict(base, rope_parameters=dict(CONFIG["rope_parameters"])),
        "rope_parameters without rope_theta": dict(base, rope_parameters=dict(yarn)),
        "rope_scaling + rope_theta (4.x)": dict(base, rope_scaling=dict(yarn), rope_theta=50000.0),
        "no RoPE keys (the YaRN default)": {k: v for k, v in base.items() if k != "max_position_embeddings"},
        "rope_parameters null, rope_theta": dict(base, rope_parameters=None, rope_theta=20000.0,
                                                 max_position_embeddings=131072),
        "default RoPE": dict(base, rope_parameters={"rope_type": "default", "rope_theta": 30000.0}),
        # model_config_hf_json's spelling: rope_theta and rope_scaling (null for the default RoPE, which
        # transformers reads as its YaRN default), max_position_embeddings 2^20, the experts twice named.
        "rope_scaling null + rope_theta (YaRN default)": dict(base, rope_scaling=None, rope_theta=40000.0,
                                                              max_position_embeddings=1 << 20),
        "flatpeak's yarn spelling": dict(base, rope_theta=150000.0, max_position_embeddings=1 << 20,
                                         layer_types=["sliding_attention"] * 3, num_experts=4,
                                         rope_scaling={"rope_type": "yarn", "factor": 8.0,
                                                       "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                                       "beta_slow": 1.0, "truncate": False}),
        "layer_types given, no head_dim (64)": dict({k: v for k, v in base.items() if k != "head_dim"},
                                                    layer_types=["full_attention", "sliding_attention",
                                                                 "full_attention"]),
        "defaults": {"model_type": "gpt_oss", "num_hidden_layers": 2},
    }
    for what, d in variants.items():
        with float32_as_float64():
            hf = hf_config(json.loads(json.dumps(d)))
            rope = modeling_gpt_oss.GptOssRotaryEmbedding(hf)
        for src, dd in (("dict", d), ("to_dict()", hf.to_dict())):
            cfg = twin.Config.from_dict(json.loads(json.dumps(dd)))
            assert cfg.model_type == "gpt_oss"
            for mine, theirs in ((cfg.hidden_size, hf.hidden_size), (cfg.num_hidden_layers, hf.num_hidden_layers),
                                 (cfg.num_attention_heads, hf.num_attention_heads),
                                 (cfg.num_key_value_heads, hf.num_key_value_heads), (cfg.head_dim, hf.head_dim),
                                 (cfg.num_experts, hf.num_local_experts),
                                 (cfg.num_experts_per_tok, hf.num_experts_per_tok),
                                 (cfg.moe_intermediate_size, hf.intermediate_size), (cfg.vocab_size, hf.vocab_size),
                                 (cfg.rms_norm_eps, hf.rms_norm_eps), (cfg.swiglu_alpha, hf.swiglu_alpha),
                                 (cfg.swiglu_limit, hf.swiglu_limit), (cfg.attention_bias, hf.attention_bias),
                                 (cfg.tie_word_embeddings, hf.tie_word_embeddings),
                                 (cfg.router_aux_loss_coef, hf.router_aux_loss_coef),
                                 (cfg.rope_theta, hf.rope_parameters["rope_theta"])):
                assert mine == theirs, (what, src, mine, theirs)
            windows = [cfg.layer_window(i) for i in range(cfg.num_hidden_layers)]
            want = [hf.sliding_window if t == "sliding_attention" else None for t in hf.layer_types]
            assert windows == want, (what, src, windows, want)
            inv, att = twin.rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
            err = max_rel(inv, rope.inv_freq)
            assert rope.inv_freq.dtype == torch.float64 and err < 1e-14, (what, src, err)
            assert abs(att - rope.attention_scaling) < 1e-15, (what, src, att, rope.attention_scaling)
        print(f"  {what}: rope {hf.rope_parameters['rope_type']} theta {hf.rope_parameters['rope_theta']:g} "
              f"factor {hf.rope_parameters.get('factor')}; inv_freq max-rel {err:.1e}, attention factor {att:.6f}; "
              f"windows {windows}")


def run_transformers(hf_weights, ids, labels, wide):
    """GptOssForCausalLM in float64 on hf_weights; wide: under float32_as_float64(). Returns (outputs,
    grads by name, clamp statistics)."""
    stats = {"gate": 0, "up": 0, "n": 0}
    apply_gate = modeling_gpt_oss.GptOssExperts._apply_gate

    def counting(self, gate_up):
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        stats["gate"] += int((gate > self.limit).sum())
        stats["up"] += int((up.abs() > self.limit).sum())
        stats["n"] += gate.numel()
        return apply_gate(self, gate_up)

    ctx = float32_as_float64() if wide else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(0)
        model = GptOssForCausalLM(hf_config(CONFIG)).to(torch.float64)
        assert model.config._attn_implementation == "eager", model.config._attn_implementation
        assert model.config._experts_implementation == "eager", model.config._experts_implementation
        with torch.no_grad():
            params = dict(model.named_parameters())
            assert sorted(params) == sorted(hf_weights), sorted(set(params) ^ set(hf_weights))
            for n, t in hf_weights.items():
                params[n].copy_(t)
        modeling_gpt_oss.GptOssExperts._apply_gate = counting
        try:
            out = model(input_ids=ids, labels=labels, output_router_logits=True)
            out.loss.backward()
        finally:
            modeling_gpt_oss.GptOssExperts._apply_gate = apply_gate
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out, grads, stats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tol", type=float, default=1e-10, help="max-relative tolerance per tensor")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    check_config_reading()

    cfg = twin.Config.from_dict(json.loads(json.dumps(CONFIG)))
    print(f"twin config: layer windows {[cfg.layer_window(i) for i in range(cfg.num_hidden_layers)]}, "
          f"rope {cfg.rope_scaling}, E={cfg.num_experts} k={cfg.num_experts_per_tok} I={cfg.moe_intermediate_size}")
    shell = GptOssForCausalLM(hf_config(CONFIG))
    hf_weights = random_hf_weights(shell, seed=1)
    del shell
    flat = twin.gptoss_hf_to_flat(hf_weights, cfg)
    assert list(flat) == list(twin.param_shapes(cfg)), "gptoss_hf_to_flat's names are not param_shapes'"
    for n, shape in twin.param_shapes(cfg).items():
        assert tuple(flat[n].shape) == shape, (n, tuple(flat[n].shape), shape)
    back = twin.gptoss_flat_to_hf(flat, cfg)
    assert sorted(back) == sorted(hf_weights) and all(torch.equal(back[n], hf_weights[n]) for n in hf_weights)
    print("hf -> flat -> hf: exact")

    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    labels = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    labels[0, 5] = labels[1, 17] = labels[1, 30] = twin.IGNORE_INDEX
    # ForCausalLMLoss shifts: position t predicts labels[t + 1]; the last position predicts nothing.
    targets = torch.full_like(labels, twin.IGNORE_INDEX)
    targets[:, :-1] = labels[:, 1:]

    ref = twin.forward_backward(flat, cfg, ids, targets)
    twin_grads = twin.gptoss_flat_to_hf(ref["grads"], cfg)
    print(f"twin: loss {ref['loss'].item():.12f} (ce {ref['ce_loss'].item():.12f}, aux {ref['aux_loss'].item():.12f}),"
          f" tokens per expert {ref['expert_counts']}")

    failures = []
    for wide in (True, False):
        out, grads, stats = run_transformers(hf_weights, ids, labels, wide)
        assert stats["gate"] > 0 and stats["up"] > 0 and stats["gate"] < stats["n"] and stats["up"] < stats["n"], stats
        rows = [("logits", max_rel(ref["logits"], out.logits)), ("loss", max_rel(ref["loss"], out.loss)),
                ("aux_loss", max_rel(ref["aux_loss"], out.aux_loss))]
        assert len(out.router_logits) == cfg.num_hidden_layers
        for i, rl in enumerate(out.router_logits):
            rows.append((f"router_logits.{i}", max_rel(ref["router_logits"][i], rl)))
        assert sorted(twin_grads) == sorted(grads), sorted(set(twin_grads) ^ set(grads))
        for n in grads:
            rows.append(("grad." + n, max_rel(twin_grads[n], grads[n])))
        worst = max(rows, key=lambda r: r[1])
        if wide:
            print(f"transformers with float32 read as float64 (Note [transformers' float32 islands]); clamps active "
                  f"on {stats['gate']} gate and {stats['up']} up values of {stats['n']}; loss {out.loss.item():.12f}")
            width = max(len(r[0]) for r in rows)
            for name, err in rows:
                ok = err <= args.tol
                print(f"  {name:<{width}}  {err:9.2e}  {'OK' if ok else 'FAIL'}")
                if not ok:
                    failures.append(name)
            print(f"  {len(rows) - len(failures)}/{len(rows)} within {args.tol:g}; worst {worst[0]} {worst[1]:.2e}")
        else:
            print(f"transformers as shipped (float32 islands): worst {worst[0]} {worst[1]:.2e} (float32's rounding)")
            if worst[1] > 1e-4:
                failures.append(f"as shipped: {worst[0]} {worst[1]:.2e}")
    if failures:
        print(f"FAIL: {failures}")
        return 1
    print("PASS: the twin's gpt_oss is transformers' GptOssForCausalLM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
