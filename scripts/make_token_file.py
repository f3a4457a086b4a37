#!/usr/bin/env python3
"""Write a token file in llm.c's format for flatpeak (docs/data.md).

Format (little-endian): a 1024-byte header of 256 int32 -- [0] = magic, [1] = version, [2] = token
count, the rest 0 -- then the tokens: uint16 (magic 20240520, version 1) when every id fits, else
uint32 (magic 20240801, version 7: llm.c's "llama-3" variant, for vocabularies such as Qwen's 151,936).

Sources:
  --text FILE   byte-level tokenizer: every byte of the file is one token (ids 0..255), so the
                model needs vocab_size >= 256
  --ids FILE    integer token ids separated by whitespace and/or commas, e.g. the output of any
                tokenizer
  --tokenizer PATH  with --text: the model's own tokenizer (tokenizer.json, or a directory holding it
                and tokenizer_config.json); one document per --text file, each followed by the
                tokenizer's EOS token. Needs the `tokenizers` package (pip install tokenizers).

Examples:
  scripts/make_token_file.py --text shakespeare.txt -o data/shakespeare_train.bin
  scripts/make_token_file.py --text shakespeare.txt -o data/train.bin --val data/val.bin --val-fraction 0.1
  scripts/make_token_file.py --ids tokens.txt -o data/tokens.bin
  scripts/make_token_file.py --tokenizer path/to/Qwen3-MoE-dir --text a.txt b.txt -o data/train.bin

For GPT-2 tokens (vocabulary 50257) use llm.c's dev/data scripts (e.g. dev/data/tinyshakespeare.py),
which write this same format; the model's vocab_size must then be >= 50257.
Only the standard library is needed, except for --tokenizer.
"""

import argparse
import os
import re
import struct
import sys
from array import array

MAGIC, VERSION = 20240520, 1  # uint16 ids
MAGIC32, VERSION32 = 20240801, 7  # uint32 ids
HEADER_INTS = 256


def write_token_file(path, tokens):
    """Writes tokens atomically (temp file, fsync, rename): uint16 when every id fits, else uint32."""
    wide = any(t > 65535 for t in tokens)
    toks = array("I" if wide else "H", tokens)  # raises OverflowError for negative ids
    assert toks.itemsize == (4 if wide else 2), "this Python's array('I') is not 32-bit"
    if len(toks) > 2**31 - 1:
        raise ValueError(f"{len(toks)} tokens do not fit the header's int32 count")
    if sys.byteorder == "big":
        toks.byteswap()
    magic, version = (MAGIC32, VERSION32) if wide else (MAGIC, VERSION)
    header = struct.pack("<3i", magic, version, len(toks)) + bytes(4 * (HEADER_INTS - 3))
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(toks.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_ids(path):
    with open(path, "r", encoding="utf-8") as f:
        fields = [x for x in re.split(r"[\s,]+", f.read()) if x]
    ids = []
    for i, x in enumerate(fields):
        try:
            v = int(x)
        except ValueError:
            sys.exit(f"error: {path}: field {i} '{x}' is not an integer token id")
        if not 0 <= v <= 2**31 - 1:
            sys.exit(f"error: {path}: id {v} (field {i}) is not a token id (0..2^31-1)")
        ids.append(v)
    return ids


def tokenize(where, texts):
    """The --text files through the model's tokenizer, each followed by its EOS token."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("error: --tokenizer needs the tokenizers package: pip install tokenizers")
    path = os.path.join(where, "tokenizer.json") if os.path.isdir(where) else where
    if not os.path.exists(path):
        sys.exit(f"error: --tokenizer {where}: no tokenizer.json")
    tok = Tokenizer.from_file(path)
    # EOS: from tokenizer_config.json beside it (transformers' convention), else none.
    eos_id = None
    cfg = os.path.join(os.path.dirname(path), "tokenizer_config.json")
    if os.path.exists(cfg):
        import json
        eos = json.load(open(cfg, encoding="utf-8")).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if eos is not None:
            eos_id = tok.token_to_id(eos)
            if eos_id is None:
                sys.exit(f"error: {cfg}: eos_token {eos!r} is not in {path}")
    tokens = []
    for t in texts:
        with open(t, "r", encoding="utf-8") as f:
            tokens += tok.encode(f.read(), add_special_tokens=False).ids
        if eos_id is not None:
            tokens.append(eos_id)
    size = tok.get_vocab_size(with_added_tokens=True)
    sep = f", documents separated by EOS id {eos_id}" if eos_id is not None else ", no EOS (no tokenizer_config.json)"
    return tokens, f"{path}: vocabulary {size}, model.vocab_size >= {size}{sep}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", metavar="FILE", nargs="+",
                     help="text file(s), tokenized byte by byte (ids 0..255), or by --tokenizer")
    src.add_argument("--ids", metavar="FILE", help="file of integer ids separated by whitespace or commas")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json or a model directory (with --text)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.bin", help="token file to write")
    p.add_argument("--val", metavar="VAL.bin", help="also write the last --val-fraction of the tokens here")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of tokens for --val (default 0.1)")
    args = p.parse_args()

    if args.tokenizer is not None and args.text is None:
        sys.exit("error: --tokenizer tokenizes --text files")
    if args.tokenizer is not None:
        tokens, vocab = tokenize(args.tokenizer, args.text)
    elif args.text is not None:
        tokens = []
        for path in args.text:
            with open(path, "rb") as f:
                tokens += list(f.read())
        vocab = "byte-level, model.vocab_size >= 256"
    else:
        tokens = read_ids(args.ids)
        vocab = f"max id {max(tokens) if tokens else 0}, model.vocab_size must exceed it"

    if args.val is not None:
        if not 0.0 < args.val_fraction < 1.0:
            sys.exit(f"error: --val-fraction = {args.val_fraction} must be in (0, 1)")
        n_val = int(len(tokens) * args.val_fraction)
        train, val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
        write_token_file(args.val, val)
        print(f"wrote {args.val}: {len(val)} tokens ({vocab})")
    else:
        train = tokens
    write_token_file(args.output, train)
    print(f"wrote {args.output}: {len(train)} tokens ({vocab})")


if __name__ == "__main__":
    main()
