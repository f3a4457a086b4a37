// Causal grouped-query attention computed tile by tile with an online softmax (FlashAttention-2):
// no (T, T) buffer exists at any T. B sequences of T tokens, nh query heads, nkv key/value heads
// (nh % nkv == 0; query head h reads kv head h / (nh / nkv)), hd head_dim, scale usually hd^-0.5.
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// Tile sizes (queries x keys) of the cpu kernel; exposed so tests can pick T across several tiles.
inline constexpr int64_t kAttentionTileQ = 64;
inline constexpr int64_t kAttentionTileK = 64;

// q (B, T, nh, hd), k, v (B, T, nkv, hd) -> o (B, T, nh, hd), lse (B, nh, T) the log-sum-exp of each
// query's scaled scores (kept for backward).
void attention_forward(const float* q, const float* k, const float* v, float* o, float* lse, int64_t B, int64_t T,
                       int64_t nh, int64_t nkv, int64_t hd, float scale);
// Recomputes the probabilities tile by tile from q, k and lse. dout (B, T, nh, hd);
// dq (B, T, nh, hd), dk, dv (B, T, nkv, hd) are overwritten. Deterministic.
void attention_backward(const float* q, const float* k, const float* v, const float* o, const float* lse,
                        const float* dout, float* dq, float* dk, float* dv, int64_t B, int64_t T, int64_t nh,
                        int64_t nkv, int64_t hd, float scale);

}  // namespace fp::ops::cpu
