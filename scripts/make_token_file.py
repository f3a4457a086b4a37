#!/usr/bin/env python3
"""Write a token file in llm.c's format for flatpeak (docs/data.md).

Format (little-endian): a 1024-byte header of 256 int32 -- [0] = 20240520 (magic), [1] = 1 (version),
[2] = token count, the rest 0 -- then the tokens as uint16.

Sources:
  --text FILE   byte-level tokenizer: every byte of the file is one token (ids 0..255), so the
                model needs vocab_size >= 256
  --ids FILE    integer token ids separated by whitespace and/or commas (ids 0..65535), e.g. the
                output of any tokenizer

Examples:
  scripts/make_token_file.py --text shakespeare.txt -o data/shakespeare_train.bin
  scripts/make_token_file.py --text shakespeare.txt -o data/train.bin --val data/val.bin --val-fraction 0.1
  scripts/make_token_file.py --ids tokens.txt -o data/tokens.bin

For GPT-2 tokens (vocabulary 50257) use llm.c's dev/data scripts (e.g. dev/data/tinyshakespeare.py),
which write this same format; the model's vocab_size must then be >= 50257.
Only the standard library is needed.
"""

import argparse
import os
import re
import struct
import sys
from array import array

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256


def write_token_file(path, tokens):
    """Writes tokens (a sequence of ints in [0, 65535]) atomically: temp file, fsync, rename."""
    toks = array("H", tokens)  # raises OverflowError for ids outside uint16
    if len(toks) > 2**31 - 1:
        raise ValueError(f"{len(toks)} tokens do not fit the header's int32 count")
    if sys.byteorder == "big":
        toks.byteswap()
    header = struct.pack("<3i", MAGIC, VERSION, len(toks)) + bytes(4 * (HEADER_INTS - 3))
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
        if not 0 <= v <= 65535:
            sys.exit(f"error: {path}: id {v} (field {i}) does not fit in uint16 (0..65535)")
        ids.append(v)
    return ids


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", metavar="FILE", help="text file, tokenized byte by byte (ids 0..255)")
    src.add_argument("--ids", metavar="FILE", help="file of integer ids separated by whitespace or commas")
    p.add_argument("-o", "--output", required=True, metavar="OUT.bin", help="token file to write")
    p.add_argument("--val", metavar="VAL.bin", help="also write the last --val-fraction of the tokens here")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of tokens for --val (default 0.1)")
    args = p.parse_args()

    if args.text is not None:
        with open(args.text, "rb") as f:
            tokens = list(f.read())
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
