#include "backend/kernels.h"

namespace fp::ops {

namespace {

// A cpu kernel as a table entry: run on the calling thread when the stream runs its work inline (the
// compute stream), else enqueued on the stream (its worker runs it in order with the stream's copies;
// the arguments are copied into the task, so pointers must outlive it, as on a device).
template <auto Op>
struct OnCpuStream;
template <class... A, void (*Op)(A...)>
struct OnCpuStream<Op> {
  static void fn(const ExecContext& c, A... a) {
    if (c.stream.runs_inline()) {
      Op(a...);
      return;
    }
    c.stream.enqueue([=] { Op(a...); });
  }
};

// The meta backend's entry: nothing to compute (Note [Kernel execution context] needs no stream here).
template <class Entry>
struct Noop;
template <class... A>
struct Noop<void (*)(const ExecContext&, A...)> {
  static void fn(const ExecContext&, A...) {}
};

}  // namespace

const char* kernel_name(KernelId k) {
  static constexpr const char* kNames[] = {
#define FP_KERNEL_NAME(name) #name,
      FP_KERNEL_LIST(FP_KERNEL_NAME)
#undef FP_KERNEL_NAME
  };
  return kNames[static_cast<int>(k)];
}

uint32_t kernel_contract_dtypes(KernelId k) {
  static constexpr uint32_t kF32 = dtype_bit(DType::DType_F32), kBoth = kF32 | dtype_bit(DType::DType_BF16);
  static constexpr uint32_t kDtypes[] = {
#define FP_KERNEL_DTYPES(name) TakesBuf<::fp::ops::name##_fn*>::value ? kBoth : kF32,
      FP_KERNEL_LIST(FP_KERNEL_DTYPES)
#undef FP_KERNEL_DTYPES
  };
  return kDtypes[static_cast<int>(k)];
}

std::vector<std::string> kernels_missing(const Kernels& table, const Precision& p) {
  uint32_t stored = dtype_bit(DType::DType_F32);  // every recipe keeps some tensors in f32 (master, moments)
  for (const DType t : {p.params, p.grads, p.activations, p.master, p.moments, p.logits, p.router})
    stored |= dtype_bit(t);
  std::vector<std::string> missing;
  for (int i = 0; i < kKernelCount; ++i) {
    const KernelId k = static_cast<KernelId>(i);
    const uint32_t lacking = kernel_contract_dtypes(k) & stored & ~table.dtypes[i];
    if (lacking == 0) continue;
    std::string dts;
    for (const DType t : {DType::DType_F32, DType::DType_BF16})
      if (lacking & dtype_bit(t)) dts += (dts.empty() ? "" : ", ") + std::string(dtype_name(t));
    missing.push_back(fmt::format("{} ({})", kernel_name(k), dts));
  }
  return missing;
}

const Kernels& kernels_cpu() {
  static const Kernels k = [] {
    Kernels t;
#define FP_KERNEL_CPU(name) t.name = &OnCpuStream<&::fp::ops::cpu::name>::fn;
    FP_KERNEL_LIST(FP_KERNEL_CPU)
#undef FP_KERNEL_CPU
    for (int i = 0; i < kKernelCount; ++i) t.dtypes[i] = kernel_contract_dtypes(static_cast<KernelId>(i));
#define FP_WORKSPACE_CPU(name) t.name = &::fp::ops::cpu::name;
    FP_WORKSPACE_LIST(FP_WORKSPACE_CPU)
#undef FP_WORKSPACE_CPU
    return t;
  }();
  return k;
}

const Kernels& kernels_meta() {
  static const Kernels k = [] {
    Kernels t;
#define FP_KERNEL_META(name) t.name = &Noop<decltype(t.name)>::fn;
    FP_KERNEL_LIST(FP_KERNEL_META)
#undef FP_KERNEL_META
    t.dtypes.fill(~0u);                                       // computes nothing: every kernel, every dtype
#define FP_WORKSPACE_META(name) t.name = kernels_cpu().name;  // the ledgers of the cpu backend
    FP_WORKSPACE_LIST(FP_WORKSPACE_META)
#undef FP_WORKSPACE_META
    return t;
  }();
  return k;
}

}  // namespace fp::ops
