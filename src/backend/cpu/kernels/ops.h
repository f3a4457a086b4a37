// The cpu backend's kernels: its implementation of every op of the contract (src/ops/*.h, one signature
// type per op), each the plain function a table entry wraps (kernels_cpu, backend/cpu/cpu_backend.h), plus
// what the cpu kernels expose of themselves (tile sizes, which instruction-set copy runs). Tests and
// benchmarks of the cpu kernels call them directly; the model never does (it calls a backend's table).
#pragma once

#include <cstdint>

#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/attention_block.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/gemm_grouped.h"
#include "ops/gemm_tiled.h"
#include "ops/moe_chunk_order.h"
#include "ops/moe_permute.h"
#include "ops/moe_routing.h"
#include "ops/online_lse.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/router.h"
#include "ops/swiglu.h"

namespace fp::ops::cpu {

// ops/adamw.h
adamw_update_fn adamw_update;
adamw_update_multi_fn adamw_update_multi;

// ops/attention.h
attention_forward_fn attention_forward;
attention_backward_fn attention_backward;
attention_sink_backward_fn attention_sink_backward;

// Tile sizes (queries x keys) of the cpu kernel; exposed so tests can pick T across several tiles.
inline constexpr int64_t kAttentionTileQ = 64;
inline constexpr int64_t kAttentionTileK = 64;

// The copy of the tile kernels this process runs, "sse2", "avx2" or "avx2+fma" (Note [Tile products with
// FMA] in backend/cpu/kernels/attention_tile.h; FLATPEAK_SIMD lowers it): benchmarks print it beside the GEMM kernels.
const char* attention_kernels();
// How the backward runs (Note [One backward sweep where the dQ sums fit] in backend/cpu/kernels/attention_block.cpp):
// "one sweep where the dQ sums fit, else two passes", or the one FLATPEAK_ATTENTION_BACKWARD forces.
const char* attention_backward_sweep();

// ops/attention_block.h
attention_block_forward_fn attention_block_forward;
attention_block_backward_fn attention_block_backward;

// Equal to the kernel's count (tests/ops/test_attention_documents.cpp).
attention_block_tile_pairs_fn attention_block_tile_pairs;

// ops/cross_entropy.h
log_softmax_forward_fn log_softmax_forward;
nll_forward_fn nll_forward;
cross_entropy_backward_fn cross_entropy_backward;

// ops/elementwise.h
add_inplace_fn add_inplace;
scale_inplace_fn scale_inplace;
fill_fn fill;
copy_fn copy;
reduce_sum_fn reduce_sum;
reduce_sumsq_fn reduce_sumsq;
reduce_sumsq_multi_fn reduce_sumsq_multi;
bias_add_fn bias_add;
bias_backward_fn bias_backward;
column_sums_f64_fn column_sums_f64;
copy_2d_fn copy_2d;
add_2d_fn add_2d;

// ops/embedding.h
embedding_forward_fn embedding_forward;
embedding_backward_fn embedding_backward;

// ops/gemm.h. All f32: one cblas_sgemm (checked by FP_BLAS_CHECK on its arguments). Any operand bf16:
// Note [bf16 GEMM on a CPU without bf16 units] in backend/cpu/kernels/gemm.cpp; the result is the f32
// GEMM of the widened operands, rounded once into a bf16 C. A and B both bf16 on a CPU with bf16 units:
// one oneDNN matmul with f32 accumulation (Note [bf16 GEMMs on the matrix units] in
// backend/cpu/kernels/gemm_onednn.h), the same products summed in another order.
gemm_fn gemm;

// The bound on one widened panel of the bf16 path, in floats (default 2^21, 8 MiB); tests lower it to
// cross panel edges on small shapes. Returns the previous bound.
int64_t gemm_panel_floats_set(int64_t floats);

// ops/gemm_grouped.h: a loop over the groups of gemm and the bias kernels (their bits).
gemm_grouped_fn gemm_grouped;
gemm_grouped_weight_fn gemm_grouped_weight;

// ops/gemm_tiled.h: tiles of kGemmTileRows x kGemmTileCols, each one single-threaded sgemm.
gemm_tiled_fn gemm_tiled;

inline constexpr int64_t kGemmTileRows = 256;
inline constexpr int64_t kGemmTileCols = 512;

// ops/moe_chunk_order.h
moe_chunk_order_fn moe_chunk_order;

// ops/moe_permute.h
moe_gather_fn moe_gather;
moe_scatter_fn moe_scatter;
moe_combine_forward_fn moe_combine_forward;
moe_combine_backward_fn moe_combine_backward;
moe_scatter_add_fn moe_scatter_add;

// ops/moe_routing.h
moe_routing_build_fn moe_routing_build;

// ops/online_lse.h
online_lse_init_fn online_lse_init;
online_lse_fold_fn online_lse_fold;
online_lse_loss_fn online_lse_loss;
online_lse_backward_fn online_lse_backward;

// ops/rmsnorm.h
rmsnorm_forward_fn rmsnorm_forward;
rmsnorm_backward_fn rmsnorm_backward;
rmsnorm_backward_workspace_fn rmsnorm_backward_workspace;

// ops/rope.h
rope_forward_fn rope_forward;
rope_backward_fn rope_backward;
rope_strided_forward_fn rope_strided_forward;
rope_strided_backward_fn rope_strided_backward;

// ops/router.h
router_forward_fn router_forward;
router_gather_fn router_gather;
router_backward_fn router_backward;
router_sigmoid_forward_fn router_sigmoid_forward;
router_sigmoid_gather_fn router_sigmoid_gather;
router_sigmoid_backward_fn router_sigmoid_backward;
routing_bias_update_fn routing_bias_update;

// ops/swiglu.h
swiglu_forward_fn swiglu_forward;
swiglu_backward_fn swiglu_backward;
swiglu_clamped_forward_fn swiglu_clamped_forward;
swiglu_clamped_backward_fn swiglu_clamped_backward;

}  // namespace fp::ops::cpu
