"""Hugging Face models into flatpeak, checked against transformers itself (run by scripts/interop with
the PyPI torch + transformers of .venv-interop; not part of scripts/test).

For each case, transformers makes a random Qwen3MoeForCausalLM, casts it to bfloat16 and writes it with
save_pretrained (its own config.json spelling, sharded by max_shard_size). Then:
  1. `flatpeak eval --checkpoint DIR --dump-logits` gives the logits of transformers (the model loaded in
     float32 from the same bf16 weights) within 1e-4 max-relative;
  2. `flatpeak convert --checkpoint DIR --out DIR2` writes it back (bf16, flatpeak's shards), and
     transformers loads DIR2 to the very same logits (bit-identical weights);
  3. `flatpeak train --init-from DIR` runs 2 steps and its checkpoint loads in transformers.
Cases: default RoPE, YaRN, linear and llama3 RoPE scaling (Note [RoPE scaling as transformers computes
it] in src/model/rope_scaling.h).

usage: interop_hf_in.py FLATPEAK_BIN WORK_DIR RUN_CONFIG_WITHOUT_MODEL
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import torch
from safetensors.torch import load_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

BIN, WORK, RUN_TOML = sys.argv[1:4]
T, B, V = 64, 2, 128


def flatpeak(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"flatpeak {' '.join(args)} failed:\n{p.stderr}")
    return p


def hf_logits(d, ids):
    model = Qwen3MoeForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


def tokens_file(path, n, seed):
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(0, V, (n,), generator=g).tolist()
    header = [20240520, 1, n] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack(f"<{n}H", *toks))


def case(name, rope):
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    cfg = Qwen3MoeConfig(vocab_size=V, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=256,
                         rope_theta=10000.0, rope_scaling=rope)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(d, max_shard_size="100KB")
    data = os.path.join(WORK, "tokens.bin")
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
    # A fine-tune started from it loads in transformers.
    run = d + ".run"
    shutil.rmtree(run, ignore_errors=True)
    flatpeak("train", "--config", RUN_TOML, "--init-from", d, "--out", run, "--steps", "2", "--quiet",
             "--set", f"train.seq_len={T}", "--set", "train.batch_size=2")
    tuned = hf_logits(os.path.join(run, "checkpoint"), ids)
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    ok = rel < 1e-4 and same and torch.isfinite(tuned).all().item()
    print(f"{name}: {len(files)} shard(s) from save_pretrained; flatpeak eval vs transformers logits max-relative "
          f"{rel:.2e}; written back by flatpeak convert: transformers logits identical: {same}; "
          f"train --init-from checkpoint loads: {torch.isfinite(tuned).all().item()} -> {'OK' if ok else 'FAILED'}")
    return ok


os.makedirs(WORK, exist_ok=True)
import transformers  # noqa: E402

print(f"torch {torch.__version__}, transformers {transformers.__version__}")
results = [
    case("default", None),
    case("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    case("linear", {"rope_type": "linear", "factor": 2.0}),
    case("llama3", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32}),
]
print("interop (Hugging Face in): OK" if all(results) else "interop (Hugging Face in): FAILED")
sys.exit(0 if all(results) else 1)
