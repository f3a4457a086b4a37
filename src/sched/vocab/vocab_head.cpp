#include "sched/vocab/vocab_head.h"

namespace fp {

HeadResult head_forward_backward(StepContext& s, const VocabSchedule& v, ParamStore& ps, const Tensor& xL,
                                 const Tensor& targets, float scale, Tensor& dxL, std::vector<float>* logits_out,
                                 bool backward) {
  if (v.kind == VocabSchedule::Kind::Kind_ring)
    return head_ring_forward_backward(s, v, ps, xL, targets, scale, dxL, logits_out, backward, nullptr);
  return head_full_forward_backward(s, ps, xL, targets, scale, dxL, logits_out, backward);
}

}  // namespace fp
