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
  const std::vector<CBuf> gate = table(w, &ExpertWeights::gate), up = table(w, &ExpertWeights::up),
                          down = table(w, &ExpertWeights::down);
  std::vector<CBuf> gate_b, up_b, down_b;
  if (d.bias) {
    gate_b = table(w, &ExpertWeights::gate_b);
    up_b = table(w, &ExpertWeights::up_b);
    down_b = table(w, &ExpertWeights::down_b);
  }
  const auto bias = [&](const std::vector<CBuf>& b) { return d.bias ? b.data() : nullptr; };
  a.g = be.alloc(kAct, {r, I}, dt, fmt::format("{}.g", d.tag));  // (r, I)
  a.u = be.alloc(kAct, {r, I}, dt, fmt::format("{}.u", d.tag));  // (r, I)
  K.gemm_grouped(true, G, off, I, H, 1.0f, a.x.buf(), gate.data(), bias(gate_b), 0.0f, a.g.buf());
  K.gemm_grouped(true, G, off, I, H, 1.0f, a.x.buf(), up.data(), bias(up_b), 0.0f, a.u.buf());
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
  K.gemm_grouped(true, G, off, H, I, 1.0f, a.act.buf(), down.data(), bias(down_b), 0.0f, y.buf());
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
  const std::vector<CBuf> gate = table(w, &ExpertWeights::gate), up = table(w, &ExpertWeights::up),
                          down = table(w, &ExpertWeights::down);
  const std::vector<Buf> d_gate = table(w, &ExpertWeights::d_gate), d_up = table(w, &ExpertWeights::d_up),
                         d_down = table(w, &ExpertWeights::d_down);
  std::vector<Buf> d_gate_b, d_up_b, d_down_b;
  if (d.bias) {
    d_gate_b = table(w, &ExpertWeights::d_gate_b);
    d_up_b = table(w, &ExpertWeights::d_up_b);
    d_down_b = table(w, &ExpertWeights::d_down_b);
  }
  const auto bias = [&](const std::vector<Buf>& b) { return d.bias ? b.data() : nullptr; };

  // down_proj
  Tensor dact = be.alloc(kAct, {r, I}, dt, fmt::format("{}.dact", d.tag));  // (r, I)
  K.gemm_grouped(false, G, off, I, H, 1.0f, dy.buf(), down.data(), nullptr, 0.0f, dact.buf());
  K.gemm_grouped_weight(G, off, H, I, 1.0f, dy.buf(), a.act.buf(), 1.0f, d_down.data(), bias(d_down_b));
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
  K.gemm_grouped(false, G, off, H, I, 1.0f, dg.buf(), gate.data(), nullptr, 0.0f, dx.buf());
  K.gemm_grouped(false, G, off, H, I, 1.0f, du.buf(), up.data(), nullptr, 1.0f, dx.buf());
  K.gemm_grouped_weight(G, off, I, H, 1.0f, dg.buf(), a.x.buf(), 1.0f, d_gate.data(), bias(d_gate_b));
  K.gemm_grouped_weight(G, off, I, H, 1.0f, du.buf(), a.x.buf(), 1.0f, d_up.data(), bias(d_up_b));
  dg.reset();
  du.reset();
  a.x.reset();
  return dx;
}

}  // namespace fp
