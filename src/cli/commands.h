// The subcommands of the flatpeak CLI: each registers its options on the app and runs.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace fp::cli {

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
void step_register(CLI::App& app, StepOptions& o);
int step_run(const StepOptions& o);

// flatpeak train (train/trainer.h holds the options).
void train_register(CLI::App& app, TrainOptions& o);

// flatpeak eval: mean cross-entropy of a checkpoint on a token file, sequences of T in order.
struct EvalOptions {
  std::string checkpoint;
  std::string data;
  int64_t seq_len = 0;
  int64_t batch = 1;
  std::string json;
  std::string device_mem = "unlimited";
  std::string dump_logits;
};
void eval_register(CLI::App& app, EvalOptions& o);
int eval_run(const EvalOptions& o);

// flatpeak bench step (more benchmarks join as their schedules land).
struct BenchOptions {
  std::string config;
  std::vector<std::string> overrides;
  int repeats = 5;
  int warmup = 1;
  std::string json;
  std::string case_path;
};
void bench_register(CLI::App& app, BenchOptions& o);
int bench_step_run(const BenchOptions& o);

}  // namespace fp::cli
