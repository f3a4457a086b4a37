// The expert FFN over rows grouped by expert (see expert_ffn.h).
// Legend: r rows, H hidden, I expert FFN width, G groups.
#include "model/expert_ffn.h"

#include "model/blocks.h"

namespace fp {

namespace {
constexpr Category kAct = Category::Category_activations;
}  // namespace

ExpertWeights expert_weights(const LayerParams& lp, int64_t e) {
  const Param& g = *lp.gate_proj[e];
  const Param& u = *lp.up_proj[e];
  const Param& d = *lp.down_proj[e];
  return {g.w.buf(), u.w.buf(), d.w.buf(), g.g.buf(), u.g.buf(), d.g.buf()};
}

Tensor expert_ffn_forward(Backend& be, const FfnDims& d, std::span<const ExpertWeights> w,
                          std::span<const int64_t> offsets, ExpertActs& a, bool keep, const std::string& y_name,
                          Category out_cat, DType dt) {
  const ops::KernelLauncher K = be.kernels();
  const int64_t G = static_cast<int64_t>(w.size()), H = d.H, I = d.I;
  FP_ASSERT(static_cast<int64_t>(offsets.size()) == G + 1 && offsets[0] == 0);
  const int64_t r = offsets[G];
  a.g = be.alloc(kAct, {r, I}, dt, fmt::format("{}.g", d.tag));  // (r, I)
  a.u = be.alloc(kAct, {r, I}, dt, fmt::format("{}.u", d.tag));  // (r, I)
  // Note [Meta skips the per-expert loops]: every allocation here is sized by the total rows r; the
  // per-group loops only launch GEMMs, which do nothing on meta. Skipping them there keeps the
  // allocation sequence and makes a W-rank plan's cost independent of how many blocks a chunk holds.
  const int64_t groups = be.computes() ? G : 0;
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t r0 = offsets[i], ne = offsets[i + 1] - r0;
    if (ne == 0) continue;
    linear_forward(be, ptr_at(a.x.buf(), r0 * H), w[i].gate, ptr_at(a.g.buf(), r0 * I), ne, H, I);
    linear_forward(be, ptr_at(a.x.buf(), r0 * H), w[i].up, ptr_at(a.u.buf(), r0 * I), ne, H, I);
  }
  a.act = be.alloc(kAct, {r, I}, dt, fmt::format("{}.act", d.tag));  // (r, I)
  K.swiglu_forward(a.g.buf(), a.u.buf(), a.act.buf(), r * I);
  if (!keep) {
    a.x.reset();
    a.g.reset();
    a.u.reset();
  }
  Tensor y = be.alloc(out_cat, {r, H}, dt, y_name);  // (r, H)
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t r0 = offsets[i], ne = offsets[i + 1] - r0;
    if (ne == 0) continue;
    linear_forward(be, ptr_at(a.act.buf(), r0 * I), w[i].down, ptr_at(y.buf(), r0 * H), ne, I, H);
  }
  if (!keep) a.act.reset();
  return y;
}

Tensor expert_ffn_backward(Backend& be, const FfnDims& d, std::span<const ExpertWeights> w,
                           std::span<const int64_t> offsets, ExpertActs& a, Tensor& dy, const std::string& dx_name,
                           Category out_cat, DType dt) {
  const ops::KernelLauncher K = be.kernels();
  const int64_t G = static_cast<int64_t>(w.size()), H = d.H, I = d.I;
  FP_ASSERT(static_cast<int64_t>(offsets.size()) == G + 1 && offsets[0] == 0);
  const int64_t r = offsets[G];

  // down_proj
  Tensor dact = be.alloc(kAct, {r, I}, dt, fmt::format("{}.dact", d.tag));  // (r, I)
  const int64_t groups = be.computes() ? G : 0;  // Note [Meta skips the per-expert loops]
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t r0 = offsets[i], ne = offsets[i + 1] - r0;
    if (ne == 0) continue;
    linear_backward_input(be, ptr_at(dy.buf(), r0 * H), w[i].down, ptr_at(dact.buf(), r0 * I), ne, I, H);
    linear_backward_weight(be, ptr_at(dy.buf(), r0 * H), ptr_at(a.act.buf(), r0 * I), w[i].d_down, ne, I, H);
  }
  dy.reset();
  a.act.reset();

  // SwiGLU
  Tensor dg = be.alloc(kAct, {r, I}, dt, fmt::format("{}.dg", d.tag));  // (r, I)
  Tensor du = be.alloc(kAct, {r, I}, dt, fmt::format("{}.du", d.tag));  // (r, I)
  K.swiglu_backward(a.g.buf(), a.u.buf(), dact.buf(), dg.buf(), du.buf(), r * I);
  dact.reset();
  a.g.reset();
  a.u.reset();

  // gate_proj, up_proj
  Tensor dx = be.alloc(out_cat, {r, H}, dt, dx_name);  // (r, H)
  for (int64_t i = 0; i < groups; ++i) {
    const int64_t r0 = offsets[i], ne = offsets[i + 1] - r0;
    if (ne == 0) continue;
    const Buf dx_i = ptr_at(dx.buf(), r0 * H);
    linear_backward_input(be, ptr_at(dg.buf(), r0 * I), w[i].gate, dx_i, ne, H, I);
    linear_backward_input(be, ptr_at(du.buf(), r0 * I), w[i].up, dx_i, ne, H, I, 1.0f);
    linear_backward_weight(be, ptr_at(dg.buf(), r0 * I), ptr_at(a.x.buf(), r0 * H), w[i].d_gate, ne, H, I);
    linear_backward_weight(be, ptr_at(du.buf(), r0 * I), ptr_at(a.x.buf(), r0 * H), w[i].d_up, ne, H, I);
  }
  dg.reset();
  du.reset();
  a.x.reset();
  return dx;
}

}  // namespace fp
