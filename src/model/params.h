// Parameters with Hugging Face names (Qwen3MoeForCausalLM), each with its gradient, laid out over the
// W ranks of a run.
//
// Legend: H hidden, V vocabulary, nh/nkv query/key-value heads, hd head_dim, E experts,
// I expert FFN width, W ranks, R rows of a parameter (its dim 0), C = numel / R its row length,
// Rp = ceil(R / W) rows per rank. Linear weights are stored (out, in) like nn.Linear.
//
// Note [FSDP layout]: with W > 1 ranks every dense parameter (embedding, attention, norms, router,
// final norm, LM head) is sharded along dim 0 in contiguous blocks: rank r holds rows
// [r Rp, min((r + 1) Rp, R)) in shard tensors of Rp rows, so every rank sends the same count to
// all_gather and receives the same from reduce_scatter (the last ranks' padding rows stay zero; a
// rank may hold no real row at all). The shard keeps the tensor's rank (AdamW decays rank >= 2 only).
// Parameters are grouped into units gathered together right before use and freed right after:
//   fsdp.embed_tokens  the embedding (forward only: its backward needs no weight)
//   fsdp.layer         one layer's dense weights (both norms, q/k/v/o and their biases, q_norm, k_norm or
//                      MLA's projections and latent norms, the router and its bias, the shared experts, or
//                      a dense layer's MLP)
//   fsdp.lm_head       model.norm + lm_head (the plain "full" head: every rank computes N x V logits)
//   fsdp.norm          model.norm alone (Ring-DTP reads its own lm_head rows, lm_head_shard())
// A gathered unit is one buffer (category params) of W Rp rows per parameter, filled by one all_gather
// per parameter in HF order; while it is gathered, each of its params' w is a full-shaped view into it
// (Tensor::view), so the blocks read p.w exactly as on one rank. In backward the unit's unsharded
// gradient ("<unit>.grad", category grads) takes the blocks' += and is then reduce-scattered into the
// shards: the sum over ranks runs in the comm's fixed order, so results are deterministic for a W. A
// parameter kept in f32 among bf16 ones (Note [Parameters kept in f32]) goes into a second buffer of
// its unit, "<unit>.f32", allocated right after the first (its gradient into "<unit>.f32.grad"); a unit
// of one dtype has the one buffer.
// Experts are not sharded by rows: expert parallelism gives rank r experts [r E/W, (r + 1) E/W) whole
// (model/layout.h); the others are not allocated on r at all (their LayerParams entries are null), and
// the owner's gradient already sums every rank's tokens (the dispatch brings them), so an expert's
// gradient needs no reduction. That is ep = W; in general:
//
// Note [Experts in groups]: parallel.ep = ep splits the W ranks into W / ep expert groups of ep
// consecutive ranks; rank r is rank r % ep of group r / ep. Each group holds every expert once, laid out
// over its ep ranks as above (rank r holds the experts of rank r % ep of a group of ep), so the W / ep
// groups are replicas of the experts. A step's expert dispatch runs within the group (expert_comm(),
// StepContext::ep): each rank's routed copies reach their experts on the ranks of its own group, which
// is why ep must divide W and E. An expert's gradient on rank r then sums only its group's tokens, so
// before an update the optimizer sums it over the replicas (replica_grads_reduce: one all-reduce per
// expert tensor over the W / ep ranks that hold it, in the comm's fixed order, the same bits on every
// replica), and the gradient norm counts an expert once, on the first group. Every replica then takes
// the same update and stays equal. Checkpoints read an expert on every replica and write it from the
// first group (layout()'s owner is a rank of group 0). ep = 1: every rank holds every expert and no
// routed copy leaves its rank.
//
// Note [Dense shards in groups] (HSDP): parallel.fsdp = f shards the dense parameters within groups of f
// consecutive ranks (rank r holds the rows of rank r % f of a world of f, Note [FSDP layout] with W = f)
// and replicates them across the W / f groups, as PyTorch's HYBRID_SHARD: a unit is gathered and its
// gradient reduce-scattered within the group (shard_comm()), and before an update the optimizer sums each
// shard's gradient over the groups holding the same rows (replica_grads_reduce, as the experts'). The
// gradient norm counts a dense row on the first group only. Ring-DTP's vocabulary ring reads the lm_head
// rows of this layout, so it runs within the group (StepContext::vocab); the loss and its token count
// stay global. f = W (the default) is plain FSDP.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/precision.h"
#include "model/config.h"
#include "model/layout.h"

namespace fp {

// The ranks per expert group (parallel.ep) and per dense-shard group (parallel.fsdp); 0: every rank
// (Note [Experts in groups], Note [Dense shards in groups]).
struct RankGroups {
  int ep = 0;
  int fsdp = 0;
};

// How one parameter is laid out over the ranks (Note [FSDP layout]).
enum class Placement {
  Placement_whole,  // one rank holds the whole tensor (one process; an expert on its owner)
  Placement_rows,   // FSDP: every rank holds a block of rows
};

// The block of rows of an (R, C) tensor that `rank` of `world` holds: [row0, row0 + rows), in shard
// tensors of rows_padded = ceil(R / world) rows (the same on every rank).
struct RowBlock {
  int64_t row0 = 0, rows = 0, rows_padded = 0;
};
RowBlock row_block(int64_t R, int rank, int world);

// Note [Parameters kept in f32]: every weight is stored in precision.params and its gradient in
// precision.grads, except DeepSeek-V3's routing bias mlp.gate.e_score_correction_bias, whose weight and
// gradient are f32 whatever the precision (on meta too, so its ledger is that of a real bf16 run).
// transformers keeps it so (_keep_in_fp32_modules_strict, checkpoints write it F32): the bias only
// moves the top-k choice, by differences between experts that the bias update makes in steps of
// moe.bias_update_rate (1e-3), while bf16's spacing is 2^-7 = 7.8e-3 at |b| = 1: rounded to bf16, a
// bias there would stop moving (each step rounds away) and its experts tie. Its gradient stays zero
// (no gradient flows into it, Note [Sigmoid routing]); it is f32 too, so that a parameter's weight and
// gradient share one dtype (the optimizers stage both through the same buffers). The router's GEMM
// reads the bf16 mlp.gate.weight widened and writes f32 logits, as transformers'
// F.linear(h.float(), w.float()).
struct Param {
  std::string name;  // Hugging Face tensor name
  Shape shape;       // the full (Hugging Face) shape
  Placement placement = Placement::Placement_whole;
  // What the blocks read and accumulate into, full-shaped (shape). whole: the storage
  // (categories params, grads). rows: views into the gathered unit while it is gathered (w) and into
  // its unsharded gradient during its backward (g); undefined otherwise.
  Tensor w;
  Tensor g;  // accumulated (+=) by backward
  // rows only: this rank's rows, (rows_padded, shape[1:]), categories params and grads.
  Tensor w_shard, g_shard;
  RowBlock block;  // rows: which rows; whole: all R of them

  // The storage this rank owns, updates (optimizer) and saves (checkpoints): the shard or the tensor.
  Tensor& local_w() { return placement == Placement::Placement_rows ? w_shard : w; }
  Tensor& local_g() { return placement == Placement::Placement_rows ? g_shard : g; }
  const Tensor& local_w() const { return placement == Placement::Placement_rows ? w_shard : w; }
  const Tensor& local_g() const { return placement == Placement::Placement_rows ? g_shard : g; }
};

// One parameter of the model as every rank sees it (ParamStore::layout()).
struct ParamInfo {
  std::string name;
  Shape shape;          // the full shape
  Placement placement;
  int owner = 0;        // whole: the rank that holds it; rows: -1 (every rank holds rows)
  Param* local = nullptr;  // this rank's Param; null when another rank holds the whole tensor
};

// With W > 1 the entries of the experts another rank owns are null (Note [FSDP layout]).
// A dense layer (ModelConfig::layer_is_sparse false) has mlp_* instead of the router and experts; the
// biases exist with attention_bias only. What a layer does not have is null.
struct LayerParams {
  int64_t index = 0;                          // the layer's number (its attention window: layer_window)
  Param* input_layernorm = nullptr;           // (H)
  Param* q_proj = nullptr;                    // (nh*hd, H)
  Param* q_bias = nullptr;                    // (nh*hd) self_attn.q_proj.bias
  Param* k_proj = nullptr;                    // (nkv*hd, H)
  Param* k_bias = nullptr;                    // (nkv*hd)
  Param* v_proj = nullptr;                    // (nkv*hd, H)
  Param* v_bias = nullptr;                    // (nkv*hd)
  Param* o_proj = nullptr;                    // (H, nh*hd)
  Param* o_bias = nullptr;                    // (H)
  Param* q_norm = nullptr;                    // (hd)   qwen3_moe
  Param* k_norm = nullptr;                    // (hd)   qwen3_moe
  Param* sinks = nullptr;                     // (nh)   gpt_oss: self_attn.sinks (Note [Attention sinks])
  // deepseek_v3's multi-head latent attention (dqk = qk_nope + qk_rope, dn = qk_nope, dr = qk_rope, dv =
  // v_head_dim, ql = q_lora_rank, kl = kv_lora_rank): q_proj (nh*dqk, H) when ql = 0, else these three.
  Param* q_a_proj = nullptr;                  // (ql, H)
  Param* q_a_layernorm = nullptr;             // (ql)
  Param* q_b_proj = nullptr;                  // (nh*dqk, ql)
  Param* kv_a_proj_with_mqa = nullptr;        // (kl + dr, H)
  Param* kv_a_layernorm = nullptr;            // (kl)
  Param* kv_b_proj = nullptr;                 // (nh*(dn + dv), kl); o_proj is (H, nh*dv)
  Param* post_attention_layernorm = nullptr;  // (H)
  Param* gate = nullptr;                      // (E, H) the router (gpt_oss: mlp.router.weight)
  Param* router_bias = nullptr;               // (E)    gpt_oss: mlp.router.bias, added to the logits
  // deepseek_v3: the router's selection bias (E) (Note [Sigmoid routing]): a parameter without gradient
  // (its gradient stays zero, so AdamW leaves it; moe.bias_update_rate moves it after each step).
  Param* gate_bias = nullptr;                 // (E) mlp.gate.e_score_correction_bias
  std::vector<Param*> gate_proj;              // E x (I, H)
  std::vector<Param*> up_proj;                // E x (I, H)
  std::vector<Param*> down_proj;              // E x (H, I)
  // gpt_oss: the experts' biases, per expert (train/checkpoint.cpp reads and writes transformers' fused
  // mlp.experts.gate_up_proj_bias and down_proj_bias); empty otherwise.
  std::vector<Param*> gate_proj_bias;         // E x (I)
  std::vector<Param*> up_proj_bias;           // E x (I)
  std::vector<Param*> down_proj_bias;         // E x (H)
  Param* mlp_gate_proj = nullptr;             // (Id, H) a dense layer's MLP, Id = intermediate_size
  Param* mlp_up_proj = nullptr;               // (Id, H)
  Param* mlp_down_proj = nullptr;             // (H, Id)
  // deepseek_v3: the shared experts of a MoE layer, one SwiGLU of width Is = n_shared_experts * I.
  Param* shared_gate_proj = nullptr;          // (Is, H) mlp.shared_experts.gate_proj
  Param* shared_up_proj = nullptr;            // (Is, H)
  Param* shared_down_proj = nullptr;          // (H, Is)
};

// This rank's rows of lm_head (V, H) (Ring-DTP's vocabulary shard): rows [row0, row0 + rows) of the
// vocabulary; w and g point at (rows_padded, H) buffers whose padding rows are zero (null on meta).
// On one rank: all V rows of lm_head's w and g. In the params and grads dtypes.
struct ParamShard {
  int64_t row0 = 0, rows = 0, rows_padded = 0;
  Buf w;
  Buf g;
};

class ParamStore {
 public:
  // Allocates every weight (params) and gradient (grads) on the backend, in HF order, laid out over
  // comm's ranks (Note [FSDP layout]); comm null or of one rank: every parameter whole. comm must
  // outlive the store. Weights (and gathered units) are allocated in precision.params, gradients in
  // precision.grads, but for the parameters kept in f32 (Note [Parameters kept in f32]); the
  // optimizers read master and moments from precision() too.
  // groups: the ranks per expert group and per dense-shard group (Note [Experts in groups], Note [Dense
  // shards in groups]); 0: every rank of comm.
  ParamStore(const ModelConfig& cfg, Backend& be, Comm* comm = nullptr, const Precision& precision = {},
             RankGroups groups = {});

  // cpu: linear weights and embeddings ~ N(0, 0.02) (HF initializer_range), norms = 1; deterministic
  // in seed and the same numbers for any W (every rank draws the full tensors, keeps its rows).
  // meta: nothing to write.
  void init(uint64_t seed);
  // Zeroes this rank's gradient storage (local_g of every parameter).
  void zero_grads();

  // The parameters this rank holds storage for, in HF order.
  std::deque<Param>& all() { return params_; }
  const std::deque<Param>& all() const { return params_; }
  // nullptr when there is no such name or this rank holds none of it.
  Param* find(const std::string& name);
  // Every parameter of the model, in HF order: the same list on every rank (built on first use).
  const std::vector<ParamInfo>& layout();
  // The experts of every layer this rank holds (all of them on one rank).
  const ExpertLayout& experts() const { return experts_; }

  Comm& comm() const { return *comm_; }
  // Note [Experts in groups]: the ranks of this rank's expert group (the expert dispatch runs among
  // them; comm itself when the experts are split over every rank), and the groups: this rank's is
  // expert_replica() of expert_replicas(), each a replica of the experts.
  Comm& expert_comm() const { return ep_.comm != nullptr ? *ep_.comm : *comm_; }
  int expert_replicas() const { return comm_->size() / ep_.size; }
  int expert_replica() const { return comm_->rank() / ep_.size; }
  // Note [Dense shards in groups]: the ranks the dense parameters are sharded over (comm itself unless
  // parallel.fsdp < W), and this rank's group among the W / fsdp.
  Comm& shard_comm() const { return shard_.comm != nullptr ? *shard_.comm : *comm_; }
  int shard_replica() const { return comm_->rank() / shard_.size; }
  // Sums each expert's gradient over its replicas and each dense shard's over the groups holding the same
  // rows (collective over comm; nothing with one group of each), so that every replica takes the same
  // update: once per optimizer step, after the last backward (Note [Experts in groups]).
  void replica_grads_reduce();
  // True when p's gradient is summed on another group too, so that a global sum over ranks (the gradient
  // norm) counts p on the first group only.
  bool replicated_elsewhere(const Param& p) const {
    return p.placement == Placement::Placement_whole ? expert_replica() > 0 : shard_replica() > 0;
  }
  // The run's dtypes (core/precision.h): params and grads here, master and moments for the optimizers.
  const Precision& precision() const { return precision_; }
  int rank() const { return comm_->rank(); }
  int world() const { return comm_->size(); }
  bool sharded() const { return comm_->size() > 1; }

  // ---- FSDP units (Note [FSDP layout]); on one rank every call below does nothing.
  int64_t unit_embed() const { return 0; }
  int64_t unit_layer(int64_t l) const { return 1 + l; }
  int64_t unit_head() const { return 1 + cfg_.num_hidden_layers; }  // model.norm + lm_head
  int64_t unit_norm() const { return 2 + cfg_.num_hidden_layers; }  // model.norm alone
  // Allocates the unit's buffer ("fsdp.<unit>", category params; a second one "fsdp.<unit>.f32" for
  // parameters kept in f32 among others), all-gathers its parameters into it and points their w at it.
  void unit_gather(int64_t u);
  // Frees the gathered buffer; the unit's w become undefined.
  void unit_release(int64_t u);
  // Allocates the unit's unsharded gradient ("fsdp.<unit>.grad", category grads), zero but for this
  // rank's rows, which start from its shard gradients (so backward keeps accumulating), and points
  // the unit's g at it.
  void unit_grad_begin(int64_t u);
  // Reduce-scatters the unsharded gradient into the shard gradients (sum over ranks) and frees it.
  void unit_grad_reduce(int64_t u);

  // This rank's rows of lm_head (Ring-DTP's vocabulary shard), see ParamShard.
  ParamShard lm_head_shard();

  // ---- whole tensors (checkpoints). Collective: every rank calls them for the same parameter of
  // layout(), in the same order. local is this rank's storage laid out like p.local->local_w() (the
  // weights, or an optimizer moment of p), device or host memory of the backend; null when the rank
  // holds none of p.
  // Rank 0 receives p's full tensor (numel of p.shape) into host; other ranks may pass null.
  void full_gather(const ParamInfo& p, const Tensor* local, float* host);
  // Every rank passes the full tensor (numel of p.shape) in host and keeps its part in local.
  void full_scatter(const ParamInfo& p, const float* host, Tensor* local);

  Param* embed_tokens = nullptr;  // (V, H)
  Param* norm = nullptr;          // (H)
  Param* lm_head = nullptr;       // (V, H); with tie_word_embeddings the same Param as embed_tokens
                                  // (Note [Tied embeddings])
  std::vector<LayerParams> layers;

 private:
  // The parameters of a unit that share one dtype (weight and gradient), gathered into one buffer.
  struct UnitPart {
    std::string name;             // the unit's name, + ".f32" for a second part of f32 parameters
    DType w_dtype = DType::DType_F32, g_dtype = DType::DType_F32;
    int64_t numel = 0;            // sum over its params of W Rp C
    Tensor w;                     // (numel) category params, while gathered
    Tensor g;                     // (numel) category grads, during the unit's backward
  };
  // One group of row-sharded parameters gathered together.
  struct Unit {
    std::string name;             // "fsdp.layer", ...
    std::vector<Param*> params;   // HF order
    std::vector<size_t> part;     // the part of each param
    std::vector<int64_t> offset;  // first element of each param in its part's buffer
    std::vector<UnitPart> parts;  // one per dtype, in the order of their first param (one part: all alike)
  };
  struct Entry;
  // Calls fn(const Entry&) for every parameter of the model in HF order (params.cpp).
  template <class Fn>
  void walk(Fn&& fn);
  // Allocates a parameter this rank holds (whole, or its rows): weight in w_dtype, gradient in g_dtype.
  Param* add(const std::string& name, const Shape& shape, Placement placement, DType w_dtype, DType g_dtype);
  void unit_add(const std::string& name, std::vector<Param*> params);

  Backend& be_;
  const ModelConfig cfg_;
  std::unique_ptr<Comm> single_;  // the one-process world when no comm is given
  Comm* comm_;                      // the control channel (host data)
  std::unique_ptr<DataComm> data_;  // the backend's data channel over it (device shards)
  // A group of ranks (the experts', the dense shards') and its replicas: with size < W, this rank's
  // group and the ranks at its place in the other groups (null when size = W).
  struct Group {
    int size = 1;
    std::unique_ptr<Comm> comm, replicas;
    std::unique_ptr<DataComm> data, replica_data;
  };
  void group_make(int size, const char* key, Group& g);
  DataComm& shard_data() { return shard_.data != nullptr ? *shard_.data : *data_; }
  int shard_rank() const { return comm_->rank() % shard_.size; }
  Group ep_, shard_;
  std::deque<Param> params_;  // a deque: Param* stay valid as it grows
  std::vector<ParamInfo> layout_;  // empty until layout() is first called
  ExpertLayout experts_;
  std::unordered_map<std::string, Param*> by_name_;
  std::vector<Unit> units_;   // embed, layers 0..L-1, head, norm (empty on one rank)
  Precision precision_;
};

}  // namespace fp
