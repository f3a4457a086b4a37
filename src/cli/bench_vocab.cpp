// flatpeak bench vocab: full vs ring vocabulary projection: peaks and time. Not implemented yet: registered so the command line lists it.
#include "cli/commands.h"
#include "core/error.h"

namespace fp::cli {

void bench_vocab_register(CLI::App& parent, Runner& run) {
  CLI::App* sub = parent.add_subcommand("vocab", "full vs ring vocabulary projection: peaks and time (not available yet)");
  sub->allow_extras();
  sub->callback([&run] {
    run = [] () -> int {
      throw Error("flatpeak bench vocab is not available yet", "it lands with Ring-DTP");
    };
  });
}

}  // namespace fp::cli
