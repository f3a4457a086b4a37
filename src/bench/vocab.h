// flatpeak bench vocab: the LM head (final RMSNorm, projection to the vocabulary, mean cross-entropy,
// forward and backward) with the full and the Ring-DTP vocabulary schedules in the same run, on random
// inputs of N tokens per rank, hidden H, vocabulary V; one rank, or W ranks under mpirun.
// Legend: N tokens per rank, H hidden, V vocabulary, W ranks.
//
// Variants: full (every rank its own (N, V) logits against the whole, replicated lm_head) and ring;
// with W > 1 ranks the ring runs in each requested mode (ring_mode) with both backward options,
// recomputing the strips and keeping them (vocab.keep_strips). For each variant, on a fresh backend
// (its own ledger): the device peak, the peaks of categories vocab and comm (largest over the ranks),
// and (cpu) the median forward+backward seconds over `repeats` after `warmup` (each run's time is
// the slowest rank's) with where it went: GEMMs, the softmax/log-sum-exp work, waiting on the ring's
// transfers (means over the ranks). On cpu every ring variant is first checked against the full head
// of its recipe, and every head against float64 (dx of a few tokens per rank, and dW of a few lm_head
// rows when N V H is small enough, kDwOracleMaxMacs in vocab.cpp), within the recipe's tolerances
// (Note [bench vocab tolerances] in vocab.cpp); check, then time. With one rank and fp32 among the
// recipes PyTorch's F.linear + F.cross_entropy (fp32) runs on the same shapes as a subprocess
// (scripts/bench_vocab_torch.py: median seconds and max RSS). With device meta nothing is
// computed and only the peaks are reported (exact, at any N and V).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp::bench {

struct BenchVocabOptions {
  int64_t tokens = 8192;
  int64_t vocab = 32768;
  int64_t hidden = 1024;
  int64_t block_tokens = 1024;
  std::string ring_mode = "auto";  // W > 1: weights | activations | auto | both
  std::string device = "cpu";
  int repeats = 5;
  int warmup = 1;
  std::string json;
  bool no_torch = false;
  std::string torch_script = "scripts/bench_vocab_torch.py";
  std::string python = "/usr/bin/python3";
  // The ring variants' lm_head in the FSDP layout (each rank holds its V / W rows, as `flatpeak train`
  // lays it out) instead of whole on every rank; W > 1.
  bool fsdp = false;
  // The precision recipes to run (core/precision.h), each with every variant, all in the same run:
  // "fp32", "bf16" or both (--precision fp32,bf16). With more than one, each variant's name carries its
  // recipe ("full/bf16"). In bf16 the hidden states, lm_head and its gradient are bf16, the logits,
  // strips and loss f32 (Note [bench vocab in bf16] in vocab.cpp).
  std::vector<std::string> precision = {"fp32"};
  bool breakdown = false;          // print every tensor live at each variant's device peak (rank 0)
};

// Runs the benchmark on the ranks of comm_world() (rank 0 prints and writes o.json); returns the exit
// code (0). Options out of range, a ring variant that disagrees with the full head, and a head whose dx
// or dW is farther from float64 than its recipe's tolerance are fp::Errors.
int bench_vocab_run(const BenchVocabOptions& o);

}  // namespace fp::bench
