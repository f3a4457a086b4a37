// RMSNorm (ops/rmsnorm.h): y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// Dimensions: rows independent rows of width d; B = ceil(rows / kRowBlock) row blocks.
//
// Memory bound: forward reads x once and writes y; backward reads x and dy once and writes dx. The
// row sums (sum of squares, sum dy w x) are taken in double with 8 interleaved lanes (a fixed order
// that g++ vectorises, as in Note [Deterministic reductions] of elementwise.cpp): d is up to a few
// thousand, and double makes rstd exact to float precision at no cost in a memory-bound loop.
//
// Note [Deterministic rmsnorm dw]: dw sums over all rows. Threads take fixed blocks of rows (kRowBlock
// rows, or rows / kMaxBlocks when that is more, so that B <= kMaxBlocks); each block writes its
// partial dw (d) into its own slot of the caller's workspace (B, d), rows in order, while it computes
// dx for those rows (one pass over x and dy). The partials are then added in block order, in double,
// split over columns. Block boundaries depend only on rows, never on the thread count, so dw has the
// same bits for any number of threads. The workspace is the caller's, from the ledger: it was a
// thread_local vector of rows / 64 x d floats (470 MB at 1M rows of 7168, 512 MB for q_norm's rows
// at 1M tokens and 64 heads) that no ledger counted; now at most kMaxBlocks x d, counted.
#include "ops/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace fp::ops::cpu {

namespace {

// Rows per dw partial: short float sums (64 terms), few partials to add at the end; at most
// kMaxBlocks partials (longer blocks beyond 16384 rows).
constexpr int64_t kRowBlock = 64;
constexpr int64_t kMaxBlocks = 256;

int64_t block_rows(int64_t rows) { return std::max(kRowBlock, (rows + kMaxBlocks - 1) / kMaxBlocks); }
// Below this many elements (rows * d) a parallel region costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 14;
constexpr int kLanes = 8;

// sum_i a_i b_i c_i in double, in the fixed lane order (c == nullptr: sum_i a_i b_i).
double row_dot(const float* __restrict a, const float* __restrict b, const float* __restrict c, int64_t d) {
  double lane[kLanes] = {};
  int64_t i = 0;
  if (c == nullptr) {
    for (; i + kLanes <= d; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(a[i + j]) * b[i + j];
    for (int j = 0; i < d; ++i, ++j) lane[j] += static_cast<double>(a[i]) * b[i];
  } else {
    for (; i + kLanes <= d; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(a[i + j]) * b[i + j] * c[i + j];
    for (int j = 0; i < d; ++i, ++j) lane[j] += static_cast<double>(a[i]) * b[i] * c[i];
  }
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

}  // namespace

int64_t rmsnorm_backward_workspace(int64_t rows, int64_t d) {
  if (rows <= 0 || d <= 0) return 0;
  const int64_t br = block_rows(rows);
  return (rows + br - 1) / br * d;
}

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t d, float eps) {
  // y may alias x: each row is read in full (the sum) before it is written.
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;  // (d)
    float* yr = y + r * d;        // (d)
    const double ss = row_dot(xr, xr, nullptr, d);
    const float rs = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
    for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] * rs) * w[i];
    if (rstd != nullptr) rstd[r] = rs;
  }
}

void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                      int64_t rows, int64_t d, float* workspace) {
  if (rows == 0 || d == 0) return;
  const int64_t br = block_rows(rows), nblocks = (rows + br - 1) / br;
  float* partial = workspace;  // (B, d): rmsnorm_backward_workspace(rows, d) floats
  const bool parallel = rows * d >= kParallelMinElements;
#pragma omp parallel if (parallel)
  {
    // Pass 1: dx per row, and the block's dw partial, rows in order (Note [Deterministic rmsnorm dw]).
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblocks; ++b) {
      float* __restrict pb = partial + b * d;  // (d)
      std::fill(pb, pb + d, 0.0f);
      const int64_t r_end = std::min(rows, (b + 1) * br);
      for (int64_t r = b * br; r < r_end; ++r) {
        const float* __restrict xr = x + r * d;    // (d)
        const float* __restrict dyr = dy + r * d;  // (d)
        float* __restrict dxr = dx + r * d;        // (d)
        const double rs = rstd[r];
        const float coef = static_cast<float>(rs * rs * rs * row_dot(dyr, w, xr, d) / static_cast<double>(d));
        const float rsf = rstd[r];
        for (int64_t i = 0; i < d; ++i) {
          dxr[i] = rsf * (w[i] * dyr[i]) - xr[i] * coef;
          pb[i] += dyr[i] * (xr[i] * rsf);
        }
      }
    }
    // Pass 2: dw += the partials in block order, in double, split over columns.
#pragma omp for schedule(static)
    for (int64_t i = 0; i < d; ++i) {
      double acc = 0;
      for (int64_t b = 0; b < nblocks; ++b) acc += partial[b * d + i];
      dw[i] += static_cast<float>(acc);
    }
  }
}

}  // namespace fp::ops::cpu
