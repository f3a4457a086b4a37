// flatpeak bench checkpoint: device vs SCO checkpoint boundaries: peaks and step time. Not implemented yet: registered so the command line lists it.
#include "cli/commands.h"
#include "core/error.h"

namespace fp::cli {

void bench_checkpoint_register(CLI::App& parent, Runner& run) {
  CLI::App* sub = parent.add_subcommand("checkpoint", "device vs SCO checkpoint boundaries: peaks and step time (not available yet)");
  sub->allow_extras();
  sub->callback([&run] {
    run = [] () -> int {
      throw Error("flatpeak bench checkpoint is not available yet", "it lands with SCO");
    };
  });
}

}  // namespace fp::cli
