// flatpeak bench dispatch: one MoE block (norm, router, dispatch, experts, combine; forward keeping
// what backward needs, then backward) with the expert dispatch variants standard, llep and
// pipelined_llep (strided and contiguous chunks) in the same run, on W ranks under mpirun (W = 1
// works: every variant then moves rows to itself). The routing profile overrides the router's
// choice (model/routing.h), so the skew is set and meta runs allocate like cpu runs.
// Legend: N tokens per rank, H hidden, I expert width, E experts, k top-k, W ranks, m = N k,
// c chunk cap, K chunks, c_eff tokens per source per chunk.
//
// Per variant, on a fresh backend (its own ledger), the largest over the ranks of: the dispatch
// category's peak, the device peak, the receive-side peak (the buffers holding rows a rank computes:
// received rows, their grouped copies, outputs, output gradients; found by tag on the ledger's
// timeline), the rows a rank computes (load ratio max / mean over the ranks), and on cpu the median
// forward+backward seconds over `repeats` after `warmup` (each run's time is the slowest rank's;
// variants interleaved). Chunked variants add K, c_eff, chunk_send_ratio (the largest send to one
// rank in a chunk over the mean send per rank, max over chunks and ranks) and recv_frac_of_bound (the
// largest receive in a chunk over W k c_eff). On cpu every variant is first checked against standard
// (check, then time): the block's output and input gradient, the router's and the owned experts'
// weight gradients. With device meta nothing is computed or moved (counts and plans are real), so
// the paper's scale runs in seconds.
#pragma once

#include <cstdint>
#include <string>

namespace fp::bench {

struct BenchDispatchOptions {
  int64_t tokens = 2048;
  int64_t experts = 16;
  int64_t top_k = 2;
  int64_t hidden = 256;
  int64_t intermediate = 512;
  std::string profile = "hot:0.95:4";  // balanced or hot:R:H (model/routing.h)
  int64_t chunk_cap = 1024;
  int64_t max_chunks = 128;
  double lambda = 1.3;
  double alpha = 1.0;
  int64_t min_tokens_per_gemm = 1024;
  int64_t token_chunk = 0;  // > 0: also pipelined_llep (strided) with the token side in chunks
  std::string device = "cpu";
  int repeats = 5;
  int warmup = 1;
  std::string json;
};

// Runs the benchmark on the ranks of comm_world() (rank 0 prints and writes o.json); returns the exit
// code (0). Options out of range, and a variant that disagrees with standard, are fp::Errors.
int bench_dispatch_run(const BenchDispatchOptions& o);

}  // namespace fp::bench
