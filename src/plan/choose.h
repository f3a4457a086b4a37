// plan --choose: the fastest plan that fits (Note [Choosing the fastest plan that fits]).
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"

namespace fp::plan {

struct Candidate {
  std::vector<std::string> items;  // the settings_apply items and mesh that make it from the start
  std::string describe;            // "cp=4 moe.dispatch=pipelined_llep ..."
  Input input;
  Result result;
};

struct Choice {
  std::vector<Candidate> tried;   // every plan the search made, in order
  int best = -1, runner_up = -1;  // indices into tried (-1: none fits)
  double seconds = 0;             // wall time of the search
};

// Note [Choosing the fastest plan that fits]: needs in.profile (a time to compare).
Choice plan_choose(const Input& in);

}  // namespace fp::plan
