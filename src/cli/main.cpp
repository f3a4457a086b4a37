// flatpeak command line: train | eval | step | plan | bench <step|vocab|checkpoint|optimizer|dispatch|kernels>.
// Errors: fp::Error prints "error: ..." and "hint: ..." and exits 1; internal errors exit 2.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

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

// Levenshtein distance (small strings: subcommand names).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// A command line that names no known subcommand of `app` (at its first positional word): an error
// naming what was typed and the nearest subcommand, or "" when the line is fine for CLI11 to parse.
std::string unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  const CLI::App* at = &app;
  std::string path = "flatpeak";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return "";  // options: CLI11 checks them
    std::vector<const CLI::App*> subs = at->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return "";
    const CLI::App* hit = nullptr;
    for (const CLI::App* s : subs)
      if (s->get_name() == word) hit = s;
    if (hit == nullptr) {
      const CLI::App* near = subs.front();
      for (const CLI::App* s : subs)
        if (edit_distance(word, s->get_name()) < edit_distance(word, near->get_name())) near = s;
      for (const CLI::App* s : subs)  // an abbreviation names its command
        if (s->get_name().rfind(word, 0) == 0) near = s;
      std::string names;
      for (const CLI::App* s : subs) names += (names.empty() ? "" : ", ") + s->get_name();
      return fmt::format("'{} {}' is not a command{}; the commands are: {}", path, word,
                         edit_distance(word, near->get_name()) <= 3 || near->get_name().rfind(word, 0) == 0
                             ? fmt::format(" (did you mean '{} {}'?)", path, near->get_name())
                             : std::string(),
                         names);
    }
    at = hit;
    path += " " + word;
  }
  return "";
}

}  // namespace

namespace fp::cli {
CLI::Validator at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long x = std::stoll(v, &used);
          if (used != v.size()) return fmt::format("'{}' is not a whole number", v);
          if (x < lo) return fmt::format("{} is below {}, the least allowed", x, lo);
        } catch (const std::exception&) {
          return fmt::format("'{}' is not a whole number", v);
        }
        return "";
      },
      fmt::format("INT >= {}", lo));
}
}  // namespace fp::cli

int main(int argc, char** argv) {
  // Progress lines reach a file or a pipe as they are printed (a killed run keeps every line it printed).
  std::setvbuf(stdout, nullptr, _IOLBF, 1 << 16);
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
  fp::cli::convert_register(app, run);
  fp::cli::step_register(app, run);
  fp::cli::plan_register(app, run);
  fp::cli::report_register(app, run);
  fp::cli::keys_register(app, run);
  fp::cli::launch_register(app, run);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks: the plain and the flattened schedule in one run");
  bench->require_subcommand(1);
  fp::cli::bench_step_register(*bench, run);
  fp::cli::bench_vocab_register(*bench, run);
  fp::cli::bench_checkpoint_register(*bench, run);
  fp::cli::bench_optimizer_register(*bench, run);
  fp::cli::bench_dispatch_register(*bench, run);
  fp::cli::bench_kernels_register(*bench, run);
  fp::cli::bench_calibrate_register(*bench, run);
  if (const std::string bad = unknown_subcommand(app, argc, argv); !bad.empty())
    fail(comm, bad, "run 'flatpeak --help' for the commands and their options", 1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // A command-line mistake is the user's: "error:" and "hint:" like every other one, exit 1.
    std::string where = "flatpeak";
    for (const CLI::App* a = &app; a != nullptr;) {
      const auto subs = a->get_subcommands();
      a = subs.empty() ? nullptr : subs.front();
      if (a != nullptr) where += " " + a->get_name();
    }
    std::string what = e.what();
    if (what.find("A subcommand is required") != std::string::npos) {
      const CLI::App* at = &app;
      for (auto subs = at->get_subcommands(); !subs.empty(); subs = at->get_subcommands()) at = subs.front();
      std::string names;
      for (const CLI::App* sub : at->get_subcommands([](const CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + sub->get_name();
      what = fmt::format("'{}' needs a command: {}", where, names);
    }
    fail(comm, what, fmt::format("run '{} --help' for its options", where), 1);
  }
  try {
    if (run) return run();
  } catch (const fp::Error& e) {
    fail(comm, e.what(), e.hint(), 1);
  } catch (const std::bad_alloc&) {
    // The host ran out (sizes beyond this machine, often on meta, whose bookkeeping is host memory).
    fail(comm, "out of host memory",
         "the sizes asked for need more host memory than this machine has: lower them (or, on meta, the "
         "context or ranks), or run `flatpeak plan`, whose cost does not grow with the token count",
         1);
  } catch (const std::exception& e) {
    fail(comm, e.what(), "", 2);
  }
  return 0;
}
