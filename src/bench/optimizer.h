// flatpeak bench optimizer: the optimizer step of every schedule (docs/design.md, OffloadStreamAdamW) in
// one run: device AdamW, offload_serial, offload_stream with the update on the device and on the
// host, for each slot count, with the copies native (memcpy) and over each emulated link
// (Note [Emulated link], backend.h; figures with it are emulated and labelled so).
//
// Reports per variant the median step time, its ratio to offload_serial in the same link mode, the
// time the overlap model predicts (Note [OffloadStream pipeline]: each stage timed in the serial run
// of that mode, per bucket, through the pipeline's dependencies), the device bytes of optimizer
// state and staging, the host bytes, and whether the weights and moments equal offload_serial's bit
// for bit (and the device AdamW's within 1e-6) after a check run before the timing, the bytes each
// step moved down (device to host) and up (OffloadTimes), and the bus floor (Note [Bus floor]). Each
// precision recipe (fp32, bf16) runs every variant on its own parameters; the variants of all recipes
// are timed interleaved, and each is checked against the variants of its own recipe. Then the CPU
// AdamW kernel's throughput against the memory-bandwidth limit: 28 bytes per parameter (fp32: 16
// read, 12 written; bf16 gradient and rounded weights: 14 and 14) at the best memory bandwidth
// measured in the same run (memcpy of a large buffer on one thread and on all, and a loop with
// AdamW's fp32 traffic and no arithmetic on the kernel's own arrays, alternating with the kernel;
// bytes read plus written). Dimensions: P parameters, b a bucket's elements, S slots.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp::bench {

struct BenchOptimizerOptions {
  std::string params = "50M";          // parameter count of the synthetic MoE layout: 50000000, 50M, 1.5G
  std::string config;                  // a run config whose [model] and [optim] to use instead of params
  std::vector<std::string> overrides;  // table.key=value, with config
  int64_t bucket_params = 0;           // 0: optim.bucket_params (1048576 by default)
  std::vector<int64_t> slots = {2};
  std::vector<double> link_gbps;  // emulated links (GB/s), each run after the native copies
  // The precision recipes to run (core/precision.h), each on its own ParamStore with every variant, in
  // the same run: "fp32", "bf16" or both. Empty: the config's [precision] (with config), else fp32. A
  // recipe named here replaces the config's [precision] whole. bf16: bf16 weights and gradients, f32
  // master and moments (Note [Offload with bf16 weights], sched/optim/offload.h); a precision other
  // than the two recipes is refused by name.
  std::vector<std::string> precision;
  int repeats = 5;                // >= 5
  int warmup = 1;
  std::string json;
};

// Runs the benchmark, prints its report and writes o.json; returns the exit code (0). Options out of
// range, and a variant whose weights and moments differ, are fp::Errors.
int bench_optimizer_run(const BenchOptimizerOptions& o);

}  // namespace fp::bench
