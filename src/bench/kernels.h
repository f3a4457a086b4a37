// flatpeak bench kernels: the kernel table (backend/kernels.h, FP_KERNEL_LIST) entry by entry at shapes of
// the paper's scale, as ggml's test-backend-ops -m perf: for each entry and storage dtype one call, timed as
// the median of repeats after a warmup, with the FLOPs and bytes that call does (formulas of its shapes and
// dtypes, Note [bench kernels: FLOPs and bytes] in kernels.cpp), the achieved GFLOP/s or GB/s (whichever
// bounds it: the GEMMs and attention by FLOPs, everything else by bytes) and its fraction of the machine's
// limit, measured in the same run (cpu: the sgemm rate at a large square shape, and the bandwidth of a large
// memcpy split over the OpenMP threads, bytes read + written). It is the table a backend is held against.
//
// Backends (--backend): cpu computes and is timed; meta computes nothing, so it prints the same table of
// shapes, FLOPs and bytes with no time (every row "not timed"); cuda needs a GPU (without one, the backend's
// own error), prints the device name, measures its limits through its own table's gemm and copy entries
// (published peaks are left for the GPU issue) and lists each entry its skeleton lacks as "missing". An
// entry a backend lacks in a dtype (Kernels::supports), or whose contract has no operand of that dtype
// (kernel_contract_dtypes: float* operands only), is listed as "not supported", never skipped.
#pragma once

#include <string>

namespace fp::bench {

struct BenchKernelsOptions {
  std::string backend = "cpu";  // a registered backend (backend/registry.h): cpu, meta, cuda
  std::string dtype = "f32";    // f32, bf16 or both: the storage dtype of the entries' Buf/CBuf operands
  std::string only;             // ECMAScript regex: the entries whose name it matches (search); "": all
  int repeats = 5;              // timed calls per entry, at most (median reported; fewer once kTimeCap is spent)
  int warmup = 1;               // untimed calls first
  std::string scale = "paper";  // paper (the shapes of kernels.cpp's paper_dims) or small (tiny: tests)
  std::string json;             // results file ("": none)
};

// Runs the benchmark, prints its table and writes o.json; returns the exit code (0). A backend that
// cannot be made (unknown name, cuda without a GPU), a bad dtype, scale or regex are fp::Errors.
int bench_kernels_run(const BenchKernelsOptions& o);

}  // namespace fp::bench
