// flatpeak command line: train | eval | step | plan | bench <step|vocab|checkpoint|optimizer>.
// Errors: fp::Error prints "error: ..." and "hint: ..." and exits 1; internal errors exit 2.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "memory/ledger.h"

int main(int argc, char** argv) {
  CLI::App app{"flatpeak: train long-context MoE models with every device-memory peak bounded at launch"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "flatpeak 0.1.0");
  fp::cli::Runner run;
  fp::cli::train_register(app, run);
  fp::cli::eval_register(app, run);
  fp::cli::step_register(app, run);
  fp::cli::plan_register(app, run);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks: the plain and the flattened schedule in one run");
  bench->require_subcommand(1);
  fp::cli::bench_step_register(*bench, run);
  fp::cli::bench_vocab_register(*bench, run);
  fp::cli::bench_checkpoint_register(*bench, run);
  fp::cli::bench_optimizer_register(*bench, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (run) return run();
  } catch (const fp::OutOfMemoryError& e) {
    std::fprintf(stderr, "error: %s\nhint: %s\n", e.what(), e.hint().c_str());
    return 1;
  } catch (const fp::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "hint: %s\n", e.hint().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
