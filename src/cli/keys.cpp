// flatpeak keys: every run-config key from the registry (Note [One key registry], train/config_keys.h):
// its type, default, what a change on resume means, the commands that read it and one line of doc.
#include <cstdio>

#include "cli/commands.h"
#include "train/config_keys.h"

namespace fp::cli {

void keys_register(CLI::App& app, Runner& run) {
  auto markdown = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand(
      "keys", "every run-config key: type, default, what a change on resume means, the commands that read it");
  sub->add_flag("--markdown", *markdown, "a markdown table (docs/config.md is this output)");
  sub->callback([&run, markdown] {
    run = [markdown] {
      std::fputs(config_keys_describe(*markdown).c_str(), stdout);
      return 0;
    };
  });
}

}  // namespace fp::cli
