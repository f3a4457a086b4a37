// The LM head and loss of one step, by vocabulary schedule: final RMSNorm, projection to the
// vocabulary, mean cross-entropy, and in the same call the gradients (dxL, model.norm, lm_head).
// Legend: n tokens, H hidden, V vocabulary.
//
//   full  (head_full.cpp)  logits, log-softmax and their gradient each (n, V) fp32: the plain variant.
//   ring  (ring_dtp.cpp)   Ring-DTP: token blocks against the vocabulary with an online log-sum-exp;
//                          only block_tokens x V (one rank) or n_blk x V/P strips exist at a time.
#pragma once

#include "model/blocks.h"
#include "model/schedules.h"
#include "sched/vocab/ring_dtp.h"

namespace fp {

// Dispatches on s.sched->vocab (head_full_forward_backward or head_ring_forward_backward).
HeadResult head_forward_backward(StepContext& s, const VocabSchedule& v, ParamStore& ps, const Tensor& xL,
                                 const Tensor& targets, float scale, Tensor& dxL, std::vector<float>* logits_out,
                                 bool backward);

// Ring-DTP with the same contract as head_full_forward_backward (model/blocks.h): loss_sum is the sum
// over this rank's tokens. With s.comm.size() == P > 1 every rank calls it together (it is a ring
// over the ranks, ring_dtp_ring.cpp) and the lm_head gradient is written only into this rank's
// vocabulary shard (ring_dtp_shard; the other rows of lm_head's g are not touched). stats, when not
// null, receives where the time went (sched/vocab/ring_dtp.h).
HeadResult head_ring_forward_backward(StepContext& s, const VocabSchedule& v, ParamStore& ps, const Tensor& xL,
                                      const Tensor& targets, float scale, Tensor& dxL, std::vector<float>* logits_out,
                                      bool backward, RingDtpStats* stats = nullptr);

// The P > 1 ranks part of head_ring_forward_backward (ring_dtp_ring.cpp), given the final norm's
// output xn (n, H); writes dxn (n, H) when backward (allocated by the caller, contents overwritten). Returns
// the loss sum, (1) f64 on the device (HeadResult).
Tensor ring_dtp_p_ranks(StepContext& s, const VocabSchedule& v, ParamStore& ps, const Tensor& xn, const Tensor& targets,
                        float scale, Tensor& dxn, std::vector<float>* logits_out, bool backward, RingDtpStats* stats);

}  // namespace fp
