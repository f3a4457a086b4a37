// flatpeak command line: train | eval | step | plan | bench <step|vocab|checkpoint|optimizer|dispatch>.
// Errors: fp::Error prints "error: ..." and "hint: ..." and exits 1; internal errors exit 2.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "comm/comm.h"
#include "core/error.h"
#include "memory/ledger.h"

namespace {

// Note [A failed rank stops the run]: an error on any rank ends every rank promptly with a non-zero
// exit, and is printed once. Rank 0 prints and aborts at once. Another rank first waits a moment: when
// the error is the same everywhere (a bad config, an unreadable file) rank 0's abort ends it before it
// prints; when the error is its own (its piece of the data, its memory), nobody else aborts, so it
// prints (naming its rank) and aborts the run itself. A rank blocked in a collective with a failed
// peer is ended by the abort, never left hanging.
[[noreturn]] void fail(fp::Comm* comm, const std::string& what, const std::string& hint, int code) {
  const bool multi = comm != nullptr && comm->size() > 1;
  if (multi && comm->rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const std::string who = multi ? " [rank " + std::to_string(comm->rank()) + "]" : "";
  std::fprintf(stderr, "%s%s: %s\n", code == 2 ? "internal error" : "error", who.c_str(), what.c_str());
  if (!hint.empty()) std::fprintf(stderr, "hint: %s\n", hint.c_str());
  std::fflush(stderr);
  if (multi) comm->abort(code);
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  fp::Comm* comm = nullptr;
  try {
    comm = &fp::comm_world();  // starts MPI first when launched by mpirun
  } catch (const fp::Error& e) {
    fail(nullptr, e.what(), e.hint(), 1);
  }
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
  fp::cli::bench_dispatch_register(*bench, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    if (rc != 0 && comm->size() > 1) comm->abort(rc);
    return rc;
  }
  try {
    if (run) return run();
  } catch (const fp::Error& e) {
    fail(comm, e.what(), e.hint(), 1);
  } catch (const std::exception& e) {
    fail(comm, e.what(), "", 2);
  }
  return 0;
}
