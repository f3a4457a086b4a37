// flatpeak plan: closed-form per-category peaks at full scale and the reach of each schedule. Not implemented yet: registered so the command line lists it.
#include "cli/commands.h"
#include "core/error.h"

namespace fp::cli {

void plan_register(CLI::App& parent, Runner& run) {
  CLI::App* sub = parent.add_subcommand("plan", "closed-form per-category peaks at full scale and the reach of each schedule (not available yet)");
  sub->allow_extras();
  sub->callback([&run] {
    run = [] () -> int {
      throw Error("flatpeak plan is not available yet", "it lands with the planner");
    };
  });
}

}  // namespace fp::cli
