// A random batch for smoke runs (flatpeak step, tests): tokens uniform in [0, V) from a seed, targets
// the next token (the last position of each sequence ignored with -100).
#pragma once

#include <cstdint>

#include "data/batch.h"

namespace fp {

Batch batch_random(int64_t B, int64_t T, int64_t V, uint64_t seed);

}  // namespace fp
