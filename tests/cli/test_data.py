#!/usr/bin/env python3
"""Real text, end to end (issue 34): scripts/make_token_file.py on a small real corpus that every Debian
machine has on disk (/usr/share/common-licenses, base-files: the GPL, Apache, MPL, ... texts), then
flatpeak trains and evaluates on it.

usage: test_data.py --bin build/flatpeak --root REPO CASE
  tokenizer   a BPE tokenizer this test trains itself on the corpus (PyPI's tokenizers, in the
              .venv-tokenizers scripts/deps test makes; saved as tokenizer.json + tokenizer_config.json
              with an EOS token, as a model directory holds them); make_token_file.py --tokenizer DIR
              --folder CORPUS writes the documents with EOS, a validation split of whole documents and
              both indexes; 40 steps with data.documents = "eos" and held-out evaluation: the loss falls,
              the held-out loss falls, and `flatpeak eval` of the checkpoint gives the last held-out loss
  index       byte-level documents (no EOS) through the document index (data.documents = "index"): every
              position a target but each document's last token, counted exactly; a damaged index is
              refused by name
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ARGS = None
CORPUS = "/usr/share/common-licenses"


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def make_token_file(python, *args):
    return run([python, os.path.join(ARGS.root, "scripts", "make_token_file.py")] + list(args)).stdout


def flatpeak(*args):
    return run([ARGS.bin] + list(args))


def train_cmd(out, train_bin, val_bin, vocab, steps, *extra):
    return ["train", "--config", os.path.join(ARGS.root, "configs", "tiny.toml"), "--steps", str(steps), "--quiet",
            "--out", out, "--set", f"model.vocab_size={vocab}", "--set", "train.seq_len=128",
            "--set", "train.batch_size=4", "--set", f"data.source={train_bin}", "--set", f"eval.data={val_bin}",
            "--set", "eval.batches=0"] + list(extra)


def case_tokenizer(tmp):
    python = os.path.join(ARGS.root, ".venv-tokenizers", "bin", "python")
    if not os.path.exists(python):
        sys.exit(f"FAILED: {python} is missing: scripts/deps test installs tokenizers there")
    tok_dir = os.path.join(tmp, "tok")
    os.makedirs(tok_dir)
    # The test's own tokenizer: byte-level BPE of 384 ids trained on the corpus, EOS <|endoftext|>.
    build = f"""
import json, os, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
files = sorted(os.path.join(r, f) for r, _, fs in os.walk({CORPUS!r}) for f in fs)
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train(files, trainer)
tok.save(os.path.join({tok_dir!r}, "tokenizer.json"))
json.dump({{"eos_token": "<|endoftext|>"}}, open(os.path.join({tok_dir!r}, "tokenizer_config.json"), "w"))
print(tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"))
"""
    vocab, eos = map(int, run([python, "-c", build]).stdout.split())
    train_bin, val_bin = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    print(make_token_file(python, "--tokenizer", tok_dir, "--folder", CORPUS, "-o", train_bin, "--val", val_bin,
                          "--val-fraction", "0.2"), end="")
    for f in (train_bin, val_bin):
        assert os.path.exists(f + ".docs"), f
    out = os.path.join(tmp, "run")
    flatpeak(*train_cmd(out, train_bin, val_bin, vocab, 40, "--set", "data.documents=eos", "--set",
                        f"data.eos_id={eos}", "--set", "eval.every=20", "--set", "optim.lr=3e-3"))
    m = metrics(out)
    first, last = sum(x["loss"] for x in m[:5]) / 5, sum(x["loss"] for x in m[-5:]) / 5
    evals = [(x["step"], x["eval_loss"]) for x in m if "eval_loss" in x]
    print(f"train loss {first:.3f} -> {last:.3f}; held-out loss {evals}")
    assert [s for s, _ in evals] == [20, 40], evals
    assert last < first - 1.0, f"the loss did not fall on real text: {first:.3f} -> {last:.3f}"
    assert evals[1][1] < evals[0][1], f"the held-out loss did not fall: {evals}"
    js = os.path.join(tmp, "eval.json")
    flatpeak("eval", "--checkpoint", out, "--data", val_bin, "--seq-len", "128", "--batch", "4", "--json", js,
             "--set", "data.documents=eos", "--set", f"data.eos_id={eos}")
    e = json.load(open(js))
    # The run's last held-out evaluation read every window of val.bin in batches of 4, as flatpeak eval does.
    print(f"flatpeak eval: loss {e['loss']:.6f} over {e['tokens']} targets ({e['sequences']} sequences)")
    assert abs(e["loss"] - evals[1][1]) <= 1e-12 * e["loss"] and e["tokens"] == m[-1]["eval_targets"], (e, m[-1])


def case_index(tmp):
    train_bin, val_bin = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    print(make_token_file(sys.executable, "--folder", CORPUS, "-o", train_bin, "--val", val_bin,
                          "--val-fraction", "0.2"), end="")
    out = os.path.join(tmp, "run")
    flatpeak(*train_cmd(out, train_bin, val_bin, 256, 3, "--set", "data.documents=index"))
    m = metrics(out)
    # The held-out targets: every position of every window but each document's last token.
    raw = open(val_bin, "rb").read()
    n = struct.unpack_from("<i", raw, 8)[0]
    idx = open(val_bin + ".docs", "rb").read()
    count = struct.unpack_from("<q", idx, 8)[0]
    starts = set(struct.unpack_from(f"<{count}q", idx, 16))
    windows = (n - 1) // 128
    want = sum(1 for w in range(windows) for t in range(128) if w * 128 + t + 1 not in starts)
    assert want < windows * 128, "no document boundary inside a window: the case checks nothing"
    assert m[-1]["eval_targets"] == want, (m[-1]["eval_targets"], want)
    print(f"held-out loss {m[-1]['eval_loss']:.4f} over {want} targets of {windows} windows ({count} documents)")
    # A damaged index is refused by name.
    with open(val_bin + ".docs", "r+b") as f:
        f.seek(16 + 8)
        f.write(struct.pack("<q", 10 ** 12))
    p = subprocess.run([ARGS.bin] + train_cmd(os.path.join(tmp, "bad"), train_bin, val_bin, 256, 1, "--set",
                                              "data.documents=index"), capture_output=True, text=True)
    assert p.returncode == 1 and "val.bin.docs" in p.stderr and "hint:" in p.stderr, p.stderr
    os.remove(val_bin + ".docs")
    p = subprocess.run([ARGS.bin, "eval", "--checkpoint", out, "--data", val_bin, "--set", "data.documents=index"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "cannot read the document index" in p.stderr, p.stderr


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("case")
    ARGS = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="flatpeak_data_")
    try:
        globals()["case_" + ARGS.case](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
