// The expert FFN over rows grouped by expert (see expert_ffn.h).
// Legend: r rows, H hidden, I expert FFN width, G groups.
#include "model/expert_ffn.h"

#include <vector>

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

namespace {

// One operand of every group, as the grouped entries take them (Note [The experts in one call] in
// ops/gemm_grouped.h): a table in host memory, alive until the call has run (the compute stream).
template <class T>
std::vector<T> table(std::span<const ExpertWeights> w, T ExpertWeights::*field) {
  std::vector<T> t;
  t.reserve(w.size());
  for (const ExpertWeights& e : w) t.push_back(e.*field);
  return t;
}

// The tables of the three projections (weights, biases or their gradients, by the members named).
template <class T>
struct Projections {
  std::vector<T> gate, up, down;
  const T* bias_or_null(const std::vector<T>& t) const { return t.empty() ? nullptr : t.data(); }
};
template <class T>
Projections<T> tables(std::span<const ExpertWeights> w, T ExpertWeights::*gate, T ExpertWeights::*up,
                      T ExpertWeights::*down) {
  return {table(w, gate), table(w, up), table(w, down)};
}

}  // namespace

Tensor expert_ffn_forward(Backend& be, const FfnDims& d, std::span<const ExpertWeights> w,
                          std::span<const int64_t> offsets, ExpertActs& a, bool keep, const std::string& y_name,
                          Category out_cat, DType dt) {
  const ops::KernelLauncher K = be.kernels();
  const int64_t G = static_cast<int64_t>(w.size()), H = d.H, I = d.I;
  FP_ASSERT(static_cast<int64_t>(offsets.size()) == G + 1 && offsets[0] == 0);
  const int64_t r = offsets[G];
  const int64_t* off = offsets.data();
  // Every expert of the block in one call per projection (Note [The experts in one call]); the biases
  // (gpt_oss) are the calls' epilogues.
  using EW = ExpertWeights;
  const Projections<CBuf> W = tables(w, &EW::gate, &EW::up, &EW::down);
  Projections<CBuf> B;  // empty tables without biases: null in the calls
  if (d.bias) B = tables(w, &EW::gate_b, &EW::up_b, &EW::down_b);
  a.g = be.alloc(kAct, {r, I}, dt, fmt::format("{}.g", d.tag));  // (r, I)
  a.u = be.alloc(kAct, {r, I}, dt, fmt::format("{}.u", d.tag));  // (r, I)
  K.gemm_grouped(true, G, off, I, H, 1.0f, a.x.buf(), W.gate.data(), B.bias_or_null(B.gate), 0.0f, a.g.buf());
  K.gemm_grouped(true, G, off, I, H, 1.0f, a.x.buf(), W.up.data(), B.bias_or_null(B.up), 0.0f, a.u.buf());
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
  K.gemm_grouped(true, G, off, H, I, 1.0f, a.act.buf(), W.down.data(), B.bias_or_null(B.down), 0.0f, y.buf());
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
  const int64_t* off = offsets.data();
  using EW = ExpertWeights;
  const Projections<CBuf> W = tables(w, &EW::gate, &EW::up, &EW::down);
  const Projections<Buf> dW = tables(w, &EW::d_gate, &EW::d_up, &EW::d_down);
  Projections<Buf> dB;  // empty tables without biases: null in the calls
  if (d.bias) dB = tables(w, &EW::d_gate_b, &EW::d_up_b, &EW::d_down_b);

  // down_proj
  Tensor dact = be.alloc(kAct, {r, I}, dt, fmt::format("{}.dact", d.tag));  // (r, I)
  K.gemm_grouped(false, G, off, I, H, 1.0f, dy.buf(), W.down.data(), nullptr, 0.0f, dact.buf());
  K.gemm_grouped_weight(G, off, H, I, 1.0f, dy.buf(), a.act.buf(), 1.0f, dW.down.data(), dB.bias_or_null(dB.down));
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

  // gate_proj, up_proj: dx = dg W_gate + du W_up, then the weight gradients.
  Tensor dx = be.alloc(out_cat, {r, H}, dt, dx_name);  // (r, H)
  K.gemm_grouped(false, G, off, H, I, 1.0f, dg.buf(), W.gate.data(), nullptr, 0.0f, dx.buf());
  K.gemm_grouped(false, G, off, H, I, 1.0f, du.buf(), W.up.data(), nullptr, 1.0f, dx.buf());
  K.gemm_grouped_weight(G, off, I, H, 1.0f, dg.buf(), a.x.buf(), 1.0f, dW.gate.data(), dB.bias_or_null(dB.gate));
  K.gemm_grouped_weight(G, off, I, H, 1.0f, du.buf(), a.x.buf(), 1.0f, dW.up.data(), dB.bias_or_null(dB.up));
  dg.reset();
  du.reset();
  a.x.reset();
  return dx;
}

}  // namespace fp
