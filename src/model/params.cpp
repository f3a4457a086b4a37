// Parameter store and its FSDP layout (Note [FSDP layout] in params.h).
// Legend: W ranks, R rows of a parameter, C its row length, Rp = ceil(R / W).
#include "model/params.h"

#include <algorithm>
#include <vector>

#include "core/rng.h"

namespace fp {

namespace {

int64_t row_length(const Shape& s) { return s.rank == 0 || s[0] == 0 ? 0 : s.numel() / s[0]; }

// shape with its dim 0 replaced by rows.
Shape with_rows(const Shape& s, int64_t rows) {
  Shape out = s;
  out.dims[0] = rows;
  return out;
}

// Element `off` of a tensor (f32 or bf16), keeping null (meta) data null.
void* ptr_at_elems(const Tensor& t, int64_t off) { return t.buf().at(off).p; }

// Note [Parameters in another dtype than the host's f32]: init, checkpoints and benchmarks hand
// ParamStore whole tensors as host f32; a bf16 parameter takes them rounded to nearest even (as
// torch's .to(torch.bfloat16)) and gives them back widened (exact), converted on the host by the
// backend's host kernels (Note [Host kernels] in backend/backend.h).
void host_to_local(Backend& be, const float* host, int64_t n, Tensor& local) {
  if (local.dtype() == DType::DType_F32) return be.copy_from_host(local.data(), host, static_cast<uint64_t>(n) * 4);
  std::vector<bf16> h(static_cast<size_t>(n));
  be.host_kernels().copy(Buf(h.data()), CBuf(host), n);
  be.copy_from_host(local.data(), h.data(), static_cast<uint64_t>(n) * sizeof(bf16));
}
void local_to_host(Backend& be, const Tensor& local, int64_t n, float* host) {
  if (local.dtype() == DType::DType_F32) return be.copy_to_host(host, local.data(), static_cast<uint64_t>(n) * 4);
  std::vector<bf16> h(static_cast<size_t>(n));
  be.copy_to_host(h.data(), local.data(), static_cast<uint64_t>(n) * sizeof(bf16));
  be.host_kernels().copy(Buf(host), CBuf(h.data()), n);
}

}  // namespace

RowBlock row_block(int64_t R, int rank, int world) {
  RowBlock b;
  b.rows_padded = (R + world - 1) / world;
  b.row0 = std::min<int64_t>(R, rank * b.rows_padded);
  b.rows = std::min<int64_t>(R, b.row0 + b.rows_padded) - b.row0;
  return b;
}

// One parameter as ParamStore::walk gives it; its name is built only when asked (entry_name).
struct ParamStore::Entry {
  int64_t layer = -1;        // -1: outside the layers
  int64_t expert = -1;       // -1: not an expert's
  const char* leaf = "";     // the name within its layer (or expert), or the whole name
  Shape shape;
  Placement placement = Placement::Placement_whole;
  int owner = 0;             // whole: the rank that holds it; rows: -1
  Param** slot = nullptr;    // the field of this store that points at it
  bool keep_f32 = false;     // weight and gradient f32 whatever the precision (Note [Parameters kept in f32])
};

namespace {
std::string entry_name(int64_t layer, int64_t expert, const char* leaf) {
  if (layer < 0) return leaf;
  if (expert < 0) return fmt::format("model.layers.{}.{}", layer, leaf);
  return fmt::format("model.layers.{}.mlp.experts.{}.{}", layer, expert, leaf);
}
}  // namespace

// Every parameter of the model in HF order: the one list the store allocates from and layout() names.
template <class Fn>
void ParamStore::walk(Fn&& fn) {
  const ModelConfig& cfg = cfg_;
  const int W = comm_->size();
  const Placement dense = W > 1 ? Placement::Placement_rows : Placement::Placement_whole;
  const int rows = W > 1 ? -1 : 0;
  const int64_t H = cfg.hidden_size, hd = cfg.head_dim, I = cfg.moe_intermediate_size;
  const int64_t q = cfg.num_attention_heads * hd, kv = cfg.num_key_value_heads * hd, Id = cfg.intermediate_size;
  const bool bias = cfg.attention_bias;
  fn(Entry{-1, -1, "model.embed_tokens.weight", {cfg.vocab_size, H}, dense, rows, &embed_tokens});
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    LayerParams& l = layers[i];
    fn(Entry{i, -1, "input_layernorm.weight", {H}, dense, rows, &l.input_layernorm});
    if (cfg.is_deepseek()) {
      // Multi-head latent attention (DeepseekV3Attention).
      const int64_t nh = cfg.num_attention_heads, dqk = cfg.qk_head_dim(), ql = cfg.q_lora_rank, kl = cfg.kv_lora_rank;
      if (ql > 0) {
        fn(Entry{i, -1, "self_attn.q_a_proj.weight", {ql, H}, dense, rows, &l.q_a_proj});
        fn(Entry{i, -1, "self_attn.q_a_layernorm.weight", {ql}, dense, rows, &l.q_a_layernorm});
        fn(Entry{i, -1, "self_attn.q_b_proj.weight", {nh * dqk, ql}, dense, rows, &l.q_b_proj});
      } else {
        fn(Entry{i, -1, "self_attn.q_proj.weight", {nh * dqk, H}, dense, rows, &l.q_proj});
      }
      fn(Entry{i, -1, "self_attn.kv_a_proj_with_mqa.weight", {kl + cfg.qk_rope_head_dim, H}, dense, rows,
               &l.kv_a_proj_with_mqa});
      fn(Entry{i, -1, "self_attn.kv_a_layernorm.weight", {kl}, dense, rows, &l.kv_a_layernorm});
      fn(Entry{i, -1, "self_attn.kv_b_proj.weight", {nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), kl}, dense, rows,
               &l.kv_b_proj});
      fn(Entry{i, -1, "self_attn.o_proj.weight", {H, nh * cfg.v_head_dim}, dense, rows, &l.o_proj});
    } else {
      fn(Entry{i, -1, "self_attn.q_proj.weight", {q, H}, dense, rows, &l.q_proj});
      if (bias) fn(Entry{i, -1, "self_attn.q_proj.bias", {q}, dense, rows, &l.q_bias});
      fn(Entry{i, -1, "self_attn.k_proj.weight", {kv, H}, dense, rows, &l.k_proj});
      if (bias) fn(Entry{i, -1, "self_attn.k_proj.bias", {kv}, dense, rows, &l.k_bias});
      fn(Entry{i, -1, "self_attn.v_proj.weight", {kv, H}, dense, rows, &l.v_proj});
      if (bias) fn(Entry{i, -1, "self_attn.v_proj.bias", {kv}, dense, rows, &l.v_bias});
      fn(Entry{i, -1, "self_attn.o_proj.weight", {H, q}, dense, rows, &l.o_proj});
      if (bias) fn(Entry{i, -1, "self_attn.o_proj.bias", {H}, dense, rows, &l.o_bias});
      if (cfg.qk_norm()) {
        fn(Entry{i, -1, "self_attn.q_norm.weight", {hd}, dense, rows, &l.q_norm});
        fn(Entry{i, -1, "self_attn.k_norm.weight", {hd}, dense, rows, &l.k_norm});
      }
      if (cfg.attention_sinks()) fn(Entry{i, -1, "self_attn.sinks", {cfg.num_attention_heads}, dense, rows, &l.sinks});
    }
    fn(Entry{i, -1, "post_attention_layernorm.weight", {H}, dense, rows, &l.post_attention_layernorm});
    if (!cfg.layer_is_sparse(i)) {
      fn(Entry{i, -1, "mlp.gate_proj.weight", {Id, H}, dense, rows, &l.mlp_gate_proj});
      fn(Entry{i, -1, "mlp.up_proj.weight", {Id, H}, dense, rows, &l.mlp_up_proj});
      fn(Entry{i, -1, "mlp.down_proj.weight", {H, Id}, dense, rows, &l.mlp_down_proj});
      continue;
    }
    if (cfg.router_bias()) {  // gpt_oss's names
      fn(Entry{i, -1, "mlp.router.weight", {cfg.num_experts, H}, dense, rows, &l.gate});
      fn(Entry{i, -1, "mlp.router.bias", {cfg.num_experts}, dense, rows, &l.router_bias});
    } else {
      fn(Entry{i, -1, "mlp.gate.weight", {cfg.num_experts, H}, dense, rows, &l.gate});
    }
    if (cfg.router_sigmoid())  // Note [Parameters kept in f32]
      fn(Entry{i, -1, "mlp.gate.e_score_correction_bias", {cfg.num_experts}, dense, rows, &l.gate_bias, true});
    if (cfg.n_shared_experts > 0) {
      const int64_t Is = cfg.n_shared_experts * I;
      fn(Entry{i, -1, "mlp.shared_experts.gate_proj.weight", {Is, H}, dense, rows, &l.shared_gate_proj});
      fn(Entry{i, -1, "mlp.shared_experts.up_proj.weight", {Is, H}, dense, rows, &l.shared_up_proj});
      fn(Entry{i, -1, "mlp.shared_experts.down_proj.weight", {H, Is}, dense, rows, &l.shared_down_proj});
    }
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      const int owner = expert_owner(e, ep_.size, cfg.num_experts);  // a rank of the first expert group
      const Placement whole = Placement::Placement_whole;
      const bool eb = cfg.expert_bias();
      fn(Entry{i, e, "gate_proj.weight", {I, H}, whole, owner, &l.gate_proj[e]});
      if (eb) fn(Entry{i, e, "gate_proj.bias", {I}, whole, owner, &l.gate_proj_bias[e]});
      fn(Entry{i, e, "up_proj.weight", {I, H}, whole, owner, &l.up_proj[e]});
      if (eb) fn(Entry{i, e, "up_proj.bias", {I}, whole, owner, &l.up_proj_bias[e]});
      fn(Entry{i, e, "down_proj.weight", {H, I}, whole, owner, &l.down_proj[e]});
      if (eb) fn(Entry{i, e, "down_proj.bias", {H}, whole, owner, &l.down_proj_bias[e]});
    }
  }
  fn(Entry{-1, -1, "model.norm.weight", {H}, dense, rows, &norm});
  // Note [Tied embeddings]: with tie_word_embeddings lm_head is not a parameter of its own (transformers
  // writes no lm_head.weight); the store points lm_head at embed_tokens, so the head reads the embedding
  // matrix and adds its gradient to the embedding's. Under FSDP both units that read it (fsdp.embed_tokens,
  // fsdp.lm_head) hold the one parameter; they are never gathered at the same time, and each unit's
  // gradient starts from the shard gradient the other left (unit_grad_begin), so the sum is complete.
  if (!cfg.tie_word_embeddings) fn(Entry{-1, -1, "lm_head.weight", {cfg.vocab_size, H}, dense, rows, &lm_head});
}

void ParamStore::group_make(int size, const char* key, Group& g) {
  const int W = comm_->size();
  g.size = size > 0 ? size : W;
  FP_CHECK(g.size <= W && W % g.size == 0, fmt::format("choose {} dividing the number of ranks (0: all of them)", key),
           "{} = {} does not divide the {} ranks", key, size, W);
  if (g.size == W) return;
  g.comm = comm_->split(comm_->rank() / g.size);      // this rank's group
  g.replicas = comm_->split(comm_->rank() % g.size);  // the ranks at its place in the other groups
  g.data = be_.data_channel(*g.comm);
  g.replica_data = be_.data_channel(*g.replicas);
}

ParamStore::ParamStore(const ModelConfig& cfg, Backend& be, Comm* comm, const Precision& precision, RankGroups groups)
    : be_(be), cfg_(cfg), comm_(comm), precision_(precision) {
  if (comm_ == nullptr) {
    single_ = comm_single();
    comm_ = single_.get();
  }
  data_ = be.data_channel(*comm_);
  const int W = comm_->size();
  // Note [Experts in groups], Note [Dense shards in groups]: ep (fsdp) consecutive ranks share the experts
  // (the dense rows); the groups are replicas.
  group_make(groups.ep, "parallel.ep", ep_);
  group_make(groups.fsdp, "parallel.fsdp", shard_);
  experts_ = expert_layout(comm_->rank() % ep_.size, ep_.size, cfg.num_experts);  // a user error unless ep divides E
  layers.resize(cfg.num_hidden_layers);
  for (LayerParams& l : layers) {
    l.index = &l - layers.data();
    l.gate_proj.assign(static_cast<size_t>(cfg.num_experts), nullptr);
    l.up_proj.assign(static_cast<size_t>(cfg.num_experts), nullptr);
    l.down_proj.assign(static_cast<size_t>(cfg.num_experts), nullptr);
    if (cfg.expert_bias()) {
      l.gate_proj_bias.assign(static_cast<size_t>(cfg.num_experts), nullptr);
      l.up_proj_bias.assign(static_cast<size_t>(cfg.num_experts), nullptr);
      l.down_proj_bias.assign(static_cast<size_t>(cfg.num_experts), nullptr);
    }
  }
  // Only what this rank holds is named and allocated: another rank's experts cost nothing here (at
  // 384 experts, 39 layers and 64 ranks, 45K names per rank that the planner's meta steps never read).
  walk([&](const Entry& p) {
    if (p.placement == Placement::Placement_whole && p.owner != comm_->rank() % ep_.size) return;
    const DType f = DType::DType_F32;
    *p.slot = add(entry_name(p.layer, p.expert, p.leaf), p.shape, p.placement, p.keep_f32 ? f : precision_.params,
                  p.keep_f32 ? f : precision_.grads);
  });
  if (cfg.tie_word_embeddings) lm_head = embed_tokens;  // Note [Tied embeddings]

  if (W == 1) return;
  unit_add("fsdp.embed_tokens", {embed_tokens});
  for (const LayerParams& l : layers)
    unit_add("fsdp.layer", {l.input_layernorm,
                            l.q_proj,
                            l.q_bias,
                            l.q_a_proj,
                            l.q_a_layernorm,
                            l.q_b_proj,
                            l.k_proj,
                            l.k_bias,
                            l.v_proj,
                            l.v_bias,
                            l.kv_a_proj_with_mqa,
                            l.kv_a_layernorm,
                            l.kv_b_proj,
                            l.o_proj,
                            l.o_bias,
                            l.q_norm,
                            l.k_norm,
                            l.sinks,
                            l.post_attention_layernorm,
                            l.gate,
                            l.router_bias,
                            l.gate_bias,
                            l.shared_gate_proj,
                            l.shared_up_proj,
                            l.shared_down_proj,
                            l.mlp_gate_proj,
                            l.mlp_up_proj,
                            l.mlp_down_proj});
  unit_add("fsdp.lm_head", {norm, lm_head});
  unit_add("fsdp.norm", {norm});
}

const std::vector<ParamInfo>& ParamStore::layout() {
  if (layout_.empty())
    walk([&](const Entry& p) {
      layout_.push_back({entry_name(p.layer, p.expert, p.leaf), p.shape, p.placement, p.owner, *p.slot});
    });
  return layout_;
}

Param* ParamStore::add(const std::string& name, const Shape& shape, Placement placement, DType w_dtype,
                       DType g_dtype) {
  Param& p = params_.emplace_back();
  p.name = name;
  p.shape = shape;
  p.placement = placement;
  if (placement == Placement::Placement_rows) {
    p.block = row_block(shape[0], shard_rank(), shard_.size);
    const Shape local = with_rows(shape, p.block.rows_padded);
    p.w_shard = be_.alloc(Category::Category_params, local, w_dtype, name);
    p.g_shard = be_.alloc(Category::Category_grads, local, g_dtype, name + ".grad");
    // Padding rows must read as zero: the gathered weight and the reduce-scatter see them.
    be_.kernels().fill(p.w_shard.buf(), 0.0f, p.w_shard.numel());
  } else {
    p.block = RowBlock{0, shape[0], shape[0]};
    p.w = be_.alloc(Category::Category_params, shape, w_dtype, name);
    p.g = be_.alloc(Category::Category_grads, shape, g_dtype, name + ".grad");
  }
  by_name_[name] = &p;
  return &p;
}

void ParamStore::unit_add(const std::string& name, std::vector<Param*> params) {
  Unit& u = units_.emplace_back();
  u.name = name;
  std::erase(params, nullptr);  // what the layer does not have (biases, router or dense MLP)
  for (Param* p : params) {
    FP_ASSERT(p->placement == Placement::Placement_rows, "unit {} holds '{}', which is not row-sharded", name, p->name);
    const DType wd = p->w_shard.dtype(), gd = p->g_shard.dtype();
    size_t k = 0;
    while (k < u.parts.size() && (u.parts[k].w_dtype != wd || u.parts[k].g_dtype != gd)) ++k;
    if (k == u.parts.size()) {
      // Note [Parameters kept in f32]: only f32 parameters join a unit of another dtype.
      FP_ASSERT(k == 0 || (wd == DType::DType_F32 && gd == DType::DType_F32), "unit {}: '{}' in a third dtype", name,
                p->name);
      UnitPart& part = u.parts.emplace_back();
      part.name = k == 0 ? name : name + ".f32";
      part.w_dtype = wd;
      part.g_dtype = gd;
    }
    u.part.push_back(k);
    u.offset.push_back(u.parts[k].numel);
    u.parts[k].numel += shard_.size * p->block.rows_padded * row_length(p->shape);
  }
  u.params = std::move(params);
}

Param* ParamStore::find(const std::string& name) {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void ParamStore::init(uint64_t seed) {
  if (!be_.computes()) return;
  // The stream of numbers runs over the full tensors in HF order whatever W is, so every layout starts
  // from the same model.
  Rng rng(seed);
  std::vector<float> host;
  for (const ParamInfo& p : layout()) {
    host.resize(static_cast<size_t>(p.shape.numel()));
    // As transformers starts them: biases and DeepSeek-V3's routing bias zero, norms one, the rest (and
    // gpt-oss's sinks and router bias) ~ N(0, 0.02).
    const bool drawn = p.name.ends_with(".sinks") || p.name.ends_with("mlp.router.bias");
    const bool is_bias = !drawn && (p.name.ends_with(".bias") || p.name.ends_with(".e_score_correction_bias"));
    const bool is_norm = p.shape.rank == 1 && !is_bias && !drawn;
    for (float& v : host) v = is_bias ? 0.0f : is_norm ? 1.0f : static_cast<float>(0.02 * rng.normal());
    full_scatter(p, host.data(), p.local ? &p.local->local_w() : nullptr);
  }
  zero_grads();
}

void ParamStore::replica_grads_reduce() {
  for (Param& p : params_) {
    // With W > 1 only the experts are whole; the rest are dense rows.
    const Group& g = p.placement == Placement::Placement_whole ? ep_ : shard_;
    if (g.replica_data == nullptr) continue;
    Tensor& grad = p.local_g();
    g.replica_data->all_reduce_sum(be_.compute_stream(), grad.data(), grad.numel(), grad.dtype());
  }
}

void ParamStore::zero_grads() {
  for (Param& p : params_) be_.kernels().fill(p.local_g().buf(), 0.0f, p.local_g().numel());
}

// ---- FSDP units

void ParamStore::unit_gather(int64_t ui) {
  if (units_.empty()) return;
  Unit& u = units_[static_cast<size_t>(ui)];
  for (UnitPart& part : u.parts) {
    FP_ASSERT(!part.w.defined(), "unit {} {} is already gathered", ui, part.name);
    part.w = be_.alloc(Category::Category_params, {part.numel}, part.w_dtype, part.name);
  }
  for (size_t i = 0; i < u.params.size(); ++i) {
    Param& p = *u.params[i];
    const Tensor& w = u.parts[u.part[i]].w;
    // Rank r's Rp rows land at rows [r Rp, (r + 1) Rp): the first R rows are the tensor in order.
    shard_data().all_gather(be_.compute_stream(), p.w_shard.data(), ptr_at_elems(w, u.offset[i]), p.w_shard.numel(),
                            p.w_shard.dtype());
    p.w = Tensor::view(w, u.offset[i], p.shape, p.name);
  }
}

void ParamStore::unit_release(int64_t ui) {
  if (units_.empty()) return;
  Unit& u = units_[static_cast<size_t>(ui)];
  for (Param* p : u.params) p->w.reset();
  for (UnitPart& part : u.parts) part.w.reset();
}

void ParamStore::unit_grad_begin(int64_t ui) {
  if (units_.empty()) return;
  Unit& u = units_[static_cast<size_t>(ui)];
  const ops::KernelLauncher K = be_.kernels();
  for (UnitPart& part : u.parts) {
    FP_ASSERT(!part.g.defined(), "unit {} {} already has its gradient", ui, part.name);
    part.g = be_.alloc(Category::Category_grads, {part.numel}, part.g_dtype, part.name + ".grad");
    K.fill(part.g.buf(), 0.0f, part.numel);
  }
  for (size_t i = 0; i < u.params.size(); ++i) {
    Param& p = *u.params[i];
    const Tensor& g = u.parts[u.part[i]].g;
    const int64_t n = p.g_shard.numel();  // Rp C
    K.copy(g.buf().at(u.offset[i] + shard_rank() * n), p.g_shard.cbuf(), n);
    p.g = Tensor::view(g, u.offset[i], p.shape, p.name + ".grad");
  }
}

void ParamStore::unit_grad_reduce(int64_t ui) {
  if (units_.empty()) return;
  Unit& u = units_[static_cast<size_t>(ui)];
  for (const UnitPart& part : u.parts)
    FP_ASSERT(part.g.defined(), "unit {} {} has no gradient to reduce", ui, part.name);
  for (size_t i = 0; i < u.params.size(); ++i) {
    Param& p = *u.params[i];
    // Padding rows of the unsharded gradient are zero (nothing writes past row R), so the shard's
    // padding stays zero.
    shard_data().reduce_scatter_sum(be_.compute_stream(), ptr_at_elems(u.parts[u.part[i]].g, u.offset[i]),
                                    p.g_shard.data(), p.g_shard.numel(), p.g_shard.dtype());
    p.g.reset();
  }
  for (UnitPart& part : u.parts) part.g.reset();
}

ParamShard ParamStore::lm_head_shard() {
  ParamShard s;
  s.row0 = lm_head->block.row0;
  s.rows = lm_head->block.rows;
  s.rows_padded = lm_head->block.rows_padded;
  s.w = lm_head->local_w().buf();
  s.g = lm_head->local_g().buf();
  return s;
}

// ---- whole tensors

void ParamStore::full_gather(const ParamInfo& p, const Tensor* local, float* host) {
  const int64_t numel = p.shape.numel();
  const int me = comm_->rank();
  if (p.placement == Placement::Placement_whole) {
    // The owner has it: a copy on rank 0, else one point-to-point transfer to rank 0.
    if (p.owner == 0) {
      if (me == 0) local_to_host(be_, *local, numel, host);
    } else if (me == p.owner) {
      std::vector<float> mine(static_cast<size_t>(numel));
      local_to_host(be_, *local, numel, mine.data());
      comm_->send_recv(mine.data(), numel, 0, nullptr, 0, 0, DType::DType_F32);
    } else if (me == 0) {
      comm_->send_recv(nullptr, 0, p.owner, host, numel, p.owner, DType::DType_F32);
    }
    return;
  }
  // Every rank's padded rows, in rank order: the first R rows are the tensor.
  const int64_t n = local->numel();  // Rp C
  // Within this rank's dense-shard group (Note [Dense shards in groups]); world rank 0 is the first group's first.
  Comm& group = shard_comm();
  std::vector<float> mine(static_cast<size_t>(n)), all(static_cast<size_t>(n * group.size()));
  local_to_host(be_, *local, n, mine.data());
  group.all_gather(mine.data(), all.data(), n, DType::DType_F32);
  if (me == 0) std::copy(all.begin(), all.begin() + numel, host);
}

void ParamStore::full_scatter(const ParamInfo& p, const float* host, Tensor* local) {
  if (local == nullptr) return;  // another rank's expert
  if (p.placement == Placement::Placement_whole) {
    host_to_local(be_, host, local->numel(), *local);
    return;
  }
  const int64_t C = row_length(p.shape);
  const RowBlock b = row_block(p.shape[0], shard_rank(), shard_.size);
  std::vector<float> mine(static_cast<size_t>(local->numel()), 0.0f);  // (Rp, C), padding zero
  std::copy(host + b.row0 * C, host + (b.row0 + b.rows) * C, mine.begin());
  host_to_local(be_, mine.data(), local->numel(), *local);
}

}  // namespace fp
