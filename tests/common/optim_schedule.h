// An optimizer schedule by its run-config names, through the parser a run config goes through
// (schedules_set in model/schedules.h: one name per setting).
#pragma once

#include <string_view>

#include "model/schedules.h"

namespace fp {

inline OptimSchedule optim_named(std::string_view schedule, std::string_view update_on = "device") {
  Schedules s;
  schedules_set(s, "optim.schedule", schedule, "test");
  schedules_set(s, "optim.update_on", update_on, "test");
  return s.optim;
}

}  // namespace fp
