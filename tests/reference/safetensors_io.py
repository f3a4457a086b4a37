"""Minimal safetensors reader and writer built on json + struct + torch (no safetensors package).

Format: 8-byte little-endian header length N, N bytes of JSON
  {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}}
then the data section (offsets relative to its start, end exclusive, row-major little-endian).
"""
import json
import struct

import torch

DTYPES = {
    "F32": torch.float32,
    "F64": torch.float64,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I32": torch.int32,
    "I64": torch.int64,
    "U8": torch.uint8,
}
NAMES = {v: k for k, v in DTYPES.items()}


class FormatError(ValueError):
    pass


def load(path):
    """Returns (tensors: dict name -> torch.Tensor (a copy), metadata: dict str -> str)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise FormatError(f"{path}: {len(raw)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise FormatError(f"{path}: header length {n} exceeds the {len(raw) - 8} bytes after it")
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise FormatError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    data = memoryview(raw)[8 + n:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, e in header.items():
        dtype = DTYPES.get(e.get("dtype"))
        if dtype is None:
            raise FormatError(f"{path}: tensor {name!r} has unsupported dtype {e.get('dtype')!r}")
        shape = [int(d) for d in e["shape"]]
        begin, end = (int(x) for x in e["data_offsets"])
        numel = 1
        for d in shape:
            numel *= d
        size = torch.empty((), dtype=dtype).element_size()
        if not (0 <= begin <= end <= len(data)) or end - begin != numel * size:
            raise FormatError(f"{path}: tensor {name!r} shape {shape} {e['dtype']} has bad data_offsets "
                              f"[{begin}, {end}] (data section {len(data)} bytes)")
        if numel == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape)
        tensors[name] = t
    return tensors, dict(metadata)


def save(path, tensors, metadata=None):
    """Writes dict name -> torch.Tensor (F32/F64/BF16/F16/I32/I64) with optional str -> str metadata.
    Data is laid out by element size (widest first) then name, as the safetensors library does."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    blobs, offset = [], 0
    for name in order:
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype not in NAMES:
            raise FormatError(f"tensor {name!r}: unsupported dtype {t.dtype}")
        # bf16 has no numpy dtype: move the raw bits through int16.
        b = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
