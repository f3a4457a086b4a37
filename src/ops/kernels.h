// The kernel table: every op a backend provides, by signature (the signatures and their contracts
// are in the op headers). The model and the schedules call kernels only through a backend's table,
// so a backend (cpu, meta, cuda later) is added without touching them. The meta backend's table
// does nothing: data pointers there are null.
#pragma once

#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/attention_block.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/gemm.h"
#include "ops/gemm_tiled.h"
#include "ops/moe_permute.h"
#include "ops/moe_routing.h"
#include "ops/online_lse.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/router.h"
#include "ops/swiglu.h"

namespace fp::ops {

#define FP_KERNEL_LIST(X)                                                                            \
  X(gemm) X(gemm_tiled)                                                                              \
  X(embedding_forward) X(embedding_backward)                                                         \
  X(rmsnorm_forward) X(rmsnorm_backward)                                                             \
  X(rope_forward) X(rope_backward) X(rope_strided_forward) X(rope_strided_backward)                 \
  X(attention_forward) X(attention_backward)                                                         \
  X(attention_block_forward) X(attention_block_backward)                                             \
  X(swiglu_forward) X(swiglu_backward)                                                               \
  X(router_forward) X(router_gather) X(router_backward)                                              \
  X(router_sigmoid_forward) X(router_sigmoid_gather) X(router_sigmoid_backward)                      \
  X(moe_routing_build) X(moe_gather) X(moe_scatter)                                                  \
  X(moe_combine_forward) X(moe_combine_backward) X(moe_scatter_add)                                  \
  X(log_softmax_forward) X(nll_forward) X(cross_entropy_backward)                                    \
  X(online_lse_init) X(online_lse_fold) X(online_lse_loss) X(online_lse_backward)                    \
  X(add_inplace) X(scale_inplace) X(fill) X(copy) X(reduce_sum) X(reduce_sumsq)                      \
  X(bias_add) X(bias_backward) X(column_sums_f64) X(copy_2d) X(add_2d)                              \
  X(adamw_update)

struct Kernels {
#define FP_KERNEL_MEMBER(name) decltype(&::fp::ops::cpu::name) name = nullptr;
  FP_KERNEL_LIST(FP_KERNEL_MEMBER)
#undef FP_KERNEL_MEMBER
};

// The cpu kernels (ops/cpu) and the do-nothing table of the meta backend.
const Kernels& kernels_cpu();
const Kernels& kernels_meta();

}  // namespace fp::ops
