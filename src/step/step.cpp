// The step orchestrator (step.h): inputs, the layers with checkpointing, the load-balancing loss, the
// head, the backward with recompute (or on the kept activations); each unit of dense weights gathered
// around its use.
// Legend: n = B * T tokens, H hidden, L layers, E experts, V vocabulary.
#include "step/step.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

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

// The positions (T) of this rank's tokens in their sequence: the batch's (context parallelism,
// data/context_split.h), or 0..T-1.
std::vector<int32_t> sequence_positions(const Batch& batch) {
  if (!batch.positions.empty()) {
    FP_CHECK(static_cast<int64_t>(batch.positions.size()) == batch.T, "positions are (T)",
             "batch positions has {} entries for T = {}", batch.positions.size(), batch.T);
    return batch.positions;
  }
  std::vector<int32_t> pos(static_cast<size_t>(batch.T));
  for (int64_t t = 0; t < batch.T; ++t) pos[t] = static_cast<int32_t>(t);
  return pos;
}

// ---- Note [One read at the step's end]
// On a GPU a blocking device-to-host copy waits for everything queued before it (docs/design.md, "Host
// syncs of one step"). Two figures of the step are only reported, never read by the step itself: the
// loss sum (the head's, HeadResult) and the router probability sums of the load-balancing loss (E per MoE
// layer, RouterStats::prob_sum). Both stay on the device until the step has synchronized at its end
// (inherent: the step's end), and are read there: the loss sum as one scalar, the probability sums as one
// (L, E) f64 tensor that the step zeroes and the MoE blocks (their tiles, in order) add into. The numbers
// are those of the reads they replace: the same double sums in the same order (column_sums_f64 adds each
// tile's sums, summed from zero, as the host loop added them), and the loss value is computed from the same
// host sums after the ranks' all-reduce. Only the load-balancing loss's gradient needs anything during
// the step, and it reads the counts (host, from the routing sort, inherent), not the probabilities.

// The load-balancing loss (step.h) from the routing statistics of the MoE layers (a dense layer has no
// router: its row of expert_counts stays zero), as transformers concatenates the router logits of those
// only: sets out.expert_counts and returns every rank's routed copies per expert (E), the loss's first
// factor (its value waits for the probability sums: aux_loss_finish, Note [One read at the step's end]).
// Sets `aux_bias`, with backward and a non-zero coefficient, to the bias (E, category workspace) its
// gradient adds to every router probability; undefined otherwise. Collective (over every rank's tokens).
std::vector<double> aux_loss_counts(const ModelConfig& cfg, Backend& be, Comm& comm,
                                    const std::vector<RouterStats>& stats, int64_t n, bool backward, double aux_weight,
                                    StepOutputs& out, Tensor& aux_bias) {
  const int64_t L = cfg.num_hidden_layers, E = cfg.num_experts;
  out.expert_counts.assign(static_cast<size_t>(L * E), 0);
  std::vector<double> count_total(static_cast<size_t>(E), 0.0);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t e = 0; e < E && cfg.layer_is_sparse(l); ++e) {
      out.expert_counts[l * E + e] = stats[l].counts[e];
      count_total[e] += static_cast<double>(stats[l].counts[e]);
    }
  // Over every rank's tokens: R rows of the concatenated router outputs.
  comm.all_reduce_sum(count_total.data(), E, DType::DType_F64);
  const double R = static_cast<double>(cfg.sparse_layer_count() * n * comm.size());
  if (backward && cfg.router_aux_loss_coef != 0.0) {
    std::vector<float> bias(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      bias[e] =
          static_cast<float>(aux_weight * cfg.router_aux_loss_coef * static_cast<double>(E) * count_total[e] / (R * R));
    aux_bias = be.alloc_f32(Category::Category_workspace, {E}, "moe.aux_bias");
    be.copy_from_host(aux_bias.data(), bias.data(), aux_bias.bytes());
  }
  return count_total;
}

// The load-balancing loss's value into out.aux_loss, from the counts (aux_loss_counts) and the (L, E) router
// probability sums on the device (undefined without a softmax router), read once: call it after the step's
// synchronize (Note [One read at the step's end]). Collective.
void aux_loss_finish(const ModelConfig& cfg, Backend& be, Comm& comm, const std::vector<double>& count_total,
                     const Tensor& prob_sums, int64_t n, StepOutputs& out) {
  // The sigmoid router has no load-balancing loss (its bias balances between steps: routing_bias_update).
  if (cfg.router_sigmoid()) {
    out.aux_loss = 0.0;
    return;
  }
  if (!be.computes()) {
    out.aux_loss = std::nan("");
    return;
  }
  const int64_t L = cfg.num_hidden_layers, E = cfg.num_experts;
  std::vector<double> by_layer(static_cast<size_t>(L * E));
  be.copy_to_host(by_layer.data(), prob_sums.data(), prob_sums.bytes());
  std::vector<double> prob_total(static_cast<size_t>(E), 0.0);
  for (int64_t l = 0; l < L; ++l)
    for (int64_t e = 0; e < E && cfg.layer_is_sparse(l); ++e) prob_total[e] += by_layer[l * E + e];
  comm.all_reduce_sum(prob_total.data(), E, DType::DType_F64);
  const double R = static_cast<double>(cfg.sparse_layer_count() * n * comm.size());
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += (count_total[e] / R) * (prob_total[e] / R);
  out.aux_loss = aux * static_cast<double>(E);
}

// What the backward of one layer reads when it is not recomputed (Note [No recompute]): kept by the
// forward, freed by the backward.
struct LayerActs {
  AttnActs attn;
  Tensor x1;  // (n, H) the attention block's output, the MoE or MLP block's input
  MoeActs moe;
  MlpActs mlp;
};

// Note [Boundaries every k layers]
// With ckpt.every = k the forward puts only the boundaries of layers 0, k, 2k, ... into the store (as
// group g = l / k: the store sees L / k boundaries, rounded up, and SCO offloads and prefetches them as
// it would L), and frees the others once their layer has run. The backward takes the groups last first:
// from the group's boundary it runs the forward of the group's layers but its last again (no statistics,
// nothing kept), keeping each output as the next layer's boundary on the device (category checkpoints),
// then runs the group's layers backward last first as with every boundary, each freeing its recomputed
// boundary. The kernels are deterministic, so a recomputed boundary is the forward's bit for bit, and so
// is every gradient (tests/model/test_recompute.cpp). Cost: k - 1 more layer forwards per group, and up
// to k - 1 recomputed boundaries on the device beside the store's; saved: all but L / k boundaries in the
// store (on the host under SCO, where a host-bound plan needs it).

// A layer's forward without keeping anything for its backward, its output in category checkpoints (a
// group's recomputed boundary, Note [Boundaries every k layers]).
Tensor layer_forward_plain(StepContext& s, const LayerParams& lp, const Tensor& x, bool sparse, int64_t out_layer) {
  const std::string name = fmt::format("ckpt.recomputed{}", out_layer);
  const Category out_cat = Category::Category_checkpoints;
  if (s.layer_tile > 0) return layer_forward_tiled(s, lp, x, sparse, nullptr, out_cat, name);
  Tensor x1 = attn_block_forward(s, lp, x, nullptr);
  return sparse ? moe_block_forward(s, lp, x1, nullptr, nullptr, out_cat, name)
                : mlp_block_forward(s, lp, x1, nullptr, out_cat, name);
}

// One layer's backward from its boundary xl: dx (n, H) in d x_{l+1}, out d x_l. Recomputed from xl (Note
// [Per-layer checkpointing]), in tiles (Note [Sequence-tiled layers] in model/layer_tiles.cpp), or with
// `kept` reading what the forward kept (Note [No recompute]).
void layer_backward(StepContext& s, ParamStore& params, int64_t l, const Tensor& xl, const Tensor& aux_bias, Tensor& dx,
                    std::vector<LayerActs>* kept) {
  const ModelConfig& cfg = s.cfg;
  const LayerParams& lp = params.layers[l];
  params.unit_gather(params.unit_layer(l));
  params.unit_grad_begin(params.unit_layer(l));
  if (s.layer_tile > 0) {
    layer_backward_tiled(s, lp, xl, cfg.layer_is_sparse(l), aux_bias, dx);
  } else {
    LayerActs local;
    LayerActs& a = kept != nullptr ? (*kept)[l] : local;
    if (kept == nullptr) a.x1 = attn_block_forward(s, lp, xl, &a.attn);
    if (cfg.layer_is_sparse(l)) {
      if (kept == nullptr)
        moe_block_recompute_backward(s, lp, a.x1, aux_bias, dx);
      else
        moe_block_backward(s, lp, a.x1, a.moe, aux_bias, dx);
    } else {
      if (kept == nullptr) mlp_block_forward(s, lp, a.x1, &a.mlp, Category::Category_activations, "mlp.x2").reset();
      mlp_block_backward(s, lp, a.x1, a.mlp, dx);
    }
    a.x1.reset();
    attn_block_backward(s, lp, xl, a.attn, dx);
  }
  // Each rank's gradient is that of its tokens' share of the loss; the shards get the sum.
  params.unit_grad_reduce(params.unit_layer(l));
  params.unit_release(params.unit_layer(l));
}

// Backward, last layer first: dx (n, H) in d x_L, out d x_0. The store holds a boundary every `every`
// layers (Note [Boundaries every k layers]); each leaves the store once its group is done.
void layers_backward(StepContext& s, ParamStore& params, BoundaryStore& store, int64_t every, const Tensor& aux_bias,
                     Tensor& dx, std::vector<LayerActs>* kept) {
  const ModelConfig& cfg = s.cfg;
  const int64_t L = cfg.num_hidden_layers, groups = (L + every - 1) / every;
  for (int64_t g = groups - 1; g >= 0; --g) {
    const int64_t l0 = g * every, l1 = std::min(L, l0 + every);
    const Tensor& x0 = store.get(g);
    std::vector<Tensor> inner(static_cast<size_t>(l1 - l0 - 1));  // x_{l0+1} .. x_{l1-1}, recomputed
    for (int64_t l = l0; l + 1 < l1; ++l) {
      params.unit_gather(params.unit_layer(l));
      inner[l - l0] =
          layer_forward_plain(s, params.layers[l], l == l0 ? x0 : inner[l - l0 - 1], cfg.layer_is_sparse(l), l + 1);
      params.unit_release(params.unit_layer(l));
    }
    for (int64_t l = l1 - 1; l >= l0; --l) {
      layer_backward(s, params, l, l == l0 ? x0 : inner[l - l0 - 1], aux_bias, dx, kept);
      if (l > l0) inner[l - l0 - 1].reset();
    }
    store.release(g);
  }
}

StepOutputs step_run(Model& model, const Batch& batch, std::vector<float>* logits_out, bool backward,
                     const StepWeights& weights) {
  const ModelConfig& cfg = model.config();
  const Schedules& sched = model.schedules();
  Backend& be = model.backend();
  ParamStore& params = model.params();
  batch_validate(batch, cfg.vocab_size);
  const int64_t n = batch.B * batch.T, H = cfg.hidden_size, L = cfg.num_hidden_layers;
  Comm& comm = params.comm();  // the model's ranks, or the store's one-process world
  StepContext s(be, cfg, model.routing_profile(), comm, &params.expert_comm(), &params.shard_comm());
  s.precision = model.precision();
  s.moe_token_chunk = sched.dispatch.token_chunk;
  // A tile of every token is the whole layer, bit for bit (Note [Sequence-tiled layers]).
  s.layer_tile = sched.ckpt.layer_tile < n ? sched.ckpt.layer_tile : 0;
  s.B = batch.B;
  s.T = batch.T;
  s.cp = model.context_parallel();
  s.n = n;
  s.reroute_each_n = model.reroute_each_n();
  // The expert dispatch of this step (local with one rank, expert parallel otherwise).
  std::unique_ptr<ExpertDispatch> dispatch = expert_dispatch_create(sched, s);
  s.dispatch = dispatch.get();
  const ops::KernelLauncher K = be.kernels();

  // Targets of the whole (global) batch: the loss is their mean on every rank.
  int64_t target_tokens = batch_targets(batch);
  comm.all_reduce_sum(&target_tokens, 1, DType::DType_I64);
  FP_CHECK(target_tokens > 0 || weights.targets > 0, "give at least one target that is not -100",
           "the batch has no target token");
  FP_ASSERT(weights.targets == 0 || weights.targets >= target_tokens, "a micro-batch of {} targets in a step of {}",
            target_tokens, weights.targets);
  const int64_t mean_over = weights.targets > 0 ? weights.targets : target_tokens;
  const std::vector<int32_t> seq_pos = sequence_positions(batch);
  const bool documents = !batch.doc_start.empty();
  if (cfg.rope_scaling.kind == RopeScaling::Kind::Kind_dynamic) {
    FP_CHECK(!documents, "use data.documents = \"none\" with this model, or a model without dynamic RoPE",
             "packed documents with dynamic RoPE: its scaling follows the sequence length, and each document run "
             "alone would need its own (not implemented)");
    // Dynamic RoPE grows with the sequence: its largest position over every rank's piece, plus one.
    int64_t len = 0;
    for (int32_t p : seq_pos) len = std::max<int64_t>(len, p + 1);
    comm.all_reduce_max(&len, 1, DType::DType_I64);
    s.rope = rope_table(cfg, len);
  }

  // Inputs on the device: tokens, targets and the positions (StepContext: RoPE's restart at each
  // document, Note [Documents from EOS] in data/documents.h).
  Tensor tokens = be.alloc(Category::Category_activations, {n}, DType::DType_I32, "input.tokens");
  Tensor targets = be.alloc(Category::Category_activations, {n}, DType::DType_I32, "input.targets");
  s.pos = be.alloc(Category::Category_activations, {n}, DType::DType_I32, "input.positions");
  // Ring attention masks by every rank's positions, whatever split dealt them (data/context_split.h).
  std::vector<int32_t> ring_pos;
  if (s.cp > 1) {  // gathered over every rank, the group's rows kept (Note [A device mesh] in train/trainer.cpp)
    // Meta reads no positions: no W x T host gather (64 ranks at 32M tokens: 17 GB over the planner's threads).
    if (be.computes()) {
      std::vector<int32_t> all(static_cast<size_t>(comm.size() * batch.T));
      comm.all_gather(seq_pos.data(), all.data(), batch.T, DType::DType_I32);
      ring_pos.assign(all.begin() + s.cp_first() * batch.T, all.begin() + (s.cp_first() + s.cp) * batch.T);
    }
    s.ring_pos = be.alloc(Category::Category_activations, {s.cp, batch.T}, DType::DType_I32, "input.ring_pos");
  }
  if (documents) s.doc_start = be.alloc(Category::Category_activations, {n}, DType::DType_I32, "input.doc_start");
  if (s.layer_tile > 0 && s.cp == 1)
    s.tile_pos = be.alloc(Category::Category_activations, {batch.T}, DType::DType_I32, "input.tile_pos");
  const int64_t n_freq = static_cast<int64_t>(s.rope.inv_freq.size());
  s.rope_inv_freq = be.alloc(Category::Category_activations, {n_freq}, DType::DType_F64, "input.rope_inv_freq");
  {
    // Meta reads no host data: no (n) positions per rank (a planner's 64 ranks near a reach: 100 MB to write).
    std::vector<int32_t> pos(be.computes() ? static_cast<size_t>(n) : 0);
    for (int64_t i = 0; i < static_cast<int64_t>(pos.size()); ++i)
      pos[i] = seq_pos[i % batch.T] - (documents ? batch.doc_start[i] : 0);
    be.copy_from_host(tokens.data(), batch.tokens.data(), tokens.bytes());
    be.copy_from_host(targets.data(), batch.targets.data(), targets.bytes());
    be.copy_from_host(s.pos.data(), pos.data(), s.pos.bytes());
    if (!ring_pos.empty()) be.copy_from_host(s.ring_pos.data(), ring_pos.data(), s.ring_pos.bytes());
    if (documents) be.copy_from_host(s.doc_start.data(), batch.doc_start.data(), s.doc_start.bytes());
    if (s.tile_pos.defined()) be.copy_from_host(s.tile_pos.data(), seq_pos.data(), s.tile_pos.bytes());
    be.copy_from_host(s.rope_inv_freq.data(), s.rope.inv_freq.data(), s.rope_inv_freq.bytes());
  }

  // Forward: keep only the layer boundaries (Note [Per-layer checkpointing]), in the store of the
  // checkpoint schedule (device, or SCO's host offload). With W ranks each unit of dense weights is
  // gathered right before its use and freed right after (Note [FSDP layout] in model/params.h); on one
  // rank the unit calls do nothing.
  // Note [Boundaries every k layers]: the store holds the boundaries of layers 0, k, 2k, ... as groups.
  const int64_t every = sched.ckpt.every;
  std::unique_ptr<BoundaryStore> store = boundary_store_create(sched.ckpt, be, (L + every - 1) / every);
  std::vector<RouterStats> stats(static_cast<size_t>(L));
  // Note [One read at the step's end]: the MoE layers' router probability sums, added on the device.
  Tensor prob_sums;
  if (cfg.sparse_layer_count() > 0 && !cfg.router_sigmoid()) {
    const int64_t E = cfg.num_experts;
    prob_sums = be.alloc(Category::Category_workspace, {L, E}, DType::DType_F64, "moe.prob_sums");
    const std::vector<double> zeros(be.computes() ? static_cast<size_t>(L * E) : 0, 0.0);
    be.copy_from_host(prob_sums.data(), zeros.data(), prob_sums.bytes());
    for (int64_t l = 0; l < L; ++l) stats[l].prob_sum = prob_sums.f64() + l * E;
  }
  // Note [No recompute]: every layer's activations, kept by the forward for the backward.
  const bool keep = backward && !sched.ckpt.recompute;
  std::vector<LayerActs> kept(keep ? static_cast<size_t>(L) : 0);
  params.unit_gather(params.unit_embed());
  Tensor x = be.alloc(Category::Category_checkpoints, {n, H}, s.precision.activations, "ckpt.layer0");
  K.embedding_forward(tokens.i32(), params.embed_tokens->w.cbuf(), x.buf(), n, H);
  params.unit_release(params.unit_embed());
  for (int64_t l = 0; l < L; ++l) {
    const LayerParams& lp = params.layers[l];
    params.unit_gather(params.unit_layer(l));
    const bool last = l + 1 == L;
    const Category out_cat = last ? Category::Category_activations : Category::Category_checkpoints;
    const std::string out_name = last ? "final.x" : fmt::format("ckpt.layer{}", l + 1);
    if (s.layer_tile > 0) {  // Note [Sequence-tiled layers]: the boundary stays until the layer's last tile
      Tensor next = layer_forward_tiled(s, lp, x, cfg.layer_is_sparse(l), &stats[l], out_cat, out_name,
                                        [&] { store->settle(); });
      if (backward && l % every == 0) store->put(l / every, std::move(x));
      x = std::move(next);
      params.unit_release(params.unit_layer(l));
      continue;
    }
    Tensor x1 = attn_block_forward(s, lp, x, keep ? &kept[l].attn : nullptr);
    if (backward && l % every == 0) {
      store->put(l / every, std::move(x));
    } else {
      x.reset();  // evaluation keeps no boundary, nor a layer between two kept ones
    }
    if (cfg.layer_is_sparse(l))
      x = moe_block_forward(s, lp, x1, keep ? &kept[l].moe : nullptr, &stats[l], out_cat, out_name);
    else
      x = mlp_block_forward(s, lp, x1, keep ? &kept[l].mlp : nullptr, out_cat, out_name);
    if (keep) kept[l].x1 = std::move(x1);
    x1.reset();
    params.unit_release(params.unit_layer(l));
  }

  StepOutputs out;
  out.target_tokens = target_tokens;
  Tensor aux_bias;
  const std::vector<double> count_total =
      aux_loss_counts(cfg, be, comm, stats, n, backward, weights.aux_weight, out, aux_bias);
  // The step's end: every figure read once (Note [One read at the step's end]).
  HeadResult head;
  const auto finish = [&] {
    be.synchronize();
    double loss_sum = head_loss_sum(be, head);
    comm.all_reduce_sum(&loss_sum, 1, DType::DType_F64);  // NaN on meta
    aux_loss_finish(cfg, be, comm, count_total, prob_sums, n, out);
    out.ce_loss = loss_sum / static_cast<double>(mean_over);
    out.loss = out.ce_loss + cfg.router_aux_loss_coef * weights.aux_weight * out.aux_loss;
    return out;
  };

  // Head: loss and d x_L. The plain head reads the whole lm_head (the FSDP2 baseline: every rank
  // computes its N x V logits); Ring-DTP reads only this rank's rows (lm_head_shard()) once its
  // multi-rank path does, and then only model.norm is gathered.
  Tensor dx;
  if (backward) dx = be.alloc(Category::Category_activations, {n, H}, s.precision.activations, "grad.x");
  // A ring of one rank (parallel.fsdp = 1: every rank holds all of lm_head) reads the gathered head.
  const bool head_reads_shard =
      sched.vocab.kind == VocabSchedule::Kind::Kind_ring && kRingReadsLmHeadShard && s.vocab.size() > 1;
  const int64_t head_unit = head_reads_shard ? params.unit_norm() : params.unit_head();
  params.unit_gather(head_unit);
  if (backward) params.unit_grad_begin(head_unit);
  head = head_forward_backward(s, sched.vocab, params, x, targets, 1.0f / static_cast<float>(mean_over), dx, logits_out,
                               backward);
  if (backward) params.unit_grad_reduce(head_unit);
  params.unit_release(head_unit);
  x.reset();
  if (!backward) return finish();

  layers_backward(s, params, *store, every, aux_bias, dx, keep ? &kept : nullptr);
  store->clear();
  params.unit_grad_begin(params.unit_embed());
  K.embedding_backward(tokens.i32(), dx.cbuf(), params.embed_tokens->g.buf(), n, H);
  params.unit_grad_reduce(params.unit_embed());
  // Every gradient is final: the dense shards got the sum over ranks by reduce-scatter, and each
  // expert's owner received every rank's tokens for it (the dispatch), so nothing is left to sum.
  return finish();
}
}  // namespace

StepOutputs step_forward_backward(Model& model, const Batch& batch, std::vector<float>* logits_out,
                                  const StepWeights& weights) {
  return step_run(model, batch, logits_out, true, weights);
}

StepOutputs step_forward(Model& model, const Batch& batch, std::vector<float>* logits_out) {
  return step_run(model, batch, logits_out, false, StepWeights{});
}

}  // namespace fp
