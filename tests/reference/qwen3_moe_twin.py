"""An independent, plain PyTorch twin of Qwen3-MoE (Hugging Face Qwen3MoeForCausalLM), DeepSeek-V3
(DeepseekV3ForCausalLM) and gpt-oss (GptOssForCausalLM), written to check flatpeak's model: logits, losses
and every parameter gradient.
Beside the plain Qwen3-MoE layer it computes attention biases, a sliding window (transformers 5.x: on
every layer, key j visible to query i iff i - sliding_window < j <= i), tied embeddings and dense layers
(mlp_only_layers, decoder_sparse_step). model_type "deepseek_v3" follows
transformers/models/deepseek_v3/modeling_deepseek_v3.py: multi-head latent attention (with or without
the query latent, interleaved or rotate-half RoPE on the shared key), the sigmoid router with
e_score_correction_bias for the choice only, group-limited top-k and routed_scaling_factor, shared
experts, and dense first layers (first_k_dense_replace); it has no load-balancing loss. model_type
"gpt_oss" follows transformers/models/gpt_oss/modeling_gpt_oss.py (transformers 5.25): GQA with biases and
no q/k norm, a learned sink logit per head joining every softmax (probability mass without a value), per
layer a sliding window or full attention (layer_types), YaRN RoPE (rope_theta 150000), a router with a
bias (top-k of the logits, softmax over the k chosen), experts with biases and the clamped SwiGLU
(clamped_swiglu), every layer a MoE layer. Its parameters go by per-expert names (param_shapes);
gptoss_hf_to_flat / gptoss_flat_to_hf convert from / to transformers' fused expert tensors.

Dimensions: B batch, T sequence, H hidden_size, L layers, nh query heads, nkv key/value heads,
hd head_dim, E experts, k experts per token, I moe_intermediate_size, Id intermediate_size (dense
layers), V vocab_size, N = B*T tokens.

It follows the Hugging Face code path (transformers/models/qwen3_moe/modeling_qwen3_moe.py) with
two deliberate differences: everything is computed in the dtype of the parameters passed in (the
checks use float64), and targets are given explicitly per position (no shift inside; -100 is
ignored). Gradients come from autograd.

bf16: forward(..., casts=BF16_CASTS) is the twin of flatpeak's bf16 recipe, the same arithmetic with
flatpeak's cast points (Note [The bf16 twin's cast points]); the default, NO_CASTS, is the plain twin
above, operation for operation.
"""
import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


# --- bf16 cast points --------------------------------------------------------------------------------
#
# Note [The bf16 twin's cast points]
# flatpeak's bf16 recipe (src/core/precision.h) stores weights, activations, activation gradients and
# weight gradients in bf16, and router tensors, logits, the loss and statistics (RMSNorm rstd, attention
# lse) in f32; every kernel widens its bf16 operands, computes in f32 and rounds each element it stores
# once (to nearest even). The bf16 twin is the plain twin computed in float64 (or float32) on the same
# (bf16) weights, with a rounding wherever flatpeak stores into a bf16 buffer, forward and backward:
#   store(x)       a tensor a kernel writes into an activations buffer: x rounded, and its gradient rounded
#                  (flatpeak stores the gradient of every activation in bf16 too). An in-place kernel
#                  (bias_add, RoPE, add_inplace, the residual GEMM with beta = 1) is one more store.
#   store_grad(x)  x unchanged, its gradient rounded: a gradient flatpeak stores where the value is not
#                  stored again (an RMSNorm's input gradient before add_inplace joins it to the residual's;
#                  the tied lm_head's share of the embedding gradient before the embedding's is added).
#   fan(x, n)      n uses of x whose gradients flatpeak accumulates into one bf16 buffer one kernel at a
#                  time (GEMMs with beta = 1, add_2d per head, the MoE scatter-add then the router GEMM):
#                  round(round(round(g_0) + g_1) + ...), in the order of the uses given.
#   attention      the FlashAttention-style kernel: o rounded once; backward from the rounded dO, with
#                  D = rowsum(dO * o) of the STORED (rounded) o, as backend/cpu/kernels/attention_block.cpp does; dq,
#                  dk, dv summed in full precision and rounded by the stores of q, k, v. gpt_oss's sinks
#                  join the softmax (P = exp(s - lse'), lse' = logsumexp([scores, sink_h])); the sink's
#                  gradient -sum_(b,i) exp(sink_h - lse') D is summed in full precision (weight_grad
#                  rounds it).
#   weight_grad    every weight gradient rounded once at the end: each is written by one kernel call
#                  into a zeroed bf16 buffer (one GEMM, one rmsnorm dw or one bias column sum per
#                  parameter, the unchunked MoE), except the tied embedding (store_grad above).
# What stays unrounded: the router logits, probabilities and top-k weights and their gradients (f32),
# the logits, log-softmax and loss, and everything inside one kernel (silu(g) before the product with
# u, the softmax probabilities, the GEMM sums). NO_CASTS makes every one of these the identity, so the
# plain twin's operations (and results, bit for bit) are unchanged.
# gpt_oss adds biases, each added in place (one more store): q = store(store(x W_q^T) + b_q) as for
# Qwen3 with attention_bias, and in an expert g = store(store(x W_g^T) + b_g), u likewise, the clamped
# SwiGLU act = store(clamped_swiglu(g, u)) (the clamps and the sigmoid inside its kernel), y =
# store(store(act W_d^T) + b_d); the router's logits x W_r^T + b_r stay f32.

def bf16_round(x):
    """x rounded to the nearest bf16, ties to even, in x's dtype (torch converts float64 through
    float32: the twin's float64 value rounded as flatpeak rounds its float32 one)."""
    return x.to(torch.bfloat16).to(x.dtype)


class _Store(torch.autograd.Function):
    """store(x): x rounded to bf16, and its incoming gradient rounded."""

    @staticmethod
    def forward(ctx, x):
        return bf16_round(x)

    @staticmethod
    def backward(ctx, g):
        return bf16_round(g)


class _StoreGrad(torch.autograd.Function):
    """store_grad(x): x unchanged, its incoming gradient rounded."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return bf16_round(g)


class _Fan(torch.autograd.Function):
    """fan(x, n): n copies of x; the gradient round(round(round(g_0) + g_1) + ...), in output order."""

    @staticmethod
    def forward(ctx, x, n):
        return tuple(x.clone() for _ in range(n))

    @staticmethod
    def backward(ctx, *gs):
        acc = None
        for g in gs:  # an unused copy has a zero gradient: adding it changes nothing
            acc = bf16_round(g) if acc is None else bf16_round(acc + g)
        return acc, None


def attention_hidden(T, window=None):
    """(T, T) bool: True where key j is hidden from query i (the future, and with a window, j <= i - window:
    masking_utils.sliding_window_overlay keeps kv > q - window)."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = j > i
    if window is not None:
        hidden = hidden | (j <= i - window)
    return hidden


def attention_probs(q, k, scale, window=None, sinks=None):
    """Causal (and windowed) softmax probabilities (B, heads, T, T) of q, k (B, heads, T, dqk). With sinks
    (heads), each head's sink logit joins every row's softmax: P = exp(s - lse'), lse' = logsumexp over
    the row's scores and the sink; returns (P, the sink's probability exp(sink - lse') (B, heads, T, 1))."""
    T = q.shape[2]
    scores = ((q @ k.transpose(-1, -2)) * scale).masked_fill(attention_hidden(T, window), float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    B, h = scores.shape[:2]
    full = torch.softmax(torch.cat([scores, sinks.view(1, h, 1, 1).expand(B, h, T, 1)], dim=-1), dim=-1)
    return full[..., :-1], full[..., -1:]


class _Attention(torch.autograd.Function):
    """Causal attention with the backward of backend/cpu/kernels/attention_block.cpp (FlashAttention-2): q (B, nh, T,
    dqk), k (B, nkv, T, dqk), v (B, nkv, T, dv), query head h reading kv head h // (nh / nkv) -> o (B, nh,
    T, dv). rounded: o is rounded to bf16 and the incoming dO too, and D = rowsum(dO * o) reads the rounded
    o; otherwise this is exact attention and its exact gradient (checked against autograd).
    sinks (nh) or None: gpt_oss's sink logits, in every row's softmax (attention_probs); backward dS = P
    (dP - D) as without them, and d sink_h = -sum over (b, i) of exp(sink_h - lse'_(b,h,i)) D_(b,h,i)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, window, rounded, sinks=None):
        rep = q.shape[1] // k.shape[1]
        kr = k.repeat_interleave(rep, dim=1)
        if sinks is None:
            P, ps = attention_probs(q, kr, scale, window), None  # (B, nh, T, T)
        else:
            P, ps = attention_probs(q, kr, scale, window, sinks)  # and (B, nh, T, 1)
        o = P @ v.repeat_interleave(rep, dim=1)
        if rounded:
            o = bf16_round(o)
        ctx.save_for_backward(q, k, v, o, P, ps)
        ctx.scale, ctx.rounded, ctx.sinks = scale, rounded, sinks is not None
        return o

    @staticmethod
    def backward(ctx, dO):
        q, k, v, o, P, ps = ctx.saved_tensors
        B, nkv, T, _ = k.shape
        rep = q.shape[1] // nkv
        if ctx.rounded:
            dO = bf16_round(dO)
        kr, vr = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        D = (dO * o).sum(-1, keepdim=True)  # (B, nh, T, 1)
        dS = P * (dO @ vr.transpose(-1, -2) - D)  # (B, nh, T, T); zero where masked (P = 0)
        dq = ctx.scale * (dS @ kr)
        dk = ctx.scale * (dS.transpose(-1, -2) @ q)
        dv = P.transpose(-1, -2) @ dO
        dsinks = -(ps * D).sum(dim=(0, 2, 3)) if ctx.sinks else None  # (nh)
        group = lambda t: t.view(B, nkv, rep, T, t.shape[-1]).sum(dim=2)  # noqa: E731 (the group's heads)
        return dq, group(dk), group(dv), None, None, None, dsinks


class NoCasts:
    """The plain twin: every cast point the identity."""
    on = False

    def store(self, x):
        return x

    def store_grad(self, x):
        return x

    def fan(self, x, n):
        return (x,) * n

    def weight_grad(self, g):
        return g


class Bf16Casts(NoCasts):
    """flatpeak's bf16 recipe (Note [The bf16 twin's cast points])."""
    on = True

    def store(self, x):
        return _Store.apply(x)

    def store_grad(self, x):
        return _StoreGrad.apply(x)

    def fan(self, x, n):
        return _Fan.apply(x, n)

    def attention(self, q, k, v, scale, window=None, sinks=None):
        return _Attention.apply(q, k, v, scale, window, True, sinks)

    def weight_grad(self, g):
        return bf16_round(g)


NO_CASTS = NoCasts()
BF16_CASTS = Bf16Casts()

# GptOssConfig's defaults (transformers 5.25, configuration_gpt_oss.py), for the keys the twin reads.
GPTOSS_DEFAULTS = dict(num_hidden_layers=36, num_local_experts=128, vocab_size=201088, hidden_size=2880,
                       intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8,
                       sliding_window=128, tie_word_embeddings=False, max_position_embeddings=131072,
                       rms_norm_eps=1e-5, num_experts_per_tok=4, swiglu_alpha=1.702, swiglu_limit=7.0,
                       router_aux_loss_coef=0.001, attention_bias=True, layer_types=None)
GPTOSS_DEFAULT_THETA = 150000.0
# GptOssConfig's rope_parameters when config.json has no rope_scaling dict and rope_parameters is null or
# absent: YaRN, not the default RoPE (a config.json meaning the default RoPE must say so in rope_parameters).
GPTOSS_DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                       "original_max_position_embeddings": 4096}


def gptoss_default_layer_types(n):
    """GptOssConfig's layer_types when absent: sliding for even layer indices, full for odd ones."""
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]


def gptoss_config_dict(d):
    """A gpt_oss config.json dict -> the twin's keys, as GptOssConfig reads it: its defaults for what is
    absent; num_local_experts (or its alias num_experts) experts of width intermediate_size; RoPE from
    rope_scaling when that is a non-empty dict, else rope_parameters (GPTOSS_DEFAULT_ROPE when null or
    absent), its rope_theta, else the top-level rope_theta, else 150000; rope_type from "type" or
    "default"; yarn's original_max_position_embeddings defaulting to max_position_embeddings."""
    out = dict(GPTOSS_DEFAULTS)
    out.update(d)
    if "num_local_experts" in d and "num_experts" in d and d["num_experts"] != d["num_local_experts"]:
        raise ValueError(f"num_experts = {d['num_experts']} and num_local_experts = {d['num_local_experts']} "
                         "disagree")
    E = d["num_experts"] if "num_experts" in d and "num_local_experts" not in d else out["num_local_experts"]
    I = out["intermediate_size"]
    if I is None:  # the twin's own Config fields (json.dumps(cfg.__dict__)): the width is moe_intermediate_size
        I = d["moe_intermediate_size"]
    if d.get("moe_intermediate_size") not in (None, I):
        raise ValueError(f"gpt_oss: the expert width is intermediate_size = {I}; moe_intermediate_size = "
                         f"{d['moe_intermediate_size']} disagrees (transformers ignores it)")
    if out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = out["num_attention_heads"]
    if out.get("head_dim") is None:
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    if out.get("layer_types") is None:
        out["layer_types"] = gptoss_default_layer_types(out["num_hidden_layers"])
    rope = d.get("rope_parameters")
    rope = dict(d.get("rope_scaling") or (GPTOSS_DEFAULT_ROPE if rope is None else rope))
    if set(rope) & {"sliding_attention", "full_attention"}:
        raise ValueError("rope parameters per layer type are not in the twin")
    theta = rope.get("rope_theta")
    if theta is None:
        theta = d.get("rope_theta")
    if theta is None:
        theta = GPTOSS_DEFAULT_THETA
    rope["rope_theta"] = theta
    rope.setdefault("rope_type", rope.get("type", "default"))
    if rope["rope_type"] in ("yarn", "llama3"):
        rope.setdefault("original_max_position_embeddings", out["max_position_embeddings"])
    if rope["rope_type"] == "yarn" and rope.get("factor") is None:
        rope["factor"] = out["max_position_embeddings"] / rope["original_max_position_embeddings"]
    out.update(num_experts=E, moe_intermediate_size=I, rope_theta=float(theta), norm_topk_prob=True, rope_scaling=rope)
    return out


@dataclass
class Config:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int  # the experts' width (gpt_oss: config.json's intermediate_size)
    vocab_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.001
    rope_scaling: dict = None  # Hugging Face's rope_scaling / rope_parameters (None: default RoPE)
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    use_sliding_window: bool = False
    sliding_window: int = None
    mlp_only_layers: list = None
    decoder_sparse_step: int = 1
    intermediate_size: int = None
    max_position_embeddings: int = None  # read by dynamic RoPE only
    # deepseek_v3
    model_type: str = "qwen3_moe"
    q_lora_rank: int = None  # None: q_proj
    kv_lora_rank: int = None
    qk_nope_head_dim: int = None
    qk_rope_head_dim: int = None
    v_head_dim: int = None
    rope_interleave: bool = True
    n_shared_experts: int = 0
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 0
    # gpt_oss (None: GptOssConfig's defaults, filled in by __post_init__)
    layer_types: list = None  # per layer "sliding_attention" (window sliding_window) or "full_attention"
    swiglu_alpha: float = None  # the clamped SwiGLU's sigmoid gain (1.702)
    swiglu_limit: float = None  # its clamp (7.0)

    OPTIONAL = ("rope_scaling", "attention_bias", "tie_word_embeddings", "use_sliding_window", "sliding_window",
                "mlp_only_layers", "decoder_sparse_step", "intermediate_size", "max_position_embeddings",
                "model_type", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "rope_interleave", "n_shared_experts", "n_group", "topk_group", "routed_scaling_factor",
                "first_k_dense_replace", "layer_types", "swiglu_alpha", "swiglu_limit")

    def __post_init__(self):
        if self.model_type != "gpt_oss":
            return
        if self.layer_types is None:
            self.layer_types = gptoss_default_layer_types(self.num_hidden_layers)
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        unknown = set(self.layer_types) - {"sliding_attention", "full_attention"}
        if unknown:
            raise ValueError(f"layer_types holds {sorted(unknown)}; gpt_oss has sliding_attention and full_attention")
        if self.swiglu_alpha is None:
            self.swiglu_alpha = GPTOSS_DEFAULTS["swiglu_alpha"]
        if self.swiglu_limit is None:
            self.swiglu_limit = GPTOSS_DEFAULTS["swiglu_limit"]
        if self.rope_scaling is None:  # spelled out, as a config.json must say it (GPTOSS_DEFAULT_ROPE)
            self.rope_scaling = {"rope_type": "default", "rope_theta": self.rope_theta}

    @staticmethod
    def from_dict(d):
        """Takes the keys above from d, a Hugging Face config.json dict (those in OPTIONAL may be left
        out; the rest are required); others are ignored. A deepseek_v3 dict names its experts
        n_routed_experts and has no head_dim (the RoPE width) nor a load-balancing loss. A gpt_oss dict is
        read as GptOssConfig reads it (gptoss_config_dict: its defaults, num_local_experts, intermediate_size
        as the expert width, rope_parameters or rope_scaling)."""
        if d.get("model_type") == "deepseek_v3":
            d = dict(d, num_experts=d["n_routed_experts"], router_aux_loss_coef=0.0)
            d.setdefault("head_dim", d["qk_rope_head_dim"])
        if d.get("model_type") == "gpt_oss":
            d = gptoss_config_dict(d)
        missing = [f.name for f in fields(Config) if f.name not in d and f.name not in Config.OPTIONAL]
        if missing:
            raise KeyError(f"config lacks {missing}")
        return Config(**{f.name: d[f.name] for f in fields(Config) if f.name in d})

    def deepseek(self):
        return self.model_type == "deepseek_v3"

    def gptoss(self):
        return self.model_type == "gpt_oss"

    def is_sparse(self, layer):
        """Qwen3MoeDecoderLayer: a MoE block unless listed in mlp_only_layers or off the sparse step;
        DeepseekV3DecoderLayer: from first_k_dense_replace on; GptOssDecoderLayer: always."""
        if self.deepseek():
            return layer >= self.first_k_dense_replace
        if self.gptoss():
            return True
        return layer not in (self.mlp_only_layers or []) and (layer + 1) % self.decoder_sparse_step == 0

    def window(self):
        """The sliding window in positions, or None for full causal attention (qwen3_moe: every layer)."""
        return self.sliding_window if self.use_sliding_window else None

    def layer_window(self, layer):
        """The sliding window of layer `layer`, or None: gpt_oss's per layer_types, else window()."""
        if self.gptoss():
            sliding = self.layer_types[layer] == "sliding_attention"
            return self.sliding_window if sliding and self.sliding_window else None
        return self.window()


def param_shapes(cfg):
    """Every parameter's Hugging Face name -> shape (nn.Linear weights are (out, in)), in model order."""
    H, hd, I = cfg.hidden_size, cfg.head_dim, cfg.moe_intermediate_size
    nh, nkv, E, V = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_experts, cfg.vocab_size
    s = {"model.embed_tokens.weight": (V, H)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (H,)
        if cfg.deepseek():
            deepseek_layer_shapes(cfg, i, s)
            continue
        if cfg.gptoss():
            gptoss_layer_shapes(cfg, i, s)
            continue
        for proj, out_dim, in_dim in (("q", nh * hd, H), ("k", nkv * hd, H), ("v", nkv * hd, H), ("o", H, nh * hd)):
            s[p + f"self_attn.{proj}_proj.weight"] = (out_dim, in_dim)
            if cfg.attention_bias:
                s[p + f"self_attn.{proj}_proj.bias"] = (out_dim,)
        s[p + "self_attn.q_norm.weight"] = (hd,)
        s[p + "self_attn.k_norm.weight"] = (hd,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        if not cfg.is_sparse(i):
            swiglu_shapes(s, p + "mlp.", H, cfg.intermediate_size)
            continue
        s[p + "mlp.gate.weight"] = (E, H)
        for e in range(E):
            swiglu_shapes(s, f"{p}mlp.experts.{e}.", H, I)
    s["model.norm.weight"] = (H,)
    if not cfg.tie_word_embeddings:
        s["lm_head.weight"] = (V, H)
    return s


def swiglu_shapes(s, prefix, H, width):
    """A SwiGLU MLP's three projections (an expert, a dense layer's MLP, the shared experts) into s."""
    s[prefix + "gate_proj.weight"] = (width, H)
    s[prefix + "up_proj.weight"] = (width, H)
    s[prefix + "down_proj.weight"] = (H, width)


def gptoss_layer_shapes(cfg, i, s):
    """GptOssDecoderLayer's parameters (after input_layernorm) into s, the experts by per-expert names
    (gptoss_hf_to_flat converts transformers' fused tensors)."""
    H, hd, I = cfg.hidden_size, cfg.head_dim, cfg.moe_intermediate_size
    nh, nkv, E = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_experts
    p = f"model.layers.{i}."
    for proj, out_dim, in_dim in (("q", nh * hd, H), ("k", nkv * hd, H), ("v", nkv * hd, H), ("o", H, nh * hd)):
        s[p + f"self_attn.{proj}_proj.weight"] = (out_dim, in_dim)
        if cfg.attention_bias:
            s[p + f"self_attn.{proj}_proj.bias"] = (out_dim,)
    s[p + "self_attn.sinks"] = (nh,)
    s[p + "post_attention_layernorm.weight"] = (H,)
    s[p + "mlp.router.weight"] = (E, H)
    s[p + "mlp.router.bias"] = (E,)
    for e in range(E):
        q = f"{p}mlp.experts.{e}."
        for proj, out_dim, in_dim in (("gate", I, H), ("up", I, H), ("down", H, I)):
            s[q + f"{proj}_proj.weight"] = (out_dim, in_dim)
            s[q + f"{proj}_proj.bias"] = (out_dim,)


GPTOSS_FUSED = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def gptoss_hf_to_flat(p, cfg):
    """transformers' GptOssExperts tensors -> the per-expert names of param_shapes: per layer
    mlp.experts.gate_up_proj (E, H, 2I), gate the even columns [..., ::2] and up the odd ones [..., 1::2]
    (gate_proj.weight[e] = gate_up_proj[e][:, ::2].T), gate_up_proj_bias (E, 2I) interleaved alike,
    down_proj (E, I, H) (down_proj.weight[e] = down_proj[e].T), down_proj_bias (E, H). Other names pass
    through. Differentiable (gradients map back through it); the result is in param_shapes' order, then
    any names param_shapes does not know."""
    E, I, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    flat = {}
    for name, t in p.items():
        pre, _, leaf = name.rpartition(".experts.")
        if not pre or leaf not in GPTOSS_FUSED:
            flat[name] = t
            continue
        want = {"gate_up_proj": (E, H, 2 * I), "gate_up_proj_bias": (E, 2 * I), "down_proj": (E, I, H),
                "down_proj_bias": (E, H)}[leaf]
        if tuple(t.shape) != want:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {want}")
        for e in range(E):
            q = f"{pre}.experts.{e}."
            if leaf == "gate_up_proj":
                flat[q + "gate_proj.weight"] = t[e][:, 0::2].T.contiguous()
                flat[q + "up_proj.weight"] = t[e][:, 1::2].T.contiguous()
            elif leaf == "gate_up_proj_bias":
                flat[q + "gate_proj.bias"] = t[e][0::2].contiguous()
                flat[q + "up_proj.bias"] = t[e][1::2].contiguous()
            elif leaf == "down_proj":
                flat[q + "down_proj.weight"] = t[e].T.contiguous()
            else:
                flat[q + "down_proj.bias"] = t[e].contiguous()
    order = [n for n in param_shapes(cfg) if n in flat]
    return {n: flat[n] for n in order + [n for n in flat if n not in set(order)]}


def gptoss_flat_to_hf(p, cfg):
    """The inverse of gptoss_hf_to_flat: per-expert names -> transformers' fused GptOssExperts tensors
    (each layer's four in place of its experts' first name); other names pass through. Differentiable."""
    E = cfg.num_experts
    out = {}
    for name, t in p.items():
        pre, _, rest = name.rpartition(".experts.")
        if not pre or not rest.split(".")[0].isdigit():
            out[name] = t
            continue
        if pre + ".experts.gate_up_proj" in out:
            continue
        x = lambda e, leaf: p[f"{pre}.experts.{e}.{leaf}"]  # noqa: E731
        # (H, I) pairs interleaved on the last dimension: column 2i is gate's i, 2i + 1 up's i.
        out[pre + ".experts.gate_up_proj"] = torch.stack(
            [torch.stack([x(e, "gate_proj.weight").T, x(e, "up_proj.weight").T], dim=-1).flatten(-2)
             for e in range(E)])
        out[pre + ".experts.gate_up_proj_bias"] = torch.stack(
            [torch.stack([x(e, "gate_proj.bias"), x(e, "up_proj.bias")], dim=-1).flatten(-2) for e in range(E)])
        out[pre + ".experts.down_proj"] = torch.stack([x(e, "down_proj.weight").T for e in range(E)])
        out[pre + ".experts.down_proj_bias"] = torch.stack([x(e, "down_proj.bias") for e in range(E)])
    return out


def deepseek_layer_shapes(cfg, i, s):
    """DeepseekV3DecoderLayer's parameters (after input_layernorm) into s."""
    H, I, E, nh = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.num_attention_heads
    dn, dr, dv, kl, ql = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank, cfg.q_lora_rank
    p = f"model.layers.{i}."
    if ql:
        s[p + "self_attn.q_a_proj.weight"] = (ql, H)
        s[p + "self_attn.q_a_layernorm.weight"] = (ql,)
        s[p + "self_attn.q_b_proj.weight"] = (nh * (dn + dr), ql)
    else:
        s[p + "self_attn.q_proj.weight"] = (nh * (dn + dr), H)
    s[p + "self_attn.kv_a_proj_with_mqa.weight"] = (kl + dr, H)
    s[p + "self_attn.kv_a_layernorm.weight"] = (kl,)
    s[p + "self_attn.kv_b_proj.weight"] = (nh * (dn + dv), kl)
    s[p + "self_attn.o_proj.weight"] = (H, nh * dv)
    s[p + "post_attention_layernorm.weight"] = (H,)
    if not cfg.is_sparse(i):
        swiglu_shapes(s, p + "mlp.", H, cfg.intermediate_size)
        return
    s[p + "mlp.gate.weight"] = (E, H)
    s[p + "mlp.gate.e_score_correction_bias"] = (E,)
    if cfg.n_shared_experts:
        swiglu_shapes(s, p + "mlp.shared_experts.", H, cfg.n_shared_experts * I)
    for e in range(E):
        swiglu_shapes(s, f"{p}mlp.experts.{e}.", H, I)


def init_params(cfg, seed=0, dtype=torch.float64):
    """Random parameters for self-checks: norm weights and biases near 1, matrices ~ N(0, 1/fan_in);
    gpt_oss's biases, router bias and sinks ~ N(0, 0.5^2) (nonzero)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if cfg.gptoss() and (name.endswith(".bias") or name.endswith(".sinks")):
            out[name] = 0.5 * torch.randn(shape, generator=g, dtype=dtype)
        elif len(shape) == 1:
            out[name] = 1.0 + 0.2 * torch.randn(shape, generator=g, dtype=dtype)
        else:
            out[name] = torch.randn(shape, generator=g, dtype=dtype) / math.sqrt(shape[1])
    out["model.embed_tokens.weight"] = torch.randn(param_shapes(cfg)["model.embed_tokens.weight"], generator=g,
                                                   dtype=dtype)
    return out


# --- building blocks -------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    """x (..., D) * rsqrt(mean(x^2) + eps) * w (D)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_inv_freq(hd, theta, scaling, seq_len=None, max_position_embeddings=None):
    """inv_freq (hd/2) and the cos/sin factor of RoPE with Hugging Face's scaling (transformers 5.x's
    modeling_rope_utils formulas, written out here in float64): default, linear, yarn, llama3, and
    dynamic NTK for a sequence of seq_len positions (its base grows past max_position_embeddings)."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv, 1.0
    factor = float(scaling["factor"])
    if kind == "dynamic":
        M = max_position_embeddings or scaling["original_max_position_embeddings"]
        L = max(seq_len or M, M)
        base = theta * ((factor * L / M) - (factor - 1)) ** (hd / (hd - 2))
        return 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)), 1.0
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "yarn":
        orig = scaling["original_max_position_embeddings"]

        def mscale(s, m=1.0):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        att = scaling.get("attention_factor")
        if att is None:
            m, mad = scaling.get("mscale"), scaling.get("mscale_all_dim")
            att = mscale(factor, m) / mscale(factor, mad) if m and mad else mscale(factor)
        fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

        def dim_of(rot):  # the dimension whose wavelength turns `rot` times over the original context
            return hd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

        lo, hi = dim_of(fast), dim_of(slow)
        if scaling.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, hd - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(hd // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        keep = 1 - ramp  # 1: extrapolate (inv), 0: interpolate (inv / factor)
        return inv / factor * (1 - keep) + inv * keep, att
    if kind == "llama3":
        orig = scaling["original_max_position_embeddings"]
        lo_f, hi_f = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        out = torch.where(wavelen > orig / lo_f, inv / factor, inv)
        smooth = (orig / wavelen - lo_f) / (hi_f - lo_f)
        medium = (wavelen <= orig / lo_f) & (wavelen >= orig / hi_f)
        return torch.where(medium, (1 - smooth) * inv / factor + smooth * inv, out), 1.0
    raise ValueError(f"rope_type {kind!r} is not in the twin")


def rope_cos_sin(T, hd, theta, dtype, scaling=None, max_position_embeddings=None):
    """cos, sin (T, hd) for positions 0..T-1: angle pos * inv_freq[i], i < hd/2, repeated twice, times
    the scaling's attention factor."""
    inv_freq, att = rope_inv_freq(hd, theta, scaling, T, max_position_embeddings)  # (hd/2)
    pos = torch.arange(T, dtype=torch.float64)
    ang = torch.outer(pos, inv_freq)  # (T, hd/2)
    emb = torch.cat([ang, ang], dim=-1)  # (T, hd)
    return (att * emb.cos()).to(dtype), (att * emb.sin()).to(dtype)


def rotate_half(x):
    """(..., hd): cat(-x2, x1) where x1, x2 are the two halves of the last dimension."""
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def causal_softmax_attention(q, k, v, scale, window=None):
    """q, k (B, heads, T, dqk), v (B, heads, T, dv) -> (B, heads, T, dv), causal (and windowed)."""
    return attention_probs(q, k, scale, window) @ v


def mla_attention(x, p, layer, cfg, casts=NO_CASTS, resid=None):
    """DeepseekV3Attention: x (B, T, H) normed -> o_proj output (B, T, H); with resid (B, T, H), the
    block's output resid + o_proj output as flatpeak forms it (model/mla_block.cpp)."""
    B, T, _ = x.shape
    nh, dn, dr, dv = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    kl, eps = cfg.kv_lora_rank, cfg.rms_norm_eps
    pre = f"model.layers.{layer}.self_attn."
    W = lambda n: p[pre + n + ".weight"]  # noqa: E731
    c = casts
    # d h1 = dq W_q, then + d kv_a W_kv_a, then + d k_pe W_k_pe, each GEMM rounding (beta = 1).
    xq, xkv, xpe = c.fan(x, 3)
    if cfg.q_lora_rank:
        q_a_n = c.store(rms_norm(c.store(xq @ W("q_a_proj").T), W("q_a_layernorm"), eps))
        q = c.store(q_a_n @ W("q_b_proj").T)
    else:
        q = c.store(xq @ W("q_proj").T)
    q = q.view(B, T, nh, dn + dr).transpose(1, 2)  # (B, nh, T, dqk)
    q_pass, q_rot = q[..., :dn], q[..., dn:]
    if c.on:  # flatpeak: the two row blocks of kv_a_proj_with_mqa as two GEMMs
        Wa = W("kv_a_proj_with_mqa")
        kv_nope, k_rot = c.store(xkv @ Wa[:kl].T), c.store(xpe @ Wa[kl:].T)
    else:
        ckv = x @ W("kv_a_proj_with_mqa").T  # (B, T, kl + dr)
        kv_nope, k_rot = ckv[..., :kl], ckv[..., kl:]
    kv = c.store(c.store(rms_norm(kv_nope, W("kv_a_layernorm"), eps)) @ W("kv_b_proj").T)  # (B, T, nh*(dn+dv))
    kv = kv.view(B, T, nh, dn + dv).transpose(1, 2)
    k_nope, v = kv[..., :dn], kv[..., dn:]
    k_rot = k_rot.view(B, 1, T, dr)
    cos, sin = rope_cos_sin(T, dr, cfg.rope_theta, x.dtype, cfg.rope_scaling, cfg.max_position_embeddings)
    cos, sin = cos[None, None], sin[None, None]  # (1, 1, T, dr)
    if cfg.rope_interleave:
        # apply_rotary_pos_emb_interleave: pairs (2i, 2i+1) rotated by angle i, written de-interleaved.
        cs, sn = cos[..., : dr // 2], sin[..., : dr // 2]

        def rot(t):
            t1, t2 = t[..., 0::2], t[..., 1::2]
            return torch.cat([t1 * cs - t2 * sn, t2 * cs + t1 * sn], dim=-1)
    else:
        def rot(t):
            return t * cos + rotate_half(t) * sin
    q = torch.cat([q_pass, c.store(rot(q_rot))], dim=-1)
    if c.on:  # every head's key carries the one RoPE key; its gradient is summed head by head (add_2d)
        k = torch.cat([k_nope, torch.cat(c.fan(c.store(rot(k_rot)), nh), dim=1)], dim=-1)
    else:
        k = torch.cat([k_nope, rot(k_rot).expand(B, nh, T, dr)], dim=-1)
    scale = (dn + dr) ** -0.5
    rs = cfg.rope_scaling or {}
    if rs.get("rope_type", rs.get("type", "default")) != "default" and rs.get("mscale_all_dim"):
        factor = float(rs["factor"])
        m = 0.1 * rs["mscale_all_dim"] * math.log(factor) + 1.0 if factor > 1 else 1.0
        scale = scale * m * m
    if c.on:
        o = c.attention(q, k, v, scale)
    else:
        o = causal_softmax_attention(q, k, v, scale)  # (B, nh, T, dv)
    o = o.transpose(1, 2).reshape(B, T, nh * dv)
    if resid is None:
        return o @ W("o_proj").T
    return c.store(resid + o @ W("o_proj").T)


def attention(x, p, layer, cfg, casts=NO_CASTS, resid=None):
    """x (B, T, H): the normed hidden states. Returns the o_proj output (B, T, H); with resid (B, T, H),
    the block's output resid + o_proj output as flatpeak forms it (model/attention_block.cpp: the GEMM
    adds into a copy of resid, then the o_proj bias is added). gpt_oss: no q/k norm, the layer's window
    (cfg.layer_window) and the sinks of self_attn.sinks in the softmax."""
    if cfg.deepseek():
        return mla_attention(x, p, layer, cfg, casts, resid)
    B, T, _ = x.shape
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    pre = f"model.layers.{layer}.self_attn."
    c = casts

    def linear(t, proj):  # nn.Linear, with its bias when the config has them (added in place)
        y = c.store(t @ p[pre + proj + ".weight"].T)
        return c.store(y + p[pre + proj + ".bias"]) if cfg.attention_bias else y

    xq, xk, xv = c.fan(x, 3)  # d h1 = dq W_q, then + dk W_k, then + dv W_v
    q = linear(xq, "q_proj").view(B, T, nh, hd)
    k = linear(xk, "k_proj").view(B, T, nkv, hd)
    v = linear(xv, "v_proj").view(B, T, nkv, hd)
    if not cfg.gptoss():  # Qwen3: per-head RMSNorm over hd on q and k, before RoPE (gpt_oss: none)
        q = c.store(rms_norm(q, p[pre + "q_norm.weight"], cfg.rms_norm_eps))
        k = c.store(rms_norm(k, p[pre + "k_norm.weight"], cfg.rms_norm_eps))
    window = cfg.layer_window(layer)
    sinks = p[pre + "sinks"] if cfg.gptoss() else None  # gpt_oss: a sink logit per query head
    cos, sin = rope_cos_sin(T, hd, cfg.rope_theta, x.dtype, cfg.rope_scaling, cfg.max_position_embeddings)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # broadcast over B and heads
    q = c.store(q * cos + rotate_half(q) * sin)  # RoPE in place
    k = c.store(k * cos + rotate_half(k) * sin)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
    if c.on:
        o = c.attention(q, k, v, hd ** -0.5, window, sinks)  # (B, nh, T, hd)
        o = o.transpose(1, 2).reshape(B, T, nh * hd)
        x1 = c.store(resid + o @ p[pre + "o_proj.weight"].T)
        return c.store(x1 + p[pre + "o_proj.bias"]) if cfg.attention_bias else x1
    # GQA: query head h reads kv head h // (nh / nkv).
    k = k.repeat_interleave(nh // nkv, dim=1)
    v = v.repeat_interleave(nh // nkv, dim=1)
    scores = (q @ k.transpose(-1, -2)) * hd ** -0.5  # (B, nh, T, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = j > i  # the future
    if window is not None:
        hidden = hidden | (j <= i - window)  # masking_utils.sliding_window_overlay: kv > q - window
    scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is None:
        o = torch.softmax(scores, dim=-1) @ v  # (B, nh, T, hd)
    else:  # gpt_oss's eager_attention_forward: the sink a last column of the softmax, then dropped
        combined = torch.cat([scores, sinks.reshape(1, -1, 1, 1).expand(B, -1, T, -1)], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        o = F.softmax(combined, dim=-1)[..., :-1] @ v
    o = o.transpose(1, 2).reshape(B, T, nh * hd)
    y = linear(o, "o_proj")
    return y if resid is None else resid + y


def swiglu_mlp(x, p, pre, casts=NO_CASTS):
    """x (..., H) -> down(silu(gate(x)) * up(x)) with the weights pre + "{gate,up,down}_proj.weight".
    flatpeak (model/expert_ffn.cpp) stores g, u, the SwiGLU product (silu(g) stays inside its
    kernel) and y; d x = dg W_g, then + du W_u (beta = 1)."""
    c = casts
    xg, xu = c.fan(x, 2)
    g = c.store(xg @ p[pre + "gate_proj.weight"].T)
    u = c.store(xu @ p[pre + "up_proj.weight"].T)
    return c.store(c.store(F.silu(g) * u) @ p[pre + "down_proj.weight"].T)


def clamped_swiglu(g, u, alpha, limit):
    """gpt_oss's GptOssExperts._apply_gate on the gate and up projections: g_c = min(g, limit), u_c =
    clamp(u, -limit, limit), (u_c + 1) * g_c * sigmoid(alpha g_c). Its gradient is torch.clamp's: zero
    where a clamp is active (g > limit, |u| > limit), passed where g or u equals the limit exactly."""
    g = g.clamp(min=None, max=limit)
    u = u.clamp(min=-limit, max=limit)
    return (u + 1) * (g * torch.sigmoid(g * alpha))


def gptoss_expert_mlp(x, p, pre, cfg, casts=NO_CASTS):
    """A gpt_oss expert: x (n, H) -> down(clamped_swiglu(gate(x), up(x))) with biases, the weights and
    biases pre + "{gate,up,down}_proj.{weight,bias}". flatpeak stores each GEMM's output and each bias
    added to it, and the clamped SwiGLU's output; d x = dg W_g, then + du W_u (beta = 1)."""
    c = casts
    W = lambda n: p[pre + n]  # noqa: E731
    xg, xu = c.fan(x, 2)
    g = c.store(c.store(xg @ W("gate_proj.weight").T) + W("gate_proj.bias"))
    u = c.store(c.store(xu @ W("up_proj.weight").T) + W("up_proj.bias"))
    act = c.store(clamped_swiglu(g, u, cfg.swiglu_alpha, cfg.swiglu_limit))
    return c.store(c.store(act @ W("down_proj.weight").T) + W("down_proj.bias"))


def expert_mlp(x, p, layer, e, casts=NO_CASTS, cfg=None):
    """x (n, H) -> (n, H): down(silu(gate(x)) * up(x)) (gpt_oss: gptoss_expert_mlp)."""
    if cfg is not None and cfg.gptoss():
        return gptoss_expert_mlp(x, p, f"model.layers.{layer}.mlp.experts.{e}.", cfg, casts)
    return swiglu_mlp(x, p, f"model.layers.{layer}.mlp.experts.{e}.", casts)


def dense_mlp(x, p, layer, leaf="mlp.", casts=NO_CASTS):
    """A dense layer's Qwen3MoeMLP (or DeepSeek's shared experts, leaf "mlp.shared_experts."):
    x (..., H) -> down(silu(gate(x)) * up(x))."""
    return swiglu_mlp(x, p, f"model.layers.{layer}.{leaf}", casts)


def deepseek_route(logits, p, layer, cfg):
    """DeepseekV3TopkRouter after its GEMM: logits (N, E) -> weights (N, k), sel (N, k), and the scores
    the choice was made on (N, E; -inf outside the chosen groups)."""
    N, E = logits.shape
    scores = logits.sigmoid()
    choice = scores + p[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"].detach()
    groups = choice.detach().view(N, cfg.n_group, E // cfg.n_group).topk(2, dim=-1)[0].sum(dim=-1)  # (N, n_group)
    gsel = torch.topk(groups, cfg.topk_group, dim=-1)[1]
    gmask = torch.zeros_like(groups).scatter_(1, gsel, 1.0)
    mask = gmask.unsqueeze(-1).expand(N, cfg.n_group, E // cfg.n_group).reshape(N, E)
    choice = choice.detach().masked_fill(mask == 0, float("-inf"))
    sel = torch.topk(choice, cfg.num_experts_per_tok, dim=-1)[1]
    weights = scores.gather(1, sel)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * cfg.routed_scaling_factor, sel, choice


def gptoss_route(logits, k):
    """GptOssTopKRouter after its linear layer: the top k of logits (N, E) (ties to the lower index),
    weights the softmax over the k chosen -> weights (N, k), sel (N, k)."""
    sel = torch.sort(logits.detach(), dim=-1, descending=True, stable=True)[1][:, :k]
    return torch.softmax(logits.gather(1, sel), dim=-1), sel


def moe(x, p, layer, cfg, casts=NO_CASTS, resid=None):
    """x (B, T, H): the normed hidden states. Returns (output (B, T, H), router logits (N, E),
    tokens per expert (E) as a list of ints, the scores the top-k chose on (N, E)). With resid (B, T, H)
    the output is the block's, resid + MoE output, as flatpeak forms it (model/moe_block.cpp: the shared
    experts' output plus resid, then the routed copies combined into it). gpt_oss: the router has a bias
    and chooses on its logits (gptoss_route)."""
    B, T, H = x.shape
    c = casts
    xs = x.reshape(B * T, H)
    # d h2: the shared experts' input gradient, then + the routed copies' (scatter-add), then + the
    # router's (GEMM, beta = 1), each rounded.
    x_shared, x_routed, x_router = c.fan(xs, 3)
    if cfg.gptoss():
        pre = f"model.layers.{layer}.mlp.router."
        logits = x_router @ p[pre + "weight"].T + p[pre + "bias"]  # (N, E), f32 in flatpeak
    else:
        logits = x_router @ p[f"model.layers.{layer}.mlp.gate.weight"].T  # (N, E)
    if cfg.deepseek():
        weights, sel, choice = deepseek_route(logits, p, layer, cfg)
    elif cfg.gptoss():
        weights, sel = gptoss_route(logits, cfg.num_experts_per_tok)
        choice = logits
    else:
        choice = torch.softmax(logits, dim=-1)
        weights, sel = torch.topk(choice, cfg.num_experts_per_tok, dim=-1)  # (N, k)
        if cfg.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(xs)
    counts = []
    for e in range(cfg.num_experts):
        tok, slot = torch.where(sel == e)  # the tokens routed to e and in which of their k slots
        counts.append(int(tok.numel()))
        if tok.numel() == 0:
            continue
        y = expert_mlp(x_routed[tok], p, layer, e, c, cfg) * weights[tok, slot, None]
        out = out.index_add(0, tok, y)
    shared = cfg.deepseek() and cfg.n_shared_experts
    if resid is None:
        if shared:
            out = out + dense_mlp(x_shared, p, layer, "mlp.shared_experts.", c)
        return out.view(B, T, H), logits, counts, choice.detach()
    x2 = resid.reshape(B * T, H)
    if shared:
        x2 = c.store(dense_mlp(x_shared, p, layer, "mlp.shared_experts.", c) + x2)
    return c.store(x2 + out).view(B, T, H), logits, counts, choice.detach()


def load_balancing_loss(router_logits, E, k):
    """Hugging Face load_balancing_loss_func without an attention mask. router_logits: list over
    the MoE layers (dense layers have no router) of (N, E); they are concatenated to (L_moe*N, E)."""
    logits = torch.cat(router_logits, dim=0)
    probs = torch.softmax(logits, dim=-1)
    _, sel = torch.topk(probs, k, dim=-1)  # (L*N, k)
    tokens_per_expert = F.one_hot(sel, E).to(probs.dtype).mean(dim=0)  # (k, E); no gradient path
    router_prob_per_expert = probs.mean(dim=0)  # (E)
    return E * torch.sum(tokens_per_expert * router_prob_per_expert[None, :])


def document_spans(doc_start):
    """doc_start (B, T) integer tensor, where each token's document begins (flatpeak's data/documents.h)
    -> per sequence the list of (start, end) spans of its documents."""
    spans = []
    for row in doc_start.tolist():
        starts = sorted(set(row))
        spans.append(list(zip(starts, starts[1:] + [len(row)])))
    return spans


def per_document(fn, h, resid, docs):
    """fn(h, resid) -> (B, T, H), run on each document alone when docs (document_spans) is given: every
    document a sequence of its own, so its attention sees only itself and its RoPE positions start at 0.
    This is packing as the definition has it, with no mask: what flatpeak's document starts must
    reproduce. resid (B, T, H) or None is sliced alike."""
    if docs is None:
        return fn(h, resid)
    rows = []
    for b, spans in enumerate(docs):
        rows.append(torch.cat([fn(h[b:b + 1, s:e], None if resid is None else resid[b:b + 1, s:e])
                               for s, e in spans], dim=1))
    return torch.cat(rows, dim=0)


def forward(p, cfg, input_ids, targets, casts=NO_CASTS, docs=None):
    """p: name -> tensor (all the same float dtype); input_ids, targets (B, T) integer tensors.
    Returns a dict: logits (B, T, V), loss, ce_loss, aux_loss (scalars), router_logits (list of
    (N, E), MoE layers only), expert_counts (L lists of E ints; all zero for a dense layer).
    casts: NO_CASTS (the plain twin) or BF16_CASTS (Note [The bf16 twin's cast points]). docs: packed
    documents (document_spans), whose attention runs document by document (per_document); every other
    op is token-wise, and the losses are over the whole batch."""
    input_ids, targets = input_ids.long(), targets.long()
    c, eps = casts, cfg.rms_norm_eps
    x = c.store(p["model.embed_tokens.weight"][input_ids])  # (B, T, H)
    router_logits, counts, choices = [], [], []
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        # The residual's gradient is d x_out + round(the norm's input gradient), rounded (add_inplace).
        h = c.store(rms_norm(c.store_grad(x), p[pre + "input_layernorm.weight"], eps))
        if c.on:
            x = per_document(lambda h_, r_: attention(h_, p, i, cfg, c, resid=r_), h, x, docs)
        else:
            x = x + per_document(lambda h_, r_: attention(h_, p, i, cfg), h, None, docs)
        h = c.store(rms_norm(c.store_grad(x), p[pre + "post_attention_layernorm.weight"], eps))
        if not cfg.is_sparse(i):
            x = c.store(x + dense_mlp(h, p, i, casts=c))  # flatpeak adds x1 into the FFN's output
            counts.append([0] * cfg.num_experts)
            continue
        if c.on:
            x, logits_i, n_e, choice = moe(h, p, i, cfg, c, resid=x)
        else:
            y, logits_i, n_e, choice = moe(h, p, i, cfg)
            x = x + y
        router_logits.append(logits_i)
        counts.append(n_e)
        choices.append(choice)
    x = c.store(rms_norm(x, p["model.norm.weight"], eps))
    head = p["model.embed_tokens.weight"] if cfg.tie_word_embeddings else p["lm_head.weight"]
    if cfg.tie_word_embeddings:  # lm_head's gradient is stored before the embedding's is added
        head = c.store_grad(head)
    logits = x @ head.T  # (B, T, V)
    ce = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1), ignore_index=IGNORE_INDEX)
    if cfg.deepseek():  # no load-balancing loss (its bias balances between steps)
        aux = torch.zeros((), dtype=logits.dtype)
    else:
        aux = load_balancing_loss(router_logits, cfg.num_experts, cfg.num_experts_per_tok)
    loss = ce + cfg.router_aux_loss_coef * aux
    return {"logits": logits, "loss": loss, "ce_loss": ce, "aux_loss": aux, "router_logits": router_logits,
            "expert_counts": counts, "choice_scores": choices}


def forward_backward(p, cfg, input_ids, targets, casts=NO_CASTS, docs=None):
    """forward() on leaf copies of p that require grad; adds "grads": name -> d loss / d param (with
    BF16_CASTS rounded to bf16, as flatpeak stores them)."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in p.items()}
    out = forward(leaves, cfg, input_ids, targets, casts, docs)
    names = list(leaves)
    grads = torch.autograd.grad(out["loss"], [leaves[n] for n in names], allow_unused=True)
    out["grads"] = {n: casts.weight_grad(g) if g is not None else torch.zeros_like(leaves[n])
                    for n, g in zip(names, grads)}
    return out
