// Small element-wise kernels and reductions. n elements.
//
// bf16 (Note [Kernel operands carry their dtype] in core/buf.h): every tensor operand is f32 or bf16,
// each on its own (a bf16 gradient added into an f32 one is one call). Values are computed in f32:
// bf16 loads are exact and each written element is rounded once per call, so a bf16 result has the
// bits of the f32 kernel run on the widened operands, then rounded. Reductions read bf16 and keep
// their double accumulators and f32/f64 results: a sum is a statistic, not a stored tensor. Any other
// dtype is an internal error naming the kernel.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// y (n) += x (n)
using add_inplace_fn = void(Buf y, CBuf x, int64_t n);

// y (n) *= a
using scale_inplace_fn = void(Buf y, float a, int64_t n);

// y (n) = v (rounded once to y's dtype)
using fill_fn = void(Buf y, float v, int64_t n);

// dst (n) = src (n) in dst's dtype: a copy when the dtypes agree, else a conversion (backend/cpu/kernels/convert.h:
// widening exact, narrowing to nearest even, NaN kept a quiet NaN). The ranges do not overlap.
using copy_fn = void(Buf dst, CBuf src, int64_t n);

// out (1) = sum of x (n), accumulated in double in a fixed order (independent of the thread count).
using reduce_sum_fn = void(CBuf x, int64_t n, float* out);

// out (1) = sum of x (n)^2 in double, as float.
using reduce_sumsq_fn = void(CBuf x, int64_t n, float* out);

// out[i] = reduce_sumsq(x[i], n[i]) for i < count, in one call (the gradient norm's partials of a bucket,
// Note [The optimizer in buckets] in ops/adamw.h): the tables x and n are host memory, read at the call;
// each out[i] has reduce_sumsq's bits.
using reduce_sumsq_multi_fn = void(const CBuf* x, const int64_t* n, int64_t count, float* out);

// A linear layer's bias: y (rows, d) += b (d) on every row.
using bias_add_fn = void(Buf y, CBuf b, int64_t rows, int64_t d);

// Its gradient: db (d) += sum over rows of dy (rows, d), each column summed in double in row order
// (the same bits for any thread count), added to db in f32.
using bias_backward_fn = void(CBuf dy, Buf db, int64_t rows, int64_t d);

// out (d) += the column sums of x (rows, d): each column summed from zero in double, in row order, then added
// to out (the router's probability sums of the load-balancing loss, added layer tile by layer tile into a
// row the step zeroed; the same bits for any thread count).
using column_sums_f64_fn = void(CBuf x, int64_t rows, int64_t d, double* out);

// Strided blocks (MLA's head splits and the shared RoPE key): dst[r * ldd + c] = src[r * lds + c] (copy_2d,
// converting as copy does) or += it (add_2d), for r < rows, c < cols (cols <= lds, ldd; the blocks do not
// overlap). Strides are in elements of each operand's own dtype.
using copy_2d_fn = void(Buf dst, int64_t ldd, CBuf src, int64_t lds, int64_t rows, int64_t cols);

using add_2d_fn = void(Buf dst, int64_t ldd, CBuf src, int64_t lds, int64_t rows, int64_t cols);

}  // namespace fp::ops
