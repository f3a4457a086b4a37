// Expert dispatch: the schedules behind the interface of model/expert_dispatch.h (its contract, and the
// variants: standard.cpp, llep.cpp, pipelined_llep.cpp here; the local one is the model's), and the
// factory the step calls.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "model/expert_dispatch.h"
#include "model/schedules.h"

namespace fp {

// Standard expert parallelism over s.ep, the expert group (W > 1; W = 1 works too, moving rows to itself).
std::unique_ptr<ExpertDispatch> dispatch_standard_create();
// The dispatch of a step: local when s.ep.size() == 1 (every rank holds every expert), otherwise the variant the
// schedules name (moe.dispatch: standard, llep or pipelined_llep, llep.h). Checks that W divides E (model.num_experts).
std::unique_ptr<ExpertDispatch> expert_dispatch_create(const Schedules& sched, const StepContext& s);

}  // namespace fp
