// Token embedding (ops/embedding.h). Dimensions: n tokens, H hidden, V vocabulary (the table's rows).
//
// Forward is a row copy per token, split over tokens. Backward is a scatter-add where tokens repeat,
// so splitting over tokens would race or need atomics (whose order, and so whose bits, vary from run
// to run). Note [Deterministic embedding backward]: threads split the destination rows instead:
// thread k of T adds the tokens whose id % T == k, scanning all tokens in order (n ids, cheap). Every
// row of dtable is owned by one thread and receives its additions in token order whatever T is --
// the same float operations as the reference, so the bits never depend on the thread count. Whole
// rows are added, contiguous in dout and dtable alike. (Splitting the hidden columns instead also
// keeps the order but reads each row in pieces, measured 2x slower than the plain loop at H = 1024.)
// Skewed ids (one token repeated) serialise on one thread; the result is still the same.
#include "ops/embedding.h"

#include <omp.h>

#include <cstring>

#include "core/error.h"

namespace fp::ops::cpu {

namespace {

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
#pragma omp parallel if (n * H >= kParallelMinElements)
  {
    // Note [Deterministic embedding backward]: this thread owns the rows with id % nthreads == k.
    const int64_t nthreads = omp_get_num_threads(), k = omp_get_thread_num();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t id = tokens[t];
      if (id % nthreads != k) continue;
      float* __restrict dst = dtable + id * H;       // (H)
      const float* __restrict src = dout + t * H;    // (H)
      for (int64_t h = 0; h < H; ++h) dst[h] += src[h];
    }
  }
}

}  // namespace fp::ops::cpu
