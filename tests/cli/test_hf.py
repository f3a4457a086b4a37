#!/usr/bin/env python3
"""End-to-end tests of reading Hugging Face Qwen3-MoE checkpoint directories (config.json plus
model.safetensors or a sharded model.safetensors.index.json) with `flatpeak eval` and
`flatpeak train --init-from`.

Cases:
  eval_matches_twin  a small random model written three ways -- transformers 4.x config.json with one
                     F32 file, 5.x config.json with three BF16 shards and an index, 4.x with one F16
                     file -- evaluates to the logits and loss of the PyTorch twin
                     (tests/reference/qwen3_moe_twin.py) run in float64 on the very values flatpeak
                     loaded (the bf16/f16-rounded weights); so do every RoPE type and the layer's switches
                     (attention biases, a sliding window, tied embeddings, dense layers) in both spellings
  refusals           every config.json value flatpeak does not implement (hidden_act, dynamic / longrope
                     RoPE, dynamic RoPE with two lengths, a rope key the rope_type does not read, a sliding window on 4.x's
                     max_window_layers, a dense layer past the last, model_type, an unknown key), a
                     tensor the model does not use, a missing tensor and a missing shard are refused:
                     exit 1, "error:" on stderr naming the key, tensor or file
  init_from          train --init-from a 5.x sharded BF16 directory with a run config without [model]:
                     the run starts from those weights, its checkpoint evaluates; a [model] key that
                     disagrees with config.json and --init-from with --resume are refused
  convert_round_trip flatpeak convert writes a BF16 directory back bit for bit (one file, shards, f32);
                     a DeepSeek-V3 directory as transformers 5's save_pretrained writes a bf16 model (its
                     config.json keys, BF16 weights with F32 routers) evaluates to the twin and comes back
                     through convert and train --init-from with every tensor in its own dtype

Needs torch (/usr/bin/python3 on Debian has it).

usage: test_hf.py --bin build/flatpeak --configs configs CASE
"""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))

import torch  # noqa: E402

import qwen3_moe_twin as twin  # noqa: E402
import safetensors_io  # noqa: E402

# The architecture of every case: 4 experts of 2 per token, head_dim = hidden / heads (so the 5.x
# spelling, which leaves head_dim out, describes the same model).
ARCH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, vocab_size=64, rope_theta=10000.0,
            rms_norm_eps=1e-6, norm_topk_prob=True, router_aux_loss_coef=0.001)
TORCH_DTYPE = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
DTYPE_NAME = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


# --- helpers -----------------------------------------------------------------------------------------

def run(a, args, check=True):
    p = subprocess.run([a.bin] + args, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"flatpeak {' '.join(args)} exited {p.returncode}\nstdout:\n{p.stdout}\n"
                             f"stderr:\n{p.stderr}")
    return p


def expect_refused(a, args, *needles):
    """flatpeak args exits 1 with an "error:" line on stderr that contains every needle."""
    p = run(a, args, check=False)
    err = p.stderr
    assert p.returncode == 1, f"flatpeak {' '.join(args)}: exit {p.returncode}, expected 1\nstdout:\n{p.stdout}\n" \
                              f"stderr:\n{err}"
    assert err.startswith("error:"), f"flatpeak {' '.join(args)}: stderr does not start with 'error:':\n{err}"
    first = err.split("\nhint:")[0]
    for n in needles:
        assert n in first, f"flatpeak {' '.join(args)}: the error does not name {n!r}:\n{err}"
    return err


def hf_config(arch, style, dtype="F32"):
    """config.json as transformers writes it: style "4.x" (num_experts, rope_theta, head_dim,
    rope_scaling null, torch_dtype) or "5.x" (num_local_experts, rope_parameters, no head_dim, dtype)."""
    c = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": arch.get("attention_bias", False),
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "decoder_sparse_step": arch.get("decoder_sparse_step", 1),
        "eos_token_id": 1,
        "hidden_act": "silu",
        "hidden_size": arch["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": arch.get("intermediate_size", 4 * arch["hidden_size"]),
        "max_position_embeddings": arch.get("max_position_embeddings", 4096),
        "max_window_layers": 0 if arch.get("sliding_window") else arch["num_hidden_layers"],
        "mlp_only_layers": arch.get("mlp_only_layers", []),
        "model_type": "qwen3_moe",
        "moe_intermediate_size": arch["moe_intermediate_size"],
        "norm_topk_prob": arch["norm_topk_prob"],
        "num_attention_heads": arch["num_attention_heads"],
        "num_experts_per_tok": arch["num_experts_per_tok"],
        "num_hidden_layers": arch["num_hidden_layers"],
        "num_key_value_heads": arch["num_key_value_heads"],
        "output_router_logits": False,
        "rms_norm_eps": arch["rms_norm_eps"],
        "router_aux_loss_coef": arch["router_aux_loss_coef"],
        "sliding_window": arch.get("sliding_window"),
        "tie_word_embeddings": arch.get("tie_word_embeddings", False),
        "use_cache": True,
        "use_sliding_window": arch.get("sliding_window") is not None,
        "vocab_size": arch["vocab_size"],
    }
    rope = arch.get("rope_scaling")  # None: default RoPE
    if style == "4.x":
        c.update(num_experts=arch["num_experts"], head_dim=arch["head_dim"], rope_theta=arch["rope_theta"],
                 rope_scaling=rope, torch_dtype=DTYPE_NAME[dtype], transformers_version="4.51.3")
    else:
        assert arch["head_dim"] == arch["hidden_size"] // arch["num_attention_heads"], "5.x leaves head_dim out"
        c.update(num_local_experts=arch["num_experts"],
                 rope_parameters=dict(rope or {"rope_type": "default"}, rope_theta=arch["rope_theta"]),
                 layer_types=["sliding_attention" if arch.get("sliding_window") else "full_attention"] *
                 arch["num_hidden_layers"], dtype=DTYPE_NAME[dtype], transformers_version="5.0.0")
        if arch.get("sliding_window"):
            del c["max_window_layers"]  # not a 5.x key: the window slides on every layer
    return dict(sorted(c.items()))


def twin_config(arch):
    return twin.Config(**{k: arch[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                "num_key_value_heads", "head_dim", "num_experts",
                                                "num_experts_per_tok", "moe_intermediate_size", "vocab_size",
                                                "rope_theta", "rms_norm_eps", "norm_topk_prob",
                                                "router_aux_loss_coef")},
                       rope_scaling=arch.get("rope_scaling"), attention_bias=arch.get("attention_bias", False),
                       tie_word_embeddings=arch.get("tie_word_embeddings", False),
                       use_sliding_window=arch.get("sliding_window") is not None,
                       sliding_window=arch.get("sliding_window"), mlp_only_layers=arch.get("mlp_only_layers", []),
                       decoder_sparse_step=arch.get("decoder_sparse_step", 1),
                       intermediate_size=arch.get("intermediate_size", 4 * arch["hidden_size"]),
                       max_position_embeddings=arch.get("max_position_embeddings", 4096))


def random_weights(arch, seed):
    """HF name -> float64 tensor: matrices N(0, 0.1^2), norm weights 1 + N(0, 0.1^2), biases N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in twin.param_shapes(twin_config(arch)).items():
        w = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        out[name] = 1.0 + w if len(shape) == 1 and not name.endswith(".bias") else w
    return out


def write_model(d, arch, weights, style="4.x", dtype="F32", shards=1, config_edit=None):
    """Writes a Hugging Face model directory d; returns the weights as flatpeak will read them
    (rounded to dtype), in float64. config_edit(dict) may change config.json before it is written."""
    os.makedirs(d, exist_ok=True)
    cfg = hf_config(arch, style, dtype)
    if config_edit is not None:
        config_edit(cfg)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    stored = {n: w.to(TORCH_DTYPE[dtype]) for n, w in weights.items()}
    if shards == 1:
        safetensors_io.save(os.path.join(d, "model.safetensors"), stored, {"format": "pt"})
    else:
        # transformers' layout: model-0000i-of-0000n.safetensors in model order, an index mapping each tensor.
        names = list(stored)
        per = -(-len(names) // shards)
        weight_map = {}
        for i in range(shards):
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: stored[n] for n in names[i * per:(i + 1) * per]}
            safetensors_io.save(os.path.join(d, file), part, {"format": "pt"})
            weight_map.update({n: file for n in part})
        total = sum(t.numel() * t.element_size() for t in stored.values())
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return {n: t.to(torch.float64) for n, t in stored.items()}


def header_dtypes(path):
    """The dtypes of the tensors in a safetensors file, from its header."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def write_tokens(path, tokens):
    """llm.c's token file: a 1024-byte header of int32 (magic, version, count, zeros), uint16 tokens."""
    import struct
    with open(path, "wb") as f:
        f.write(struct.pack("<3i", 20240520, 1, len(tokens)) + bytes(4 * 253))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def random_tokens(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def eval_args(d, data, tmp, T, B, tag):
    out_json, logits = os.path.join(tmp, tag + ".json"), os.path.join(tmp, tag + ".logits.safetensors")
    return ["eval", "--checkpoint", d, "--data", data, "--seq-len", str(T), "--batch", str(B), "--json", out_json,
            "--dump-logits", logits], out_json, logits


# --- cases -------------------------------------------------------------------------------------------

def eval_matches_twin(a, tmp):
    """Three spellings of one random model; logits and loss match the float64 twin on the loaded values."""
    T, B = 32, 2
    tokens = random_tokens(B * T + 1, ARCH["vocab_size"], seed=7)
    data = os.path.join(tmp, "tokens.bin")
    write_tokens(data, tokens)
    weights = random_weights(ARCH, seed=1)
    # Each variant also sets norm_topk_prob, rope_theta and rms_norm_eps (all written into config.json)
    # so that a key read from the wrong place, or replaced by its default, changes the logits.
    # RoPE scaling (Note [RoPE scaling as transformers computes it]) at a short original context so that
    # 32 positions reach the scaled frequencies: YaRN (default and DeepSeek's mscale attention factor),
    # linear, llama3.
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    yarn_ds = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16, "mscale": 1.0,
               "mscale_all_dim": 0.707, "beta_fast": 16}
    linear = {"rope_type": "linear", "factor": 2.5}
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 32}
    # The layer's switches, all at once: a window shorter than T, dense layers from mlp_only_layers and
    # from decoder_sparse_step (layer 0: (0 + 1) % 2 != 0; layer 2: listed), with biases and tied embeddings.
    layers = dict(num_hidden_layers=4, attention_bias=True, tie_word_embeddings=True, sliding_window=12,
                  mlp_only_layers=[2], decoder_sparse_step=2, intermediate_size=24)
    variants = [  # (tag, config style, dtype, shards, norm_topk_prob, rope_theta, rms_norm_eps, rope scaling)
        ("f32_4x_single", "4.x", "F32", 1, True, 10000.0, 1e-6, None),
        ("layers_4x", "4.x", "F32", 1, True, 10000.0, 1e-6, None, layers),
        ("layers_yarn_5x", "5.x", "BF16", 3, True, 10000.0, 1e-6, yarn, layers),
        ("bf16_5x_sharded", "5.x", "BF16", 3, False, 1000.0, 1e-6, None),
        ("f16_4x_single", "4.x", "F16", 1, True, 1e6, 1e-5, None),
        ("yarn_4x", "4.x", "F32", 1, True, 10000.0, 1e-6, yarn),
        ("yarn_mscale_5x", "5.x", "F32", 1, True, 10000.0, 1e-6, yarn_ds),
        ("linear_5x", "5.x", "F32", 1, True, 10000.0, 1e-6, linear),
        ("llama3_4x", "4.x", "F32", 1, True, 10000.0, 1e-6, llama3),
        # dynamic NTK past max_position_embeddings = 16 < T: the base grows with the sequence
        ("dynamic_5x", "5.x", "F32", 1, True, 10000.0, 1e-6, {"rope_type": "dynamic", "factor": 2.0},
         {"max_position_embeddings": 16}),
        ("dynamic_4x", "4.x", "F32", 1, True, 10000.0, 1e-6, {"type": "dynamic", "factor": 3.0},
         {"max_position_embeddings": 20}),
    ]
    for tag, style, dtype, shards, topk, theta, eps, rope, *switches in variants:
        arch = dict(ARCH, norm_topk_prob=topk, rope_theta=theta, rms_norm_eps=eps, rope_scaling=rope,
                    **(switches[0] if switches else {}))
        d = os.path.join(tmp, tag)
        w = random_weights(arch, seed=1) if switches else weights
        loaded = write_model(d, arch, w, style, dtype, shards)
        if shards > 1:
            assert len([f for f in os.listdir(d) if f.endswith(".safetensors")]) == shards, os.listdir(d)
        args, out_json, out_logits = eval_args(d, data, tmp, T, B, tag)
        run(a, args)
        dump, _ = safetensors_io.load(out_logits)
        ids, tgt, logits = dump["input_ids"].long(), dump["targets"].long(), dump["logits"].to(torch.float64)
        # The batch is the token file's first B windows of T (targets shifted by one).
        want_ids = torch.tensor([tokens[r * T:(r + 1) * T] for r in range(B)])
        want_tgt = torch.tensor([tokens[r * T + 1:(r + 1) * T + 1] for r in range(B)])
        assert torch.equal(ids, want_ids), f"{tag}: dumped input_ids are not the token file's windows"
        assert torch.equal(tgt, want_tgt), f"{tag}: dumped targets are not the token file's windows shifted by one"
        with torch.no_grad():
            ref = twin.forward(loaded, twin_config(arch), ids, tgt)
        rl = ref["logits"]
        assert logits.shape == rl.shape, f"{tag}: logits {tuple(logits.shape)} vs twin {tuple(rl.shape)}"
        rel = ((logits - rl).abs().max() / rl.abs().max()).item()
        assert rel < 1e-4, f"{tag}: max |logits - twin| / max |twin| = {rel:.3e} (>= 1e-4)"
        got = json.load(open(out_json))
        ce = ref["ce_loss"].item()
        assert got["tokens"] == B * T and got["sequences"] == B and got["seq_len"] == T, got
        loss_rel = abs(got["loss"] - ce) / abs(ce)
        assert loss_rel < 1e-4, f"{tag}: eval loss {got['loss']!r} vs twin cross-entropy {ce!r} (relative {loss_rel:.2e})"
        # The rounded weights must differ from float32's, else the bf16/f16 variants tested nothing new.
        if dtype != "F32":
            off = max((loaded[n] - w[n].to(torch.float32).to(torch.float64)).abs().max().item() for n in w)
            assert off > 0, f"{tag}: the {dtype} weights equal the float32 ones"
        print(f"{tag}: logits rel diff {rel:.2e}, loss {got['loss']:.6f} vs twin {ce:.6f} (rel {loss_rel:.1e}), "
              f"tokens per expert {ref['expert_counts']}")


def refusals(a, tmp):
    """Each unimplemented config.json key, an unused tensor, a missing tensor and a missing shard."""
    T, B = 8, 1
    data = os.path.join(tmp, "tokens.bin")
    write_tokens(data, random_tokens(T + 1, ARCH["vocab_size"], seed=3))
    weights = random_weights(ARCH, seed=2)

    def eval_of(d):
        return ["eval", "--checkpoint", d, "--data", data, "--seq-len", str(T), "--batch", str(B)]

    # The unchanged directories evaluate, so every refusal below is the one change's doing.
    for style in ("4.x", "5.x"):
        d = os.path.join(tmp, "ok_" + style)
        write_model(d, ARCH, weights, style)
        run(a, eval_of(d))

    def setter(**kv):
        return lambda c: c.update(kv)

    cases = [  # (tag, config style, edit, strings the error must name)
        ("hidden_act", "4.x", setter(hidden_act="gelu"), ["hidden_act"]),
        ("max_window_layers", "4.x", setter(use_sliding_window=True, sliding_window=16, max_window_layers=1),
         ["max_window_layers"]),
        ("sliding_window_null", "4.x", setter(use_sliding_window=True, sliding_window=None), ["sliding_window"]),
        ("layer_types_mixed", "5.x", setter(layer_types=["full_attention", "sliding_attention"]), ["layer_types"]),
        ("rope_scaling_dynamic_other_max", "4.x",
         setter(rope_scaling={"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}),
         ["rope_scaling", "original_max_position_embeddings"]),
        ("rope_parameters_longrope", "5.x",
         setter(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "factor": 4.0}),
         ["rope_parameters", "longrope"]),
        ("rope_scaling_yarn_unknown_key", "4.x",
         setter(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                              "low_freq_factor": 1.0}),
         ["rope_scaling", "low_freq_factor", "yarn"]),
        ("rope_parameters_llama3_incomplete", "5.x",
         setter(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}),
         ["rope_parameters", "llama3"]),
        ("rope_scaling_factor_below_one", "4.x", setter(rope_scaling={"rope_type": "linear", "factor": 0.5}),
         ["rope_scaling", "factor"]),
        ("mlp_only_layers_past_last", "4.x", setter(mlp_only_layers=[5]), ["mlp_only_layers"]),
        ("decoder_sparse_step_zero", "4.x", setter(decoder_sparse_step=0), ["decoder_sparse_step"]),
        ("no_moe_layer", "4.x", setter(mlp_only_layers=[0, 1]), ["no MoE layer"]),
        ("model_type", "4.x", setter(model_type="mixtral"), ["model_type", "mixtral"]),
        # A Qwen3-MoE config relabelled deepseek_v3 (a model_type flatpeak reads): its class is refused.
        ("model_type_deepseek_v3", "4.x", setter(model_type="deepseek_v3"), ["architectures", "DeepseekV3ForCausalLM"]),
        ("unknown_key", "4.x", setter(foo_bar=1), ["unknown key", "foo_bar"]),
        ("unknown_key_5x", "5.x", setter(foo_bar=1), ["unknown key", "foo_bar"]),
    ]
    for tag, style, edit, needles in cases:
        d = os.path.join(tmp, tag)
        write_model(d, ARCH, weights, style, config_edit=edit)
        expect_refused(a, eval_of(d), *needles)
        print(f"refused: {tag}")

    # A tensor the model does not use (an attention bias while attention_bias is false) is named, not dropped.
    d = os.path.join(tmp, "extra_tensor")
    extra = dict(weights)
    extra["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(ARCH["num_attention_heads"] * ARCH["head_dim"],
                                                                dtype=torch.float64)
    write_model(d, ARCH, extra)
    expect_refused(a, eval_of(d), "model.layers.0.self_attn.q_proj.bias")
    print("refused: extra_tensor")

    # A missing tensor is named, with the config.json key that implies it.
    gone = "model.layers.1.mlp.experts.3.down_proj.weight"
    d = os.path.join(tmp, "missing_tensor")
    write_model(d, ARCH, {n: w for n, w in weights.items() if n != gone})
    expect_refused(a, eval_of(d), gone, f"num_experts = {ARCH['num_experts']}")
    print("refused: missing_tensor")

    # A shard the index names but the directory lacks is named.
    d = os.path.join(tmp, "missing_shard")
    write_model(d, ARCH, weights, "5.x", "BF16", shards=3)
    shard = "model-00002-of-00003.safetensors"
    os.remove(os.path.join(d, shard))
    expect_refused(a, eval_of(d), shard)
    print("refused: missing_shard")


def init_from(a, tmp):
    """train --init-from a 5.x sharded BF16 directory, its checkpoint evaluates; the refusals."""
    d = os.path.join(tmp, "hf")
    weights = random_weights(ARCH, seed=4)
    loaded = write_model(d, ARCH, weights, "5.x", "BF16", shards=3)
    # The run config: configs/tiny.toml without its [model] table, a small recall run.
    tiny = open(os.path.join(a.configs, "tiny.toml")).read()
    no_model = re.sub(r"(?ms)^\[model\]\n.*?(?=^\[)", "", tiny)
    assert not re.search(r"(?m)^(\[model\]|hidden_size)", no_model) and "[train]" in no_model, no_model
    run_toml = os.path.join(tmp, "run.toml")
    with open(run_toml, "w") as f:
        f.write(no_model)
    small = ["--set", "train.seq_len=64", "--set", "train.batch_size=2"]
    out = os.path.join(tmp, "out")
    run(a, ["train", "--config", run_toml, "--init-from", d, "--out", out, "--steps", "2", "--quiet"] + small)

    with open(os.path.join(out, "metrics.jsonl")) as f:
        m = [json.loads(l) for l in f if l.strip()]
    assert [r["step"] for r in m] == [1, 2], m
    assert math.isfinite(m[0]["loss"]), f"step-1 loss {m[0]['loss']!r} is not finite"

    # The run started from d's weights: two steps at the first warmup learning rates move them little,
    # far less than the distance between two independent random models (~0.14).
    ck = os.path.join(out, "checkpoint")
    trained, _ = safetensors_io.load(os.path.join(ck, "model.safetensors"))
    assert set(trained) == set(loaded), sorted(set(trained) ^ set(loaded))
    moved = max((trained[n].to(torch.float64) - loaded[n]).abs().max().item() for n in loaded)
    assert moved < 0.01, f"the trained weights are {moved:.3g} from --init-from's: not started from them?"

    # The run's checkpoint (its config.json written by flatpeak) loads back through eval.
    # Its config.json is the --init-from one, key for key, with use_cache true and the dtype written.
    saved = json.load(open(os.path.join(ck, "config.json")))
    original = json.load(open(os.path.join(d, "config.json")))
    assert saved == dict(original, use_cache=True, dtype="bfloat16"), (saved, original)
    data = os.path.join(tmp, "tokens.bin")
    write_tokens(data, random_tokens(2 * 64 + 1, ARCH["vocab_size"], seed=5))
    out_json = os.path.join(tmp, "eval.json")
    run(a, ["eval", "--checkpoint", out, "--data", data, "--seq-len", "64", "--batch", "2", "--json", out_json])
    loss = json.load(open(out_json))["loss"]
    assert math.isfinite(loss) and 0 < loss < 3 * math.log(ARCH["vocab_size"]), loss
    print(f"init_from: step-1 loss {m[0]['loss']:.4f}, weights moved {moved:.2e}, eval of the checkpoint {loss:.4f}")

    # Note [Checkpoint dtype and shards]: a BF16 input is written back in BF16 with its own config keys
    # (the 5.x spellings here), use_cache true, and the f32 master weights in optimizer.safetensors.
    assert header_dtypes(os.path.join(ck, "model.safetensors")) == {"BF16"}, "weights not written back in bf16"
    assert "num_local_experts" in saved and "rope_parameters" in saved and "num_experts" not in saved, saved
    opt, _ = safetensors_io.load(os.path.join(ck, "optimizer.safetensors"))
    masters = [n for n in opt if n.endswith(".master")]
    assert len(masters) == len(loaded) and all(opt[n].dtype == torch.float32 for n in masters), len(masters)
    for n in loaded:  # the bf16 file is the master rounded to nearest even
        assert torch.equal(opt[n + ".master"].to(torch.bfloat16), trained[n].to(torch.bfloat16)), n

    # Sharded output (--shard-size) loads back, and a resume across a bf16 checkpoint is bit-exact:
    # 2 + 2 steps give the same master weights, moments and losses as 4 straight.
    straight, split = os.path.join(tmp, "straight"), os.path.join(tmp, "split")
    base = ["train", "--config", run_toml, "--quiet", "--shard-size", "20KB"] + small
    run(a, base + ["--init-from", d, "--out", straight, "--steps", "4"])
    run(a, base + ["--init-from", d, "--out", split, "--steps", "4", "--stop-after", "2"])
    run(a, base + ["--resume", split, "--out", split, "--steps", "4"])
    for o in (straight, split):
        index = json.load(open(os.path.join(o, "checkpoint", "model.safetensors.index.json")))
        files = sorted(set(index["weight_map"].values()))
        assert len(files) > 1 and set(index["weight_map"]) == set(loaded), files
        assert all(header_dtypes(os.path.join(o, "checkpoint", f)) == {"BF16"} for f in files), files
    o1, _ = safetensors_io.load(os.path.join(straight, "checkpoint", "optimizer.safetensors"))
    o2, _ = safetensors_io.load(os.path.join(split, "checkpoint", "optimizer.safetensors"))
    assert set(o1) == set(o2) and all(torch.equal(o1[n], o2[n]) for n in o1), "resume across bf16 not bit-exact"
    l1 = [json.loads(l)["loss"] for l in open(os.path.join(straight, "metrics.jsonl")) if l.strip()]
    l2 = [json.loads(l)["loss"] for l in open(os.path.join(split, "metrics.jsonl")) if l.strip()]
    assert l1 == l2, (l1, l2)
    run(a, ["eval", "--checkpoint", split, "--data", data, "--seq-len", "64", "--batch", "2"])
    print(f"init_from: bf16 written back ({len(files)} shards), resume across it bit-exact")

    # A [model] key that disagrees with the checkpoint's config.json is refused by name.
    bad_toml = os.path.join(tmp, "bad.toml")
    with open(bad_toml, "w") as f:
        f.write("[model]\nhidden_size = 64\n\n" + no_model)
    expect_refused(a, ["train", "--config", bad_toml, "--init-from", d, "--out", os.path.join(tmp, "bad"),
                       "--steps", "2", "--quiet"] + small,
                   "[model] disagrees with the checkpoint's config.json", "hidden_size")
    # So is a disagreeing key given with --set.
    expect_refused(a, ["train", "--config", run_toml, "--init-from", d, "--out", os.path.join(tmp, "bad2"),
                       "--steps", "2", "--quiet", "--set", "model.num_experts=8"] + small,
                   "disagrees with the checkpoint's config.json", "num_experts")
    # RoPE scaling is part of the architecture: a run config that scales RoPE differently is refused.
    rope_toml = os.path.join(tmp, "rope.toml")
    with open(rope_toml, "w") as f:
        f.write('[model]\nrope_scaling = { rope_type = "linear", factor = 2.0 }\n\n' + no_model)
    expect_refused(a, ["train", "--config", rope_toml, "--init-from", d, "--out", os.path.join(tmp, "bad3"),
                       "--steps", "1", "--quiet"] + small, "disagrees with the checkpoint's config.json", "rope_scaling")
    # A [model] table that agrees is accepted (keys it leaves out come from config.json).
    ok_toml = os.path.join(tmp, "ok.toml")
    with open(ok_toml, "w") as f:
        f.write("[model]\nhidden_size = 32\nnum_experts = 4\n\n" + no_model)
    run(a, ["train", "--config", ok_toml, "--init-from", d, "--out", os.path.join(tmp, "ok"), "--steps", "1",
            "--quiet"] + small)
    # --init-from and --resume together are refused.
    expect_refused(a, ["train", "--config", run_toml, "--init-from", d, "--resume", out, "--out", out,
                       "--steps", "3", "--quiet"] + small, "--init-from", "--resume")
    print("init_from: disagreeing [model] and --init-from with --resume refused")


def convert_round_trip(a, tmp):
    """flatpeak convert: a 5.x sharded BF16 directory read strictly and written back loses nothing: the
    same tensors bit for bit, the same config keys (use_cache true, dtype as written); resharded and
    widened to f32 exactly; an existing --out is refused."""
    d = os.path.join(tmp, "hf")
    loaded = write_model(d, ARCH, random_weights(ARCH, seed=9), "5.x", "BF16", shards=3)
    src, _ = load_dir(d)
    one = os.path.join(tmp, "one")
    run(a, ["convert", "--checkpoint", d, "--out", one])
    got, files = load_dir(one)
    assert files == ["model.safetensors"], files
    assert header_dtypes(os.path.join(one, "model.safetensors")) == {"BF16"}
    assert set(got) == set(src) and all(torch.equal(got[n], src[n]) for n in src), "bf16 tensors changed"
    original = json.load(open(os.path.join(d, "config.json")))
    assert json.load(open(os.path.join(one, "config.json"))) == dict(original, use_cache=True, dtype="bfloat16")
    # Resharded at 20KB and back: still the same bits.
    sharded, back = os.path.join(tmp, "sharded"), os.path.join(tmp, "back")
    run(a, ["convert", "--checkpoint", one, "--out", sharded, "--shard-size", "20KB"])
    run(a, ["convert", "--checkpoint", sharded, "--out", back])
    mid, mid_files = load_dir(sharded)
    assert len(mid_files) > 1 and all(torch.equal(mid[n], src[n]) for n in src), mid_files
    again, _ = load_dir(back)
    assert all(torch.equal(again[n], src[n]) for n in src)
    # Widened to f32: exactly the bf16 values.
    wide = os.path.join(tmp, "f32")
    run(a, ["convert", "--checkpoint", d, "--out", wide, "--dtype", "f32"])
    w, _ = load_dir(wide)
    assert all(w[n].dtype == torch.float32 and torch.equal(w[n].to(torch.float64), loaded[n]) for n in src)
    assert json.load(open(os.path.join(wide, "config.json")))["dtype"] == "float32"
    expect_refused(a, ["convert", "--checkpoint", d, "--out", one], "already exists")
    print(f"convert_round_trip: {len(src)} bf16 tensors bit-identical through 1 file, {len(mid_files)} shards, back")
    deepseek_f32_routers(a, tmp)


# config.json as transformers 5.24's save_pretrained writes it for a DeepseekV3ForCausalLM (the keys of
# scripts/interop_hf_in.py's case deepseek, which checks this spelling against transformers itself): the
# derived head_dim (the RoPE width) and qk_head_dim, num_nextn_predict_layers (its num_mtp_layers),
# pretraining_tp, output_router_logits, rope_parameters and dtype.
DEEPSEEK = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "dtype": "bfloat16", "eos_token_id": 1, "first_k_dense_replace": 1, "head_dim": 4,
    "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02, "intermediate_size": 48,
    "kv_lora_rank": 12, "max_position_embeddings": 256, "model_type": "deepseek_v3", "moe_intermediate_size": 16,
    "n_group": 2, "n_routed_experts": 4, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 4,
    "num_experts_per_tok": 2, "num_hidden_layers": 2, "num_key_value_heads": 4, "num_nextn_predict_layers": 1,
    "output_router_logits": False, "pad_token_id": None, "pretraining_tp": 1, "q_lora_rank": 16,
    "qk_head_dim": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "rms_norm_eps": 1e-06,
    "rope_interleave": True, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "routed_scaling_factor": 2.5, "tie_word_embeddings": False, "topk_group": 1, "transformers_version": "5.24.0",
    "use_cache": True, "v_head_dim": 6, "vocab_size": 64}


def deepseek_f32_routers(a, tmp):
    """Note [Tensors transformers keeps in f32] (src/train/checkpoint.cpp): transformers keeps DeepSeek-V3's
    routers (mlp.gate.weight, mlp.gate.e_score_correction_bias) in float32 in a bf16 model, so its files mix
    F32 and BF16. Such a directory evaluates to the twin's logits on the loaded values, and convert and
    train --init-from write every tensor back in its own dtype: the routers in F32, bit for bit (the bias is
    not rounded to bf16), the rest BF16, config.json's dtype bfloat16."""
    T, B = 32, 2
    d = os.path.join(tmp, "deepseek")
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(DEEPSEEK, f, indent=2)
    cfg = twin.Config.from_dict(dict(DEEPSEEK, rope_theta=10000.0))  # the twin reads 4.x's rope_theta
    g = torch.Generator().manual_seed(11)
    stored = {}
    for name, shape in twin.param_shapes(cfg).items():
        w = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith("e_score_correction_bias"):
            stored[name] = (0.02 * torch.randn(shape, generator=g, dtype=torch.float64)).to(torch.float32)
        elif name.endswith(".mlp.gate.weight"):
            stored[name] = w.to(torch.float32)
        else:
            stored[name] = (1.0 + w if len(shape) == 1 else w).to(torch.bfloat16)
    f32 = sorted(n for n, t in stored.items() if t.dtype == torch.float32)
    assert len(f32) == 2 and any(t.to(torch.bfloat16).to(torch.float32).ne(t).any() for n, t in stored.items()
                                 if n in f32), "the f32 routers must not be bf16 values"
    safetensors_io.save(os.path.join(d, "model.safetensors"), stored, {"format": "pt"})
    loaded = {n: t.to(torch.float64) for n, t in stored.items()}

    tokens = random_tokens(B * T + 1, DEEPSEEK["vocab_size"], seed=12)
    data = os.path.join(tmp, "deepseek_tokens.bin")
    write_tokens(data, tokens)
    args, _, out_logits = eval_args(d, data, tmp, T, B, "deepseek")
    run(a, args)
    dump, _ = safetensors_io.load(out_logits)
    with torch.no_grad():
        ref = twin.forward(loaded, cfg, dump["input_ids"].long(), dump["targets"].long())["logits"]
    rel = ((dump["logits"].to(torch.float64) - ref).abs().max() / ref.abs().max()).item()
    assert rel < 1e-4, f"deepseek: max |logits - twin| / max |twin| = {rel:.3e} (>= 1e-4)"

    def same_dtypes_and_bits(got, what):
        assert set(got) == set(stored), (what, sorted(set(got) ^ set(stored)))
        changed = [n for n in stored if got[n].dtype != stored[n].dtype]
        assert not changed, f"{what}: {changed[:4]} not written back in their dtype"
        return [n for n in stored if not torch.equal(got[n], stored[n])]

    back = os.path.join(tmp, "deepseek_back")
    run(a, ["convert", "--checkpoint", d, "--out", back])
    got, _ = load_dir(back)
    diff = same_dtypes_and_bits(got, "convert")
    assert not diff, f"convert changed {diff[:4]}"
    assert json.load(open(os.path.join(back, "config.json"))) == DEEPSEEK
    ck = train_init_from(a, tmp, d, "deepseek", T)
    trained, _ = safetensors_io.load(os.path.join(ck, "model.safetensors"))
    same_dtypes_and_bits(trained, "train --init-from")
    assert json.load(open(os.path.join(ck, "config.json")))["dtype"] == "bfloat16"
    print(f"deepseek_f32_routers: logits rel diff {rel:.2e} vs twin; {len(f32)} F32 router tensors and "
          f"{len(stored) - len(f32)} BF16 tensors kept by convert (bit for bit) and train --init-from")


# config.json as transformers 5.25's save_pretrained writes a GptOssForCausalLM (bf16): layer_types, YaRN with
# truncate = false in rope_parameters, the clamped SwiGLU's numbers; a window shorter than the sequence.
GPTOSS = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "bos_token_id": None,
    "dtype": "bfloat16", "eos_token_id": None, "head_dim": 8, "hidden_act": "silu", "hidden_size": 32,
    "initializer_range": 0.02, "intermediate_size": 64, "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 4, "num_experts_per_tok": 2,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "num_local_experts": 4, "output_router_logits": False,
    "pad_token_id": None, "rms_norm_eps": 1e-05,
    "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0, "original_max_position_embeddings": 16,
                        "rope_theta": 10000.0, "rope_type": "yarn", "truncate": False},
    "router_aux_loss_coef": 0.001, "sliding_window": 8, "swiglu_alpha": 1.702, "swiglu_limit": 0.3,
    "tie_word_embeddings": False, "transformers_version": "5.25.0", "use_cache": True, "vocab_size": 64}
MXFP4 = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                    "lm_head"], "quant_method": "mxfp4"}
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_dequantize(blocks, scales):
    """MXFP4 as the gpt-oss files hold it, written out here: blocks (E, R, G, 16) uint8, scales (E, R, G) uint8
    -> (E, G * 32, R) float64; byte b of group g holds values 2b (low nibble) and 2b + 1 (high), each
    FP4[nibble] * 2^(scale - 127)."""
    E, R, G, _ = blocks.shape
    lut = torch.tensor(FP4, dtype=torch.float64)
    b = blocks.long()
    vals = torch.stack([lut[b & 15], lut[b >> 4]], dim=-1).reshape(E, R, G, 32)
    vals = vals * torch.pow(2.0, scales.double() - 127)[..., None]
    return vals.reshape(E, R, G * 32).transpose(1, 2).contiguous()


def gpt_oss_checkpoints(a, tmp):
    """A gpt-oss directory as transformers writes it (each layer's experts fused, gate and up interleaved:
    Note [gpt-oss's experts in files] in src/train/fused_experts.h), in BF16 and with MXFP4 experts as the
    published files hold them, evaluates to the twin's logits on the values flatpeak loaded; convert writes
    the BF16 directory back bit for bit (the MXFP4 one as BF16, its values the dequantized ones exactly, no
    quantization_config), and train --init-from runs from it."""
    T, B = 32, 2
    cfg = twin.Config.from_dict(GPTOSS)
    g = torch.Generator().manual_seed(21)
    flat = {}
    for name, shape in twin.param_shapes(cfg).items():
        w = 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith(".sinks"):
            w = torch.randn(shape, generator=g, dtype=torch.float64)
        flat[name] = 1.0 + w if len(shape) == 1 and name.endswith("norm.weight") else w
    hf = twin.gptoss_flat_to_hf(flat, cfg)
    stored = {n: t.detach().to(torch.bfloat16) for n, t in hf.items()}
    tokens = random_tokens(B * T + 1, GPTOSS["vocab_size"], seed=22)
    data = os.path.join(tmp, "gptoss_tokens.bin")
    write_tokens(data, tokens)

    def write(d, tensors, config):
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        safetensors_io.save(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})

    def eval_vs_twin(d, hf_values, tag):
        args, _, out_logits = eval_args(d, data, tmp, T, B, tag)
        run(a, args)
        dump, _ = safetensors_io.load(out_logits)
        loaded = {n: t.to(torch.float64) for n, t in twin.gptoss_hf_to_flat(hf_values, cfg).items()}
        with torch.no_grad():
            ref = twin.forward(loaded, cfg, dump["input_ids"].long(), dump["targets"].long())["logits"]
        rel = ((dump["logits"].to(torch.float64) - ref).abs().max() / ref.abs().max()).item()
        assert rel < 1e-4, f"{tag}: max |logits - twin| / max |twin| = {rel:.3e} (>= 1e-4)"
        return rel

    d = os.path.join(tmp, "gptoss")
    write(d, stored, GPTOSS)
    rel = eval_vs_twin(d, {n: t.to(torch.float64) for n, t in stored.items()}, "gptoss")
    back = os.path.join(tmp, "gptoss_back")
    run(a, ["convert", "--checkpoint", d, "--out", back])
    got, _ = load_dir(back)
    assert set(got) == set(stored), sorted(set(got) ^ set(stored))
    diff = [n for n in stored if got[n].dtype != torch.bfloat16 or not torch.equal(got[n], stored[n])]
    assert not diff, f"convert changed {diff[:4]}"
    assert json.load(open(os.path.join(back, "config.json"))) == GPTOSS

    # MXFP4 experts: scales 2^-8 .. 2^-3 (values up to 6 x that), the rest BF16 as published.
    quant = {n: t for n, t in stored.items() if not n.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    deq = dict(quant)
    E, H, I = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    for l in range(cfg.num_hidden_layers):
        for kind, R, C in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            name = f"model.layers.{l}.mlp.experts.{kind}"
            blocks = torch.randint(0, 256, (E, R, C // 32, 16), generator=g, dtype=torch.uint8)
            scales = torch.randint(119, 125, (E, R, C // 32), generator=g, dtype=torch.uint8)
            quant[name + "_blocks"], quant[name + "_scales"] = blocks, scales
            deq[name] = mxfp4_dequantize(blocks, scales).to(torch.bfloat16)  # exact: FP4 x 2^k is a bf16 value
    dq = os.path.join(tmp, "gptoss_mxfp4")
    write(dq, quant, dict(GPTOSS, quantization_config=MXFP4))
    rel_q = eval_vs_twin(dq, {n: t.to(torch.float64) for n, t in deq.items()}, "gptoss_mxfp4")
    back_q = os.path.join(tmp, "gptoss_mxfp4_back")
    run(a, ["convert", "--checkpoint", dq, "--out", back_q])
    got, _ = load_dir(back_q)
    assert set(got) == set(deq), sorted(set(got) ^ set(deq))
    diff = [n for n in deq if not torch.equal(got[n], deq[n])]
    assert not diff, f"convert of the MXFP4 directory: {diff[:4]} differ from the dequantized values"
    assert "quantization_config" not in json.load(open(os.path.join(back_q, "config.json")))

    # The load-balancing weight is the run's to choose (the published gpt-oss files say 0.9): the checkpoint
    # says what it trained with; any other [model] key must agree (init_from).
    ck = train_init_from(a, tmp, dq, "gptoss", T, ["--set", "model.router_aux_loss_coef=0.0"])
    trained, _ = safetensors_io.load(os.path.join(ck, "model.safetensors"))
    assert set(trained) == set(deq), sorted(set(trained) ^ set(deq))
    assert GPTOSS["router_aux_loss_coef"] != 0.0
    assert json.load(open(os.path.join(ck, "config.json")))["router_aux_loss_coef"] == 0.0
    print(f"gpt_oss_checkpoints: logits rel diff {rel:.2e} (bf16) and {rel_q:.2e} (MXFP4) vs twin; convert bit for "
          f"bit; train --init-from the MXFP4 directory wrote {len(trained)} fused tensors")


def train_init_from(a, tmp, d, tag, T, extra=()):
    """flatpeak train --init-from d for 2 steps with tiny.toml's run settings (its [model] left out: the model
    comes from d), extra arguments added; returns the run's checkpoint directory."""
    run_toml = os.path.join(tmp, f"{tag}_run.toml")
    with open(run_toml, "w") as f:
        f.write(re.sub(r"(?ms)^\[model\]\n.*?(?=^\[)", "", open(os.path.join(a.configs, "tiny.toml")).read()))
    out = os.path.join(tmp, f"{tag}_run")
    run(a, ["train", "--config", run_toml, "--init-from", d, "--out", out, "--steps", "2", "--quiet",
            "--set", f"train.seq_len={T}", "--set", "train.batch_size=2", *extra])
    return os.path.join(out, "checkpoint")


def load_dir(d):
    """All tensors of a model directory (one file or shards) and the sorted weight file names."""
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    out = {}
    for f in files:
        t, _ = safetensors_io.load(os.path.join(d, f))
        out.update(t)
    return out, files


CASES = {f.__name__: f for f in (eval_matches_twin, refusals, init_from, convert_round_trip, gpt_oss_checkpoints)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("case", choices=sorted(CASES))
    a = ap.parse_args()
    a.bin = os.path.abspath(a.bin)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="flatpeak_hf_") as tmp:
        CASES[a.case](a, tmp)
    print(f"{a.case}: ok")


if __name__ == "__main__":
    sys.exit(main())
