// The kernel table: every op a backend provides. The model, the step and the schedules call kernels
// only through a backend's table, so a backend (cpu, meta, cuda) is added without touching them.
//
// Each op's contract (what it computes, shapes, what must hold bit for bit) is in its op header
// (ops/*.h): a signature type in namespace ops (ops::gemm_fn, ...), which each backend implements in its
// own room and a table entry takes with an ExecContext first; its scalar reference is ops/ref.
// A table entry has the op's parameters preceded by an ExecContext, the stream the kernel is
// enqueued on (Note [Kernel execution context]). Backends fill the table (Note [Backends as plug-ins]
// in backend/registry.h):
//   cpu   backend/cpu/kernels, run on the calling thread when the stream is inline (the compute
//         stream), else enqueued on the stream's worker (ops::kernels_cpu, backend/cpu/cpu_backend.h);
//   meta  nothing (data pointers there are null; backend/meta);
//   cuda  launches on the context's cudaStream_t (backend/cuda); the kernels it lacks throw by name.
//
// Note [Kernel execution context]: PyTorch's kernels find their stream in a thread-local "current
// stream"; ours get it as the first argument, so a kernel's stream is visible at every call site that
// chose it and nothing global changes between calls. The stream is the backend's own (a cuda stream
// owns its library handles and their workspaces, backend/cuda/cuda_stream.h), so a kernel finds its
// backend's context there, never in a global. Callers rarely spell it: Backend::kernels()
// returns a KernelLauncher bound to the compute stream (K.gemm(...) calls table.gemm(ctx, ...)), and
// Backend::kernels_on(stream) one bound to another stream. Work on a stream is ordered with the other
// work on it and with events (core/stream.h); a kernel's buffers must stay alive until the stream
// has passed it (Tensor::record_stream, memory/arena.h).
#pragma once

#include <array>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/precision.h"
#include "core/stream.h"
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

namespace fp {

// Where one kernel call runs (Note [Kernel execution context]).
struct ExecContext {
  Stream& stream;
};

namespace ops {

#define FP_KERNEL_LIST(X)                                                                                            \
  X(gemm)                                                                                                            \
  X(gemm_tiled)                                                                                                      \
  X(gemm_grouped)                                                                                                    \
  X(gemm_grouped_weight)                                                                                             \
  X(embedding_forward) X(embedding_backward) X(rmsnorm_forward) X(rmsnorm_backward) X(rope_forward) X(rope_backward) \
      X(rope_strided_forward) X(rope_strided_backward) X(attention_forward) X(attention_backward)                    \
          X(attention_sink_backward) X(attention_block_forward) X(attention_block_backward) X(swiglu_forward)        \
              X(swiglu_backward) X(swiglu_clamped_forward) X(swiglu_clamped_backward) X(router_forward)              \
                  X(router_gather) X(router_backward) X(router_sigmoid_forward) X(router_sigmoid_gather)             \
                      X(router_sigmoid_backward) X(routing_bias_update) X(moe_routing_build) X(moe_gather)           \
                          X(moe_scatter) X(moe_chunk_order) X(moe_combine_forward) X(moe_combine_backward)           \
                              X(moe_scatter_add) X(log_softmax_forward) X(nll_forward) X(cross_entropy_backward)     \
                                  X(online_lse_init) X(online_lse_fold) X(online_lse_loss) X(online_lse_backward)    \
                                      X(add_inplace) X(scale_inplace) X(fill) X(copy) X(reduce_sum) X(reduce_sumsq)  \
                                          X(reduce_sumsq_multi) X(bias_add) X(bias_backward) X(column_sums_f64)      \
                                              X(copy_2d) X(add_2d) X(adamw_update) X(adamw_update_multi)

// The type of a table entry: the op's signature (ops::name_fn in ops/*.h) with the context first.
template <class Op>
struct KernelEntry;
template <class... A>
struct KernelEntry<void (*)(A...)> {
  using type = void (*)(const ExecContext&, A...);
};
template <class Op>
using kernel_entry_t = typename KernelEntry<Op>::type;

// Host queries of a backend's kernels: plain host functions of the shapes, each backend's own.
//   workspace sizes (CUTLASS's get_workspace_size): the scratch a kernel needs, asked before it runs so
//     that the caller allocates it through the ledger (category workspace);
//   work measures: the tiles a kernel computes (ring balance studies).
// The meta backend answers as the cpu backend, whose ledgers it must reproduce.
#define FP_QUERY_LIST(X) X(rmsnorm_backward_workspace) X(attention_block_tile_pairs)

// Note [Kernel coverage]: a backend may implement a kernel for some storage dtypes only (the cuda
// skeleton: a few kernels, f32), so each table says, per entry, the dtypes it takes its token operands in
// (`dtypes`, a bit per DType). The cpu table is the contract: an entry with a Buf/CBuf operand takes f32
// and bf16, any other f32 (its operands have one dtype whatever the recipe). A step of a precision needs,
// of every entry, the cpu table's dtypes that the recipe stores tokens in (kernels_missing); a Model
// checks its backend's table against it when it is made (model/model.cpp), so a backend's coverage is an
// error naming the kernels before a run starts, never a failure in its middle. meta covers everything.
enum class KernelId {
#define FP_KERNEL_ID(name) KernelId_##name,
  FP_KERNEL_LIST(FP_KERNEL_ID)
#undef FP_KERNEL_ID
};
#define FP_KERNEL_COUNT(name) +1
inline constexpr int kKernelCount = 0 FP_KERNEL_LIST(FP_KERNEL_COUNT);
#undef FP_KERNEL_COUNT
const char* kernel_name(KernelId k);

constexpr uint32_t dtype_bit(DType t) { return 1u << static_cast<int>(t); }

// Whether an entry type takes a dtype-carrying operand (Buf, CBuf, a table of them, a bucket of AdamW
// tensors): then f32 and bf16 on the cpu.
template <class A>
inline constexpr bool kCarriesDtype =
    std::is_same_v<A, Buf> || std::is_same_v<A, CBuf> || std::is_same_v<A, const Buf*> ||
    std::is_same_v<A, const CBuf*> || std::is_same_v<A, const AdamWTensor*>;
template <class Entry>
struct TakesBuf;
template <class... A>
struct TakesBuf<void (*)(A...)> {
  static constexpr bool value = (kCarriesDtype<std::decay_t<A>> || ...);
};

// Note [Support by shape and options]: a backend may take an entry in a dtype and still not take every case
// of it (ggml's supports_op): cuDNN's fused attention takes head widths up to a bound and not every
// mask, a library's grouped GEMM may lack a bias epilogue. A use of an entry is the entry, the dtype its
// token operands are stored in, and the attributes that can decide; a table may answer per use whether it
// takes it (Kernels::refuses: "" when it does, else why; null: every use its dtypes allow). A model's uses
// follow from its config and precision alone (model_kernel_uses, model/model.h), so a case its backend
// refuses is an error naming the entry and the reason when the Model is made, before a run starts, and
// never a silent switch to another kernel.
struct KernelUse {
  KernelId id;
  DType dtype = DType::DType_F32;        // the token operands' storage
  int64_t head_dim = 0, head_dim_v = 0;  // attention: the widths of queries and keys, and of values
  int64_t window = 0;                    // attention: a sliding window of this many keys (0: none)
  bool sinks = false;                    // attention: a learned sink logit per head
  bool bias = false;                     // gemm_grouped, gemm_grouped_weight: the bias epilogues
};
using refuses_fn = std::string(const KernelUse& use);

struct Kernels {
#define FP_KERNEL_MEMBER(name) kernel_entry_t<::fp::ops::name##_fn*> name = nullptr;
  FP_KERNEL_LIST(FP_KERNEL_MEMBER)
#undef FP_KERNEL_MEMBER
  // Note [Kernel coverage]: the dtypes each entry takes (KernelId order).
  std::array<uint32_t, kKernelCount> dtypes{};
  bool supports(KernelId k, DType t) const { return (dtypes[static_cast<int>(k)] & dtype_bit(t)) != 0; }
#define FP_QUERY_MEMBER(name) ::fp::ops::name##_fn* name = nullptr;
  FP_QUERY_LIST(FP_QUERY_MEMBER)
#undef FP_QUERY_MEMBER
  // Note [Support by shape and options]: null takes every use the dtypes allow (cpu, meta).
  refuses_fn* refuses = nullptr;
};

// A table bound to one stream: K.name(args...) calls table.name({stream}, args...).
class KernelLauncher {
 public:
  KernelLauncher(const Kernels& table, Stream& stream) : table_(&table), ctx_{stream} {}
  const Kernels& table() const { return *table_; }
  const ExecContext& context() const { return ctx_; }

#define FP_KERNEL_LAUNCH(name)                 \
  template <class... A>                        \
  void name(A&&... a) const {                  \
    table_->name(ctx_, std::forward<A>(a)...); \
  }
  FP_KERNEL_LIST(FP_KERNEL_LAUNCH)
#undef FP_KERNEL_LAUNCH
#define FP_QUERY_CALL(name)                     \
  template <class... A>                         \
  int64_t name(A&&... a) const {                \
    return table_->name(std::forward<A>(a)...); \
  }
  FP_QUERY_LIST(FP_QUERY_CALL)
#undef FP_QUERY_CALL

 private:
  const Kernels* table_;
  ExecContext ctx_;
};

// The dtypes the cpu table takes for each entry (Note [Kernel coverage]): the contract.
uint32_t kernel_contract_dtypes(KernelId k);
// "name (bf16)" for every entry that `table` lacks in a dtype a step of precision p needs; empty: covered.
std::vector<std::string> kernels_missing(const Kernels& table, const Precision& p);
// "name (why)" for every use that `table` refuses (Note [Support by shape and options]); empty: all taken.
std::vector<std::string> kernels_refused(const Kernels& table, const std::vector<KernelUse>& uses);

}  // namespace ops
}  // namespace fp
