// The cuda backend's kernel table entries (backend/kernels.h): each has its op's contract (ops/*.h) with
// the execution context first, and launches on the context's stream (Note [A cuda stream owns its
// context] in cuda_stream.h). Each returns once its work has been enqueued: errors of the launch are
// thrown, errors of the execution surface at the next synchronising call. Operands are device memory;
// the host tables of the bucketed entries (reduce_sumsq_multi, adamw_update_multi) are read at the call.
// Which entries meet the cpu's bits and which the error model: Note [Bits as the cpu's] in common.cuh,
// and each file's header.
#pragma once

#include <cstdint>

#include "backend/kernels.h"

namespace fp::ops::cuda {

// gemm_lt.cpp: cuBLASLt; f32 and bf16 operands, each on its own; the error model of ops/gemm.h.
void gemm(const ExecContext& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A,
          int64_t lda, CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc);
void gemm_grouped(const ExecContext& c, bool trans_b, int64_t G, const int64_t* offsets, int64_t N, int64_t K,
                  float alpha, CBuf A, const CBuf* B, const CBuf* bias, float beta, Buf C);
void gemm_grouped_weight(const ExecContext& c, int64_t G, const int64_t* offsets, int64_t M, int64_t N, float alpha,
                         CBuf A, CBuf B, float beta, const Buf* C, const Buf* db);
// gemm_tiled.cu: bits independent of how C is cut (Note [The device's tiled GEMM]).
void gemm_tiled(const ExecContext& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A,
                int64_t lda, CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc);

// elementwise.cu: f32 and bf16 operands, each on its own; the cpu's bits.
void add_inplace(const ExecContext& c, Buf y, CBuf x, int64_t n);
void scale_inplace(const ExecContext& c, Buf y, float a, int64_t n);
void fill(const ExecContext& c, Buf y, float v, int64_t n);
void copy(const ExecContext& c, Buf dst, CBuf src, int64_t n);
void copy_2d(const ExecContext& c, Buf dst, int64_t ldd, CBuf src, int64_t lds, int64_t rows, int64_t cols);
void add_2d(const ExecContext& c, Buf dst, int64_t ldd, CBuf src, int64_t lds, int64_t rows, int64_t cols);
void bias_add(const ExecContext& c, Buf y, CBuf b, int64_t rows, int64_t d);
void bias_backward(const ExecContext& c, CBuf dy, Buf db, int64_t rows, int64_t d);
void column_sums_f64(const ExecContext& c, CBuf x, int64_t rows, int64_t d, double* out);

// reduce.cu: f32 and bf16 x, out device memory; the cpu's bits.
void reduce_sum(const ExecContext& c, CBuf x, int64_t n, float* out);
void reduce_sumsq(const ExecContext& c, CBuf x, int64_t n, float* out);
void reduce_sumsq_multi(const ExecContext& c, const CBuf* x, const int64_t* n, int64_t count, float* out);

// adamw.cu: f32 state, f32 or bf16 gradient and working copy; the cpu's bits.
void adamw_update(const ExecContext& c, float* param, CBuf grad, float* m, float* v, int64_t n, AdamWHyper h,
                  Buf param_copy);
void adamw_update_multi(const ExecContext& c, const AdamWTensor* t, int64_t count, AdamWHyper h);

// cross_entropy.cu: f32 (as the cpu table); the error model (exp, log).
void log_softmax_forward(const ExecContext& c, const float* logits, float* logp, int64_t n, int64_t V);
void nll_forward(const ExecContext& c, const float* logp, const int32_t* targets, float* loss, int64_t n, int64_t V);
void cross_entropy_backward(const ExecContext& c, const float* logp, const int32_t* targets, float scale,
                            float* dlogits, int64_t n, int64_t V);
void online_lse_init(const ExecContext& c, float* m, double* z, float* y, int64_t rows);
void online_lse_fold(const ExecContext& c, const float* strip, int64_t ld, const int32_t* targets, int64_t rows,
                     int64_t v0, int64_t v1, float* m, double* z, float* y);
void online_lse_loss(const ExecContext& c, const float* m, const double* z, const float* y, const int32_t* targets,
                     int64_t rows, double* loss_sum);
void online_lse_backward(const ExecContext& c, float* strip, int64_t ld, const int32_t* targets, int64_t rows,
                         int64_t v0, int64_t v1, const float* m, const double* z, float scale);

// embedding.cu: forward f32 and bf16, each operand on its own; backward into an f32 table (dout f32 or bf16);
// the cpu's bits.
void embedding_forward(const ExecContext& c, const int32_t* tokens, CBuf table, Buf out, int64_t n, int64_t H);
void embedding_backward(const ExecContext& c, const int32_t* tokens, CBuf dout, Buf dtable, int64_t n, int64_t H);

// rmsnorm.cu: f32 and bf16, each operand on its own; the cpu's bits (its row order and dw blocks, whose
// workspace the query gives: rmsnorm_backward_workspace(rows, d) floats of device memory).
void rmsnorm_forward(const ExecContext& c, CBuf x, CBuf w, Buf y, float* rstd, int64_t rows, int64_t d, float eps);
void rmsnorm_backward(const ExecContext& c, CBuf x, CBuf w, const float* rstd, CBuf dy, Buf dx, Buf dw, int64_t rows,
                      int64_t d, float* workspace);
int64_t rmsnorm_backward_workspace(int64_t rows, int64_t d);

// rope.cu: x f32 or bf16; the error model (CUDA's double cos and sin), the cpu's float rotation.
void rope_forward(const ExecContext& c, Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, RopeFreqs f);
void rope_backward(const ExecContext& c, Buf dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, RopeFreqs f);
void rope_strided_forward(const ExecContext& c, Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd,
                          int64_t head_stride, bool interleaved, RopeFreqs f);
void rope_strided_backward(const ExecContext& c, Buf dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd,
                           int64_t head_stride, bool interleaved, RopeFreqs f);

// swiglu.cu: f32 and bf16, each operand on its own; the error model (exp).
void swiglu_forward(const ExecContext& c, CBuf g, CBuf u, Buf a, int64_t n);
void swiglu_backward(const ExecContext& c, CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n);
void swiglu_clamped_forward(const ExecContext& c, CBuf g, CBuf u, Buf a, int64_t n, float alpha, float limit);
void swiglu_clamped_backward(const ExecContext& c, CBuf g, CBuf u, CBuf da, Buf dg, Buf du, int64_t n, float alpha,
                             float limit);

// moe_permute.cu: f32 and bf16 rows, each operand on its own; the cpu's bits.
void moe_gather(const ExecContext& c, CBuf x, const int32_t* rows, Buf xs, int64_t m, int64_t H);
void moe_scatter(const ExecContext& c, CBuf src, const int32_t* rows, Buf dst, int64_t m, int64_t H);
void moe_combine_forward(const ExecContext& c, CBuf ys, const int32_t* slot_pos, const float* w, Buf out, int64_t n,
                         int64_t k, int64_t H);
void moe_combine_backward(const ExecContext& c, CBuf ys, const int32_t* slot_pos, const float* w, CBuf dout, Buf dys,
                          float* dw, int64_t n, int64_t k, int64_t H);
void moe_scatter_add(const ExecContext& c, CBuf dxs, const int32_t* slot_pos, Buf dx, int64_t n, int64_t k, int64_t H);

// router.cu: f32 (as the cpu table); the error model (exp), the cpu's arithmetic otherwise.
void router_forward(const ExecContext& c, const float* logits, float* probs, int32_t* topk_idx, float* topk_w,
                    RouterSpec spec);
void router_gather(const ExecContext& c, const float* probs, const int32_t* topk_idx, float* topk_w, RouterSpec spec);
void router_backward(const ExecContext& c, const float* probs, const int32_t* topk_idx, const float* d_topk_w,
                     const float* dprobs_bias, float* dlogits, RouterSpec spec);
void router_sigmoid_forward(const ExecContext& c, const float* logits, const float* bias, float* scores,
                            int32_t* topk_idx, float* topk_w, RouterSpec spec);
void router_sigmoid_gather(const ExecContext& c, const float* scores, const int32_t* topk_idx, float* topk_w,
                           RouterSpec spec);
void router_sigmoid_backward(const ExecContext& c, const float* scores, const int32_t* topk_idx, const float* d_topk_w,
                             float* dlogits, RouterSpec spec);
void routing_bias_update(const ExecContext& c, float* bias, const double* load, int64_t rows, double mean,
                         double rate);

// moe_routing.cu: the two counting sorts; integers, the cpu's bits.
void moe_routing_build(const ExecContext& c, const int32_t* topk_idx, int64_t n, int64_t k, int64_t E, int32_t* rows,
                       int32_t* slot_pos, int64_t* expert_offsets);
void moe_chunk_order(const ExecContext& c, const int32_t* rows, const int64_t* pieces, ChunkOrderSpec spec,
                     int32_t* order, int32_t* tokens, int64_t* group_offsets, int64_t* block_counts);

}  // namespace fp::ops::cuda
