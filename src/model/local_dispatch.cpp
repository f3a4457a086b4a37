// The local dispatch (W = 1): every expert is on this rank, so the routed copies are already where
// they are computed: the expert FFN runs on xs in expert order, with no comm and no copy. This is the
// model's plain single-rank path; its allocation sequence is the planner's W = 1 replay. Nothing is
// received, so nothing here is in category dispatch: ys and dxs are the rank's own routed copies
// (m = n k rows, fixed by the config), category activations like xs and dys.
// Legend: m routed copies, H hidden, I expert width, E experts.
#include "model/expert_dispatch.h"
#include "model/expert_ffn.h"

namespace fp {

namespace {

struct LocalActs : DispatchActs {
  ExpertActs ffn;  // x = xs (m, H); g, u, act (m, I)
};

class LocalDispatch : public ExpertDispatch {
 public:
  std::string_view name() const override { return "local"; }

  Tensor forward(StepContext& s, const LayerParams& lp, Tensor xs, std::span<const int64_t> offsets,
                 const MoeChunk& chunk, std::unique_ptr<DispatchActs>* keep) override {
    weights_fill(lp, offsets);
    ExpertActs scratch;
    ExpertActs* a = &scratch;
    if (keep) {
      auto acts = std::make_unique<LocalActs>();
      a = &acts->ffn;
      *keep = std::move(acts);
    }
    last_ = {0, xs.dim(0)};
    a->x = std::move(xs);
    return expert_ffn_forward(s.be, expert_ffn_dims(s.cfg), weights_, offsets, *a, keep != nullptr, "moe.ys",
                              Category::Category_activations, s.precision.activations);
  }

  Tensor backward(StepContext& s, const LayerParams& lp, Tensor dys, std::span<const int64_t> offsets,
                  const MoeChunk& chunk, std::unique_ptr<DispatchActs> acts) override {
    auto* a = dynamic_cast<LocalActs*>(acts.get());
    FP_ASSERT(a != nullptr, "local dispatch backward needs the acts of a local forward with keep");
    weights_fill(lp, offsets);
    return expert_ffn_backward(s.be, expert_ffn_dims(s.cfg), weights_, offsets, a->ffn, dys, "moe.dxs",
                               Category::Category_activations, s.precision.activations);
  }

 private:
  // Weights of every expert that has rows (an expert without rows is never read).
  void weights_fill(const LayerParams& lp, std::span<const int64_t> offsets) {
    const int64_t E = static_cast<int64_t>(offsets.size()) - 1;
    weights_.assign(static_cast<size_t>(E), ExpertWeights{});
    for (int64_t e = 0; e < E; ++e)
      if (offsets[e + 1] > offsets[e]) weights_[e] = expert_weights(lp, e);
  }

  std::vector<ExpertWeights> weights_;  // (E) host scratch, reused across layers
};

}  // namespace

std::unique_ptr<ExpertDispatch> dispatch_local_create() { return std::make_unique<LocalDispatch>(); }

}  // namespace fp
