// The subcommands of the flatpeak CLI: each registers its options on the app and runs.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace fp::cli {

// Each subcommand registers itself on its parent and, when the command line selects it, sets `run`
// to the function that executes it (main calls it inside the error handler).
using Runner = std::function<int()>;

// A validator for integer flags: the value must be at least lo ("--steps: 0 is below 1, the least
// allowed").
CLI::Validator at_least(int64_t lo);

// Options every run shares.
struct CommonOptions {
  std::string config;
  std::vector<std::string> overrides;  // --set table.key=value
  std::string device = "cpu";
  std::string device_mem = "unlimited";
  std::string host_mem = "unlimited";
};
void common_register(CLI::App& sub, CommonOptions& o);

// flatpeak step: one forward+backward of the model on a random batch; prints the loss and the peak
// of every memory category; writes memory_trace.json (and step.json) into --out.
struct StepOptions {
  CommonOptions common;
  std::string out;
  uint64_t data_seed = 1;
};
void step_register(CLI::App& app, Runner& run);
int step_run(const StepOptions& o);

// flatpeak train (train/trainer.h holds the options).
void train_register(CLI::App& app, Runner& run);

// flatpeak report RUN_DIR: one self-contained HTML page of a run (report.cpp).
void report_register(CLI::App& app, Runner& run);

// flatpeak eval: mean cross-entropy of a checkpoint on a token file, sequences of T in order.
struct EvalOptions {
  std::string checkpoint;
  std::string data;
  int64_t seq_len = 0;
  int64_t batch = 1;
  std::string json;
  std::string device_mem = "unlimited";
  std::string dump_logits;
  std::vector<std::string> overrides;  // --set data.documents=eos ...: the keys flatpeak keys marks for eval
};
void eval_register(CLI::App& app, Runner& run);
int eval_run(const EvalOptions& o);

// flatpeak convert: a checkpoint read strictly and written back as a Hugging Face directory (another
// dtype, other shards), nothing dropped (train.cpp).
void convert_register(CLI::App& app, Runner& run);

// flatpeak bench step | vocab | checkpoint | optimizer | dispatch | kernels (bench.cpp): each registers its flags
// on `parent` (the bench command) and runs the benchmark of bench/<name>.h.
void bench_step_register(CLI::App& parent, Runner& run);
void bench_vocab_register(CLI::App& parent, Runner& run);
void bench_checkpoint_register(CLI::App& parent, Runner& run);
void bench_optimizer_register(CLI::App& parent, Runner& run);
void bench_dispatch_register(CLI::App& parent, Runner& run);
void bench_kernels_register(CLI::App& parent, Runner& run);
// flatpeak bench calibrate: the local device profile (bench/calibrate.h).
void bench_calibrate_register(CLI::App& parent, Runner& run);

// flatpeak plan (plan.cpp).
void plan_register(CLI::App& app, Runner& run);

// flatpeak launch (launch.cpp): mpirun ... flatpeak train, watched and restarted from its newest checkpoint.
void launch_register(CLI::App& app, Runner& run);

// flatpeak keys (keys.cpp): the run config's keys from the registry.
void keys_register(CLI::App& app, Runner& run);

}  // namespace fp::cli
