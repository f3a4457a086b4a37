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

const Kernels& kernels_cpu() {
  static const Kernels k = [] {
    Kernels t;
#define FP_KERNEL_CPU(name) t.name = &OnCpuStream<&::fp::ops::cpu::name>::fn;
    FP_KERNEL_LIST(FP_KERNEL_CPU)
#undef FP_KERNEL_CPU
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
#define FP_WORKSPACE_META(name) t.name = kernels_cpu().name;  // the ledgers of the cpu backend
    FP_WORKSPACE_LIST(FP_WORKSPACE_META)
#undef FP_WORKSPACE_META
    return t;
  }();
  return k;
}

}  // namespace fp::ops
