// One step's tokens on this rank, as every data source hands them to the step (step/step.h).
// Legend: B sequences, T tokens per sequence (this rank's share under context parallelism), V vocabulary.
#pragma once

#include <cstdint>
#include <vector>

namespace fp {

// Host memory, row-major (B, T). Under context parallelism T is this rank's share of each sequence and
// positions says which positions of the sequence they are (data/context_split.h); empty positions mean
// 0..T-1.
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens;     // (B, T) ids in [0, V)
  std::vector<int32_t> targets;    // (B, T) ids in [0, V) or -100 (ignored)
  std::vector<int32_t> positions;  // (T) ascending positions in the sequence, or empty
  // (B, T) where each token's document begins, a position in its sequence (data/documents.h), or empty:
  // one document per sequence.
  std::vector<int32_t> doc_start;
  // (B) the token-file offset each sequence's window starts at (data/loader.h), or empty: where a
  // document index finds the sequence's documents (data/documents.h).
  std::vector<int64_t> offsets;
};

// The targets of b that take a loss (not -100).
int64_t batch_targets(const Batch& b);

// Sequences [first, first + count) of b (tokens, targets, document starts, offsets), positions kept.
Batch batch_rows(const Batch& b, int64_t first, int64_t count);

// Throws fp::Error naming the first bad position: shapes, token ids out of [0, vocab_size), targets
// neither in [0, vocab_size) nor -100, document starts that pass their token or descend.
void batch_validate(const Batch& b, int64_t vocab_size);

}  // namespace fp
