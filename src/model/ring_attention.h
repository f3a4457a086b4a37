// Ring attention over the context-parallel ranks (docs/design.md, "Architecture").
// Legend: B sequences, N = T / W tokens per rank (zig-zag pieces, data/context_split.h), nh/nkv
// heads, hd the query/key head width, hdv the value/output head width (Note [Value heads of their own
// width], ops/attention.h).
//
// Forward: each rank keeps its queries; the K/V blocks of all ranks travel the ring (rank r sends to
// r + 1 and receives from r - 1), and each arriving block's partial attention, causal by global
// positions, is merged into the running (o, lse) with the log-sum-exp rule. Exact: the same function
// as attention over the whole sequence, only the summation order differs.
// Backward: with the final o and lse, K/V travel the ring again together with their dK/dV
// accumulators; each rank adds its queries' contribution; after W hops every block is home with its
// complete dK/dV, and each rank's dQ has seen every block.
// Transfers are blocking send_recv for now (the overlap with the block's compute comes with the
// stream-ordered comm of the schedules). Buffers: category comm, two blocks of K (B, N, nkv, hd) and of
// V (B, N, nkv, hdv) (and of dK, dV, the same shapes).
#pragma once

#include "model/blocks.h"

namespace fp {

// q (B, N, nh, hd), k (B, N, nkv, hd), v (B, N, nkv, hdv) -> o (B, N, nh, hdv), lse (B, nh, N). a: the
// rank's spec as whole-sequence attention would take it (StepContext::attention_spec: sizes, scale,
// window, documents); the ring adds the global positions of its queries and of each block's keys. The
// tensors may have any shape of these sizes (the model's are 2-D).
// A tile of queries (Note [Sequence-tiled layers] in model/layer_tiles.cpp): a.Tq = Nq < N queries of each
// of a.B sequences, the rank's positions q0 .. q0 + Nq - 1 (q (B, Nq, nh, hd), o, lse of Nq), against all
// N keys of those sequences (a.Tk = N): the blocks that travel are those B sequences' K/V.
void ring_attention_forward(StepContext& s, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o, Tensor& lse,
                            ops::AttentionSpec a, int64_t q0 = 0);
// dout (B, N, nh, hdv) -> dq (B, N, nh, hd), dk (B, N, nkv, hd), dv (B, N, nkv, hdv), overwritten (with
// accumulate, dk and dv f32 and added to instead: a tile's share). a, q0: the forward's.
void ring_attention_backward(StepContext& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                             ops::AttentionSpec a, int64_t q0 = 0, bool accumulate = false);

}  // namespace fp
