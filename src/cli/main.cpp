// flatpeak command line: train | eval | plan | bench (as they land) and step (one forward+backward).
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
  fp::cli::StepOptions step;
  fp::cli::step_register(app, step);
  fp::TrainOptions train;
  fp::cli::train_register(app, train);
  fp::cli::EvalOptions eval;
  fp::cli::eval_register(app, eval);
  fp::cli::BenchOptions bench;
  fp::cli::bench_register(app, bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (app.got_subcommand("step")) return fp::cli::step_run(step);
    if (app.got_subcommand("train")) return fp::train_run(train);
    if (app.got_subcommand("eval")) return fp::cli::eval_run(eval);
    if (app.got_subcommand("bench")) return fp::cli::bench_step_run(bench);
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
