// Token-file batches (Note [Token file sequences] in loader.h).
//
// Dimensions: N tokens in the file, B sequences per batch, T tokens per sequence.
#include "data/loader.h"

#include <algorithm>

#include "core/error.h"

namespace fp {
namespace {

void check_fits(const TokenFile& file, int64_t T, const std::string& seq_flag) {
  FP_CHECK(file.size() >= T + 1,
           fmt::format("a sequence needs {0} + 1 tokens (inputs and the next token): use a longer file or a "
                       "shorter {0}",
                       seq_flag),
           "token file '{}' has {} tokens, fewer than {} + 1 = {}", file.path(), file.size(), seq_flag, T + 1);
}

// Row r of b from the window starting at token offset p.
void window_copy(const TokenFile& file, int64_t p, int64_t T, Batch& b, int64_t r) {
  const uint32_t* src = file.data() + p;     // (T + 1)
  int32_t* tok = b.tokens.data() + r * T;    // (T)
  int32_t* tgt = b.targets.data() + r * T;   // (T)
  for (int64_t t = 0; t < T; ++t) {
    tok[t] = static_cast<int32_t>(src[t]);  // < vocab_size <= int32 max (checked on load)
    tgt[t] = static_cast<int32_t>(src[t + 1]);
  }
}

Batch batch_empty(int64_t B, int64_t T) {
  Batch b;
  b.B = B;
  b.T = T;
  b.tokens.resize(static_cast<size_t>(B * T));
  b.targets.resize(static_cast<size_t>(B * T));
  return b;
}

}  // namespace

TokenFileLoader::TokenFileLoader(const TokenFile& file, int64_t B, int64_t T) : file_(file), B_(B), T_(T) {
  FP_ASSERT(B >= 1 && T >= 1, "B {} T {}", B, T);
  check_fits(file, T, "train.seq_len");
}

Batch TokenFileLoader::next() {
  Batch b = batch_empty(B_, T_);
  for (int64_t r = 0; r < B_; ++r) {
    if (position_ + T_ + 1 > file_.size()) position_ = 0;  // wrap: a new pass
    window_copy(file_, position_, T_, b, r);
    b.offsets.push_back(position_);
    position_ += T_;
  }
  return b;
}

void TokenFileLoader::seek(int64_t position) {
  FP_CHECK(position >= 0 && position <= file_.size(),
           "the position must come from a loader over the same token file (was the file replaced?)",
           "cannot seek token file '{}' to token {}: it has {} tokens", file_.path(), position, file_.size());
  position_ = position;
}

std::vector<Batch> token_file_eval_batches(const TokenFile& file, int64_t T, int64_t B, const std::string& seq_flag,
                                           int64_t max_batches) {
  FP_ASSERT(B >= 1 && T >= 1 && max_batches >= 0, "B {} T {} max_batches {}", B, T, max_batches);
  check_fits(file, T, seq_flag);
  int64_t sequences = (file.size() - 1) / T;
  if (max_batches > 0) sequences = std::min(sequences, max_batches * B);
  std::vector<Batch> out;
  out.reserve(static_cast<size_t>((sequences + B - 1) / B));
  for (int64_t first = 0; first < sequences; first += B) {
    const int64_t rows = std::min(B, sequences - first);
    Batch b = batch_empty(rows, T);
    for (int64_t r = 0; r < rows; ++r) {
      window_copy(file, (first + r) * T, T, b, r);
      b.offsets.push_back((first + r) * T);
    }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace fp
