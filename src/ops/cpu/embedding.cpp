// Token embedding (ops/embedding.h). Dimensions: n tokens, H hidden, V vocabulary (the table's rows).
//
// Forward is a row copy per token, split over tokens. Backward is a scatter-add where tokens repeat,
// so splitting over tokens would race or need atomics (whose order, and so whose bits, vary from run
// to run). Note [Deterministic embedding backward]: threads split the hidden columns into fixed
// chunks of kColumnChunk instead; every thread walks all tokens in order over its own columns, so each
// element of dtable receives its additions in token order whatever the thread count -- the same float
// operations as the reference. Each token's chunk is kColumnChunk contiguous floats (4 cache lines),
// so the strided walk over dout still reads whole lines.
#include "ops/embedding.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace fp::ops::cpu {

namespace {

// Columns per backward work item: a multiple of every SIMD width, 4 cache lines of floats.
constexpr int64_t kColumnChunk = 64;
// Below this many elements (n * H) a parallel region costs more than the copy.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// Ids come validated from the data loader; a negative id here is our bug. Checked before the
// parallel loops because an exception must not leave an OpenMP region.
void tokens_check(const int32_t* tokens, int64_t n) {
  for (int64_t t = 0; t < n; ++t) FP_ASSERT(tokens[t] >= 0, "token {} has id {}", t, tokens[t]);
}

}  // namespace

void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t n, int64_t H) {
  tokens_check(tokens, n);
  if (H == 0) return;
#pragma omp parallel for schedule(static) if (n * H >= kParallelMinElements)
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(out + t * H, table + static_cast<int64_t>(tokens[t]) * H, static_cast<size_t>(H) * sizeof(float));
  }
}

void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, int64_t n, int64_t H) {
  tokens_check(tokens, n);
  const int64_t nchunks = (H + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static) if (n * H >= kParallelMinElements)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t h0 = c * kColumnChunk;
    const int64_t width = std::min(kColumnChunk, H - h0);
    for (int64_t t = 0; t < n; ++t) {
      float* __restrict dst = dtable + static_cast<int64_t>(tokens[t]) * H + h0;  // (width)
      const float* __restrict src = dout + t * H + h0;                            // (width)
      for (int64_t h = 0; h < width; ++h) dst[h] += src[h];
    }
  }
}

}  // namespace fp::ops::cpu
