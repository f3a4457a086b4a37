// plan --choose (choose.h).
#include "plan/choose.h"

#include <algorithm>

#include "core/error.h"
#include "core/timing.h"

namespace fp::plan {

// Note [Choosing the fastest plan that fits]
// A plan's predicted time (Note [Time in the planner] in plan.h) ranks the plans that fit. The space is the mesh
// (cp context-parallel ranks of W, the rest data-parallel replicas) and each schedule's knobs: the dispatch
// (standard, PipelinedLLEP), the vocabulary (full, Ring-DTP), the boundaries (device, SCO), the optimizer (device,
// OffloadStreamAdamW, serial offload), the layer tile and the MoE token chunk. Its product is hundreds of plans,
// each a W-rank engine run, so the search is coordinate descent: from the plan asked for, every knob's other
// values one at a time; the fastest that fits becomes the start of the next round, until a round finds nothing
// faster (at most kRounds). It returns every plan it made: the fastest that fits and the runner-up (the fastest
// of another setting). A plan that does not fit is never chosen, however fast.
Choice plan_choose(const Input& in) {
  FP_CHECK(in.profile != nullptr, "give --profile (h100-sxm, h200-sxm, local or a file)",
           "plan --choose compares predicted times and needs a device profile");
  constexpr int kRounds = 3;
  const Clock::time_point t0 = Clock::now();
  const int64_t W = in.settings.layout.ranks;
  struct Knob {
    std::string key;
    std::vector<std::string> values;
  };
  std::vector<Knob> knobs = {{"vocab.schedule", {"full", "ring"}},
                             {"ckpt.schedule", {"device", "sco"}},
                             {"optim.schedule", {"device", "offload_stream", "offload_serial"}},
                             {"ckpt.layer_tile", {"0", "2048", "8192"}},
                             {"moe.token_chunk", {"0", "16384"}}};
  if (W > 1) knobs.insert(knobs.begin(), {"moe.dispatch", {"standard", "pipelined_llep"}});
  std::vector<int64_t> cps;  // the mesh: cp | W with the context divisible by 2 cp
  for (int64_t cp = W; cp >= 1; --cp)
    if (W % cp == 0 && (cp == 1 || in.context % (2 * cp) == 0)) cps.push_back(cp);

  Choice out;
  auto plan_of = [&](const Input& x, std::vector<std::string> items) -> int {
    std::string d;
    for (const std::string& s : items) d += (d.empty() ? "" : " ") + s;
    for (size_t i = 0; i < out.tried.size(); ++i)
      if (out.tried[i].describe == d) return static_cast<int>(i);
    Candidate c{std::move(items), d.empty() ? "(as asked)" : d, x, {}};
    try {
      c.result = plan_step(x);
    } catch (const Error&) {
      return -1;  // a mesh or knob the engine refuses here
    }
    out.tried.push_back(std::move(c));
    return static_cast<int>(out.tried.size()) - 1;
  };
  auto faster = [&](int a, int b) {  // a fits and beats b
    if (a < 0 || !out.tried[static_cast<size_t>(a)].result.fits()) return false;
    if (b < 0 || !out.tried[static_cast<size_t>(b)].result.fits()) return true;
    return out.tried[static_cast<size_t>(a)].result.time.seconds <
           out.tried[static_cast<size_t>(b)].result.time.seconds;
  };
  int best = plan_of(in, {});
  for (int round = 0; round < kRounds; ++round) {
    const int start = best;
    if (start < 0) break;
    const Candidate base = out.tried[static_cast<size_t>(start)];
    auto with = [&](const std::string& key, const std::string& item) {
      std::vector<std::string> items;
      for (const std::string& s : base.items)
        if (s.rfind(key + "=", 0) != 0) items.push_back(s);
      items.push_back(item);
      std::sort(items.begin(), items.end());
      return items;
    };
    for (int64_t cp : cps) {
      if (cp == base.input.settings.layout.context_ranks()) continue;
      Input x = base.input;
      x.settings.layout.cp = cp;
      const int i = plan_of(x, with("cp", fmt::format("cp={}", cp)));
      if (faster(i, best)) best = i;
    }
    for (const Knob& k : knobs) {
      for (const std::string& v : k.values) {
        Input x = base.input;
        const std::string item = k.key + "=" + v;
        try {
          settings_apply(x.settings, item);
        } catch (const Error&) {
          continue;
        }
        const int i = plan_of(x, with(k.key, item));
        if (faster(i, best)) best = i;
      }
    }
    if (best == start) break;
  }
  if (best >= 0 && out.tried[static_cast<size_t>(best)].result.fits()) {
    out.best = best;
    for (size_t i = 0; i < out.tried.size(); ++i) {
      if (static_cast<int>(i) == best) continue;
      if (faster(static_cast<int>(i), out.runner_up)) out.runner_up = static_cast<int>(i);
    }
  }
  out.seconds = seconds_since(t0);
  return out;
}

}  // namespace fp::plan
