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
//
// Note [bf16 element-wise kernels by f32 chunks]: with any bf16 operand the element-wise kernels run
// the f32 loop on chunks of kChunk elements: each bf16 operand's chunk is widened into a stack
// buffer (backend/cpu/kernels/convert.h, AVX2), the f32 loop computes, and a bf16 result is rounded back from the
// stack, so every element is loaded exactly and rounded once, with no allocation and the AVX2
// conversions rather than scalar ones (the build targets plain x86-64). f32 operands of a mixed call
// are used in place. The reductions instead read bf16 directly in their templated loops (widening is
// a shift): the lane order, and so the bits, are those of the f32 kernel on the widened values. The
// all-f32 case runs the same loops as before bf16 existed.
#include "ops/elementwise.h"

#include <algorithm>
#include <cstring>
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

// Below this many elements a parallel region costs more than the loop.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;
// Elements per reduction block: 16 KiB of floats, a multiple of every SIMD width.
constexpr int64_t kReduceBlock = 4096;
constexpr int kLanes = 8;
// f(begin, len) on the kChunk chunks of [0, n), threads taking fixed contiguous ranges.
template <class F>
void for_chunks(int64_t n, const F& f) {
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t c = 0; c < nchunks; ++c) f(c * kChunk, std::min(kChunk, n - c * kChunk));
}

// y (n) += x (n) on one thread.
void add_serial(float* __restrict y, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// The sum in double of x (n) or of x^2, in the fixed lane order of Note [Deterministic reductions].
template <bool kSquare, class T>
double block_sum(const T* __restrict x, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double v = to_f32(x[i + j]);
      lane[j] += kSquare ? v * v : v;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double v = to_f32(x[i]);
    lane[j] += kSquare ? v * v : v;
  }
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

template <bool kSquare, class T>
float reduce(const T* x, int64_t n) {
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

template <bool kSquare>
float reduce_any(const char* kernel, CBuf x, int64_t n) {
  if (f32(x.dtype)) return reduce<kSquare>(static_cast<const float*>(x.p), n);
  chunked::dtypes_check(kernel, {{"x", x.dtype}});
  return reduce<kSquare>(static_cast<const bf16*>(x.p), n);
}

// The all-f32 loops.
void add_f32(float* __restrict y, const float* __restrict x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_f32(float* y, float a, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

void fill_f32(float* y, float v, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) y[i] = v;
}

void bias_add_f32(float* __restrict y, const float* __restrict b, int64_t rows, int64_t d) {
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < d; ++j) y[r * d + j] += b[j];
}

void add_2d_f32(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) {
    float* __restrict d = dst + r * ldd;
    const float* __restrict x = src + r * lds;
    for (int64_t c = 0; c < cols; ++c) d[c] += x[c];
  }
}

// Mixed dtypes: dst (cols) += src (cols), one row, by chunks.
void add_row_mixed(Buf dst, CBuf src, int64_t cols) {
  for (int64_t c = 0; c < cols; c += kChunk) {
    const int64_t m = std::min(kChunk, cols - c);
    float dt[kChunk], st[kChunk];
    float* d = load_rw(dst.at(c), dt, m);
    add_serial(d, load(src.at(c), st, m), m);
    store(dst.at(c), d, m);
  }
}

}  // namespace

void add_inplace(Buf y, CBuf x, int64_t n) {
  if (f32(y.dtype) && f32(x.dtype)) return add_f32(static_cast<float*>(y.p), static_cast<const float*>(x.p), n);
  chunked::dtypes_check("add_inplace", {{"y", y.dtype}, {"x", x.dtype}});
  for_chunks(n, [&](int64_t i, int64_t m) {
    float yt[kChunk], xt[kChunk];
    float* yf = load_rw(y.at(i), yt, m);
    add_serial(yf, load(x.at(i), xt, m), m);
    store(y.at(i), yf, m);
  });
}

void scale_inplace(Buf y, float a, int64_t n) {
  if (f32(y.dtype)) return scale_f32(static_cast<float*>(y.p), a, n);
  chunked::dtypes_check("scale_inplace", {{"y", y.dtype}});
  for_chunks(n, [&](int64_t i, int64_t m) {
    float yt[kChunk];
    float* yf = load_rw(y.at(i), yt, m);
    for (int64_t k = 0; k < m; ++k) yf[k] *= a;
    store(y.at(i), yf, m);
  });
}

void fill(Buf y, float v, int64_t n) {
  if (f32(y.dtype)) return fill_f32(static_cast<float*>(y.p), v, n);
  chunked::dtypes_check("fill", {{"y", y.dtype}});
  const bf16 h = from_f32<bf16>(v);
  bf16* p = static_cast<bf16*>(y.p);
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) p[i] = h;
}

void copy(Buf dst, CBuf src, int64_t n) {
  if (n <= 0) return;
  if (f32(dst.dtype) && f32(src.dtype)) {
    std::memcpy(dst.p, src.p, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  chunked::dtypes_check("copy", {{"dst", dst.dtype}, {"src", src.dtype}});
  if (dst.dtype == src.dtype) {
    std::memcpy(dst.p, src.p, static_cast<size_t>(n) * dtype_size(dst.dtype));
    return;
  }
  // A conversion, split over threads in fixed blocks (each element converted alone: any split gives
  // the same bits).
  const int64_t nblocks = (n + kParallelMinElements - 1) / kParallelMinElements;
#pragma omp parallel for schedule(static) if (nblocks > 1)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t i = b * kParallelMinElements;
    convert(dst.at(i), src.at(i), std::min(kParallelMinElements, n - i));
  }
}

void reduce_sum(CBuf x, int64_t n, float* out) { *out = reduce_any<false>("reduce_sum", x, n); }

void reduce_sumsq(CBuf x, int64_t n, float* out) { *out = reduce_any<true>("reduce_sumsq", x, n); }

void reduce_sumsq_multi(const CBuf* x, const int64_t* n, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = reduce_any<true>("reduce_sumsq_multi", x[i], n[i]);
}

void bias_add(Buf y, CBuf b, int64_t rows, int64_t d) {
  if (f32(y.dtype) && f32(b.dtype))
    return bias_add_f32(static_cast<float*>(y.p), static_cast<const float*>(b.p), rows, d);
  chunked::dtypes_check("bias_add", {{"y", y.dtype}, {"b", b.dtype}});
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) add_row_mixed(y.at(r * d), b, d);
}

namespace {
// Column sums of x (rows, d) in double, each in row order; done(j0, nc, acc) takes each block of
// columns [j0, j0 + nc). Threads own blocks of columns, so the bits do not depend on them.
template <class T, class Done>
void column_sums(const T* __restrict x, int64_t rows, int64_t d, Done&& done) {
  constexpr int64_t kCols = 64;
  const int64_t nblocks = (d + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (rows * d >= kParallelMinElements)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t j0 = blk * kCols, nc = std::min(kCols, d - j0);
    double acc[kCols] = {};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < nc; ++j) acc[j] += static_cast<double>(to_f32(x[r * d + j0 + j]));
    done(j0, nc, acc);
  }
}

// column_sums over x read as its dtype (f32 or bf16, checked by the caller).
template <class Done>
void column_sums_any(CBuf x, int64_t rows, int64_t d, Done&& done) {
  if (f32(x.dtype)) return column_sums(static_cast<const float*>(x.p), rows, d, done);
  column_sums(static_cast<const bf16*>(x.p), rows, d, done);
}

template <class T>
void bias_backward_t(CBuf dy, T* __restrict db, int64_t rows, int64_t d) {
  column_sums_any(dy, rows, d, [db](int64_t j0, int64_t nc, const double* acc) {
    for (int64_t j = 0; j < nc; ++j)
      db[j0 + j] = from_f32<T>(static_cast<float>(static_cast<double>(to_f32(db[j0 + j])) + acc[j]));
  });
}
}  // namespace

void bias_backward(CBuf dy, Buf db, int64_t rows, int64_t d) {
  if (!(f32(dy.dtype) && f32(db.dtype))) chunked::dtypes_check("bias_backward", {{"dy", dy.dtype}, {"db", db.dtype}});
  if (f32(db.dtype)) return bias_backward_t(dy, static_cast<float*>(db.p), rows, d);
  bias_backward_t(dy, static_cast<bf16*>(db.p), rows, d);
}

void column_sums_f64(CBuf x, int64_t rows, int64_t d, double* __restrict out) {
  if (!f32(x.dtype)) chunked::dtypes_check("column_sums_f64", {{"x", x.dtype}});
  column_sums_any(x, rows, d, [out](int64_t j0, int64_t nc, const double* acc) {
    for (int64_t j = 0; j < nc; ++j) out[j0 + j] += acc[j];
  });
}

void copy_2d(Buf dst, int64_t ldd, CBuf src, int64_t lds, int64_t rows, int64_t cols) {
  if (!(f32(dst.dtype) && f32(src.dtype))) chunked::dtypes_check("copy_2d", {{"dst", dst.dtype}, {"src", src.dtype}});
  if (dst.dtype == src.dtype) {
    const size_t row_bytes = static_cast<size_t>(cols) * dtype_size(dst.dtype);
    char* d = static_cast<char*>(dst.p);
    const char* s = static_cast<const char*>(src.p);
    const int64_t ldd_b = ldd * static_cast<int64_t>(dtype_size(dst.dtype)),
                  lds_b = lds * static_cast<int64_t>(dtype_size(src.dtype));
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinElements)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * ldd_b, s + r * lds_b, row_bytes);
    return;
  }
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) convert(dst.at(r * ldd), src.at(r * lds), cols);
}

void add_2d(Buf dst, int64_t ldd, CBuf src, int64_t lds, int64_t rows, int64_t cols) {
  if (f32(dst.dtype) && f32(src.dtype))
    return add_2d_f32(static_cast<float*>(dst.p), ldd, static_cast<const float*>(src.p), lds, rows, cols);
  chunked::dtypes_check("add_2d", {{"dst", dst.dtype}, {"src", src.dtype}});
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinElements)
  for (int64_t r = 0; r < rows; ++r) add_row_mixed(dst.at(r * ldd), src.at(r * lds), cols);
}

}  // namespace fp::ops::cpu
