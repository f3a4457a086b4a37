// The model: its constructor (parameters in the run's precision) and the sigmoid router's bias update
// between steps. The step itself is step/step.cpp.
// Legend: L layers, E experts.
#include "model/model.h"

namespace fp {

// Note [bf16 on a computing backend]: every allocation honours the precision recipe, and the cpu
// kernels read and write bf16 storage (Note [Kernel operands carry their dtype] in core/buf.h), as do
// ParamStore (bf16 weights from f32 init and checkpoints) and AdamW (an f32 master rounded into the
// weights). What is not yet bf16-aware: the offloaded optimizers' host copies, Ring-DTP across ranks,
// the router's bias, checkpoints of the f32 master, and a bf16 twin to check the whole step against.
// Until those land a backend that computes refuses any dtype but f32 here, before anything is
// allocated; meta computes nothing, so it takes any recipe (its peaks are those of real bf16 training).
namespace {
const Precision& precision_checked(const Backend& be, const Precision& p) {
  FP_CHECK(!be.computes() || precision_all_f32(p),
           "the bf16 recipe is not complete on the cpu backend yet (its kernels are; the optimizer offload, "
           "Ring-DTP across ranks and checkpoints are not); use --device meta to see bf16 peaks, or "
           "precision.recipe = \"fp32\"",
           "precision {} on the {} backend: {} must be f32 there", precision_describe(p), be.name(),
           precision_non_f32(p));
  return p;
}
}  // namespace

Model::Model(const ModelConfig& cfg, Backend& be, RoutingProfile profile, Schedules sched, Comm* comm)
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
