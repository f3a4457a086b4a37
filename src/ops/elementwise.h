// Small element-wise kernels and reductions. n elements.
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// y (n) += x (n)
void add_inplace(float* y, const float* x, int64_t n);
// y (n) *= a
void scale_inplace(float* y, float a, int64_t n);
// y (n) = v
void fill(float* y, float v, int64_t n);
// dst (n) = src (n)
void copy(float* dst, const float* src, int64_t n);
// out (1) = sum of x (n), accumulated in double in a fixed order (independent of the thread count).
void reduce_sum(const float* x, int64_t n, float* out);
// out (1) = sum of x (n)^2 in double, as float.
void reduce_sumsq(const float* x, int64_t n, float* out);
// A linear layer's bias: y (rows, d) += b (d) on every row.
void bias_add(float* y, const float* b, int64_t rows, int64_t d);
// Its gradient: db (d) += sum over rows of dy (rows, d), each column summed in double in row order
// (the same bits for any thread count).
void bias_backward(const float* dy, float* db, int64_t rows, int64_t d);
// out (d) = the column sums of x (rows, d) in double, each in row order (the router's probability sums
// of the load-balancing loss; the same bits for any thread count).
void column_sums_f64(const float* x, int64_t rows, int64_t d, double* out);
// Strided blocks (MLA's head splits and the shared RoPE key): dst[r * ldd + c] = src[r * lds + c] (copy_2d)
// or += it (add_2d), for r < rows, c < cols (cols <= lds, ldd; the blocks do not overlap).
void copy_2d(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols);
void add_2d(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols);

}  // namespace fp::ops::cpu
