#include "data/batch.h"

#include "core/error.h"

namespace fp {

int64_t batch_targets(const Batch& b) {
  int64_t n = 0;
  for (const int32_t t : b.targets) n += t != -100;
  return n;
}

Batch batch_rows(const Batch& b, int64_t first, int64_t count) {
  FP_ASSERT(first >= 0 && count >= 0 && first + count <= b.B, "rows [{}, {}) of a batch of {}", first, first + count,
            b.B);
  Batch r;
  r.B = count;
  r.T = b.T;
  r.positions = b.positions;
  auto part = [&](const std::vector<int32_t>& x) {
    return x.empty() ? std::vector<int32_t>{}
                     : std::vector<int32_t>(x.begin() + first * b.T, x.begin() + (first + count) * b.T);
  };
  r.tokens = part(b.tokens);
  r.targets = part(b.targets);
  r.doc_start = part(b.doc_start);
  if (!b.offsets.empty()) r.offsets.assign(b.offsets.begin() + first, b.offsets.begin() + first + count);
  return r;
}

void batch_validate(const Batch& b, int64_t V) {
  const int64_t n = b.B * b.T;
  FP_CHECK(b.B >= 1 && b.T >= 1, "a batch holds B >= 1 sequences of T >= 1 tokens", "empty batch ({} x {})", b.B, b.T);
  FP_CHECK(static_cast<int64_t>(b.tokens.size()) == n && static_cast<int64_t>(b.targets.size()) == n,
           "tokens and targets are both (B, T)", "batch of {} x {} has {} tokens and {} targets", b.B, b.T,
           b.tokens.size(), b.targets.size());
  for (int64_t i = 0; i < n; ++i) {
    FP_CHECK(b.tokens[i] >= 0 && b.tokens[i] < V, "every token id must be < model.vocab_size",
             "token id {} at sequence {}, position {} is out of range [0, {})", b.tokens[i], i / b.T, i % b.T, V);
    FP_CHECK(b.targets[i] == -100 || (b.targets[i] >= 0 && b.targets[i] < V),
             "targets are token ids < model.vocab_size, or -100 to ignore a position",
             "target {} at sequence {}, position {} is out of range [0, {})", b.targets[i], i / b.T, i % b.T, V);
  }
  FP_CHECK(b.positions.empty() || static_cast<int64_t>(b.positions.size()) == b.T, "positions are (T)",
           "batch of {} tokens per sequence has {} positions", b.T, b.positions.size());
  if (b.doc_start.empty()) return;
  FP_CHECK(static_cast<int64_t>(b.doc_start.size()) == n, "document starts are (B, T) like the tokens",
           "batch of {} x {} has {} document starts", b.B, b.T, b.doc_start.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = i % b.T, pos = b.positions.empty() ? t : b.positions[t];
    FP_CHECK(b.doc_start[i] >= 0 && b.doc_start[i] <= pos && (t == 0 || b.doc_start[i - 1] <= b.doc_start[i]),
             "a token's document starts at or before it, and starts ascend along a sequence",
             "document start {} at sequence {}, position {} (the token's position {})", b.doc_start[i], i / b.T, t,
             pos);
  }
}

}  // namespace fp
