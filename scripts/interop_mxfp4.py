"""flatpeak's MXFP4 dequantization against transformers' own, bit for bit (optional; run with the PyPI
torch + transformers of .venv-interop, not part of scripts/test).

Writes a gpt-oss-shaped layer's packed experts with the Python safetensors library (U8 blocks
(E, R, G, 16) and scales (E, R, G) for gate_up_proj and down_proj, E = 2), random bytes in which every
scale 0..255 and every nibble at every scale occur, both nibble positions; dequantizes them with
transformers.integrations.mxfp4.convert_moe_packed_tensors (bf16 (E, G*32, R)); runs flatpeak's
tests/unit/mxfp4_dump on the same file (expert by expert: SafetensorsFile::read_u8_rows, then
mxfp4_dequantize_bf16 and mxfp4_dequantize_f32, Note [MXFP4 in gpt-oss checkpoints] in src/io/mxfp4.h);
and requires every bf16 bit pattern to be equal, and the f32 output to be the bf16 widened.

usage: .venv-interop/bin/python scripts/interop_mxfp4.py [MXFP4_DUMP [WORK_DIR]]
       (defaults: build/tests/mxfp4_dump and runs/interop/mxfp4)
"""
import os
import subprocess
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DUMP = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "tests", "mxfp4_dump")
WORK = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "runs", "interop", "mxfp4")
E, H, I = 2, 256, 192  # gate_up_proj: R = 2I = 384, G = H/32 = 8; down_proj: R = H = 256, G = I/32 = 6
PREFIX = "model.layers.0.mlp.experts."
PROJ = {"gate_up_proj": (2 * I, H // 32), "down_proj": (H, I // 32)}


def packed(R, G, gen):
    """Blocks (E, R, G, 16) and scales (E, R, G): random bytes, every scale value in every expert, and
    for each scale one block whose bytes hold all 16 nibbles low and all 16 high."""
    blocks = torch.randint(0, 256, (E, R, G, 16), dtype=torch.uint8, generator=gen)
    n = R * G
    assert n >= 256
    scales = torch.empty(E, n, dtype=torch.uint8)
    for e in range(E):
        perm = torch.randperm(n, generator=gen)
        scales[e, perm] = (torch.arange(n) % 256).to(torch.uint8)  # each value n/256 times, shuffled
        flat = blocks[e].reshape(n, 16)
        for s in range(256):
            k = perm[s].item()  # the first block of scale s
            b = torch.arange(16)
            flat[k] = (b | ((15 - b) << 4)).to(torch.uint8)
    return blocks, scales.reshape(E, R, G)


def coverage(blocks, scales):
    """(scale, nibble, position) triples present: must be 256 * 16 * 2."""
    s = scales.to(torch.int64).unsqueeze(-1).expand(blocks.shape)
    lo = (blocks & 0x0F).to(torch.int64)
    hi = (blocks >> 4).to(torch.int64)
    return torch.unique(torch.cat([s * 32 + lo * 2, s * 32 + hi * 2 + 1]).flatten()).numel()


def bits(t):
    return t.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def main():
    os.makedirs(WORK, exist_ok=True)
    if not os.access(DUMP, os.X_OK):
        sys.exit(f"{DUMP} not found: cd build && ninja mxfp4_dump")
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for proj, (R, G) in PROJ.items():
        blocks, scales = packed(R, G, gen)
        cov = coverage(blocks, scales)
        assert cov == 256 * 16 * 2, f"{proj}: only {cov} of 8192 (scale, nibble, position) triples present"
        tensors[PREFIX + proj + "_blocks"] = blocks
        tensors[PREFIX + proj + "_scales"] = scales
    src = os.path.join(WORK, "packed.safetensors")
    out = os.path.join(WORK, "flatpeak.safetensors")
    save_file(tensors, src, metadata={"format": "pt"})
    p = subprocess.run([DUMP, src, out, *(PREFIX + proj for proj in PROJ)], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"mxfp4_dump failed:\n{p.stderr}")
    got = load_file(out)

    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    failed = False
    for proj, (R, G) in PROJ.items():
        blocks, scales = tensors[PREFIX + proj + "_blocks"], tensors[PREFIX + proj + "_scales"]
        want = convert_moe_packed_tensors(blocks, scales)  # bf16 (E, G*32, R)
        mine, mine_f32 = got[PREFIX + proj], got[PREFIX + proj + ".f32"]
        assert want.dtype == torch.bfloat16 and tuple(want.shape) == (E, G * 32, R), (want.dtype, want.shape)
        assert mine.dtype == torch.bfloat16 and mine.shape == want.shape, (mine.dtype, mine.shape)
        differ = (bits(mine) != bits(want)).nonzero()
        f32_differ = (mine_f32.view(torch.int32) != mine.float().view(torch.int32)).sum().item()
        w = want.float()
        print(f"{proj}: blocks {tuple(blocks.shape)} scales {tuple(scales.shape)} -> bf16 {tuple(want.shape)}: "
              f"{want.numel()} elements, {(w == 0).sum().item()} zeros ({torch.signbit(w[w == 0]).sum().item()} "
              f"of them -0), {torch.isinf(w).sum().item()} infinities, {torch.isnan(w).sum().item()} NaNs, "
              f"{((w != 0) & (w.abs() < 2.0**-126)).sum().item()} subnormals; "
              f"bf16 bit patterns differing: {differ.shape[0]}; f32 != bf16 widened: {f32_differ}")
        for idx in differ[:10].tolist():
            e, c, r = idx
            g, rest = divmod(c, 32)
            byte = blocks[e, r, g, rest // 2].item()
            print(f"  ({e}, {c}, {r}): byte 0x{byte:02x} nibble {(byte >> 4) if rest % 2 else (byte & 15)} "
                  f"scale {scales[e, r, g].item()}: transformers 0x{bits(want)[e, c, r].item():04x}, "
                  f"flatpeak 0x{bits(mine)[e, c, r].item():04x}")
        failed |= differ.shape[0] > 0 or f32_differ > 0
    if failed:
        sys.exit("FAILED: flatpeak's MXFP4 dequantization differs from transformers'")
    print("OK: flatpeak's MXFP4 dequantization is bit-identical to transformers' convert_moe_packed_tensors")


if __name__ == "__main__":
    main()
