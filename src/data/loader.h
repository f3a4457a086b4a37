// Batches from a token file, for training (TokenFileLoader) and for `flatpeak eval`.
//
// Dimensions: N tokens in the file, B sequences per batch, T tokens per sequence.
//
// Note [Token file sequences]: a sequence starting at token offset p is the window data[p .. p + T]
// (T + 1 tokens): tokens = data[p .. p + T), targets = data[p + 1 .. p + T] (the model does not
// shift; no target is ignored). Consecutive sequences start T tokens apart (p = 0, T, 2T, ...), so
// every token except the first is a target exactly once per pass. When the next window would run
// past the end (p + T + 1 > N) the loader wraps to p = 0: one pass (epoch) is (N - 1) / T sequences
// and the last (N - 1) % T tokens are never a target. A batch may straddle the wrap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/token_file.h"

namespace fp {

class TokenFileLoader {
 public:
  // file must outlive the loader. Throws fp::Error if the file has fewer than T + 1 tokens.
  TokenFileLoader(const TokenFile& file, int64_t B, int64_t T);

  // The next B sequences in file order (Note [Token file sequences]).
  Batch next();

  // Token offset where the next sequence starts; saving it and calling seek() on a new loader over
  // the same file resumes the exact sequence order.
  int64_t position() const { return position_; }
  // Throws fp::Error unless 0 <= position <= N (e.g. a checkpoint written for a different file).
  void seek(int64_t position);

 private:
  const TokenFile& file_;
  int64_t B_, T_;
  int64_t position_ = 0;
};

// Every sequence of one pass (Note [Token file sequences]: offsets 0, T, 2T, ..., (N - 1) / T of
// them; the last partial window dropped) in order, grouped into batches of B; the last batch holds
// the remainder (B' < B) so that every sequence is evaluated once. Holds 8 bytes per token of the
// file (tokens and targets as int32). Throws fp::Error if the file has fewer than T + 1 tokens.
// seq_flag: how the user named T, for errors ("train.seq_len", "--seq-len"). max_batches > 0: only
// the first max_batches batches (the file's first windows).
std::vector<Batch> token_file_eval_batches(const TokenFile& file, int64_t T, int64_t B,
                                           const std::string& seq_flag = "train.seq_len", int64_t max_batches = 0);

}  // namespace fp
