#include "data/random_batch.h"

#include "core/rng.h"

namespace fp {

Batch batch_random(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Batch b;
  b.B = B;
  b.T = T;
  b.tokens.resize(static_cast<size_t>(B * T));
  b.targets.resize(static_cast<size_t>(B * T));
  Rng rng(seed);
  for (auto& t : b.tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  for (int64_t s = 0; s < B; ++s)
    for (int64_t t = 0; t < T; ++t) b.targets[s * T + t] = t + 1 < T ? b.tokens[s * T + t + 1] : -100;
  return b;
}

}  // namespace fp
