// Token permutation kernels: routed copies between token order and expert order.
// n tokens, k slots per token, m = n * k routed copies, H hidden.
// rows (m): token of each copy in expert order; slot_pos (n, k): row of token t's slot j.
//
// Every kernel walks the side whose rows it writes (copies for the gather and the scatter, tokens for
// the rest), so each output row has one owner thread: no atomics, and the per-row arithmetic is
// fixed, so any thread count gives the same bits. The inner loops run over H and vectorise.
//
// bf16 rows (Note [Kernel operands carry their dtype], core/buf.h): the arithmetic kernels run the
// f32 loops on f32 rows, each bf16 row widened into a per-thread scratch row (H floats) with the AVX2
// conversions of backend/cpu/kernels/convert.h, and a bf16 output row is widened before it is accumulated into
// and rounded once after its last slot. So the f32 operations per element are those of the all-f32
// kernel on the widened operands, in the same order, and an all-f32 call allocates no scratch.
#include "ops/moe_permute.h"

#include <cstring>
#include <vector>

#include "backend/cpu/kernels/convert.h"
#include "backend/cpu/kernels/ops.h"

namespace fp::ops::cpu {

namespace {
// Below this many elements the OpenMP fork costs more than the work.
constexpr int64_t kParallelMin = 1 << 15;

// dot(a (H), b (H)) with 8 partial sums: a plain float reduction does not vectorise without
// -ffast-math (it would reorder the sum), so the reorder is written out, fixed, and the partials are
// combined in a fixed tree. Error <= H eps sum|a b|, like the sequential sum.
inline float dot_lanes8(const float* a, const float* b, int64_t H) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t h = 0;
  for (; h + 8 <= H; h += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[h + l] * b[h + l];
  float tail = 0;
  for (; h < H; ++h) tail += a[h] * b[h];
  return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

// o (H) += a * y (H).
inline void axpy_row(float* __restrict o, const float* __restrict y, float a, int64_t H) {
  for (int64_t h = 0; h < H; ++h) o[h] += a * y[h];
}

// o (H) += g (H).
inline void add_row(float* __restrict o, const float* __restrict g, int64_t H) {
  for (int64_t h = 0; h < H; ++h) o[h] += g[h];
}

// An error naming the kernel unless t is f32 or bf16 (visit_float's one check).
void check_float(DType t, const char* kernel) {
  visit_float(t, kernel, []<class T>() {});
}

using chunked::f32;  // rows go through chunked::load / load_rw / stage / store with a row of scratch

// dst row dr (H) = src row sr (H): a memcpy when the dtypes agree (bit for bit), else converted.
inline void copy_row(CBuf src, int64_t sr, Buf dst, int64_t dr, int64_t H) {
  if (src.dtype == dst.dtype) {
    const size_t bytes = static_cast<size_t>(H) * dtype_size(dst.dtype);
    std::memcpy(static_cast<char*>(dst.p) + static_cast<size_t>(dr) * bytes,
                static_cast<const char*>(src.p) + static_cast<size_t>(sr) * bytes, bytes);
  } else {
    convert(dst.at(dr * H), src.at(sr * H), H);
  }
}
}  // namespace

void moe_gather(CBuf x, const int32_t* rows, Buf xs, int64_t m, int64_t H) {
  check_float(x.dtype, "moe_gather");
  check_float(xs.dtype, "moe_gather");
#pragma omp parallel for schedule(static) if (m * H >= kParallelMin)
  for (int64_t i = 0; i < m; ++i) copy_row(x, rows[i], xs, i, H);
}

void moe_scatter(CBuf src, const int32_t* rows, Buf dst, int64_t m, int64_t H) {
  check_float(src.dtype, "moe_scatter");
  check_float(dst.dtype, "moe_scatter");
#pragma omp parallel for schedule(static) if (m * H >= kParallelMin)
  for (int64_t i = 0; i < m; ++i) copy_row(src, i, dst, rows[i], H);
}

void moe_combine_forward(CBuf ys, const int32_t* slot_pos, const float* w, Buf out, int64_t n, int64_t k, int64_t H) {
  check_float(ys.dtype, "moe_combine_forward");
  check_float(out.dtype, "moe_combine_forward");
#pragma omp parallel if (n * k * H >= kParallelMin)
  {
    std::vector<float> ybuf(f32(ys.dtype) ? 0 : H), obuf(f32(out.dtype) ? 0 : H);  // (H) scratch rows
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      float* o = chunked::load_rw(out.at(t * H), obuf.data(), H);  // (H)
      for (int64_t j = 0; j < k; ++j)
        axpy_row(o, chunked::load(ys.at(slot_pos[t * k + j] * H), ybuf.data(), H), w[t * k + j], H);
      chunked::store(out.at(t * H), o, H);
    }
  }
}

void moe_combine_backward(CBuf ys, const int32_t* slot_pos, const float* w, CBuf dout, Buf dys, float* dw, int64_t n,
                          int64_t k, int64_t H) {
  check_float(ys.dtype, "moe_combine_backward");
  check_float(dout.dtype, "moe_combine_backward");
  check_float(dys.dtype, "moe_combine_backward");
#pragma omp parallel if (n * k * H >= kParallelMin)
  {
    std::vector<float> ybuf(f32(ys.dtype) ? 0 : H), dbuf(f32(dout.dtype) ? 0 : H);  // (H) scratch rows
    std::vector<float> sbuf(f32(dys.dtype) ? 0 : H);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* d = chunked::load(dout.at(t * H), dbuf.data(), H);  // (H)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t r = slot_pos[t * k + j];
        // dys may be ys (in place): the row is read (or widened) for dw before it is overwritten; rows
        // are distinct.
        dw[t * k + j] = dot_lanes8(d, chunked::load(ys.at(r * H), ybuf.data(), H), H);
        const float wj = w[t * k + j];
        float* dy = chunked::stage(dys.at(r * H), sbuf.data());  // (H)
        for (int64_t h = 0; h < H; ++h) dy[h] = wj * d[h];
        chunked::store(dys.at(r * H), dy, H);
      }
    }
  }
}

void moe_scatter_add(CBuf dxs, const int32_t* slot_pos, Buf dx, int64_t n, int64_t k, int64_t H) {
  check_float(dxs.dtype, "moe_scatter_add");
  check_float(dx.dtype, "moe_scatter_add");
#pragma omp parallel if (n * k * H >= kParallelMin)
  {
    std::vector<float> gbuf(f32(dxs.dtype) ? 0 : H), obuf(f32(dx.dtype) ? 0 : H);  // (H) scratch rows
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      float* o = chunked::load_rw(dx.at(t * H), obuf.data(), H);  // (H)
      for (int64_t j = 0; j < k; ++j) add_row(o, chunked::load(dxs.at(slot_pos[t * k + j] * H), gbuf.data(), H), H);
      chunked::store(dx.at(t * H), o, H);
    }
  }
}

}  // namespace fp::ops::cpu
