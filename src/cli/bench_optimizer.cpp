// flatpeak bench optimizer: device / offload_serial / offload_stream AdamW. Not implemented yet: registered so the command line lists it.
#include "cli/commands.h"
#include "core/error.h"

namespace fp::cli {

void bench_optimizer_register(CLI::App& parent, Runner& run) {
  CLI::App* sub = parent.add_subcommand("optimizer", "device / offload_serial / offload_stream AdamW (not available yet)");
  sub->allow_extras();
  sub->callback([&run] {
    run = [] () -> int {
      throw Error("flatpeak bench optimizer is not available yet", "it lands with OffloadStreamAdamW");
    };
  });
}

}  // namespace fp::cli
