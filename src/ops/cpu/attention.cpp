// Causal grouped-query flash attention over whole sequences (ops/attention.h), forward and backward: the
// block kernels of ops/cpu/attention_block.cpp with every token of the sequence as both the query block
// and the key block (q_pos = k_pos = 0 .. T-1, Note [Whole sequences as one block pair]).
// Dimensions: B sequences, T tokens each, nh query heads, nkv kv heads, hd the query/key head width, hdv
// the value/output head width (Note [Value heads of their own width], ops/attention.h).
//
// Note [Whole sequences as one block pair]: with contiguous positions the block kernels' masks (Note
// [Masks from sorted positions], attention_block.cpp) are the causal diagonal and, with a window, the
// band below it; every tile pair they test holds a visible pair, so they visit the tiles, in the order
// and with the sums that a kernel written for the causal mask would, and first = true writes (o, lse)
// as such a kernel would (Note [Merging partial attention]). The one difference is that the block
// backward adds into dq, dk, dv where attention_backward overwrites them: they are first filled with
// -0.0f, the one float x for which -0.0f + x == x bit for bit for every x (+0.0f + -0.0f would be
// +0.0f), so the sums arrive unchanged, signed zeros included. The positions cost one (T) int32 buffer
// per call, the masks 2 TQ binary searches per tile row: nothing next to the tile products.
#include "ops/attention.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "ops/attention_block.h"

namespace fp::ops::cpu {

namespace {

void shapes_check(int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, int64_t window) {
  FP_ASSERT(B >= 0 && T >= 0 && nh > 0 && nkv > 0 && hd > 0 && hdv > 0 && nh % nkv == 0 && window >= 0,
            "attention shapes B={} T={} nh={} nkv={} hd={} hdv={} window={} (nh must be a multiple of nkv, "
            "window >= 0)",
            B, T, nh, nkv, hd, hdv, window);
  FP_ASSERT(T <= INT32_MAX, "attention T={} exceeds the int32 positions of the block kernels", T);
}

// The positions 0 .. T-1 (T) of every query and key.
std::vector<int32_t> positions(int64_t T) {
  std::vector<int32_t> pos(T);
  std::iota(pos.begin(), pos.end(), 0);
  return pos;
}

}  // namespace

void attention_forward(CBuf q, CBuf k, CBuf v, Buf o, float* lse, int64_t B, int64_t T, int64_t nh, int64_t nkv,
                       int64_t hd, int64_t hdv, float scale, int64_t window) {
  shapes_check(B, T, nh, nkv, hd, hdv, window);
  if (B == 0 || T == 0) return;
  const std::vector<int32_t> pos = positions(T);
  const int64_t w = window >= T ? 0 : window;  // a window of T or more masks nothing
  attention_block_forward(q, k, v, pos.data(), pos.data(), o, lse, /*first=*/true, B, T, T, nh, nkv, hd, hdv, scale, w);
}

void attention_backward(CBuf q, CBuf k, CBuf v, CBuf o, const float* lse, CBuf dout, Buf dq, Buf dk, Buf dv, int64_t B,
                        int64_t T, int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, float scale, int64_t window) {
  shapes_check(B, T, nh, nkv, hd, hdv, window);
  if (B == 0 || T == 0) return;
  const std::vector<int32_t> pos = positions(T);
  const int64_t w = window >= T ? 0 : window;
  // Overwritten, not added to (Note [Whole sequences as one block pair]).
  auto fill_negative_zero = [](Buf x, int64_t n) {
    visit_float(x.dtype, "attention_backward",
                [&]<class E>() { std::fill(x.as<E>(), x.as<E>() + n, from_f32<E>(-0.0f)); });
  };
  fill_negative_zero(dq, B * T * nh * hd);
  fill_negative_zero(dk, B * T * nkv * hd);
  fill_negative_zero(dv, B * T * nkv * hdv);
  attention_block_backward(q, k, v, o, lse, dout, pos.data(), pos.data(), dq, dk, dv, B, T, T, nh, nkv, hd, hdv, scale,
                           w);
}

}  // namespace fp::ops::cpu
