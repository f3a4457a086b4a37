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
//
// Note [bf16 rmsnorm by f32 chunks]: with any bf16 operand each row goes by chunks of kChunk
// elements: a bf16 operand's chunk is widened into a stack buffer (backend/cpu/kernels/convert.h), the f32 loops
// run on it, and a bf16 output chunk is rounded back from the stack. Chunks start at multiples of
// kLanes, so the row sums put element i in lane i % kLanes as on a whole f32 row, and every value is
// the f32 kernel's on the widened operands: the same bits, rounded once; no allocation. The all-f32
// case runs on whole rows as before bf16 existed.
#include "ops/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/kernels/convert.h"
#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

namespace fp::ops::cpu {

namespace {

using namespace chunked;  // kChunk, load, stage, store (Note [bf16 kernels by f32 chunks])

// Rows per dw partial: short float sums (64 terms), few partials to add at the end; at most
// kMaxBlocks partials (longer blocks beyond 16384 rows).
constexpr int64_t kRowBlock = 64;
constexpr int64_t kMaxBlocks = 256;

int64_t block_rows(int64_t rows) { return std::max(kRowBlock, (rows + kMaxBlocks - 1) / kMaxBlocks); }
// Below this many elements (rows * d) a parallel region costs more than the work.
constexpr int64_t kParallelMinElements = int64_t{1} << 14;
constexpr int kLanes = 8;
// The bf16 staging chunks (Note [bf16 rmsnorm by f32 chunks]) keep the f32 lanes of a whole row.
static_assert(kChunk % kLanes == 0);

// lane += a_i b_i c_i in double for i < d, element i in lane i % kLanes (c == nullptr: a_i b_i).
void dot_lanes(double* lane, const float* __restrict a, const float* __restrict b, const float* __restrict c,
               int64_t d) {
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
}

double lanes_sum(const double* lane) {
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

// sum_i a_i b_i c_i in double, in the fixed lane order (c == nullptr: sum_i a_i b_i).
double row_dot(const float* __restrict a, const float* __restrict b, const float* __restrict c, int64_t d) {
  double lane[kLanes] = {};
  dot_lanes(lane, a, b, c, d);
  return lanes_sum(lane);
}

// The same over operands of any dtype, by chunks (Note [bf16 rmsnorm by f32 chunks]); b may be a
// (then widened once).
double row_dot_mixed(CBuf a, CBuf b, CBuf c, int64_t d) {
  double lane[kLanes] = {};
  for (int64_t i = 0; i < d; i += kChunk) {
    const int64_t m = std::min(kChunk, d - i);
    float at[kChunk], bt[kChunk], ct[kChunk];
    const float* af = load(a.at(i), at, m);
    const float* bf = b.p == a.p ? af : load(b.at(i), bt, m);
    dot_lanes(lane, af, bf, c.null() ? nullptr : load(c.at(i), ct, m), m);
  }
  return lanes_sum(lane);
}

// y (d) = (x rs) w; y may alias x.
void scale_row(const float* x, const float* w, float rs, float* y, int64_t d) {
  for (int64_t i = 0; i < d; ++i) y[i] = (x[i] * rs) * w[i];
}

// dx (d) and the dw partial pb (d) += of one row (or a chunk of it).
void backward_row(const float* __restrict xr, const float* w, const float* __restrict dyr, float* __restrict dxr,
                  float* __restrict pb, float rsf, float coef, int64_t d) {
  for (int64_t i = 0; i < d; ++i) {
    dxr[i] = rsf * (w[i] * dyr[i]) - xr[i] * coef;
    pb[i] += dyr[i] * (xr[i] * rsf);
  }
}

float inv_rms(double ss, int64_t d, float eps) {
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
}

}  // namespace

int64_t rmsnorm_backward_workspace(int64_t rows, int64_t d) {
  if (rows <= 0 || d <= 0) return 0;
  const int64_t br = block_rows(rows);
  return (rows + br - 1) / br * d;
}

void rmsnorm_forward(CBuf x, CBuf w, Buf y, float* rstd, int64_t rows, int64_t d, float eps) {
  const bool all_f32 = f32(x.dtype) && f32(w.dtype) && f32(y.dtype);
  if (!all_f32) chunked::dtypes_check("rmsnorm_forward", {{"x", x.dtype}, {"w", w.dtype}, {"y", y.dtype}});
    // y may alias x: each row is read in full (the sum) before it is written, and a chunk is read
    // before it is written.
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) {
    float rs;
    if (all_f32) {
      const float* xr = static_cast<const float*>(x.p) + r * d;  // (d)
      float* yr = static_cast<float*>(y.p) + r * d;              // (d)
      rs = inv_rms(row_dot(xr, xr, nullptr, d), d, eps);
      scale_row(xr, static_cast<const float*>(w.p), rs, yr, d);
    } else {
      const CBuf xr = x.at(r * d);  // (d)
      const Buf yr = y.at(r * d);   // (d)
      rs = inv_rms(row_dot_mixed(xr, xr, nullptr, d), d, eps);
      for (int64_t i = 0; i < d; i += kChunk) {
        const int64_t m = std::min(kChunk, d - i);
        float xt[kChunk], wt[kChunk], yt[kChunk];
        float* yf = stage(yr.at(i), yt);
        scale_row(load(xr.at(i), xt, m), load(w.at(i), wt, m), rs, yf, m);
        store(yr.at(i), yf, m);
      }
    }
    if (rstd != nullptr) rstd[r] = rs;
  }
}

void rmsnorm_backward(CBuf x, CBuf w, const float* rstd, CBuf dy, Buf dx, Buf dw, int64_t rows, int64_t d,
                      float* workspace) {
  if (rows == 0 || d == 0) return;
  const bool all_f32 = f32(x.dtype) && f32(w.dtype) && f32(dy.dtype) && f32(dx.dtype) && f32(dw.dtype);
  if (!all_f32)
    chunked::dtypes_check("rmsnorm_backward",
                 {{"x", x.dtype}, {"w", w.dtype}, {"dy", dy.dtype}, {"dx", dx.dtype}, {"dw", dw.dtype}});
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
        const double rs = rstd[r];
        const float rsf = rstd[r];
        if (all_f32) {
          const float* __restrict xr = static_cast<const float*>(x.p) + r * d;    // (d)
          const float* __restrict dyr = static_cast<const float*>(dy.p) + r * d;  // (d)
          float* __restrict dxr = static_cast<float*>(dx.p) + r * d;              // (d)
          const float* wp = static_cast<const float*>(w.p);                       // (d)
          const float coef = static_cast<float>(rs * rs * rs * row_dot(dyr, wp, xr, d) / static_cast<double>(d));
          backward_row(xr, wp, dyr, dxr, pb, rsf, coef, d);
          continue;
        }
        const CBuf xr = x.at(r * d), dyr = dy.at(r * d);  // (d)
        const Buf dxr = dx.at(r * d);                     // (d)
        const float coef = static_cast<float>(rs * rs * rs * row_dot_mixed(dyr, w, xr, d) / static_cast<double>(d));
        for (int64_t i = 0; i < d; i += kChunk) {
          const int64_t m = std::min(kChunk, d - i);
          float xt[kChunk], wt[kChunk], dyt[kChunk], dxt[kChunk];
          float* dxf = stage(dxr.at(i), dxt);
          backward_row(load(xr.at(i), xt, m), load(w.at(i), wt, m), load(dyr.at(i), dyt, m), dxf, pb + i, rsf, coef, m);
          store(dxr.at(i), dxf, m);
        }
      }
    }
    // Pass 2: dw += the partials in block order, in double, split over columns; a bf16 dw rounded once.
#pragma omp for schedule(static)
    for (int64_t i = 0; i < d; ++i) {
      double acc = 0;
      for (int64_t b = 0; b < nblocks; ++b) acc += partial[b * d + i];
      if (f32(dw.dtype)) {
        static_cast<float*>(dw.p)[i] += static_cast<float>(acc);
      } else {
        bf16& v = static_cast<bf16*>(dw.p)[i];
        v = from_f32<bf16>(to_f32(v) + static_cast<float>(acc));
      }
    }
  }
}

}  // namespace fp::ops::cpu
