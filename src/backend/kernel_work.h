// The work of each kernel table entry, from its arguments: FLOPs and bytes moved (Note [Meta counts the work]
// in backend/work_log.h). One function per entry of FP_KERNEL_LIST (backend/kernels.h), named after it,
// with the entry's parameters (ops/*.h give their shapes). The meta table calls them; nothing else does.
//
// Conventions: FLOPs count a multiply-add as 2, an exp or a division as 1; bytes are what an ideal kernel reads
// and writes once (each operand's elements times its dtype's size; an accumulating output is read and written).
// Attention counts the visible (query, key) pairs: causal T (T + 1) / 2 per (sequence, head), T min(w, T) with
// a sliding window w; a block of the ring (Tq queries against Tk keys at positions meta does not hold) half of
// Tq Tk, which is exact on average over a zig-zag ring's blocks (every rank's chunks see half of every other's).
// Legend: M, N, K a GEMM's dims; r grouped rows; n tokens (rows); H hidden; V vocabulary; E experts; k top-k.
#pragma once

#include <algorithm>

#include "backend/kernels.h"
#include "backend/work_log.h"

namespace fp::kernel_work {

inline double sz(DType t) { return static_cast<double>(dtype_size(t)); }
inline double sz(CBuf b) { return sz(b.dtype); }
inline double sz(Buf b) { return sz(b.dtype); }
inline DType wider_half(DType a, DType b) {
  return a == DType::DType_F32 && b == DType::DType_F32 ? DType::DType_F32 : DType::DType_BF16;
}
inline double d(int64_t x) { return static_cast<double>(x); }

inline KernelWork gemm_work(double M, double N, double K, DType a, DType b, double sc, bool accumulate) {
  KernelWork w;
  w.kind = KernelWork::Kind::Kind_gemm;
  w.flops = 2 * M * N * K;
  w.bytes = M * K * sz(a) + K * N * sz(b) + M * N * sc * (accumulate ? 2 : 1);
  w.dtype = wider_half(a, b);
  w.M = M, w.N = N, w.K = K;
  return w;
}
inline KernelWork other(double flops, double bytes) {
  KernelWork w;
  w.flops = flops;
  w.bytes = bytes;
  return w;
}

inline KernelWork gemm(bool, bool, int64_t M, int64_t N, int64_t K, float, CBuf A, int64_t, CBuf B, int64_t, float beta,
                       Buf C, int64_t) {
  return gemm_work(d(M), d(N), d(K), A.dtype, B.dtype, sz(C), beta != 0.0f);
}
inline KernelWork gemm_tiled(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, CBuf A, int64_t lda,
                             CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc) {
  return gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
// Each non-empty group is a GEMM of n_g rows; the shape curve sees the mean group.
inline KernelWork gemm_grouped(bool, int64_t G, const int64_t* offsets, int64_t N, int64_t K, float, CBuf A,
                               const CBuf* B, const CBuf* bias, float beta, Buf C) {
  double r = 0, groups = 0;
  DType bt = DType::DType_F32;
  for (int64_t g = 0; g < G && offsets != nullptr; ++g) {
    const int64_t n = offsets[g + 1] - offsets[g];
    if (n <= 0) continue;
    r += d(n), groups += 1;
    if (B != nullptr) bt = B[g].dtype;
  }
  KernelWork w = gemm_work(groups > 0 ? r / groups : 0, d(N), d(K), A.dtype, bt, sz(C), beta != 0.0f);
  w.flops *= groups;
  w.bytes = r * d(K) * sz(A) + groups * d(N) * d(K) * sz(bt) + r * d(N) * sz(C) * (beta != 0.0f ? 2 : 1) +
            (bias != nullptr ? groups * d(N) * sz(C) : 0);
  return w;
}
inline KernelWork gemm_grouped_weight(int64_t G, const int64_t* offsets, int64_t M, int64_t N, float, CBuf A, CBuf B,
                                      float beta, const Buf* C, const Buf* db) {
  double r = 0, groups = 0;
  DType ct = DType::DType_F32;
  for (int64_t g = 0; g < G && offsets != nullptr; ++g) {
    const int64_t n = offsets[g + 1] - offsets[g];
    if (n <= 0) continue;
    r += d(n), groups += 1;
    if (C != nullptr) ct = C[g].dtype;
  }
  KernelWork w = gemm_work(d(M), d(N), groups > 0 ? r / groups : 0, A.dtype, B.dtype, sz(ct), beta != 0.0f);
  w.flops *= groups;
  w.bytes = r * d(M) * sz(A) + r * d(N) * sz(B) + groups * d(M) * d(N) * sz(ct) * (beta != 0.0f ? 2 : 1) +
            (db != nullptr ? groups * d(M) * sz(ct) : 0);
  return w;
}

inline KernelWork embedding_forward(const int32_t*, CBuf table, Buf out, int64_t n, int64_t H) {
  return other(0, d(n) * d(H) * (sz(table) + sz(out)) + 4 * d(n));
}
inline KernelWork embedding_backward(const int32_t*, CBuf dout, Buf dtable, int64_t n, int64_t H) {
  return other(d(n) * d(H), d(n) * d(H) * (sz(dout) + 2 * sz(dtable)) + 4 * d(n));
}
inline KernelWork rmsnorm_forward(CBuf x, CBuf w, Buf y, float*, int64_t rows, int64_t dd, float) {
  return other(4 * d(rows) * d(dd), d(rows) * d(dd) * (sz(x) + sz(y)) + d(dd) * sz(w) + 4 * d(rows));
}
inline KernelWork rmsnorm_backward(CBuf x, CBuf w, const float*, CBuf dy, Buf dx, Buf dw, int64_t rows, int64_t dd,
                                   float*) {
  return other(8 * d(rows) * d(dd),
               d(rows) * d(dd) * (sz(x) + sz(dy) + sz(dx)) + d(dd) * (sz(w) + 2 * sz(dw)) + 4 * d(rows));
}
inline KernelWork rope_forward(Buf x, const int32_t*, int64_t n, int64_t heads, int64_t hd, ops::RopeFreqs) {
  const double e = d(n) * d(heads) * d(hd);
  return other(3 * e, 2 * e * sz(x) + 4 * d(n));
}
inline KernelWork rope_backward(Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, ops::RopeFreqs f) {
  return rope_forward(x, pos, n, heads, hd, f);
}
inline KernelWork rope_strided_forward(Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, int64_t, bool,
                                       ops::RopeFreqs f) {
  return rope_forward(x, pos, n, heads, hd, f);
}
inline KernelWork rope_strided_backward(Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, int64_t, bool,
                                        ops::RopeFreqs f) {
  return rope_forward(x, pos, n, heads, hd, f);
}

// Visible (query, key) pairs per (sequence, head): see the header's conventions.
inline double attention_pairs(const ops::AttentionSpec& a, bool block) {
  const double Tq = d(a.Tq), Tk = d(a.Tk);
  if (block) return a.window > 0 ? Tq * std::min(d(a.window), Tk) / 2 : Tq * Tk / 2;
  if (a.window > 0 && a.window < a.Tq) {
    const double w = d(a.window);
    return w * (w + 1) / 2 + (Tq - w) * w;
  }
  return Tq * (Tq + 1) / 2;
}
inline double attention_io(const ops::AttentionSpec& a, double s) {
  const double B = d(a.B);
  return B * (d(a.Tq) * d(a.nh) * (d(a.hd) + d(a.hdv)) + d(a.Tk) * d(a.nkv) * (d(a.hd) + d(a.hdv))) * s +
         4 * B * d(a.nh) * d(a.Tq);
}
inline KernelWork attention_fwd(const ops::AttentionSpec& a, DType t, bool block) {
  KernelWork w;
  w.kind = KernelWork::Kind::Kind_attention;
  w.dtype = t;
  // S = Q K^T over hd, O = P V over hdv, and the softmax's exp per pair.
  const double p = d(a.B) * d(a.nh) * attention_pairs(a, block);
  w.flops = 2 * p * (d(a.hd) + d(a.hdv));
  w.bytes = attention_io(a, sz(t));
  return w;
}
inline KernelWork attention_bwd(const ops::AttentionSpec& a, DType t, bool block) {
  KernelWork w = attention_fwd(a, t, block);
  // S recomputed (hd), dP = dO V^T (hdv), dV = P^T dO (hdv), dQ = dS K (hd), dK = dS^T Q (hd).
  const double p = d(a.B) * d(a.nh) * attention_pairs(a, block);
  w.flops = 2 * p * (3 * d(a.hd) + 2 * d(a.hdv));
  w.bytes = 2 * attention_io(a, sz(t)) + d(a.B) * d(a.Tq) * d(a.nh) * d(a.hdv) * sz(t);
  return w;
}
inline KernelWork attention_forward(CBuf q, CBuf, CBuf, Buf, float*, ops::AttentionSpec a) {
  return attention_fwd(a, q.dtype, false);
}
inline KernelWork attention_backward(CBuf q, CBuf, CBuf, CBuf, const float*, CBuf, Buf, Buf, Buf,
                                     ops::AttentionSpec a) {
  return attention_bwd(a, q.dtype, false);
}
inline KernelWork attention_sink_backward(CBuf o, CBuf, const float*, Buf, ops::AttentionSpec a) {
  const double e = d(a.B) * d(a.Tq) * d(a.nh) * d(a.hdv);
  return other(2 * e, 2 * e * sz(o) + 4 * d(a.B) * d(a.Tq) * d(a.nh));
}
inline KernelWork attention_block_forward(CBuf q, CBuf, CBuf, Buf, float*, bool, ops::AttentionSpec a) {
  return attention_fwd(a, q.dtype, true);
}
inline KernelWork attention_block_backward(CBuf q, CBuf, CBuf, CBuf, const float*, CBuf, Buf, Buf, Buf,
                                           ops::AttentionSpec a) {
  return attention_bwd(a, q.dtype, true);
}

inline KernelWork swiglu_forward(CBuf g, CBuf u, Buf a, int64_t n) {
  return other(5 * d(n), d(n) * (sz(g) + sz(u) + sz(a)));
}
inline KernelWork swiglu_backward(CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n) {
  return other(10 * d(n), d(n) * (sz(g) + sz(u) + sz(da) + sz(dg) + sz(du)));
}
inline KernelWork swiglu_clamped_forward(CBuf g, CBuf u, Buf a, int64_t n, float, float) {
  return swiglu_forward(g, u, a, n);
}
inline KernelWork swiglu_clamped_backward(CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n, float, float) {
  return swiglu_backward(g, u, da, dg, du, n);
}

inline KernelWork router_forward(const float*, float*, int32_t*, float*, ops::RouterSpec s) {
  return other(d(s.n) * d(s.E) * (4 + d(s.k)), 8 * d(s.n) * d(s.E) + 8 * d(s.n) * d(s.k));
}
inline KernelWork router_gather(const float*, const int32_t*, float*, ops::RouterSpec s) {
  return other(2 * d(s.n) * d(s.k), 12 * d(s.n) * d(s.k));
}
inline KernelWork router_backward(const float*, const int32_t*, const float*, const float*, float*, ops::RouterSpec s) {
  return other(6 * d(s.n) * d(s.E), 8 * d(s.n) * d(s.E) + 12 * d(s.n) * d(s.k));
}
inline KernelWork router_sigmoid_forward(const float*, const float*, float*, int32_t*, float*, ops::RouterSpec s) {
  return other(d(s.n) * d(s.E) * (4 + d(s.k)), 8 * d(s.n) * d(s.E) + 8 * d(s.n) * d(s.k));
}
inline KernelWork router_sigmoid_gather(const float*, const int32_t*, float*, ops::RouterSpec s) {
  return other(2 * d(s.n) * d(s.k), 12 * d(s.n) * d(s.k));
}
inline KernelWork router_sigmoid_backward(const float*, const int32_t*, const float*, float*, ops::RouterSpec s) {
  return other(4 * d(s.n) * d(s.E), 8 * d(s.n) * d(s.E) + 12 * d(s.n) * d(s.k));
}
inline KernelWork routing_bias_update(float*, const double*, int64_t rows, double, double) {
  return other(2 * d(rows), 16 * d(rows));  // bias read and written (f32), the loads read (f64)
}
inline KernelWork moe_routing_build(const int32_t*, int64_t n, int64_t k, int64_t E, int32_t*, int32_t*, int64_t*) {
  return other(0, 12 * d(n) * d(k) + 8 * d(E));
}
inline KernelWork moe_gather(CBuf x, const int32_t*, Buf xs, int64_t m, int64_t H) {
  return other(0, d(m) * d(H) * (sz(x) + sz(xs)) + 4 * d(m));
}
inline KernelWork moe_scatter(CBuf src, const int32_t*, Buf dst, int64_t m, int64_t H) {
  return other(0, d(m) * d(H) * (sz(src) + sz(dst)) + 4 * d(m));
}
inline KernelWork moe_chunk_order(const int32_t*, const int64_t*, ops::ChunkOrderSpec s, int32_t*, int32_t*, int64_t*,
                                  int64_t*) {
  return other(0, 16 * d(s.m));
}
inline KernelWork moe_combine_forward(CBuf ys, const int32_t*, const float*, Buf out, int64_t n, int64_t k, int64_t H) {
  return other(2 * d(n) * d(k) * d(H), d(n) * d(k) * d(H) * sz(ys) + 2 * d(n) * d(H) * sz(out) + 8 * d(n) * d(k));
}
inline KernelWork moe_combine_backward(CBuf ys, const int32_t*, const float*, CBuf dout, Buf dys, float*, int64_t n,
                                       int64_t k, int64_t H) {
  return other(4 * d(n) * d(k) * d(H),
               d(n) * d(k) * d(H) * (sz(ys) + sz(dys)) + d(n) * d(H) * sz(dout) + 12 * d(n) * d(k));
}
inline KernelWork moe_scatter_add(CBuf dxs, const int32_t*, Buf dx, int64_t n, int64_t k, int64_t H) {
  return other(d(n) * d(k) * d(H), d(n) * d(k) * d(H) * sz(dxs) + 2 * d(n) * d(H) * sz(dx) + 4 * d(n) * d(k));
}

inline KernelWork log_softmax_forward(const float*, float*, int64_t n, int64_t V) {
  return other(3 * d(n) * d(V), 12 * d(n) * d(V));
}
inline KernelWork nll_forward(const float*, const int32_t*, float*, int64_t n, int64_t) { return other(0, 12 * d(n)); }
inline KernelWork cross_entropy_backward(const float*, const int32_t*, float, float*, int64_t n, int64_t V) {
  return other(2 * d(n) * d(V), 8 * d(n) * d(V));
}
inline KernelWork online_lse_init(float*, double*, float*, int64_t rows) { return other(0, 16 * d(rows)); }
inline KernelWork online_lse_fold(const float*, int64_t, const int32_t*, int64_t rows, int64_t v0, int64_t v1, float*,
                                  double*, float*) {
  return other(3 * d(rows) * d(v1 - v0), 4 * d(rows) * d(v1 - v0) + 32 * d(rows));
}
inline KernelWork online_lse_loss(const float*, const double*, const float*, const int32_t*, int64_t rows, double*) {
  return other(2 * d(rows), 20 * d(rows));
}
inline KernelWork online_lse_backward(float*, int64_t, const int32_t*, int64_t rows, int64_t v0, int64_t v1,
                                      const float*, const double*, float) {
  return other(3 * d(rows) * d(v1 - v0), 8 * d(rows) * d(v1 - v0) + 16 * d(rows));
}

inline KernelWork add_inplace(Buf y, CBuf x, int64_t n) { return other(d(n), d(n) * (2 * sz(y) + sz(x))); }
inline KernelWork scale_inplace(Buf y, float, int64_t n) { return other(d(n), 2 * d(n) * sz(y)); }
inline KernelWork fill(Buf y, float, int64_t n) { return other(0, d(n) * sz(y)); }
inline KernelWork copy(Buf dst, CBuf src, int64_t n) { return other(0, d(n) * (sz(dst) + sz(src))); }
inline KernelWork reduce_sum(CBuf x, int64_t n, float*) { return other(d(n), d(n) * sz(x)); }
inline KernelWork reduce_sumsq(CBuf x, int64_t n, float*) { return other(2 * d(n), d(n) * sz(x)); }
inline KernelWork reduce_sumsq_multi(const CBuf* x, const int64_t* n, int64_t count, float*) {
  double f = 0, b = 0;
  for (int64_t i = 0; i < count && x != nullptr && n != nullptr; ++i) f += 2 * d(n[i]), b += d(n[i]) * sz(x[i]);
  return other(f, b);
}
inline KernelWork bias_add(Buf y, CBuf b, int64_t rows, int64_t dd) {
  return other(d(rows) * d(dd), 2 * d(rows) * d(dd) * sz(y) + d(dd) * sz(b));
}
inline KernelWork bias_backward(CBuf dy, Buf db, int64_t rows, int64_t dd) {
  return other(d(rows) * d(dd), d(rows) * d(dd) * sz(dy) + 2 * d(dd) * sz(db));
}
inline KernelWork column_sums_f64(CBuf x, int64_t rows, int64_t dd, double*) {
  return other(d(rows) * d(dd), d(rows) * d(dd) * sz(x) + 16 * d(dd));  // out read and written (it adds)
}
inline KernelWork copy_2d(Buf dst, int64_t, CBuf src, int64_t, int64_t rows, int64_t cols) {
  return other(0, d(rows) * d(cols) * (sz(dst) + sz(src)));
}
inline KernelWork add_2d(Buf dst, int64_t, CBuf src, int64_t, int64_t rows, int64_t cols) {
  return other(d(rows) * d(cols), d(rows) * d(cols) * (2 * sz(dst) + sz(src)));
}
// AdamW: reads param, m, v (f32), the gradient; writes param, m, v and the rounded copy of a mixed recipe
// (meta holds no pointers, so a bf16 copy operand is counted as present).
inline KernelWork adamw_update(float*, CBuf grad, float*, float*, int64_t n, ops::AdamWHyper, Buf param_copy) {
  const double copy_bytes = param_copy.dtype == DType::DType_F32 && param_copy.p == nullptr ? 0 : sz(param_copy);
  return other(14 * d(n), d(n) * (24 + sz(grad) + copy_bytes));
}
inline KernelWork adamw_update_multi(const ops::AdamWTensor* t, int64_t count, ops::AdamWHyper h) {
  KernelWork w;
  for (int64_t i = 0; i < count && t != nullptr; ++i) {
    const KernelWork x = adamw_update(nullptr, t[i].grad, nullptr, nullptr, t[i].n, h, t[i].param_copy);
    w.flops += x.flops, w.bytes += x.bytes;
  }
  return w;
}

}  // namespace fp::kernel_work
