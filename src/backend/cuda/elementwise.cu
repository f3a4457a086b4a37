// Element-wise kernels, the bias and the column sums (ops/elementwise.h) on cuda.
// Dimensions: n elements; (rows, d) or (rows, cols) blocks with row strides ldd, lds.
//
// Every operand f32 or bf16 on its own, one template per pair of element types. Each element goes through
// the cpu's float operations, loaded exactly and rounded once: the cpu's bits (Note [Bits as the cpu's] in
// common.cuh). One thread per element in grid-stride loops; memory bound.
//
// The column sums (bias_backward, column_sums_f64) give one thread a column and add its rows in row order
// in double, as the cpu does: its bits, with (d / 256) blocks of parallelism, which is little for a narrow
// bias; a split over rows would change the order of the sum (a two-level sum is the cpu's to define first).
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace fp::ops::cuda {

namespace {

template <class Y, class X>
__global__ void add_kernel(Y* y, const X* x, int64_t n) {
  FP_CUDA_GRID_STRIDE(i, n) y[i] = st<Y>(ld(y[i]) + ld(x[i]));
}

template <class Y>
__global__ void scale_kernel(Y* y, float a, int64_t n) {
  FP_CUDA_GRID_STRIDE(i, n) y[i] = st<Y>(ld(y[i]) * a);
}

template <class Y>
__global__ void fill_kernel(Y* y, Y v, int64_t n) {
  FP_CUDA_GRID_STRIDE(i, n) y[i] = v;
}

// dst[r * ldd + c] = src[r * lds + c] converted (kAdd: dst + src), for (rows, cols); n = rows * cols.
template <bool kAdd, class D, class S>
__global__ void block_2d_kernel(D* dst, int64_t ldd, const S* src, int64_t lds, int64_t cols, int64_t n) {
  FP_CUDA_GRID_STRIDE(i, n) {
    const int64_t r = i / cols, c = i - r * cols;
    D& d = dst[r * ldd + c];
    d = kAdd ? st<D>(ld(d) + ld(src[r * lds + c])) : st<D>(ld(src[r * lds + c]));
  }
}

template <class Y, class B>
__global__ void bias_add_kernel(Y* y, const B* b, int64_t d, int64_t n) {
  FP_CUDA_GRID_STRIDE(i, n) y[i] = st<Y>(ld(y[i]) + ld(b[i % d]));
}

// acc[j] = sum over rows of x[r * d + j] in double, in row order; then out(j, acc).
template <class X>
__device__ double column_sum(const X* x, int64_t rows, int64_t d, int64_t j) {
  double acc = 0;
  for (int64_t r = 0; r < rows; ++r) acc += static_cast<double>(ld(x[r * d + j]));
  return acc;
}

template <class X, class DB>
__global__ void bias_backward_kernel(const X* dy, DB* db, int64_t rows, int64_t d) {
  FP_CUDA_GRID_STRIDE(j, d) {
    db[j] = st<DB>(static_cast<float>(static_cast<double>(ld(db[j])) + column_sum(dy, rows, d, j)));
  }
}

template <class X>
__global__ void column_sums_kernel(const X* x, int64_t rows, int64_t d, double* out) {
  FP_CUDA_GRID_STRIDE(j, d) out[j] += column_sum(x, rows, d, j);  // the contract adds (ops/elementwise.h)
}

template <bool kAdd>
void block_2d(const ExecContext& c, const char* kernel, Buf dst, int64_t ldd, CBuf src, int64_t lds, int64_t rows,
              int64_t cols) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  visit_float2(dst.dtype, src.dtype, kernel, [&]<class D, class S>() {
    block_2d_kernel<kAdd><<<blocks_for(n), kThreads, 0, stream_of(c)>>>(static_cast<D*>(dst.p), ldd,
                                                                        static_cast<const S*>(src.p), lds, cols, n);
  });
  launched(kernel);
}

}  // namespace

void add_inplace(const ExecContext& c, Buf y, CBuf x, int64_t n) {
  if (n <= 0) return;
  visit_float2(y.dtype, x.dtype, "add_inplace", [&]<class Y, class X>() {
    add_kernel<<<blocks_for(n), kThreads, 0, stream_of(c)>>>(static_cast<Y*>(y.p), static_cast<const X*>(x.p), n);
  });
  launched("add_inplace");
}

void scale_inplace(const ExecContext& c, Buf y, float a, int64_t n) {
  if (n <= 0) return;
  visit_float(y.dtype, "scale_inplace", [&]<class Y>() {
    scale_kernel<<<blocks_for(n), kThreads, 0, stream_of(c)>>>(static_cast<Y*>(y.p), a, n);
  });
  launched("scale_inplace");
}

// v rounded once on the host side of the launch (the cpu's rounding: core/dtype.h).
void fill(const ExecContext& c, Buf y, float v, int64_t n) {
  if (n <= 0) return;
  visit_float(y.dtype, "fill", [&]<class Y>() {
    fill_kernel<<<blocks_for(n), kThreads, 0, stream_of(c)>>>(static_cast<Y*>(y.p), from_f32<Y>(v), n);
  });
  launched("fill");
}

// The same dtype: a device copy; else a conversion, element by element.
void copy(const ExecContext& c, Buf dst, CBuf src, int64_t n) {
  if (n <= 0) return;
  if (dst.dtype == src.dtype) {
    ::fp::cuda::float_check(dst.dtype, "copy");
    cuda_check(
        cudaMemcpyAsync(dst.p, src.p, static_cast<size_t>(n) * dtype_size(dst.dtype), cudaMemcpyDefault, stream_of(c)),
        "copy");
    return;
  }
  block_2d<false>(c, "copy", dst, n, src, n, 1, n);
}

void copy_2d(const ExecContext& c, Buf dst, int64_t ldd, CBuf src, int64_t lds, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  if (dst.dtype == src.dtype) {
    ::fp::cuda::float_check(dst.dtype, "copy_2d");
    const size_t e = dtype_size(dst.dtype);
    cuda_check(
        cudaMemcpy2DAsync(dst.p, static_cast<size_t>(ldd) * e, src.p, static_cast<size_t>(lds) * e,
                          static_cast<size_t>(cols) * e, static_cast<size_t>(rows), cudaMemcpyDefault, stream_of(c)),
        "copy_2d");
    return;
  }
  block_2d<false>(c, "copy_2d", dst, ldd, src, lds, rows, cols);
}

void add_2d(const ExecContext& c, Buf dst, int64_t ldd, CBuf src, int64_t lds, int64_t rows, int64_t cols) {
  block_2d<true>(c, "add_2d", dst, ldd, src, lds, rows, cols);
}

void bias_add(const ExecContext& c, Buf y, CBuf b, int64_t rows, int64_t d) {
  const int64_t n = rows * d;
  if (n <= 0) return;
  visit_float2(y.dtype, b.dtype, "bias_add", [&]<class Y, class B>() {
    bias_add_kernel<<<blocks_for(n), kThreads, 0, stream_of(c)>>>(static_cast<Y*>(y.p), static_cast<const B*>(b.p), d,
                                                                  n);
  });
  launched("bias_add");
}

void bias_backward(const ExecContext& c, CBuf dy, Buf db, int64_t rows, int64_t d) {
  if (d <= 0) return;
  visit_float2(dy.dtype, db.dtype, "bias_backward", [&]<class X, class DB>() {
    bias_backward_kernel<<<blocks_for(d), kThreads, 0, stream_of(c)>>>(static_cast<const X*>(dy.p),
                                                                       static_cast<DB*>(db.p), rows, d);
  });
  launched("bias_backward");
}

void column_sums_f64(const ExecContext& c, CBuf x, int64_t rows, int64_t d, double* out) {
  if (d <= 0) return;
  visit_float(x.dtype, "column_sums_f64", [&]<class X>() {
    column_sums_kernel<<<blocks_for(d), kThreads, 0, stream_of(c)>>>(static_cast<const X*>(x.p), rows, d, out);
  });
  launched("column_sums_f64");
}

}  // namespace fp::ops::cuda
