#include "core/error.h"
#include "sched/vocab/vocab_head.h"

namespace fp {

HeadResult head_ring_forward_backward(StepContext&, const VocabSchedule&, ParamStore&, const Tensor&, const Tensor&,
                                      float, Tensor&, std::vector<float>*, bool) {
  throw Error("vocab.schedule = \"ring\" is not available yet", "use vocab.schedule = \"full\"");
}

}  // namespace fp
