// Dense MLP block of a decoder layer (mlp_only_layers, decoder_sparse_step), forward and backward: the
// experts' SwiGLU FFN (model/expert_ffn.h) as one group over every token, with the layer's own
// weights. Legend: n tokens, H hidden, Id = intermediate_size.
#include "model/blocks.h"
#include "model/expert_ffn.h"

namespace fp {

namespace {

FfnDims mlp_dims(const ModelConfig& c) { return {c.hidden_size, c.intermediate_size, "mlp"}; }

ExpertWeights mlp_weights(const LayerParams& lp) {
  return {lp.mlp_gate_proj->w.buf(), lp.mlp_up_proj->w.buf(), lp.mlp_down_proj->w.buf(),
          lp.mlp_gate_proj->g.buf(), lp.mlp_up_proj->g.buf(), lp.mlp_down_proj->g.buf()};
}
}  // namespace

Tensor mlp_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x1, MlpActs* keep, Category out_cat,
                         const std::string& out_name) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size;
  MlpActs local;
  MlpActs& a = keep ? *keep : local;

  ExpertActs ffn;
  ffn.x = be.alloc(kAct, {n, H}, s.precision.activations, "mlp.h2");
  a.rstd2 = be.alloc_f32(kAct, {n}, "mlp.rstd2");
  K.rmsnorm_forward(x1.buf(), lp.post_attention_layernorm->w.buf(), ffn.x.buf(), a.rstd2.f32(), n, H,
                    static_cast<float>(c.rms_norm_eps));
  const ExpertWeights w = mlp_weights(lp);
  const int64_t offsets[2] = {0, n};
  // x2 = y + x1, formed in y's buffer.
  Tensor x2 = expert_ffn_forward(be, mlp_dims(c), {&w, 1}, offsets, ffn, keep != nullptr, out_name, out_cat,
                                 s.precision.activations);
  K.add_inplace(x2.buf(), x1.buf(), n * H);
  if (keep) {
    a.h2 = std::move(ffn.x);
    a.g = std::move(ffn.g);
    a.u = std::move(ffn.u);
    a.act = std::move(ffn.act);
  } else {
    a.rstd2.reset();
  }
  return x2;
}

void mlp_block_backward(StepContext& s, const LayerParams& lp, const Tensor& x1, MlpActs& a, Tensor& dx) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size;
  // The FFN's backward consumes its dy: a copy of d x2, whose residual part stays in dx.
  Tensor dy = be.alloc(kAct, {n, H}, s.precision.activations, "mlp.dy");
  K.copy(dy.buf(), dx.buf(), n * H);
  ExpertActs ffn;
  ffn.x = std::move(a.h2);
  ffn.g = std::move(a.g);
  ffn.u = std::move(a.u);
  ffn.act = std::move(a.act);
  const ExpertWeights w = mlp_weights(lp);
  const int64_t offsets[2] = {0, n};
  Tensor dh2 = expert_ffn_backward(be, mlp_dims(c), {&w, 1}, offsets, ffn, dy, "mlp.dh2", kAct,
                                   s.precision.activations);
  Tensor dnorm = be.alloc(kAct, {n, H}, s.precision.activations, "mlp.dnorm");
  rmsnorm_backward(be, x1.buf(), lp.post_attention_layernorm->w.buf(), a.rstd2.f32(), dh2.buf(), dnorm.buf(),
                   lp.post_attention_layernorm->g.buf(), n, H);
  dh2.reset();
  K.add_inplace(dx.buf(), dnorm.buf(), n * H);
  a.rstd2.reset();
}

}  // namespace fp
