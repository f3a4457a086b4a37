#!/usr/bin/env python3
"""Write a token file in llm.c's format for flatpeak (docs/data.md).

Format (little-endian): a 1024-byte header of 256 int32 -- [0] = magic, [1] = version, [2] = token
count, the rest 0 -- then the tokens: uint16 (magic 20240520, version 1) when every id fits, else
uint32 (magic 20240801, version 7: llm.c's "llama-3" variant, for vocabularies such as Qwen's 151,936).

Sources:
  --text FILE   byte-level tokenizer: every byte of the file is one token (ids 0..255), so the
                model needs vocab_size >= 256; each file is one document
  --folder DIR  every file under DIR (recursively, in path order) as one document, tokenized as --text
                files are; files that are not UTF-8 text are skipped with --tokenizer (and named)
  --ids FILE    integer token ids separated by whitespace and/or commas, e.g. the output of any
                tokenizer
  --tokenizer PATH  with --text: the model's own tokenizer (tokenizer.json, or a directory holding it
                and tokenizer_config.json); one document per --text file, each followed by the
                tokenizer's EOS token. Needs the `tokenizers` package (pip install tokenizers).

Documents (docs/data.md, "Packed documents"): with --text or --folder, OUT.bin.docs is written beside
OUT.bin: where each document starts (8 bytes "FPDOCS01", int64 count, int64 token offsets; Note [A
document index] in src/data/documents.h), read by data.documents = "index". With --tokenizer each document
also ends with the tokenizer's EOS token, for data.documents = "eos". --val then takes whole documents,
the last --val-fraction of them, and writes VAL.bin.docs too.

Examples:
  scripts/make_token_file.py --text shakespeare.txt -o data/shakespeare_train.bin
  scripts/make_token_file.py --text shakespeare.txt -o data/train.bin --val data/val.bin --val-fraction 0.1
  scripts/make_token_file.py --ids tokens.txt -o data/tokens.bin
  scripts/make_token_file.py --tokenizer path/to/Qwen3-MoE-dir --text a.txt b.txt -o data/train.bin
  scripts/make_token_file.py --tokenizer path/to/model-dir --folder corpus/ -o data/train.bin --val data/val.bin

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
DOCS_MAGIC = b"FPDOCS01"  # the document index (Note [A document index] in src/data/documents.h)


def atomic_write(path, chunks):
    """Writes the byte strings `chunks` to path atomically (temp file, fsync, rename)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_document_index(path, lengths):
    """PATH: the token offset where each document of the given lengths starts (the first 0)."""
    starts, at = [], 0
    for n in lengths:
        starts.append(at)
        at += n
    atomic_write(path, [DOCS_MAGIC, struct.pack("<q", len(starts)), struct.pack(f"<{len(starts)}q", *starts)])


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
    atomic_write(path, [header, toks.tobytes()])


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


def load_tokenizer(where):
    """The model's tokenizer (tokenizer.json) and its EOS id (tokenizer_config.json beside it, else None)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("error: --tokenizer needs the tokenizers package: pip install tokenizers")
    path = os.path.join(where, "tokenizer.json") if os.path.isdir(where) else where
    if not os.path.exists(path):
        sys.exit(f"error: --tokenizer {where}: no tokenizer.json")
    tok = Tokenizer.from_file(path)
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
    return tok, eos_id, path


def folder_files(folder):
    """Every regular file under folder, in path order."""
    if not os.path.isdir(folder):
        sys.exit(f"error: --folder {folder}: not a directory")
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        out += [os.path.join(root, f) for f in sorted(files) if os.path.isfile(os.path.join(root, f))]
    if not out:
        sys.exit(f"error: --folder {folder}: no files")
    return out


def documents(files, tokenizer):
    """One token list per file: its bytes, or its text through the tokenizer followed by EOS."""
    if tokenizer is None:
        return [list(open(p, "rb").read()) for p in files], "byte-level, model.vocab_size >= 256", None
    tok, eos_id, path = load_tokenizer(tokenizer)
    docs, skipped = [], []
    for p in files:
        try:
            text = open(p, "r", encoding="utf-8").read()
        except UnicodeDecodeError:
            skipped.append(p)
            continue
        ids = tok.encode(text, add_special_tokens=False).ids
        docs.append(ids + ([eos_id] if eos_id is not None else []))
    if skipped:
        print(f"skipped {len(skipped)} files that are not UTF-8 text: {', '.join(skipped[:5])}"
              f"{' ...' if len(skipped) > 5 else ''}")
    if not docs:
        sys.exit("error: no UTF-8 text file to tokenize")
    size = tok.get_vocab_size(with_added_tokens=True)
    sep = f", documents end with EOS id {eos_id}" if eos_id is not None else ", no EOS (no tokenizer_config.json)"
    return docs, f"{path}: vocabulary {size}, model.vocab_size >= {size}{sep}", eos_id


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", metavar="FILE", nargs="+",
                     help="text file(s), each one document, tokenized byte by byte (ids 0..255) or by --tokenizer")
    src.add_argument("--folder", metavar="DIR", help="every file under DIR, each one document (as --text)")
    src.add_argument("--ids", metavar="FILE", help="file of integer ids separated by whitespace or commas")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json or a model directory (with --text, --folder)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.bin", help="token file to write")
    p.add_argument("--val", metavar="VAL.bin", help="also write the last --val-fraction (of the documents) here")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share for --val (default 0.1)")
    args = p.parse_args()

    if args.tokenizer is not None and args.ids is not None:
        sys.exit("error: --tokenizer tokenizes --text files or a --folder")
    if args.val is not None and not 0.0 < args.val_fraction < 1.0:
        sys.exit(f"error: --val-fraction = {args.val_fraction} must be in (0, 1)")
    if args.ids is not None:
        tokens = read_ids(args.ids)
        vocab = f"max id {max(tokens) if tokens else 0}, model.vocab_size must exceed it"
        docs = None
    else:
        files = args.text if args.text is not None else folder_files(args.folder)
        docs, vocab, _ = documents(files, args.tokenizer)
        docs = [d for d in docs if d]  # an empty file is no document

    if docs is None or len(docs) < 2:
        # One stream: split by tokens.
        tokens = tokens if docs is None else docs[0]
        n_val = int(len(tokens) * args.val_fraction) if args.val is not None else 0
        parts = [(args.output, [tokens[: len(tokens) - n_val]])]
        if args.val is not None:
            parts.append((args.val, [tokens[len(tokens) - n_val:]]))
    else:
        # Whole documents: the last --val-fraction of them (at least one) to --val.
        n_val = max(1, round(len(docs) * args.val_fraction)) if args.val is not None else 0
        if n_val >= len(docs):
            sys.exit(f"error: {len(docs)} documents leave none for training with --val-fraction {args.val_fraction}")
        parts = [(args.output, docs[: len(docs) - n_val])]
        if args.val is not None:
            parts.append((args.val, docs[len(docs) - n_val:]))
    for path, ds in parts:
        write_token_file(path, [t for d in ds for t in d])
        what = ""
        if docs is not None:
            write_document_index(path + ".docs", [len(d) for d in ds])
            what = f" in {len(ds)} documents (index {path}.docs)"
        print(f"wrote {path}: {sum(len(d) for d in ds)} tokens{what} ({vocab})")


if __name__ == "__main__":
    main()
