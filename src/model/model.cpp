// The step orchestrator: embedding, layers with checkpointing, head, backward with recompute.
// Legend: n = B * T tokens, H hidden, L layers, E experts, V vocabulary.
#include "model/model.h"

#include <cmath>

#include "model/blocks.h"
#include "sched/ckpt/boundary_store.h"
#include "sched/dispatch/dispatch.h"
#include "sched/vocab/vocab_head.h"

namespace fp {

namespace {
// Whether Ring-DTP's multi-rank path reads this rank's lm_head rows (ParamStore::lm_head_shard())
// rather than a slice of the whole, gathered lm_head. Until it does, the ring head gets the gathered
// lm_head as the plain head does (its dW rows are then reduce-scattered like any unit gradient).
constexpr bool kRingReadsLmHeadShard = true;
}  // namespace

void batch_validate(const Batch& b, int64_t V) {
  const int64_t n = b.B * b.T;
  FP_CHECK(b.B >= 1 && b.T >= 1, "a batch holds B >= 1 sequences of T >= 1 tokens", "empty batch ({} x {})", b.B,
           b.T);
  FP_CHECK(static_cast<int64_t>(b.tokens.size()) == n && static_cast<int64_t>(b.targets.size()) == n,
           "tokens and targets are both (B, T)", "batch of {} x {} has {} tokens and {} targets", b.B, b.T,
           b.tokens.size(), b.targets.size());
  for (int64_t i = 0; i < n; ++i) {
    FP_CHECK(b.tokens[i] >= 0 && b.tokens[i] < V, "every token id must be < model.vocab_size",
             "token id {} at sequence {}, position {} is out of range [0, {})", b.tokens[i], i / b.T, i % b.T, V);
    FP_CHECK(b.targets[i] == -100 || (b.targets[i] >= 0 && b.targets[i] < V),
             "targets are token ids < model.vocab_size, or -100 to ignore a position",
             "target {} at sequence {}, position {} is out of range [0, {})", b.targets[i], i / b.T, i % b.T, V);
  }
}

// Note [bf16 on a computing backend]: every allocation honours the precision recipe, but the cpu
// kernels read and write f32 only. Until bf16 compute lands, a backend that computes refuses any
// other dtype here, before anything is allocated; meta computes nothing, so it takes any recipe
// (its peaks are those of real bf16 training).
namespace {
const Precision& precision_checked(const Backend& be, const Precision& p) {
  FP_CHECK(!be.computes() || precision_all_f32(p),
           "bf16 compute is not implemented on the cpu backend yet; use --device meta to see bf16 peaks, or "
           "precision.recipe = \"fp32\"",
           "precision {} on the {} backend: {} must be f32 there", precision_describe(p), be.name(),
           precision_non_f32(p));
  return p;
}
}  // namespace

Model::Model(const ModelConfig& cfg, Backend& be, RoutingProfile profile, ModelSchedules sched, Comm* comm)
    : cfg_(cfg),
      be_(be),
      profile_(profile),
      sched_(sched),
      comm_(comm),
      params_(cfg, be, comm, precision_checked(be, sched_.precision)) {
  FP_CHECK(be.computes() || profile.kind != RoutingProfile::Kind::Kind_router,
           "set moe.routing_profile = \"balanced\" or \"hot:R:H\" for --device meta",
           "the meta backend computes no router: tokens-per-expert must come from a routing profile");
}

StepOutputs Model::step(const Batch& batch, std::vector<float>* logits_out, bool backward) {
  batch_validate(batch, cfg_.vocab_size);
  const int64_t n = batch.B * batch.T, H = cfg_.hidden_size, L = cfg_.num_hidden_layers, E = cfg_.num_experts;
  static std::unique_ptr<Comm> single = comm_single();
  Comm& comm = comm_ != nullptr ? *comm_ : *single;
  StepContext s(be_, cfg_, profile_, comm);
  s.precision = sched_.precision;
  s.moe_token_chunk = sched_.dispatch.token_chunk;
  s.B = batch.B;
  s.T = batch.T;
  s.n = n;
  // The expert dispatch of this step (local with one rank, expert parallel otherwise).
  std::unique_ptr<ExpertDispatch> dispatch = expert_dispatch_create(sched_, s);
  s.dispatch = dispatch.get();
  const ops::Kernels& K = be_.kernels();

  // Targets of the whole (global) batch: the loss is their mean on every rank.
  int64_t target_tokens = 0;
  for (int32_t t : batch.targets) target_tokens += (t != -100);
  comm.all_reduce_sum(&target_tokens, 1, DType::DType_I64);
  FP_CHECK(target_tokens > 0, "give at least one target that is not -100", "the batch has no target token");
  if (batch.positions.empty()) {
    s.seq_pos.resize(static_cast<size_t>(batch.T));
    for (int64_t t = 0; t < batch.T; ++t) s.seq_pos[t] = static_cast<int32_t>(t);
  } else {
    FP_CHECK(static_cast<int64_t>(batch.positions.size()) == batch.T, "positions are (T)",
             "batch positions has {} entries for T = {}", batch.positions.size(), batch.T);
    s.seq_pos = batch.positions;
  }
  if (cfg_.rope_scaling.kind == RopeScaling::Kind::Kind_dynamic) {
    // Dynamic RoPE grows with the sequence: its largest position over every rank's piece, plus one.
    int64_t len = 0;
    for (int32_t p : s.seq_pos) len = std::max<int64_t>(len, p + 1);
    comm.all_reduce_max(&len, 1, DType::DType_I64);
    s.rope = rope_table(cfg_, len);
  }

  // Inputs on the device.
  Tensor tokens = be_.alloc(Category::Category_activations, {n}, DType::DType_I32, "input.tokens");
  Tensor targets = be_.alloc(Category::Category_activations, {n}, DType::DType_I32, "input.targets");
  s.pos = be_.alloc(Category::Category_activations, {n}, DType::DType_I32, "input.positions");
  {
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[i] = s.seq_pos[i % batch.T];
    be_.copy_from_host(tokens.data(), batch.tokens.data(), tokens.bytes());
    be_.copy_from_host(targets.data(), batch.targets.data(), targets.bytes());
    be_.copy_from_host(s.pos.data(), pos.data(), s.pos.bytes());
  }

  // Forward: keep only the layer boundaries (Note [Per-layer checkpointing]), in the store of the
  // checkpoint schedule (device, or SCO's host offload). With W ranks each unit of dense weights is
  // gathered right before its use and freed right after (Note [FSDP layout] in params.h); on one rank
  // the unit calls do nothing.
  std::unique_ptr<BoundaryStore> store = boundary_store_create(sched_.ckpt, be_, L);
  std::vector<RouterStats> stats(static_cast<size_t>(L));
  params_.unit_gather(params_.unit_embed());
  Tensor x = be_.alloc(Category::Category_checkpoints, {n, H}, s.precision.activations, "ckpt.layer0");
  K.embedding_forward(tokens.i32(), params_.embed_tokens->w.f32(), x.f32(), n, H);
  params_.unit_release(params_.unit_embed());
  for (int64_t l = 0; l < L; ++l) {
    const LayerParams& lp = params_.layers[l];
    params_.unit_gather(params_.unit_layer(l));
    Tensor x1 = attn_block_forward(s, lp, x, nullptr);
    if (backward) {
      store->put(l, std::move(x));
    } else {
      x.reset();  // evaluation keeps no boundary
    }
    const bool last = l + 1 == L;
    const Category out_cat = last ? Category::Category_activations : Category::Category_checkpoints;
    const std::string out_name = last ? "final.x" : fmt::format("ckpt.layer{}", l + 1);
    x = cfg_.layer_is_sparse(l) ? moe_block_forward(s, lp, x1, nullptr, &stats[l], out_cat, out_name)
                                : mlp_block_forward(s, lp, x1, nullptr, out_cat, out_name);
    x1.reset();
    params_.unit_release(params_.unit_layer(l));
  }

  // Load-balancing loss from the routing statistics of the MoE layers (a dense layer has no router:
  // its row of expert_counts stays zero), as transformers concatenates the router logits of those only.
  StepOutputs out;
  out.target_tokens = target_tokens;
  out.expert_counts.assign(static_cast<size_t>(L * E), 0);
  std::vector<double> count_total(static_cast<size_t>(E), 0.0), prob_total(static_cast<size_t>(E), 0.0);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t e = 0; e < E && cfg_.layer_is_sparse(l); ++e) {
      out.expert_counts[l * E + e] = stats[l].counts[e];
      count_total[e] += static_cast<double>(stats[l].counts[e]);
      if (!stats[l].prob_sum.empty()) prob_total[e] += stats[l].prob_sum[e];
    }
  // Over every rank's tokens: R rows of the concatenated router outputs.
  comm.all_reduce_sum(count_total.data(), E, DType::DType_F64);
  if (be_.computes()) comm.all_reduce_sum(prob_total.data(), E, DType::DType_F64);
  const double R = static_cast<double>(cfg_.sparse_layer_count() * n * comm.size());
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += (count_total[e] / R) * (prob_total[e] / R);
  aux *= static_cast<double>(E);
  // The sigmoid router has no load-balancing loss (its bias balances between steps: routing_bias_update).
  out.aux_loss = cfg_.router_sigmoid() ? 0.0 : be_.computes() ? aux : std::nan("");
  Tensor aux_bias;
  if (backward && cfg_.router_aux_loss_coef != 0.0) {
    std::vector<float> bias(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      bias[e] = static_cast<float>(cfg_.router_aux_loss_coef * static_cast<double>(E) * count_total[e] / (R * R));
    aux_bias = be_.alloc_f32(Category::Category_workspace, {E}, "moe.aux_bias");
    be_.copy_from_host(aux_bias.data(), bias.data(), aux_bias.bytes());
  }

  // Head: loss and d x_L. The plain head reads the whole lm_head (the FSDP2 baseline: every rank
  // computes its N x V logits); Ring-DTP reads only this rank's rows (lm_head_shard()) once its
  // multi-rank path does, and then only model.norm is gathered.
  Tensor dx;
  if (backward) dx = be_.alloc(Category::Category_activations, {n, H}, s.precision.activations, "grad.x");
  const bool head_reads_shard = sched_.vocab.kind == VocabSchedule::Kind::Kind_ring && kRingReadsLmHeadShard;
  const int64_t head_unit = head_reads_shard ? params_.unit_norm() : params_.unit_head();
  params_.unit_gather(head_unit);
  if (backward) params_.unit_grad_begin(head_unit);
  HeadResult head = head_forward_backward(s, sched_.vocab, params_, x, targets,
                                          1.0f / static_cast<float>(target_tokens), dx, logits_out, backward);
  if (backward) params_.unit_grad_reduce(head_unit);
  params_.unit_release(head_unit);
  x.reset();
  if (be_.computes()) comm.all_reduce_sum(&head.loss_sum, 1, DType::DType_F64);
  out.ce_loss = head.loss_sum / static_cast<double>(target_tokens);
  out.loss = out.ce_loss + cfg_.router_aux_loss_coef * out.aux_loss;
  if (!backward) {
    be_.synchronize();
    return out;
  }

  // Backward with recompute, last layer first.
  for (int64_t l = L - 1; l >= 0; --l) {
    const LayerParams& lp = params_.layers[l];
    params_.unit_gather(params_.unit_layer(l));
    params_.unit_grad_begin(params_.unit_layer(l));
    AttnActs attn;
    const Tensor& xl = store->get(l);
    Tensor x1 = attn_block_forward(s, lp, xl, &attn);
    if (cfg_.layer_is_sparse(l)) {
      moe_block_recompute_backward(s, lp, x1, aux_bias, dx);
    } else {
      MlpActs mlp;
      mlp_block_forward(s, lp, x1, &mlp, Category::Category_activations, "mlp.x2").reset();
      mlp_block_backward(s, lp, x1, mlp, dx);
    }
    x1.reset();
    attn_block_backward(s, lp, xl, attn, dx);
    store->release(l);
    // Each rank's gradient is that of its tokens' share of the loss; the shards get the sum.
    params_.unit_grad_reduce(params_.unit_layer(l));
    params_.unit_release(params_.unit_layer(l));
  }
  store->clear();
  params_.unit_grad_begin(params_.unit_embed());
  K.embedding_backward(tokens.i32(), dx.f32(), params_.embed_tokens->g.f32(), n, H);
  params_.unit_grad_reduce(params_.unit_embed());
  be_.synchronize();
  // Every gradient is final: the dense shards got the sum over ranks by reduce-scatter, and each
  // expert's owner received every rank's tokens for it (the dispatch), so nothing is left to sum.
  return out;
}

std::vector<Param*> Model::routing_bias_update(const std::vector<int64_t>& expert_counts, double rate) {
  std::vector<Param*> written;
  if (!cfg_.router_sigmoid() || rate == 0.0 || !be_.computes()) return written;
  const int64_t L = cfg_.num_hidden_layers, E = cfg_.num_experts;
  FP_ASSERT(static_cast<int64_t>(expert_counts.size()) == L * E, "expert_counts holds {} for L x E = {}",
            expert_counts.size(), L * E);
  std::vector<double> counts(expert_counts.begin(), expert_counts.end());
  params_.comm().all_reduce_sum(counts.data(), L * E, DType::DType_F64);
  std::vector<float> host;
  for (int64_t l = 0; l < L; ++l) {
    if (!cfg_.layer_is_sparse(l)) continue;
    Param* b = params_.layers[l].gate_bias;
    const double* c = counts.data() + l * E;
    double mean = 0;
    for (int64_t e = 0; e < E; ++e) mean += c[e];
    mean /= static_cast<double>(E);
    Tensor& w = b->local_w();  // this rank's rows of the (E) bias
    host.resize(static_cast<size_t>(w.numel()));
    be_.copy_to_host(host.data(), w.data(), w.bytes());
    for (int64_t r = 0; r < b->block.rows; ++r) {
      const double err = mean - c[b->block.row0 + r];
      const double step = err > 0 ? rate : err < 0 ? -rate : 0.0;
      host[r] = static_cast<float>(static_cast<double>(host[r]) + step);
    }
    be_.copy_from_host(w.data(), host.data(), w.bytes());
    written.push_back(b);
  }
  return written;
}

}  // namespace fp
