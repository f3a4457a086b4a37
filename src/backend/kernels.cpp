#include "backend/kernels.h"

namespace fp::ops {

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

std::vector<std::string> kernels_refused(const Kernels& table, const std::vector<KernelUse>& uses) {
  std::vector<std::string> refused;
  if (table.refuses == nullptr) return refused;
  for (const KernelUse& u : uses) {
    const std::string why = table.refuses(u);
    if (!why.empty()) refused.push_back(fmt::format("{} ({})", kernel_name(u.id), why));
  }
  return refused;
}

}  // namespace fp::ops
