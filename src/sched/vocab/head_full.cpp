// LM head with the plain ("full") vocabulary schedule: logits, log-softmax and their gradient are
// each materialised as (n, V) fp32, as PyTorch and Megatron do. This is the peak Ring-DTP flattens.
// Legend: n tokens, H hidden, V vocabulary.
#include <cmath>
#include <limits>

#include "model/blocks.h"

namespace fp {

HeadResult head_full_forward_backward(StepContext& s, ParamStore& ps, const Tensor& xL, const Tensor& targets,
                                      float scale, Tensor& dxL, std::vector<float>* logits_out, bool backward) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const int64_t n = s.n, H = s.cfg.hidden_size, V = s.cfg.vocab_size;

  Tensor xn = be.alloc(kAct, {n, H}, s.precision.activations, "head.xn");
  Tensor rstd = be.alloc_f32(kAct, {n}, "head.rstd");
  K.rmsnorm_forward(xL.buf(), ps.norm->w.buf(), xn.buf(), rstd.f32(), n, H, static_cast<float>(s.cfg.rms_norm_eps));

  Tensor logits = be.alloc(kVocab, {n, V}, s.precision.logits, "head.logits");
  linear_forward(be, xn.buf(), ps.lm_head->w.buf(), logits.f32(), n, H, V);
  if (logits_out != nullptr && be.computes()) {
    logits_out->resize(static_cast<size_t>(n * V));
    be.copy_to_host(logits_out->data(), logits.data(), logits.bytes());
  }
  Tensor logp = be.alloc(kVocab, {n, V}, s.precision.logits, "head.logp");
  K.log_softmax_forward(logits.f32(), logp.f32(), n, V);

  HeadResult r;
  {
    Tensor tok_loss = be.alloc_f32(Category::Category_workspace, {n}, "head.token_loss");
    r.loss_sum = be.alloc_f32(Category::Category_workspace, {1}, "head.loss_sum");
    K.nll_forward(logp.f32(), targets.i32(), tok_loss.f32(), n, V);
    K.reduce_sum(tok_loss.f32(), n, r.loss_sum.f32());
  }
  if (!backward) return r;

  Tensor dlogits = be.alloc(kVocab, {n, V}, s.precision.logits, "head.dlogits");
  K.cross_entropy_backward(logp.f32(), targets.i32(), scale, dlogits.f32(), n, V);
  logp.reset();
  logits.reset();

  Tensor dxn = be.alloc(kAct, {n, H}, s.precision.activations, "head.dxn");
  linear_backward_input(be, dlogits.f32(), ps.lm_head->w.buf(), dxn.buf(), n, H, V);
  linear_backward_weight(be, dlogits.f32(), xn.buf(), ps.lm_head->g.buf(), n, H, V);
  dlogits.reset();
  xn.reset();

  rmsnorm_backward(be, xL.buf(), ps.norm->w.buf(), rstd.f32(), dxn.buf(), dxL.buf(), ps.norm->g.buf(), n, H);
  return r;
}

double head_loss_sum(Backend& be, const HeadResult& r) {
  if (!be.computes()) return std::numeric_limits<double>::quiet_NaN();
  if (r.loss_sum.dtype() == DType::DType_F64) {
    double host = 0;
    be.copy_to_host(&host, r.loss_sum.data(), sizeof(double));
    return host;
  }
  FP_ASSERT(r.loss_sum.dtype() == DType::DType_F32, "a loss sum of dtype {}", dtype_name(r.loss_sum.dtype()));
  float host = 0;
  be.copy_to_host(&host, r.loss_sum.data(), sizeof(float));
  return host;
}

}  // namespace fp
