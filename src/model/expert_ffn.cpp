// The expert FFN over rows grouped by expert (see expert_ffn.h).
// Legend: r rows, H hidden, I expert FFN width, G groups.
#include "model/expert_ffn.h"

#include "model/blocks.h"

namespace fp {

ExpertWeights expert_weights(const LayerParams& lp, int64_t e) {
  const Param& g = *lp.gate_proj[e];
  const Param& u = *lp.up_proj[e];
  const Param& d = *lp.down_proj[e];
  ExpertWeights w{g.w.buf(), u.w.buf(), d.w.buf(), g.g.buf(), u.g.buf(), d.g.buf()};
  if (!lp.gate_proj_bias.empty()) {
    const Param &gb = *lp.gate_proj_bias[e], &ub = *lp.up_proj_bias[e], &db = *lp.down_proj_bias[e];
    w.gate_b = gb.w.buf();
    w.up_b = ub.w.buf();
    w.down_b = db.w.buf();
    w.d_gate_b = gb.g.buf();
    w.d_up_b = ub.g.buf();
    w.d_down_b = db.g.buf();
  }
  return w;
}

int64_t expert_packed_size(const FfnDims& d) { return 3 * d.I * d.H + (d.bias ? 2 * d.I + d.H : 0); }

void expert_pack(const ops::KernelLauncher& K, const FfnDims& d, const ExpertWeights& w, Buf dst) {
  const int64_t IH = d.I * d.H;
  K.copy(dst, w.gate, IH);
  K.copy(ptr_at(dst, IH), w.up, IH);
  K.copy(ptr_at(dst, 2 * IH), w.down, IH);
  if (!d.bias) return;
  K.copy(ptr_at(dst, 3 * IH), w.gate_b, d.I);
  K.copy(ptr_at(dst, 3 * IH + d.I), w.up_b, d.I);
  K.copy(ptr_at(dst, 3 * IH + 2 * d.I), w.down_b, d.H);
}

ExpertWeights expert_packed(const FfnDims& d, CBuf w, Buf g) {
  const int64_t IH = d.I * d.H;
  ExpertWeights out{w, ptr_at(w, IH), ptr_at(w, 2 * IH), g, ptr_at(g, IH), ptr_at(g, 2 * IH)};
  if (!d.bias) return out;
  out.gate_b = ptr_at(w, 3 * IH);
  out.up_b = ptr_at(w, 3 * IH + d.I);
  out.down_b = ptr_at(w, 3 * IH + 2 * d.I);
  out.d_gate_b = ptr_at(g, 3 * IH);
  out.d_up_b = ptr_at(g, 3 * IH + d.I);
  out.d_down_b = ptr_at(g, 3 * IH + 2 * d.I);
  return out;
}

void expert_grads_add(const ops::KernelLauncher& K, const FfnDims& d, const ExpertWeights& w, CBuf g) {
  const int64_t IH = d.I * d.H;
  K.add_inplace(w.d_gate, g, IH);
  K.add_inplace(w.d_up, ptr_at(g, IH), IH);
  K.add_inplace(w.d_down, ptr_at(g, 2 * IH), IH);
  if (!d.bias) return;
  K.add_inplace(w.d_gate_b, ptr_at(g, 3 * IH), d.I);
  K.add_inplace(w.d_up_b, ptr_at(g, 3 * IH + d.I), d.I);
  K.add_inplace(w.d_down_b, ptr_at(g, 3 * IH + 2 * d.I), d.H);
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
    if (d.bias) {
      K.bias_add(ptr_at(a.g.buf(), r0 * I), w[i].gate_b, ne, I);
      K.bias_add(ptr_at(a.u.buf(), r0 * I), w[i].up_b, ne, I);
    }
  }
  a.act = be.alloc(kAct, {r, I}, dt, fmt::format("{}.act", d.tag));  // (r, I)
  if (d.swiglu_alpha > 0)
    K.swiglu_clamped_forward(a.g.buf(), a.u.buf(), a.act.buf(), r * I, d.swiglu_alpha, d.swiglu_limit);
  else
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
    if (d.bias) K.bias_add(ptr_at(y.buf(), r0 * H), w[i].down_b, ne, H);
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
    if (d.bias) K.bias_backward(ptr_at(dy.buf(), r0 * H), w[i].d_down_b, ne, H);
  }
  dy.reset();
  a.act.reset();

  // SwiGLU
  Tensor dg = be.alloc(kAct, {r, I}, dt, fmt::format("{}.dg", d.tag));  // (r, I)
  Tensor du = be.alloc(kAct, {r, I}, dt, fmt::format("{}.du", d.tag));  // (r, I)
  if (d.swiglu_alpha > 0)
    K.swiglu_clamped_backward(a.g.buf(), a.u.buf(), dact.buf(), dg.buf(), du.buf(), r * I, d.swiglu_alpha,
                              d.swiglu_limit);
  else
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
    if (d.bias) {
      K.bias_backward(ptr_at(dg.buf(), r0 * I), w[i].d_gate_b, ne, I);
      K.bias_backward(ptr_at(du.buf(), r0 * I), w[i].d_up_b, ne, I);
    }
  }
  dg.reset();
  du.reset();
  a.x.reset();
  return dx;
}

}  // namespace fp
