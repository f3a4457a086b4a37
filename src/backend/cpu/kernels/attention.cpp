// Causal grouped-query flash attention over whole sequences (ops/attention.h), forward and backward: the
// block kernels of backend/cpu/kernels/attention_block.cpp with every token of the sequence as both the query block
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
// per call, the masks 2 TQ binary searches per tile row: nothing next to the tile products. Documents
// (Note [Documents in attention], ops/attention.h) pass through as they are: the block kernels then skip
// the tile pairs that lie across documents, and a tile pair that holds a visible pair sums as before.
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "backend/cpu/kernels/ops.h"
#include "core/error.h"
#include "ops/attention_block.h"

namespace fp::ops::cpu {

namespace {

void shapes_check(const AttentionSpec& a) {
  FP_ASSERT(a.B >= 0 && a.Tq >= 0 && a.Tq == a.Tk && a.nh > 0 && a.nkv > 0 && a.hd > 0 && a.hdv > 0 &&
                a.nh % a.nkv == 0 && a.window >= 0 && a.q_pos == nullptr && a.k_pos == nullptr,
            "attention shapes B={} T={} (keys {}) nh={} nkv={} hd={} hdv={} window={} (nh must be a multiple of nkv, "
            "window >= 0, as many keys as queries, no positions)",
            a.B, a.Tq, a.Tk, a.nh, a.nkv, a.hd, a.hdv, a.window);
  FP_ASSERT(a.Tq <= INT32_MAX, "attention T={} exceeds the int32 positions of the block kernels", a.Tq);
}

// The positions 0 .. T-1 (T) of every query and key.
std::vector<int32_t> positions(int64_t T) {
  std::vector<int32_t> pos(T);
  std::iota(pos.begin(), pos.end(), 0);
  return pos;
}

// The block kernels' spec of whole-sequence attention: positions 0 .. T-1 (pos), and a window of T or more
// run as none (it masks nothing).
AttentionSpec block_spec(AttentionSpec a, const std::vector<int32_t>& pos) {
  a.q_pos = a.k_pos = pos.data();
  if (a.window >= a.Tq) a.window = 0;
  return a;
}

}  // namespace

void attention_forward(CBuf q, CBuf k, CBuf v, Buf o, float* lse, AttentionSpec a) {
  shapes_check(a);
  if (a.B == 0 || a.Tq == 0) return;
  const std::vector<int32_t> pos = positions(a.Tq);
  attention_block_forward(q, k, v, o, lse, /*first=*/true, block_spec(a, pos));
}

void attention_backward(CBuf q, CBuf k, CBuf v, CBuf o, const float* lse, CBuf dout, Buf dq, Buf dk, Buf dv,
                        AttentionSpec a) {
  shapes_check(a);
  if (a.B == 0 || a.Tq == 0) return;
  const std::vector<int32_t> pos = positions(a.Tq);
  // Overwritten, not added to (Note [Whole sequences as one block pair]).
  auto fill_negative_zero = [](Buf x, int64_t n) {
    visit_float(x.dtype, "attention_backward",
                [&]<class E>() { std::fill(x.as<E>(), x.as<E>() + n, from_f32<E>(-0.0f)); });
  };
  const int64_t rows = a.B * a.Tq;
  fill_negative_zero(dq, rows * a.nh * a.hd);
  fill_negative_zero(dk, rows * a.nkv * a.hd);
  fill_negative_zero(dv, rows * a.nkv * a.hdv);
  attention_block_backward(q, k, v, o, lse, dout, dq, dk, dv, block_spec(a, pos));
}

void attention_sink_backward(CBuf o, CBuf dout, const float* lse, Buf dsinks, AttentionSpec a) {
  FP_ASSERT(!a.sinks.null() || a.B * a.Tq == 0, "attention_sink_backward: the spec has no sinks");
  FP_ASSERT(o.dtype == dout.dtype, "attention_sink_backward: o in {}, dout in {}", dtype_name(o.dtype),
            dtype_name(dout.dtype));
  const int64_t B = a.B, Tq = a.Tq, nh = a.nh, hdv = a.hdv;
  if (B == 0 || Tq == 0) return;
  visit_float(o.dtype, "attention_sink_backward", [&]<class E>() {
    visit_float(a.sinks.dtype, "attention_sink_backward (sinks)", [&]<class S>() {
      visit_float(dsinks.dtype, "attention_sink_backward (dsinks)", [&]<class G>() {
        const E* po = o.as<E>();
        const E* pd = dout.as<E>();
        const S* ps = a.sinks.as<S>();
        G* pg = dsinks.as<G>();
#pragma omp parallel for schedule(static) if (nh > 1 && B * Tq * hdv > 4096)
        for (int64_t h = 0; h < nh; ++h) {
          const float sink = to_f32(ps[h]);
          double sum = 0;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t i = 0; i < Tq; ++i) {
              const int64_t row = ((b * Tq + i) * nh + h) * hdv;  // (hdv) of o and dout
              float D = 0.0f;                                     // rowsum(dO * o) in f32, as the block kernels form it
              for (int64_t c = 0; c < hdv; ++c) D += to_f32(pd[row + c]) * to_f32(po[row + c]);
              sum += static_cast<double>(std::exp(sink - lse[(b * nh + h) * Tq + i])) * D;
            }
          pg[h] = from_f32<G>(to_f32(pg[h]) - static_cast<float>(sum));
        }
      });
    });
  });
}

}  // namespace fp::ops::cpu
