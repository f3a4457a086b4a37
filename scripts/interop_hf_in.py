"""Hugging Face models into flatpeak, checked against transformers itself (run by scripts/interop with
the PyPI torch + transformers of .venv-interop; not part of scripts/test).

For each case, transformers makes a random Qwen3MoeForCausalLM or DeepseekV3ForCausalLM in bfloat16 and
writes it with save_pretrained (its own config.json spelling, sharded by max_shard_size). Then:
  1. `flatpeak eval --checkpoint DIR --dump-logits` gives the logits of transformers (the model loaded in
     float32 from the same bf16 weights) within 1e-4 max-relative;
  2. `flatpeak convert --checkpoint DIR --out DIR2` writes it back (bf16, flatpeak's shards), and
     transformers loads DIR2 to the very same logits (bit-identical weights);
  3. `flatpeak train --init-from DIR` runs 2 steps and its checkpoint loads in transformers.
Cases: default RoPE, YaRN, linear and llama3 RoPE scaling (Note [RoPE scaling as transformers computes
it] in src/model/rope_scaling.h); attention biases (set random: transformers starts them at zero), tied
embeddings, dense layers (mlp_only_layers and decoder_sparse_step), a sliding window shorter than the
sequence, and all of those at once; dynamic NTK RoPE past max_position_embeddings. DeepSeek-V3
(multi-head latent attention, the sigmoid group-limited router with a random nonzero e_score_correction_bias,
a shared expert, a dense first layer): "deepseek" with a query latent (q_lora_rank), interleaved RoPE and
4 groups of which 2 are kept; "deepseek_noq_yarn" with q_proj (q_lora_rank null), rotate-half RoPE, one
group, unnormalized top-k weights and YaRN with DeepSeek's mscale / mscale_all_dim past the original
context. gpt-oss (GptOssForCausalLM: sinks, sliding and full layers, biases everywhere, the clamped SwiGLU, each
layer's experts fused in the files): "gpt_oss" and "gpt_oss_yarn" (YaRN with truncate = false). transformers keeps their routers (mlp.gate.weight, e_score_correction_bias) in float32 in a bf16
model (_keep_in_fp32_modules_strict), so those files mix F32 and BF16, and flatpeak writes them back the same
way (Note [Tensors transformers keeps in f32] in src/train/checkpoint.cpp). Last, one thing flatpeak does
not compute (LongRoPE) must be refused by name.

usage: interop_hf_in.py FLATPEAK_BIN WORK_DIR RUN_CONFIG_WITHOUT_MODEL [CASE...]   (no CASE: every case)
"""
import collections
import json
import os
import shutil
import struct
import subprocess
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, GptOssConfig, GptOssForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

BIN, WORK, RUN_TOML = sys.argv[1:4]
ONLY = set(sys.argv[4:])  # case names to run (none: all)
T, B, V = 64, 2, 128
CLASSES = {"qwen3_moe": Qwen3MoeForCausalLM, "deepseek_v3": DeepseekV3ForCausalLM, "gpt_oss": GptOssForCausalLM}


def flatpeak(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"flatpeak {' '.join(args)} failed:\n{p.stderr}")
    return p


def hf_logits(d, ids):
    """transformers' logits of the model in d, loaded in float32; every tensor of the files must be one the
    model has and every weight of the model must come from the files (none initialized at random)."""
    cls = CLASSES[json.load(open(os.path.join(d, "config.json")))["model_type"]]
    model, info = cls.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}  # missing, unexpected, mismatched keys; error messages
    if bad:
        sys.exit(f"transformers loaded {d} with {bad}")
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def tokens_file(path, n, seed):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, V, (n,), generator=g).tolist()
    header = [20240520, 1, n] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{n}H", *toks))


def hf_model(d, rope, extra):
    cfg = Qwen3MoeConfig(**dict(dict(vocab_size=V, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                     max_position_embeddings=256, rope_theta=10000.0, rope_scaling=rope), **extra))
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith(".bias"):
                t.normal_(0.0, 0.5)
    model.to(torch.bfloat16).save_pretrained(d, max_shard_size="100KB")


def deepseek_model(d, rope, extra):
    """A random bf16 DeepseekV3ForCausalLM. Made in bfloat16 by transformers itself (_from_config), so the
    routers stay float32 as in a model from_pretrained loads in bf16; every MoE layer gets a random nonzero
    e_score_correction_bias (a buffer transformers starts at zero and save_pretrained writes)."""
    cfg = DeepseekV3Config(**dict(dict(vocab_size=V, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                       num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                                       q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                       v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                                       topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
                                       routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=256,
                                       rope_parameters=dict(rope or {"rope_type": "default"}, rope_theta=10000.0)),
                                  **extra))
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM._from_config(cfg, dtype=torch.bfloat16)
    biases = 0
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.02)  # about the spread of the sigmoid scores: both move the choice
                biases += 1
    assert biases == cfg.num_hidden_layers - cfg.first_k_dense_replace, biases
    model.save_pretrained(d, max_shard_size="100KB")


def gpt_oss_model(d, rope, extra):
    """A random bf16 GptOssForCausalLM: sinks, sliding and full layers (window 24 < T), biases on q/k/v/o, the
    router and the fused experts (all random: transformers starts the expert biases at zero), a swiglu_limit
    the activations cross, YaRN without truncation when rope is given."""
    cfg = GptOssConfig(**dict(dict(vocab_size=V, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                                   num_experts_per_tok=2, sliding_window=24, swiglu_limit=0.2,
                                   max_position_embeddings=256,
                                   rope_parameters=dict(rope or {"rope_type": "default"}, rope_theta=10000.0)),
                              **extra))
    torch.manual_seed(0)
    model = GptOssForCausalLM(cfg)
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name.endswith(("bias", "sinks")):
                t.normal_(0.0, 0.5)
    model.to(torch.bfloat16).save_pretrained(d, max_shard_size="100KB")


def file_dtypes(d):
    """{tensor name: safetensors dtype} over the model's .safetensors files in d (not a run's optimizer state)."""
    out = {}
    for f in sorted(os.listdir(d)):
        if f.startswith("model") and f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), "pt") as s:
                for k in s.keys():
                    out[k] = str(s.get_slice(k).get_dtype())
    return out


def case(name, rope, T=T, make=hf_model, **extra):
    if ONLY and name not in ONLY:
        return True
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    make(d, rope, extra)
    data = os.path.join(WORK, f"tokens{T}.bin")
    tokens_file(data, B * T + 1, seed=1)
    dump = os.path.join(WORK, name + ".logits.safetensors")
    flatpeak("eval", "--checkpoint", d, "--data", data, "--seq-len", str(T), "--batch", str(B), "--dump-logits", dump)
    ref = load_file(dump)
    ids = ref["input_ids"].long()
    theirs = hf_logits(d, ids)
    rel = ((theirs - ref["logits"]).abs().max() / theirs.abs().max()).item()
    # Round trip: flatpeak writes it back; transformers reads the same function.
    back = d + ".flatpeak"
    shutil.rmtree(back, ignore_errors=True)
    flatpeak("convert", "--checkpoint", d, "--out", back, "--shard-size", "200KB")
    same = torch.equal(hf_logits(back, ids), theirs)
    # ... in the dtypes it was read in, tensor by tensor (transformers' f32 routers stay f32).
    dtypes = file_dtypes(d)
    kept = file_dtypes(back) == dtypes
    # A fine-tune started from it loads in transformers.
    run = d + ".run"
    shutil.rmtree(run, ignore_errors=True)
    flatpeak("train", "--config", RUN_TOML, "--init-from", d, "--out", run, "--steps", "2", "--quiet",
             "--set", f"train.seq_len={T}", "--set", "train.batch_size=2")
    tuned = hf_logits(os.path.join(run, "checkpoint"), ids)
    loads = torch.isfinite(tuned).all().item() and file_dtypes(os.path.join(run, "checkpoint")) == dtypes
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    mix = ", ".join(f"{n} {t}" for t, n in sorted(collections.Counter(dtypes.values()).items()))
    ok = rel < 1e-4 and same and kept and loads
    print(f"{name}: {len(files)} shard(s) from save_pretrained ({mix}); flatpeak eval vs transformers logits "
          f"max-relative {rel:.2e}; written back by flatpeak convert: transformers logits identical: {same}, "
          f"dtypes kept: {kept}; train --init-from checkpoint loads (same dtypes): {loads} -> "
          f"{'OK' if ok else 'FAILED'}")
    return ok


os.makedirs(WORK, exist_ok=True)
import transformers  # noqa: E402

print(f"torch {torch.__version__}, transformers {transformers.__version__}")
def refused(name, rope, needle):
    """flatpeak eval must fail on this model, naming `needle` in its error."""
    if ONLY and name not in ONLY:
        return True
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    hf_model(d, rope, {})
    data = os.path.join(WORK, f"tokens{T}.bin")
    tokens_file(data, B * T + 1, seed=1)
    p = subprocess.run([BIN, "eval", "--checkpoint", d, "--data", data, "--seq-len", str(T), "--batch", str(B)],
                       capture_output=True, text=True)
    ok = p.returncode != 0 and needle in p.stderr
    print(f"{name}: refused naming '{needle}': {ok} -> {'OK' if ok else 'FAILED'}\n  {p.stderr.strip()[:300]}")
    return ok


results = [
    case("default", None),
    case("bias", None, attention_bias=True),
    case("tied", None, tie_word_embeddings=True),
    case("dense", None, num_hidden_layers=4, mlp_only_layers=[3], decoder_sparse_step=2),
    case("sliding", None, use_sliding_window=True, sliding_window=24),
    case("all", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}, attention_bias=True,
         tie_word_embeddings=True, num_hidden_layers=3, mlp_only_layers=[0], use_sliding_window=True,
         sliding_window=40),
    case("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    case("linear", {"rope_type": "linear", "factor": 2.0}),
    case("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32}),
    case("dynamic", {"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=24),
    # DeepSeek-V3: a query latent, interleaved RoPE, 2 of 4 groups, normalized top-k weights.
    case("deepseek", None, make=deepseek_model),
    # q_proj, rotate-half RoPE, one group, unnormalized weights, YaRN with mscale / mscale_all_dim (the
    # softmax scale grows too) over 96 positions, past the original 64.
    case("deepseek_noq_yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                               "mscale": 1.0, "mscale_all_dim": 1.0}, T=96, make=deepseek_model, q_lora_rank=None,
         rope_interleave=False, n_group=1, topk_group=1, norm_topk_prob=False),
    # gpt-oss: sinks, alternating sliding/full layers, biases, the clamped SwiGLU; fused experts in the files.
    case("gpt_oss", None, make=gpt_oss_model),
    case("gpt_oss_yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                          "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}, make=gpt_oss_model),
    refused("longrope_refused", {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                                 "original_max_position_embeddings": 32}, "longrope"),
]
print("interop (Hugging Face in): OK" if all(results) else "interop (Hugging Face in): FAILED")
sys.exit(0 if all(results) else 1)
