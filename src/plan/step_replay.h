// Internal to src/plan: the replay of one step's allocation sequence (step_plan.cpp) for resolved
// schedules (optim is never auto here). plan_step (plan.cpp) resolves, then labels the result.
#pragma once

#include "plan/plan.h"

namespace fp::plan {

Result step_replay(const Input& in, const Schedules& sched, PeakReplay* device_replay, PeakReplay* host_replay);

}  // namespace fp::plan
