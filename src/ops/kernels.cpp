#include "ops/kernels.h"

namespace fp::ops {

namespace {
template <class F>
struct Noop;
template <class R, class... A>
struct Noop<R (*)(A...)> {
  static R fn(A...) { return R(); }
};
}  // namespace

const Kernels& kernels_cpu() {
  static const Kernels k = [] {
    Kernels t;
#define FP_KERNEL_CPU(name) t.name = &::fp::ops::cpu::name;
    FP_KERNEL_LIST(FP_KERNEL_CPU)
#undef FP_KERNEL_CPU
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
    return t;
  }();
  return k;
}

}  // namespace fp::ops
