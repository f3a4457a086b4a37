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
// V (B, N, nkv, hdv) (and of dK, dV, the same shapes); with ckpt.layer_tile = N' < N, blocks of N' keys of
// each sequence, the ring going round once per chunk (Note [The ring's blocks in chunks] in
// model/ring_attention.cpp).
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

// Note [MLA's ring on the latent]
// Multi-head latent attention (model/mla_block.cpp) expands every token's keys and values from its normed
// latent c (kl numbers) and one RoPE'd key k_pe (dr) shared by the heads: nh x (dn + dr) key and nh x dv value
// numbers per token, 64 x (192 + 128) = 20480 for Kimi-K2 against 512 + 64 = 576. So the MLA ring sends the
// latent rows [c | k_pe] (n, kl + dr) and each rank expands the block it holds, hop by hop, with the layer's
// kv_b_proj (the same weights and GEMM on every rank: the keys and values the owner would have sent, bit
// for bit). The backward sends the latent rows again with their gradient, f32 (n, kl + dr): at each hop
// the rank's queries' dK and dV of the block (f32) go back through the expansion, into the traveling d c
// (dK_nope and dV through kv_b_proj) and d k_pe (the heads' RoPE parts summed, fixed head order), and into
// kv_b_proj's weight gradient (f32, added to the parameter's once at the end). Against the expanded ring
// the sums over hops run before the kv_b_proj GEMMs instead of after: the same function to rounding.
// Comm buffers: two latent blocks and two f32 latent gradients instead of two K, V blocks and two f32 dK,
// dV; the expanded K and V (and dK, dV) of one block, or of a chunk of it (Note [MLA's keys in chunks]), exist
// for one hop (category activations).
// q (B, N, nh, dqk) -> o (B, N, nh, dv), lse (B, nh, N); latent (B N, kl + dr). a: as for
// ring_attention_forward (hd = dqk, hdv = dv), and so is a tile of queries (a.Tq < N from q0; latent: the
// tile's B sequences' rows).
void ring_attention_mla_forward(StepContext& s, const LayerParams& lp, const Tensor& q, const Tensor& latent, Tensor& o,
                                Tensor& lse, ops::AttentionSpec a, int64_t q0 = 0);
// dout (B, N, nh, dv) -> dq (B, N, nh, dqk) overwritten, dlatent (B N, kl + dr) f32 overwritten (with accumulate:
// added to, a tile's share); kv_b_proj's gradient accumulated.
void ring_attention_mla_backward(StepContext& s, const LayerParams& lp, const Tensor& q, const Tensor& latent,
                                 const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dlatent,
                                 ops::AttentionSpec a, int64_t q0 = 0, bool accumulate = false);

// Note [MLA's keys in chunks]
// The keys and values MLA expands from its latent take nh (dqk + dv) numbers per key (20480 for Kimi-K2), and
// their f32 gradients as many again: expanded for a whole block they bind the plan. With ckpt.layer_tile = N
// (Note [Sequence-tiled layers] in model/layer_tiles.cpp) they exist for at most N keys of each sequence at a
// time: mla_attend_forward expands a block's latent rows chunk by chunk and merges each chunk into (o, lse)
// by the block kernel's log-sum-exp rule, as the ring merges its hops; mla_attend_backward folds each chunk's
// dK, dV back through the expansion into the latent's f32 gradient and kv_b_proj's at once. In a tile with
// cp = 1 the chunks cover the keys of the tile's sequences up to its last query; in a ring hop they split the
// ring's chunk (Note [The ring's blocks in chunks] in model/ring_attention.cpp: at most 8 of a block, so of N
// keys or more). A chunk of every key (N = 0 or N >= Tk) is one call, bit for bit the unchunked code; smaller
// chunks merge in another order (to rounding). Cost: each chunk's expansion GEMM again per tile of queries.
// q (B, Tq, nh, dqk) against the keys of latent rows (B, Tk, kl + dr): o (B, Tq, nh, dv) and lse (B, nh, Tq)
// merged (first: the first chunk starts them). a: the block pair's spec (q_pos (Tq), k_pos (Tk)).
void mla_attend_forward(StepContext& s, const LayerParams& lp, CBuf q, CBuf latent, Buf o, float* lse, bool first,
                        const ops::AttentionSpec& a, int64_t chunk);
// Their backward from the final (o, lse): dq (B, Tq, nh, dqk) += the queries' share; dlatent (B, Tk, kl + dr)
// f32 += the keys' latent gradient; dw (nh (dn + dv), kl) += kv_b_proj's gradient.
void mla_attend_backward(StepContext& s, const LayerParams& lp, CBuf q, CBuf latent, CBuf o, const float* lse,
                         CBuf dout, Buf dq, Buf dlatent, Buf dw, const ops::AttentionSpec& a, int64_t chunk);

}  // namespace fp
