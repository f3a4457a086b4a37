// Grouped-query attention of a block of queries against a block of keys/values, masked by GLOBAL token
// positions, with a running (o, lse) that merges the partial results of successive key blocks: the
// kernels of ring attention (context parallelism). Each rank keeps its queries while the key/value
// blocks of all ranks pass by; after every block has been merged, (o, lse) equal the causal attention
// of ops/attention.h over the whole sequence (to rounding), with the same sliding window if any.
// Backward: with the final (o, lse), each (query block, key block) pair adds its terms to dq of the
// queries and to dk, dv of the keys.
// Dimensions: B sequences, Tq queries and Tk keys of each sequence in this block pair, nh query heads,
// nkv key/value heads (nh % nkv == 0; query head h reads kv head h / (nh / nkv)), hd the query/key head
// width, hdv the value/output head width (Note [Value heads of their own width], ops/attention.h), scale
// usually hd^-0.5. Layouts as in ops/attention.h: (B, T, heads, hd or hdv) rows, (B, nh, T) log-sum-exps.
//
// Storage: q, k, v (and the backward's o, dout) are all f32 or all bf16 in one call (the recipe's
// activations; Note [Kernel operands carry their dtype] in core/buf.h); the outputs the ring
// accumulates over its blocks, o (forward) and dq, dk, dv (backward), are in that dtype too or f32
// (ring attention's accumulators: f32 whatever the recipe, Note [Ring attention accumulates in f32]
// in model/ring_attention.cpp); lse is f32 always. bf16 rows are widened
// into the f32 tiles, every product, softmax and accumulation is f32, and each output element is
// rounded once per call: o when written or merged, dq/dk/dv when this block pair's share is added. So
// a bf16 call gives exactly the f32 call's results on the widened inputs, rounded (tested); across the
// key blocks of a ring, bf16 outputs would be rounded once per block (the ring's f32 ones: never).
//
// Masking: key j is visible to query i iff k_pos[j] <= q_pos[i], and with a sliding window w > 0 also
// q_pos[i] - w < k_pos[j] (ops/attention.h's window, by global positions), and with documents also
// doc_start[b, i] <= k_pos[j] (Note [Documents in attention] in ops/attention.h; doc_start holds global
// positions too, ascending along each sequence, doc_start[b, i] <= q_pos[i]). q_pos (Tq) and k_pos (Tk) are
// the global positions (the same for every sequence b), each ascending (not necessarily contiguous;
// equal positions allowed); the zig-zag pieces of data/context_split.h are. The keys a query sees are
// then one contiguous run of the block, possibly empty; a query that sees no key of the block gets
// nothing from it. window = 0 is plain causal masking, and so is any window larger than every
// q_pos[i] - k_pos[j], bit for bit. Tile pairs holding no visible pair are never computed: a block
// entirely outside every query's window costs only the binary searches that find the visible runs.
#pragma once

#include <cstdint>

#include "core/buf.h"
#include "ops/attention.h"

namespace fp::ops {

// A block pair's spec: q_pos (Tq) and k_pos (Tk) device positions, the rest as ops::attention_spec.
inline AttentionSpec attention_block_spec(const int32_t* q_pos, const int32_t* k_pos, int64_t B, int64_t Tq, int64_t Tk,
                                          int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, float scale, int64_t window,
                                          const int32_t* doc_start = nullptr) {
  AttentionSpec a = attention_spec(B, Tq, nh, nkv, hd, hdv, scale, window, doc_start);
  a.Tk = Tk;
  a.q_pos = q_pos;
  a.k_pos = k_pos;
  return a;
}

}  // namespace fp::ops

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// Folds the block (k, v) into the running state of the queries q.
// q (B, Tq, nh, hd); k (B, Tk, nkv, hd); v (B, Tk, nkv, hdv); a.q_pos (Tq), a.k_pos (Tk) ascending.
// first = true: o (B, Tq, nh, hdv), lse (B, nh, Tq) := this block's attention and log-sum-exp; a query
//   with no visible key gets o = 0, lse = -inf. Their previous contents are not read.
// With a.sinks (Note [Attention sinks] in ops/attention.h) a first call joins each row's sink logit: a
//   query with no visible key then gets o = 0, lse = sink; a later call never reads a.sinks.
// first = false: merged with the previous state by the log-sum-exp rule
//   lse' = log(exp(lse) + exp(lse_b)),  o' = o exp(lse - lse') + o_b exp(lse_b - lse'),
//   where (o_b, lse_b) are this block's; a query with no visible key here keeps (o, lse) bit for bit,
//   and one whose state is still (0, -inf) takes (o_b, lse_b). Never NaN for finite inputs.
// a.window >= 0 (0: none). With first = true and q_pos = k_pos = 0 .. T-1 this is attention_forward of
// ops/attention.h with the same window and documents, bit for bit.
// Deterministic: each query row is computed by one thread in a fixed order.
using attention_block_forward_fn = void(CBuf q, CBuf k, CBuf v, Buf o, float* lse, bool first, AttentionSpec a);

// The block pair's share of the gradient, ADDED to dq, dk, dv. o, lse are the FINAL forward state of the
// queries (after every key block was merged), dout (B, Tq, nh, hdv) the gradient of o (B, Tq, nh, hdv). The
// probabilities P = exp(scale q.k - lse) are recomputed tile by tile and D = rowsum(dout * o) inside (no
// extra input: it costs Tq * nh * hdv per tile row, nothing next to the tile products). Summed over all
// key blocks this is attention_backward of ops/attention.h.
// dq (B, Tq, nh, hd) += scale dS K;  dk (B, Tk, nkv, hd) += scale dS^T Q;  dv (B, Tk, nkv, hdv) += P^T dout,
// with dS = P (dO V^T - D), P and dS zero on masked pairs. a: the forward's. Deterministic: the
// same bits for any thread count.
using attention_block_backward_fn = void(CBuf q, CBuf k, CBuf v, CBuf o, const float* lse, CBuf dout, Buf dq, Buf dk,
                                         Buf dv, AttentionSpec a);

// The tile pairs attention_block_forward computes for each (sequence, query head) of spec a, summed over
// the sequences: the work measure of a block pair (ring balance studies, plan/ring_balance.h), each
// backend's own (its tiles). A host query of the positions and document starts, like a workspace size:
// a.q_pos, a.k_pos, a.doc_start are read on the host.
using attention_block_tile_pairs_fn = int64_t(const AttentionSpec& a);

}  // namespace fp::ops
