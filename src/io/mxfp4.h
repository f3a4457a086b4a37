// MXFP4 expert weights of gpt-oss checkpoints, dequantized to bf16 exactly as transformers does.
//
// Dimensions: E experts, R rows of the stored matrix (2I for gate_up_proj, H for down_proj),
// G groups of 32 values along the other dimension (H/32 for gate_up_proj, I/32 for down_proj),
// C = G * 32 columns once dequantized.
//
// Note [MXFP4 in gpt-oss checkpoints]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The published gpt-oss safetensors store each layer's experts as two U8 tensors per projection:
//   model.layers.N.mlp.experts.gate_up_proj_blocks  (E, 2I, H/32, 16)   gate_up_proj_scales (E, 2I, H/32)
//   model.layers.N.mlp.experts.down_proj_blocks     (E, H, I/32, 16)    down_proj_scales    (E, H, I/32)
// A block of 16 bytes holds 32 FP4 (e2m1) values, two per byte, the LOW nibble first; every block
// shares one scale byte s, an E8M0 exponent: the block's values are lut[nibble] * 2^(s - 127) with
//   lut = {+0, +0.5, +1, +1.5, +2, +3, +4, +6, -0, -0.5, -1, -1.5, -2, -3, -4, -6}
// (nibble bit 3 is the sign). transformers (integrations/mxfp4.py, _convert_moe_packed_tensors, what
// from_pretrained runs to load gpt-oss unquantized) turns blocks (E, R, G, 16) and scales (E, R, G)
// into a bf16 tensor (E, G*32, R), i.e. the stored matrix transposed:
//   out[e, c, r] with c = g*32 + 2*b + nib  comes from  blocks[e, r, g, b], nibble nib (0 low, 1 high),
// so gate_up_proj is (E, H, 2I) and down_proj (E, I, H), the parameters GptOssExperts multiplies
// with (x @ gate_up_proj[e]; gate and up interleaved along 2I: gate = [..., ::2], up = [..., 1::2]).
//
// The exactness rule. transformers computes lut[nibble] in bf16, then torch.ldexp(sub, exp, out=sub)
// with sub bf16 and exp = s - 127 int32. PyTorch's eager ldexp (measured on torch 2.15, CPU, with the
// DEFAULT and AVX2 kernels) keeps the bf16 dtype and is a true ldexp: the exact value x * 2^n rounded
// once to bf16 (its float32 computation is exact for every bf16 x, float32 subnormals included), not
// x * pow(2, n) (torch's own decomposition, used under torch.compile, which makes 2^128 infinite at
// s = 255, so 0.5 * 2^128 an inf and 0 * inf a NaN). Since every lut value has at most two significant
// bits, lut * 2^(s - 127) is a bf16 exactly for all 256 scales (the smallest, 0.5 * 2^-127 = 2^-128,
// is a bf16 subnormal) or it overflows, so the rule reduces to:
//   - the exact value lut[nibble] * 2^(s - 127) when it is below 2^128 in magnitude; at s = 255,
//     +-0.5 gives +-2^127 (finite) and +-1 and above give +-inf; at s = 254, +-2 and above give +-inf;
//   - +-0 stays +-0 at every scale, s = 255 included (never a NaN), the sign kept (nibble 8 is -0).
// mxfp4_bf16 computes std::ldexp in float (exact here) and rounds with bf16_from_float, which is the
// same rule; tests/unit/test_mxfp4.cpp checks all 16 x 256 values against an independent double
// computation and hand-derived patterns, and scripts/interop_mxfp4.py against transformers itself.
#pragma once

#include <cstdint>

namespace fp {

constexpr int64_t kMxfp4BlockBytes = 16;  // bytes per block: 32 values, two per byte
constexpr int64_t kMxfp4GroupSize = 32;   // values per block, all sharing one scale byte

// The bf16 bit pattern of one MXFP4 value: lut[nibble & 15] * 2^(scale - 127) under the rule of
// Note [MXFP4 in gpt-oss checkpoints].
uint16_t mxfp4_bf16(uint8_t nibble, uint8_t scale);

// Dequantizes one expert's slab as transformers' convert_moe_packed_tensors does (Note [MXFP4 in
// gpt-oss checkpoints]): blocks (R, G, 16) and scales (R, G), the slices of expert e of the
// (E, R, G, 16) and (E, R, G) tensors, into out (G*32, R) row-major, transformers' (E, G*32, R)
// output restricted to e: out[(g*32 + 2*b + nib) * R + r] from blocks[(r*G + g)*16 + b]. Every
// element of out is written; out must not overlap the inputs. No allocation, one thread (about 2 ns an
// element on one core); calls on different slabs may run in parallel.
void mxfp4_dequantize_bf16(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups, uint16_t* out);
// The same values widened to float (exact: every bf16 is a float), same layout.
void mxfp4_dequantize_f32(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups, float* out);

}  // namespace fp
