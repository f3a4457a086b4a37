// The planner's reports: JSON (flatpeak plan --json) and a text table (the CLI's stdout).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "plan/plan.h"

namespace fp::plan {

// What the plan's numbers are: "exact (the engine ran it on meta)", or approximate when the model is
// (Note [The engine is its own planner] in plan.h).
std::string category_status(const Result& r);

// Every per-category peak with its status and formula, the step peak, binding category, host memory,
// layout, precision, schedules, whether the plan is exact (and why not), and the model's notes.
// Bytes are integers.
nlohmann::ordered_json plan_json(const Model& m, const Input& in, const Result& r);
// {"max_context": T, "max_context_str": "128K", "max_pow2": .., "capped": .., "step_peak_at_max": ..,
//  "binding_at_max": "..", "schedule": {...}}; max_context 0 when nothing fits.
nlohmann::ordered_json reach_json(const Reach& r);

// The step's counts and, with a profile, its predicted time (Note [Time in the planner] in plan.h): "counted"
// {flops, gemm_flops, attention_flops, model_flops_estimate, kernel_calls, link_bytes}, "predicted" {profile,
// step_seconds, tokens_per_s_per_device, mfu, peak_flops, binding_time, busy_seconds} or null.
nlohmann::ordered_json step_time_json(const StepTime& t);
// One line of the text report, labelled a prediction.
std::string step_time_line(const StepTime& t);

// The human report: one line per category (peak, bytes at the step peak, status), the step peak
// against the device memory, the binding category and the host memory needed.
std::string plan_table(const Model& m, const Input& in, const Result& r);

}  // namespace fp::plan
