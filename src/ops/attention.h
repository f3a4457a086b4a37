// Causal grouped-query attention computed tile by tile with an online softmax (FlashAttention-2):
// no (T, T) buffer exists at any T. B sequences of T tokens, nh query heads, nkv key/value heads
// (nh % nkv == 0; query head h reads kv head h / (nh / nkv)), hd the query/key head width, hdv the
// value/output head width, scale usually hd^-0.5.
//
// Note [Value heads of their own width]: the scores q.k run over hd and the outputs P V over hdv, and
// nothing ties the two: DeepSeek-V3's multi-head latent attention has q/k heads of 192 (128 + 64 rope)
// and v heads of 128. Q K^T, dQ = dS K and dK = dS^T Q run over hd; P V, dO V^T, D = rowsum(dO * O) and
// dV = P^T dO over hdv. With hd == hdv (every other model) the tiles, loops and bits are those of a
// single width.
//
// Masking: query i sees key j iff j <= i, and with a sliding window w > 0 also i - w < j (the last w
// tokens, itself included: Hugging Face's sliding_window, kv_idx > q_idx - sliding_window). window = 0
// is plain causal attention, and so is any window >= T, bit for bit. Every query sees at least itself.
// Tile pairs (query tile, key tile) holding no visible (query, key) pair are never computed, so the cost
// is about T * min(w, T) rather than T^2 / 2 (Note [Sliding-window bands], ops/cpu/attention_tile.h).
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops::cpu {

// Tile sizes (queries x keys) of the cpu kernel; exposed so tests can pick T across several tiles.
inline constexpr int64_t kAttentionTileQ = 64;
inline constexpr int64_t kAttentionTileK = 64;

// q (B, T, nh, hd), k (B, T, nkv, hd), v (B, T, nkv, hdv) -> o (B, T, nh, hdv), lse (B, nh, T) the
// log-sum-exp of each query's scaled scores over its visible keys (kept for backward). window >= 0 (0: no
// window).
// q, k, v, o (and in backward dout, dq, dk, dv) all f32 or all bf16, lse f32: ops/attention_block.h's
// storage rule (each output element rounded once).
void attention_forward(CBuf q, CBuf k, CBuf v, Buf o, float* lse, int64_t B, int64_t T, int64_t nh, int64_t nkv,
                       int64_t hd, int64_t hdv, float scale, int64_t window);
// Recomputes the probabilities tile by tile from q, k and lse. o, dout (B, T, nh, hdv); dq (B, T, nh, hd),
// dk (B, T, nkv, hd), dv (B, T, nkv, hdv) are overwritten. window: the forward's. Deterministic.
void attention_backward(CBuf q, CBuf k, CBuf v, CBuf o, const float* lse, CBuf dout, Buf dq, Buf dk, Buf dv, int64_t B,
                        int64_t T, int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, float scale, int64_t window);

// The copy of the tile kernels this process runs, "sse2", "avx2" or "avx2+fma" (Note [Tile products with
// FMA] in ops/cpu/attention_tile.h; FLATPEAK_SIMD lowers it): benchmarks print it beside the GEMM kernels.
const char* attention_kernels();
// How the backward runs (Note [One backward sweep where the dQ sums fit] in ops/cpu/attention_block.cpp):
// "one sweep where the dQ sums fit, else two passes", or the one FLATPEAK_ATTENTION_BACKWARD forces.
const char* attention_backward_sweep();

}  // namespace fp::ops::cpu
