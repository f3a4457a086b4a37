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
//
// Note [bf16 embedding backward]: a bf16 dtable row must be rounded once per call, after all of its
// tokens' additions, so each thread first lists its tokens grouped by id: keys (id << 32 | t) sorted,
// a thread_local vector grown once and reused (8 bytes per token of the thread, host scratch outside
// the ledger like the bf16 GEMM panels). Each id's row then goes by chunks of kChunk columns: widened
// into a stack buffer, its tokens' dout rows added in token order in f32, rounded back once. The
// additions are the f32 kernel's, in its order, so the bits are still independent of the thread count.
#include "ops/embedding.h"

#include <omp.h>

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

// Below this many elements (n * H) a parallel region costs more than the copy.
constexpr int64_t kParallelMinElements = int64_t{1} << 15;

// Ids come validated from the data loader; a negative id here is our bug. Checked before the
// parallel loops because an exception must not leave an OpenMP region.
void tokens_check(const int32_t* tokens, int64_t n) {
  for (int64_t t = 0; t < n; ++t) FP_ASSERT(tokens[t] >= 0, "token {} has id {}", t, tokens[t]);
}

// dst (n) += src (n).
void add_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t h = 0; h < n; ++h) dst[h] += src[h];
}

// The bf16 dtable case of embedding_backward (Note [bf16 embedding backward]); dout f32 or bf16.
void backward_bf16_table(const int32_t* tokens, CBuf dout, bf16* dtable, int64_t n, int64_t H) {
  FP_ASSERT(n < (int64_t{1} << 32), "embedding_backward: {} tokens", n);
#pragma omp parallel if (n * H >= kParallelMinElements)
  {
    const int64_t nthreads = omp_get_num_threads(), k = omp_get_thread_num();
    thread_local std::vector<uint64_t> keys;  // (id << 32 | t) of this thread's tokens
    keys.clear();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t id = tokens[t];
      if (id % nthreads == k) keys.push_back(static_cast<uint64_t>(id) << 32 | static_cast<uint64_t>(t));
    }
    std::sort(keys.begin(), keys.end());
    for (size_t run = 0; run < keys.size();) {
      const int64_t id = static_cast<int64_t>(keys[run] >> 32);
      size_t end = run + 1;
      while (end < keys.size() && static_cast<int64_t>(keys[end] >> 32) == id) ++end;
      bf16* row = dtable + id * H;  // (H)
      for (int64_t h = 0; h < H; h += kChunk) {
        const int64_t m = std::min(kChunk, H - h);
        float acc[kChunk], tmp[kChunk];
        bf16_to_f32(row + h, acc, m);
        for (size_t j = run; j < end; ++j) {
          const int64_t t = static_cast<int64_t>(keys[j] & 0xffffffffu);
          add_row(acc, load(dout.at(t * H + h), tmp, m), m);
        }
        f32_to_bf16(acc, row + h, m);
      }
      run = end;
    }
  }
}

}  // namespace

void embedding_forward(const int32_t* tokens, CBuf table, Buf out, int64_t n, int64_t H) {
  tokens_check(tokens, n);
  if (!(f32(table.dtype) && f32(out.dtype)))
    chunked::dtypes_check("embedding_forward", {{"table", table.dtype}, {"out", out.dtype}});
  if (H == 0) return;
  if (table.dtype == out.dtype) {
    const size_t row_bytes = static_cast<size_t>(H) * dtype_size(out.dtype);
    char* o = static_cast<char*>(out.p);
    const char* tab = static_cast<const char*>(table.p);
#pragma omp parallel for schedule(static) if (n * H >= kParallelMinElements)
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(o + t * row_bytes, tab + static_cast<int64_t>(tokens[t]) * row_bytes, row_bytes);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (n * H >= kParallelMinElements)
  for (int64_t t = 0; t < n; ++t) convert(out.at(t * H), table.at(static_cast<int64_t>(tokens[t]) * H), H);
}

void embedding_backward(const int32_t* tokens, CBuf dout, Buf dtable, int64_t n, int64_t H) {
  tokens_check(tokens, n);
  const bool all_f32 = f32(dout.dtype) && f32(dtable.dtype);
  if (!all_f32) chunked::dtypes_check("embedding_backward", {{"dout", dout.dtype}, {"dtable", dtable.dtype}});
  if (!f32(dtable.dtype)) return backward_bf16_table(tokens, dout, static_cast<bf16*>(dtable.p), n, H);
  float* dtab = static_cast<float*>(dtable.p);
#pragma omp parallel if (n * H >= kParallelMinElements)
  {
    // Note [Deterministic embedding backward]: this thread owns the rows with id % nthreads == k.
    const int64_t nthreads = omp_get_num_threads(), k = omp_get_thread_num();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t id = tokens[t];
      if (id % nthreads != k) continue;
      float* __restrict dst = dtab + id * H;  // (H)
      if (all_f32) {
        const float* __restrict src = static_cast<const float*>(dout.p) + t * H;  // (H)
        for (int64_t h = 0; h < H; ++h) dst[h] += src[h];
        continue;
      }
      for (int64_t h = 0; h < H; h += kChunk) {  // a bf16 dout row, widened by chunks
        const int64_t m = std::min(kChunk, H - h);
        float tmp[kChunk];
        add_row(dst + h, load(dout.at(t * H + h), tmp, m), m);
      }
    }
  }
}

}  // namespace fp::ops::cpu
