// The two blocks of a decoder layer and the LM head, forward and backward, written against the
// backend's kernel table. The step (step/step.cpp) drives them.
//
// Legend: n tokens on this rank (B sequences of T), H hidden, nh/nkv heads, hd head_dim,
// E experts, k experts per token, m = n * k routed copies, I expert FFN width, V vocabulary.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "comm/comm.h"
#include "model/config.h"
#include "model/params.h"
#include "model/rope_scaling.h"
#include "ops/attention.h"
#include "ops/rope.h"

namespace fp {

class ExpertDispatch;  // model/expert_dispatch.h
// What an expert dispatch keeps from its forward for its backward: each variant's own subclass
// (model/expert_dispatch.h). Destroying it frees its tensors.
struct DispatchActs {
  virtual ~DispatchActs() = default;
};

// What every block of one step shares.
struct StepContext {
  // ep_comm: the expert group (ParamStore::expert_comm); vocab_comm: the dense-shard group
  // (ParamStore::shard_comm); null: cm.
  StepContext(Backend& b, const ModelConfig& c, RoutingProfile p, Comm& cm, Comm* ep_comm = nullptr,
              Comm* vocab_comm = nullptr)
      : be(b),
        cfg(c),
        rope(rope_table(c)),
        profile(p),
        comm(cm),
        data_channel(b.data_channel(cm)),
        data(*data_channel),
        ep(ep_comm != nullptr ? *ep_comm : cm),
        ep_channel(ep_comm != nullptr && ep_comm != &cm ? b.data_channel(*ep_comm) : nullptr),
        ep_data(ep_channel != nullptr ? *ep_channel : data),
        vocab(vocab_comm != nullptr ? *vocab_comm : cm),
        vocab_channel(vocab_comm != nullptr && vocab_comm != &cm ? b.data_channel(*vocab_comm) : nullptr),
        vocab_data(vocab_channel != nullptr ? *vocab_channel : data) {}
  Backend& be;
  const ModelConfig& cfg;
  // The model's RoPE frequencies (Note [RoPE scaling as transformers computes it]), once per step
  // (dynamic RoPE: recomputed by the step for its sequence length).
  RopeTable rope;
  // The table's inv_freq on the device (the step uploads it: kernels read device buffers only, Note
  // [Kernel execution context]), with its factor.
  Tensor rope_inv_freq;  // (head_dim / 2) f64
  ops::RopeFreqs rope_freqs() const {
    return {static_cast<const double*>(rope_inv_freq.data()), static_cast<float>(rope.attention_factor)};
  }
  RoutingProfile profile;
  // The ranks (context-parallel, experts sharded over them; size 1: one process): the control channel
  // for host data (counts, plans, totals) and the backend's data channel for device buffers, whose
  // calls are ordered with a stream (comm/data_comm.h).
  Comm& comm;
  std::unique_ptr<DataComm> data_channel;
  DataComm& data;
  // The ranks the experts are split over and the expert dispatch runs among (Note [Experts in groups] in
  // model/params.h): comm itself unless parallel.ep < W; the dispatch moves its rows on ep_data.
  Comm& ep;
  std::unique_ptr<DataComm> ep_channel;
  DataComm& ep_data;
  // The ranks Ring-DTP's vocabulary ring spans: those lm_head's rows are sharded over (Note [Dense shards
  // in groups] in model/params.h): comm itself unless parallel.fsdp < W.
  Comm& vocab;
  std::unique_ptr<DataComm> vocab_channel;
  DataComm& vocab_data;
  // The dtype of each kind of tensor (Note [Which dtype each allocation gets] in core/precision.h):
  // every block allocates in it; the model's (Model::precision), all f32 unless the run says otherwise.
  Precision precision;
  ExpertDispatch* dispatch = nullptr;  // the step's expert dispatch (expert_dispatch_create); null: local (W = 1)
  int64_t B = 0, T = 0, n = 0;
  // The context-parallel group (Note [A device mesh] in train/trainer.cpp): cp consecutive ranks of the comm
  // share each sequence (ring attention); cp = 1: every rank holds whole sequences.
  int cp = 1;
  int cp_rank() const { return comm.rank() % cp; }
  int cp_first() const {
    return comm.rank() - cp_rank();
  }  // the group's first rank in the comm         // T: this rank's tokens per sequence
  // The MoE blocks' token side in chunks of this many of the rank's tokens (moe.token_chunk; 0: all n at
  // once), read by the MoE block only: each dispatch call is given its window explicitly (MoeChunk in
  // model/expert_dispatch.h; Note [The MoE token side in chunks] in model/moe_block.cpp).
  int64_t moe_token_chunk = 0;
  // Each layer's token-wise work in equal tiles of at most this many of the rank's tokens (ckpt.layer_tile;
  // 0: whole layers): layer_forward_tiled / layer_backward_tiled (Note [Sequence-tiled layers] in
  // model/layer_tiles.cpp).
  int64_t layer_tile = 0;
  // The step's positions, on the device (data/batch.h). pos: each token's RoPE position, its position in
  // its document (in its sequence without documents). ring_pos: with cp > 1, every rank's positions of this
  // rank's context-parallel group (data/context_split.h: group rank r's T at row r), which ring attention
  // masks by; empty otherwise. doc_start: where each token's document begins in its sequence (Note [Documents in
  // attention] in ops/attention.h); empty: one document per sequence.
  Tensor pos;        // (n) i32
  Tensor ring_pos;   // (cp, T) i32
  Tensor doc_start;  // (n) i32
  Tensor tile_pos;   // (T) i32 the sequence's positions (0 .. T-1): a tile's query and key positions with cp = 1
                     // (layer_tile > 0 only)
  // The attention spec of this step's sequences: this rank's T queries and keys, with its documents.
  ops::AttentionSpec attention_spec(int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, float scale,
                                    int64_t window) const {
    return ops::attention_spec(B, T, nh, nkv, hd, hdv, scale, window, doc_start.defined() ? doc_start.i32() : nullptr);
  }
  // The MoE block's host scratch, reused across layers (no allocation per layer once sized). The expert
  // order itself is built on the device and stays there (Note [The routing sort on the device] in
  // model/moe_block.cpp).
  std::vector<int32_t> host_topk;  // (n, k) a routing profile's choice, uploaded to every MoE block
  // Note [A routing profile is routed once per step]: a profile's choice depends only on (n, k, E),
  // never on the layer or the data, so with a profile the first MoE block builds host_topk and these
  // offsets and every later block (and the recompute) reuses them: it uploads the choice and sorts it
  // on the device, but never reads the offsets back. On meta only the offsets, in closed form (Note
  // [Meta routes a profile in closed form] in model/routing.cpp).
  std::vector<int64_t> profile_offsets;  // (E + 1) once the step's profile is routed; empty before
  // The same per chunk of the MoE token side, on meta (Note [The MoE token side in chunks]).
  std::vector<std::vector<int64_t>> profile_chunk_offsets;
  // The n those were built for: a block of another n (the last, shorter tile of Note [Sequence-tiled
  // layers]) takes that n's instead (moe_block.cpp, profile_cache_for_n).
  int64_t profile_n = -1;
  // Note [One routing per token count] (model/moe_block.cpp): what was routed for the step's other n's, by n.
  struct ProfileRouting {
    std::vector<int64_t> offsets;
    std::vector<std::vector<int64_t>> chunk_offsets;
    std::vector<int32_t> host_topk;
  };
  std::map<int64_t, ProfileRouting> profile_by_n;
  // Route afresh at every change of n instead, the dispatch too (tests: the same ledgers, event for event).
  bool reroute_each_n = false;
};

// ---- attention block: x1 = x + o_proj(attention(rope(norm_q(q)), rope(norm_k(k)), v)), q,k,v from rmsnorm(x)
struct AttnActs {
  Tensor h1, rstd1;        // (n, H), (n)
  Tensor q_raw, k_raw, v;  // (n, nh*hd), (n, nkv*hd), (n, nkv*hd): projections
  Tensor q, k;             // after q_norm/k_norm and RoPE
  Tensor rstd_q, rstd_k;   // (n*nh), (n*nkv)
  Tensor o, lse;           // (n, nh*hd), (B, nh, T)
  // MLA (Note [Multi-head latent attention] in model/mla_block.cpp; rstd_q, rstd_k: the latents' norms).
  Tensor q_a, q_a_n;    // (n, ql) the query latent before and after q_a_layernorm
  Tensor kv_a, kv_a_n;  // (n, kl) the key/value latent before and after kv_a_layernorm
  Tensor latent;        // (n, kl + dr) [kv_a_n | RoPE'd k_pe]: what MLA's ring sends (cp > 1; ring_attention.h)
};
// The attention spec of a layer's GQA attention on the step's sequences: its window (layer_window), its
// sinks (gpt_oss, Note [Attention sinks] in ops/attention.h), scale head_dim^-0.5.
ops::AttentionSpec layer_attention_spec(const StepContext& s, const LayerParams& lp);
// x (n, H) -> x1 (n, H), allocated here (category activations). keep: when not null, everything
// backward needs is left in it; otherwise intermediates are freed as soon as they are consumed.
Tensor attn_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs* keep);
// The attention block's output for `rows` rows: x1 = x + o W_o^T (+ o_proj's bias), a new tensor (category
// activations) named attn.x1; o (rows, width). Shared by the whole block, MLA's and a layer tile's.
Tensor attn_output(StepContext& s, const LayerParams& lp, CBuf x, CBuf o, int64_t rows, int64_t width);
// dx (n, H): in d x1, out d x (the residual path plus the block's input gradient). Frees `a`.
void attn_block_backward(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs& a, Tensor& dx);
// The same contract for deepseek_v3's multi-head latent attention (model/mla_block.cpp); attn_block_forward
// and attn_block_backward call these for that model type.
Tensor mla_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs* keep);
void mla_block_backward(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs& a, Tensor& dx);
// MLA's pieces that its tiles share (Note [Sequence-tiled layers] in model/layer_tiles.cpp): the softmax scale; the
// queries of r rows from h1 (r, H) into a.q (r, nh dqk), RoPE'd on each head's last dr numbers at pos (r), with
// a query latent (q_lora_rank > 0) through a.q_a, a.q_a_n, a.rstd_q (kept with keep); their backward from dq
// (RoPE undone in place; freed) into dh1 (r, H, overwritten) and the query weights' gradients; and
// kv_a_proj_with_mqa's backward from its two row blocks' output gradients, dh1 += dkv_a W_c + dk_pe W_pe.
float mla_softmax_scale(const ModelConfig& c);
void mla_queries_forward(StepContext& s, const LayerParams& lp, CBuf h1, int64_t r, const int32_t* pos, AttnActs& a,
                         bool keep);
void mla_queries_backward(StepContext& s, const LayerParams& lp, Tensor& dq, CBuf h1, int64_t r, const int32_t* pos,
                          AttnActs& a, Buf dh1);
void mla_kv_a_backward(StepContext& s, const LayerParams& lp, CBuf dkv_a, CBuf dk_pe, CBuf h1, int64_t r, Buf dh1);

// ---- MoE block: x2 = x1 + sum_j w_j expert_{e_j}(rmsnorm(x1)) [+ shared(rmsnorm(x1))]
// The routed copies go to their experts through s.dispatch (model/expert_dispatch.h): with W > 1
// only the experts this rank owns (model/layout.h) are read and get gradients. The token side (this
// rank's own m = n k routed copies: rows, slot_pos, xs, ys, dys, dxs) is category activations, sized
// by the config; category dispatch holds only what the dispatch receives from other ranks.
struct MoeActs {
  Tensor h2, rstd2;                        // (n, H), (n)
  Tensor probs;                            // (n, E) router softmax (the sigmoid router: its scores)
  Tensor topk_idx, topk_w;                 // (n, k) i32, (n, k)
  Tensor rows, slot_pos;                   // (m) i32, (n, k) i32: expert order <-> token order
  std::vector<int64_t> offsets;            // (E + 1) rows of each expert in expert order (host)
  std::unique_ptr<DispatchActs> dispatch;  // what the expert dispatch keeps (routed copies, FFN intermediates)
  Tensor ys;                               // (m, H) expert outputs in expert order (activations)
  Tensor shared_g, shared_u, shared_act;   // (n, Is) x 3: the shared experts' FFN (Note [Shared experts])
};
// Per-layer routing statistics for the load-balancing loss.
struct RouterStats {
  std::vector<int64_t> counts;  // (E) routed copies per expert (host: the routing sort's offsets)
  // (E) on the device, f64: the block adds the sums over its tokens of the router probability here (the
  // step's row of this layer, zeroed by it, read once at the step's end: Note [One read at the step's end]
  // in step/step.cpp); null when nobody reads them.
  double* prob_sum = nullptr;
};
// The output x2 is allocated in category out_cat (checkpoints when it is the next layer's boundary).
Tensor moe_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x1, MoeActs* keep, RouterStats* stats,
                         Category out_cat = Category::Category_activations, const std::string& out_name = "moe.x2");
// dx (n, H): in d x2, out d x1. aux_bias (E) on the device: d loss / d probs of every token from
// the load-balancing loss (may be undefined when the coefficient is 0). Frees `a`.
void moe_block_backward(StepContext& s, const LayerParams& lp, const Tensor& x1, MoeActs& a, const Tensor& aux_bias,
                        Tensor& dx);
// The recompute before backward and the backward (moe_block_forward with keep, then moe_block_backward),
// or, with s.moe_token_chunk < n, both chunk by chunk (Note [The MoE token side in chunks] in
// model/moe_block.cpp). moe_block_forward without keep chunks the same way.
void moe_block_recompute_backward(StepContext& s, const LayerParams& lp, const Tensor& x1, const Tensor& aux_bias,
                                  Tensor& dx);

// ---- dense MLP block (a layer ModelConfig::layer_is_sparse calls dense):
// x2 = x1 + down(silu(gate h2) * up h2), h2 = rmsnorm(x1); Qwen3MoeMLP of width intermediate_size.
struct MlpActs {
  Tensor rstd2;          // (n)
  Tensor h2, g, u, act;  // (n, H), (n, Id) x 3: what the FFN's backward reads (model/expert_ffn.h)
};
// The output x2 is allocated in category out_cat, named out_name (as moe_block_forward's).
Tensor mlp_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x1, MlpActs* keep, Category out_cat,
                         const std::string& out_name);
// dx (n, H): in d x2, out d x1. Frees `a`.
void mlp_block_backward(StepContext& s, const LayerParams& lp, const Tensor& x1, MlpActs& a, Tensor& dx);

// ---- a whole decoder layer in tiles of s.layer_tile tokens (Note [Sequence-tiled layers] in
// model/layer_tiles.cpp): the attention block, then the MoE block (sparse) or the dense MLP.
// x (n, H) -> the layer's output (n, H), allocated in out_cat named out_name; stats as moe_block_forward's
// (a dense layer leaves it alone).
// before_output, when set, runs once K and V are computed, right before the output is allocated (the
// checkpoint store's settle: the previous boundary leaves the device first).
Tensor layer_forward_tiled(StepContext& s, const LayerParams& lp, const Tensor& x, bool sparse, RouterStats* stats,
                           Category out_cat, const std::string& out_name,
                           const std::function<void()>& before_output = {});
// The recompute from the boundary x and the backward: dx (n, H) in d (the layer's output), out d x.
void layer_backward_tiled(StepContext& s, const LayerParams& lp, const Tensor& x, bool sparse, const Tensor& aux_bias,
                          Tensor& dx);

// ---- head, plain ("full") vocabulary schedule: final RMSNorm, logits, log-softmax and their gradient
// each (n, V) fp32. Returns the sum of the token losses; writes dxL (n, H) and accumulates the gradients of
// model.norm and lm_head. scale = 1 / (number of target tokens).
struct HeadResult {
  // (1) on the device (category workspace): f32 from the plain head, f64 from Ring-DTP's. Not read by the
  // head: the step reads it once at its end (Note [One read at the step's end] in step/step.cpp).
  Tensor loss_sum;
};
// The head's loss sum on the host, as a double (NaN on meta). A blocking copy: call it where the device has
// drained anyway (the step's end).
double head_loss_sum(Backend& be, const HeadResult& r);
// With backward = false (evaluation) only the loss is computed and dxL is not touched.
HeadResult head_full_forward_backward(StepContext& s, ParamStore& ps, const Tensor& xL, const Tensor& targets,
                                      float scale, Tensor& dxL, std::vector<float>* logits_out, bool backward = true);

// Linear layers as GEMMs with nn.Linear weights W (out, in):
//   y (n, out) = x (n, in) W^T + beta y;  dx (n, in) = dy W + beta dx;  dW (out, in) += dy^T x.
void linear_forward(Backend& be, CBuf x, CBuf W, Buf y, int64_t n, int64_t in, int64_t out, float beta = 0.0f);
void linear_backward_input(Backend& be, CBuf dy, CBuf W, Buf dx, int64_t n, int64_t in, int64_t out, float beta = 0.0f);
void linear_backward_weight(Backend& be, CBuf dy, CBuf x, Buf dW, int64_t n, int64_t in, int64_t out);
// The backend's rmsnorm_backward with its scratch (the dw partials) allocated through the ledger,
// category workspace, for the call's duration: every byte an op uses is on the ledger.
void rmsnorm_backward(Backend& be, CBuf x, CBuf w, const float* rstd, CBuf dy, Buf dx, Buf dw, int64_t rows, int64_t d);

// p + off, keeping null (meta) pointers null; for kernel operands, off elements of their dtype.
template <class T>
inline T* ptr_at(T* p, int64_t off) {
  return p == nullptr ? nullptr : p + off;
}
inline Buf ptr_at(Buf p, int64_t off) { return p.at(off); }
inline CBuf ptr_at(CBuf p, int64_t off) { return p.at(off); }

// body(i) for i = 0 .. count - 1, where the caller states that every iteration allocates and frees the same
// tensors in the same order as the first and holds nothing after it (Note [Repeats replayed once] in
// memory/ledger.h): where the backend computes nothing and its ledgers count repeats, the first runs and the
// others are counted; returns how many were counted (0: all ran). An iteration that does not end where it
// began is refused (fp::Error), never half replayed: every rank decides alike, so the collectives an
// iteration calls stay matched. Whatever else an iteration does must be of no account on meta: kernels, the
// data channel (meta's does nothing), collectives every rank repeats alike, and host state the caller
// repeats itself (the returned count).
template <class Body>
int64_t repeat_same(Backend& be, int64_t count, Body&& body) {
  Ledger& d = be.device_ledger();
  Ledger& h = be.host_ledger();
  if (count > 1 && !be.computes() && d.repeats() && h.repeats()) {
    const LedgerMark md = d.mark(), mh = h.mark();
    be.repeat_begin(count);  // the first stands for all of them in the counts of work
    try {
      body(int64_t{0});
    } catch (...) {
      be.repeat_end();
      throw;
    }
    be.repeat_end();
    d.repeat(md, static_cast<uint64_t>(count - 1));  // refuses a block that does not end where it began
    h.repeat(mh, static_cast<uint64_t>(count - 1));
    return count - 1;
  }
  for (int64_t i = 0; i < count; ++i) body(i);
  return 0;
}

}  // namespace fp
