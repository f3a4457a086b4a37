// The model: its constructor (parameters in the run's precision) and the sigmoid router's bias update
// between steps. The step itself is step/step.cpp.
// Legend: L layers, E experts.
#include "model/model.h"

#include <algorithm>

namespace fp {

// Note [bf16 on a computing backend]: every allocation honours the precision recipe, and on the cpu
// backend the kernels read and write bf16 storage (Note [Kernel operands carry their dtype] in
// core/buf.h), ParamStore rounds f32 init and checkpoints into bf16 weights, and AdamW keeps the f32
// master (Note [When AdamW keeps a master copy]), checkpointed beside the moments. On W ranks the
// gradients are reduce-scattered in bf16 (Note [Summing bf16 over ranks] in comm/comm.h) and every
// ring moves bf16 payloads (Ring-DTP's shards and batches, ring attention's K/V blocks, LLEP's guest
// experts) beside f32 partial sums. DeepSeek-V3 trains in bf16 too: multi-head latent attention stores
// its latents, their norms, q, k, v and o in bf16 like any activation; the router stays f32 (its logits,
// scores, top-k weights and their gradients, precision.router; the gate GEMM reads the bf16
// mlp.gate.weight widened, as transformers' F.linear(h.float(), w.float())), and the routing bias
// e_score_correction_bias is the one parameter kept f32, weight and (zero) gradient, whatever the recipe
// (Note [Parameters kept in f32] in model/params.h): transformers keeps it f32, and its 1e-3 steps
// (routing_bias_update, below, on the f32 values) would vanish in bf16's 7.8e-3 spacing at 1. AdamW keeps
// a master of it like of every parameter (a plain f32 copy, refreshed by weights_written after each bias
// update), and every offloaded optimizer stages it in its own dtype, 4 B each way (Note [Offload with
// bf16 weights] in sched/optim/offload.h). Refused by name before anything is allocated: precision
// mixes other than the two recipes (here, and in the offloaded optimizers' constructors). meta computes
// nothing, so it takes any precision: its peaks are those of real bf16 training.
namespace {
const Precision& precision_checked(const Backend& be, const Precision& p) {
  if (!be.computes() || precision_all_f32(p)) return p;
  constexpr const char* kMeta = "use --device meta to see the peaks of any precision, or precision.recipe = \"fp32\"";
  const DType f = DType::DType_F32, h = DType::DType_BF16;
  FP_CHECK(p.params == h && p.grads == h && p.activations == h && p.master == f && p.moments == f && p.logits == f &&
               p.router == f,
           std::string("set precision.recipe = \"bf16\" without per-field overrides; ") + kMeta,
           "precision {} on the {} backend: it computes the recipes fp32 and bf16 only", precision_describe(p),
           be.name());
  return p;
}
}  // namespace

std::vector<ops::KernelUse> model_kernel_uses(const ModelConfig& cfg, const Precision& p) {
  using ops::KernelId;
  std::vector<int64_t> windows;
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    if (std::find(windows.begin(), windows.end(), cfg.layer_window(l)) == windows.end())
      windows.push_back(cfg.layer_window(l));
  std::vector<ops::KernelUse> uses;
  for (const int64_t w : windows)
    for (const KernelId k : {KernelId::KernelId_attention_forward, KernelId::KernelId_attention_backward,
                             KernelId::KernelId_attention_block_forward, KernelId::KernelId_attention_block_backward}) {
      ops::KernelUse u{k, p.activations};
      u.head_dim = cfg.qk_head_dim();
      u.head_dim_v = cfg.value_head_dim();
      u.window = w;
      u.sinks = cfg.attention_sinks();
      uses.push_back(u);
    }
  for (const KernelId k : {KernelId::KernelId_gemm_grouped, KernelId::KernelId_gemm_grouped_weight}) {
    ops::KernelUse u{k, p.activations};
    u.bias = cfg.expert_bias();
    uses.push_back(u);
  }
  return uses;
}

Model::Model(const ModelConfig& cfg, Backend& be, RoutingProfile profile, Schedules sched, const Precision& precision,
             Comm* comm, RankGroups groups)
    : cfg_(cfg),
      be_(be),
      profile_(profile),
      sched_(sched),
      comm_(comm),
      cp_(comm != nullptr ? comm->size() : 1),
      params_(cfg, be, comm, precision_checked(be, precision), groups) {
  // Note [Kernel coverage] (backend/kernels.h): every kernel the step calls, in the recipe's dtypes.
  const std::vector<std::string> missing = ops::kernels_missing(be.kernels().table(), precision);
  FP_CHECK(missing.empty(),
           "use --device cpu (or meta for peaks), or precision.recipe = \"fp32\" where bf16 is missing",
           "the {} backend lacks {} kernel(s) this model's step calls in precision {}: {}", be.name(), missing.size(),
           precision_describe(precision), fmt::join(missing, ", "));
  // Note [Support by shape and options]: and every case of them it calls.
  const std::vector<std::string> refused =
      ops::kernels_refused(be.kernels().table(), model_kernel_uses(cfg, precision));
  FP_CHECK(refused.empty(), "use --device cpu (or meta for peaks), or a model whose cases this backend takes",
           "the {} backend refuses {} case(s) of this model's step in precision {}: {}", be.name(), refused.size(),
           precision_describe(precision), fmt::join(refused, ", "));
  FP_CHECK(be.computes() || profile.kind != RoutingProfile::Kind::Kind_router,
           "set moe.routing_profile = \"balanced\" or \"hot:R:H\" for --device meta",
           "the meta backend computes no router: tokens-per-expert must come from a routing profile");
}

void Model::set_context_parallel(int cp) {
  const int W = comm_ != nullptr ? comm_->size() : 1;
  FP_ASSERT(cp >= 1 && W % cp == 0, "context-parallel groups of {} ranks over {}", cp, W);
  cp_ = cp;
}

std::vector<Param*> Model::routing_bias_update(const std::vector<int64_t>& expert_counts, double rate) {
  std::vector<Param*> written;
  if (!cfg_.router_sigmoid() || rate == 0.0) return written;
  const int64_t L = cfg_.num_hidden_layers, E = cfg_.num_experts;
  FP_ASSERT(static_cast<int64_t>(expert_counts.size()) == L * E, "expert_counts holds {} for L x E = {}",
            expert_counts.size(), L * E);
  std::vector<double> counts(expert_counts.begin(), expert_counts.end());
  params_.comm().all_reduce_sum(counts.data(), L * E, DType::DType_F64);
  // The loads go to the device and the bias moves there (nothing is read back: docs/design.md, "Host syncs
  // of one step"); the counts are the host's already (the routing sort's offsets).
  Tensor load = be_.alloc(Category::Category_workspace, {L, E}, DType::DType_F64, "moe.bias_load");
  be_.copy_from_host(load.data(), counts.data(), load.bytes());
  for (int64_t l = 0; l < L; ++l) {
    if (!cfg_.layer_is_sparse(l)) continue;
    Param* b = params_.layers[l].gate_bias;
    const double* c = counts.data() + l * E;
    double mean = 0;
    for (int64_t e = 0; e < E; ++e) mean += c[e];
    mean /= static_cast<double>(E);
    Tensor& w = b->local_w();  // this rank's rows of the (E) bias, f32 in every recipe (Note [Parameters kept in f32])
    FP_ASSERT(w.dtype() == DType::DType_F32, "{} is {}, not f32", b->name, dtype_name(w.dtype()));
    be_.kernels().routing_bias_update(w.f32(), load.f64() + l * E + b->block.row0, b->block.rows, mean, rate);
    written.push_back(b);
  }
  return written;
}

}  // namespace fp
