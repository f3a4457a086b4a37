// Element-wise kernels and reductions (ops/elementwise.h). Dimensions: n elements.
//
// All memory bound. The element-wise loops are plain loops g++ -O3 vectorises, split over threads
// in fixed contiguous ranges (schedule(static)) once n is large enough to pay for a parallel region.
//
// Note [Deterministic reductions]: reduce_sum and reduce_sumsq cut x into fixed blocks of
// kReduceBlock elements, whatever the thread count. Each block is summed in double by 8 interleaved
// accumulators (element i goes to lane i % 8; the lanes are then added in a fixed tree), which g++
// vectorises without -ffast-math because the order is written out. The block partials are then
// added in block order by one thread. Threads only decide who computes which block, never how, so
// the result has the same bits for any thread count. Double accumulation keeps the result within
// one float rounding of the exact sum for any n that fits in memory.
#include "ops/elementwise.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace fp::ops::cpu {

namespace {

// Below this many elements a parallel region costs more than the loop.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;
// Elements per reduction block: 16 KiB of floats, a multiple of every SIMD width.
constexpr int64_t kReduceBlock = 4096;
constexpr int kLanes = 8;

// The sum in double of x (n) or of x^2, in the fixed lane order of Note [Deterministic reductions].
template <bool kSquare>
double block_sum(const float* __restrict x, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      lane[j] += kSquare ? v * v : v;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double v = x[i];
    lane[j] += kSquare ? v * v : v;
  }
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

template <bool kSquare>
float reduce(const float* x, int64_t n) {
  const int64_t nblocks = (n + kReduceBlock - 1) / kReduceBlock;
  if (nblocks <= 1) return static_cast<float>(block_sum<kSquare>(x, n));
  std::vector<double> partial(nblocks);  // (nblocks) one per block
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * kReduceBlock;
    partial[b] = block_sum<kSquare>(x + begin, std::min(kReduceBlock, n - begin));
  }
  double s = 0;
  for (int64_t b = 0; b < nblocks; ++b) s += partial[b];
  return static_cast<float>(s);
}

}  // namespace

void add_inplace(float* __restrict y, const float* __restrict x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* y, float a, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

void fill(float* y, float v, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) y[i] = v;
}

void copy(float* __restrict dst, const float* __restrict src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void reduce_sum(const float* x, int64_t n, float* out) { *out = reduce<false>(x, n); }

void reduce_sumsq(const float* x, int64_t n, float* out) { *out = reduce<true>(x, n); }

void bias_add(float* __restrict y, const float* __restrict b, int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j) y[r * d + j] += b[j];
}

namespace {
// Column sums of x (rows, d) in double, each in row order; done(j0, nc, acc) takes each block of
// columns [j0, j0 + nc). Threads own blocks of columns, so the bits do not depend on them.
template <class Done>
void column_sums(const float* __restrict x, int64_t rows, int64_t d, Done&& done) {
  constexpr int64_t kCols = 64;
  const int64_t nblocks = (d + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t j0 = blk * kCols, nc = std::min(kCols, d - j0);
    double acc[kCols] = {};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < nc; ++j) acc[j] += static_cast<double>(x[r * d + j0 + j]);
    done(j0, nc, acc);
  }
}
}  // namespace

void bias_backward(const float* __restrict dy, float* __restrict db, int64_t rows, int64_t d) {
  column_sums(dy, rows, d, [db](int64_t j0, int64_t nc, const double* acc) {
    for (int64_t j = 0; j < nc; ++j) db[j0 + j] = static_cast<float>(static_cast<double>(db[j0 + j]) + acc[j]);
  });
}

void column_sums_f64(const float* __restrict x, int64_t rows, int64_t d, double* __restrict out) {
  column_sums(x, rows, d, [out](int64_t j0, int64_t nc, const double* acc) {
    for (int64_t j = 0; j < nc; ++j) out[j0 + j] = acc[j];
  });
}

void copy_2d(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ldd, src + r * lds, static_cast<size_t>(cols) * sizeof(float));
}

void add_2d(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict d = dst + r * ldd;
    const float* __restrict x = src + r * lds;
    for (int64_t c = 0; c < cols; ++c) d[c] += x[c];
  }
}

}  // namespace fp::ops::cpu
