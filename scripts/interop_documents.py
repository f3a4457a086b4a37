"""Packed documents against transformers running each document alone (issue 34; run by scripts/interop with the
PyPI torch + transformers of .venv-interop; not part of scripts/test, whose twin tests check the same against
the PyTorch twin).

For each model (a random bf16 Qwen3MoeForCausalLM with a sliding window, and a GptOssForCausalLM with sinks
and sliding/full layers, both written by transformers' save_pretrained), a token file of documents of mixed
lengths, each ending with EOS, is cut into windows that start inside documents and hold several of them.
`flatpeak eval --set data.documents=eos --set data.eos_id=E --dump-logits` gives the logits of each packed
window; transformers then runs every document fragment of every window as a sequence of its own (positions
from 0, nothing else visible) and its logits must equal flatpeak's at those positions within 1e-5
max-relative per fragment. Note [Documents in attention] (src/ops/attention.h): a document ends with its EOS,
inclusive; a window that starts inside a document starts that fragment at position 0.

usage: interop_documents.py FLATPEAK_BIN WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import torch
from safetensors.torch import load_file
from transformers import GptOssConfig, GptOssForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

BIN, WORK = sys.argv[1:3]
V, EOS, T, B = 128, 127, 96, 3


def models():
    qwen = Qwen3MoeConfig(vocab_size=V, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                          num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=256,
                          use_sliding_window=True, sliding_window=24, max_window_layers=0, attention_bias=True)
    gpt_oss = GptOssConfig(vocab_size=V, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                           num_experts_per_tok=2, sliding_window=16, swiglu_limit=0.3, max_position_embeddings=256,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return {"qwen3_moe": (Qwen3MoeForCausalLM, qwen), "gpt_oss": (GptOssForCausalLM, gpt_oss)}


def tokens_file(path):
    """Documents of 1 .. 70 tokens (a long tail: a few long, many short), each ending with EOS."""
    g = torch.Generator().manual_seed(3)
    toks = []
    while len(toks) < B * T + 1:
        n = int(min(70, 1 + torch.empty(1).exponential_(1 / 18, generator=g).item()))
        toks += torch.randint(0, EOS, (n - 1,), generator=g).tolist() + [EOS]
    toks = toks[:B * T + 1]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) + struct.pack(f"<{len(toks)}H", *toks))


def fragments(ids):
    """(start, end) of each document fragment of a window: cut after every EOS."""
    out, s = [], 0
    for t, x in enumerate(ids):
        if x == EOS:
            out.append((s, t + 1))
            s = t + 1
    if s < len(ids):
        out.append((s, len(ids)))
    return out


def main():
    os.makedirs(WORK, exist_ok=True)
    data = os.path.join(WORK, "documents.bin")
    tokens_file(data)
    ok = True
    for name, (cls, cfg) in models().items():
        d = os.path.join(WORK, name)
        shutil.rmtree(d, ignore_errors=True)
        torch.manual_seed(0)
        model = cls(cfg)
        with torch.no_grad():
            for pname, t in model.named_parameters():
                if pname.endswith(("bias", "sinks")):
                    t.normal_(0.0, 0.5)
        model.to(torch.bfloat16).save_pretrained(d)
        dump = os.path.join(WORK, name + ".logits.safetensors")
        p = subprocess.run([BIN, "eval", "--checkpoint", d, "--data", data, "--seq-len", str(T), "--batch", str(B),
                            "--set", "data.documents=eos", "--set", f"data.eos_id={EOS}", "--dump-logits", dump],
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"flatpeak eval failed:\n{p.stderr}")
        out = load_file(dump)
        ids, logits = out["input_ids"].long(), out["logits"].double()
        ref = cls.from_pretrained(d, dtype=torch.float32)
        ref.eval()
        worst, count, longest = 0.0, 0, 0
        with torch.no_grad():
            for b in range(ids.shape[0]):
                for s, e in fragments(ids[b].tolist()):
                    alone = ref(input_ids=ids[b:b + 1, s:e]).logits[0].double()
                    rel = ((logits[b, s:e] - alone).abs().max() / alone.abs().max()).item()
                    worst, count, longest = max(worst, rel), count + 1, max(longest, e - s)
        good = worst < 1e-5
        ok = ok and good
        print(f"{name}: {count} document fragments in {ids.shape[0]} windows of {T} (longest {longest}): flatpeak's "
              f"packed logits vs transformers on each fragment alone, worst max-relative {worst:.2e} -> "
              f"{'OK' if good else 'FAILED'}")
    print("interop (documents): OK" if ok else "interop (documents): FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
