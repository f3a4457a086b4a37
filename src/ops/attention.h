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
// With documents (Note [Documents in attention]) it also sees only keys of its own document.
// Tile pairs (query tile, key tile) holding no visible (query, key) pair are never computed, so the cost
// is about T * min(w, T) rather than T^2 / 2 (Note [Sliding-window bands], backend/cpu/kernels/attention_tile.h),
// and about sum over documents of len^2 / 2 with documents.
//
// Note [Documents in attention]: a window of packed documents (torchtitan's block_causal mask,
// Transformer Engine's THD with cu_seqlens) is given by doc_start, (B, Tq) int32 on the device: for each
// query, the position in its sequence where its document begins. Key j is visible to query i only if
// doc_start[b, i] <= pos(j): documents are contiguous, so the keys at or after the start of i's
// document and at or before i are exactly the earlier keys of the same document. The mask stays a run
// of keys per query whose ends ascend with i (doc_start ascends along a sequence, and it is never past
// the query itself), so the tiled kernels skip the tile pairs across documents as they skip those
// outside a window. Null: one document per sequence (doc_start = 0).
//
// Note [Attention sinks]: gpt-oss gives each query head h a learned logit sink_h that joins every query
// row's softmax as one more entry with no value: p_j = exp(s_j - lse'), lse' = log(sum_j exp(s_j) +
// exp(sink_h)), o = sum_j p_j v_j, and the sink's own share exp(sink_h - lse') goes nowhere. In the online
// softmax it is one more term of the row's running sum, joined once: a call with first = true
// (ops/attention_block.h; whole-sequence attention is one) starts each row's state (m, l) at (sink_h, 1)
// instead of (-inf, 0), so a row with no visible key gets o = 0 and lse = sink_h, and the ring's later
// blocks merge into that state as into any other. The backward needs nothing new: with lse' and the
// final o, P = exp(s - lse') and D = rowsum(dO * o) are already those of the sink softmax (the sink's
// entry has dP = 0, so dS_sink = -p_sink D), and attention_sink_backward adds the sink's gradient,
// d sink_h = -sum over the head's rows of exp(sink_h - lse') D.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The sizes and the mask of one attention call (this header's kernels and ops/attention_block.h's):
// the argument struct of the four kernels, whose tensor operands stay positional.
struct AttentionSpec {
  int64_t B = 0;            // sequences
  int64_t Tq = 0, Tk = 0;   // queries and keys of each sequence (whole-sequence kernels: Tq = Tk = T)
  int64_t nh = 0, nkv = 0;  // query heads, key/value heads (nh % nkv == 0)
  int64_t hd = 0, hdv = 0;  // query/key and value/output head widths
  float scale = 0.0f;       // usually hd^-0.5
  int64_t window = 0;       // sliding window (0: none)
  // Device int32 operands. q_pos (Tq) and k_pos (Tk): the global positions of the block kernels
  // (ops/attention_block.h); the whole-sequence kernels take none (null: 0 .. T-1).
  const int32_t* q_pos = nullptr;
  const int32_t* k_pos = nullptr;
  // (B, Tq) where each query's document begins, or null (Note [Documents in attention]).
  const int32_t* doc_start = nullptr;
  // (nh) each head's sink logit, f32 or bf16, or null: none (Note [Attention sinks]). Joined by the
  // forward kernels' first call only.
  CBuf sinks;
};

// Whole-sequence attention: a spec of T queries and T keys with no positions.
inline AttentionSpec attention_spec(int64_t B, int64_t T, int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, float scale,
                                    int64_t window, const int32_t* doc_start = nullptr) {
  AttentionSpec a;
  a.B = B;
  a.Tq = a.Tk = T;
  a.nh = nh;
  a.nkv = nkv;
  a.hd = hd;
  a.hdv = hdv;
  a.scale = scale;
  a.window = window;
  a.doc_start = doc_start;
  return a;
}

}  // namespace fp::ops

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// q (B, T, nh, hd), k (B, T, nkv, hd), v (B, T, nkv, hdv) -> o (B, T, nh, hdv), lse (B, nh, T) the
// log-sum-exp of each query's scaled scores over its visible keys (kept for backward). a: Tq = Tk = T,
// no positions.
// q, k, v, o (and in backward dout, dq, dk, dv) all f32 or all bf16, lse f32: ops/attention_block.h's
// storage rule (each output element rounded once).
using attention_forward_fn = void(CBuf q, CBuf k, CBuf v, Buf o, float* lse, AttentionSpec a);

// Recomputes the probabilities tile by tile from q, k and lse. o, dout (B, T, nh, hdv); dq (B, T, nh, hd),
// dk (B, T, nkv, hd), dv (B, T, nkv, hdv) are overwritten. a: the forward's. Deterministic.
using attention_backward_fn = void(CBuf q, CBuf k, CBuf v, CBuf o, const float* lse, CBuf dout, Buf dq, Buf dk, Buf dv,
                                   AttentionSpec a);

// The sinks' gradient (Note [Attention sinks]), ADDED to dsinks (nh): dsinks[h] += -sum over b, i of
// exp(sinks[h] - lse[b, h, i]) D[b, h, i], D = rowsum(dout * o) over hdv, for the a.B x a.Tq query rows of
// o, dout (B, Tq, nh, hdv) and lse (B, nh, Tq), the FINAL forward state (after every key block). Each head
// sums its rows in order in double and adds once: deterministic. a.sinks must be set.
using attention_sink_backward_fn = void(CBuf o, CBuf dout, const float* lse, Buf dsinks, AttentionSpec a);

}  // namespace fp::ops
