// Which expert dispatch a step uses (dispatch.h).
#include "sched/dispatch/dispatch.h"

#include "model/layout.h"
#include "sched/dispatch/llep.h"

namespace fp {

std::unique_ptr<ExpertDispatch> expert_dispatch_create(const Schedules& sched, const StepContext& s) {
  const int W = s.ep.size();
  if (W == 1) return dispatch_local_create();
  (void)expert_layout(s.ep.rank(), W, s.cfg.num_experts);  // a user error unless W divides E
  switch (sched.dispatch.kind) {
    case DispatchSchedule::Kind::Kind_llep: return dispatch_llep_create(sched.dispatch);
    case DispatchSchedule::Kind::Kind_pipelined_llep: return dispatch_pipelined_llep_create(sched.dispatch, s);
    case DispatchSchedule::Kind::Kind_standard: break;
  }
  return dispatch_standard_create();
}

}  // namespace fp
