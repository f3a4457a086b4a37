// Note [Kernel coverage] (backend/kernels.h): each table says which dtypes each kernel takes; the cpu table
// is the contract (a Buf/CBuf operand: f32 and bf16, else f32), meta covers everything, and a table that
// lacks kernels is named, kernel by kernel, before a Model runs anything.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/kernels.h"
#include "backend/meta/meta_backend.h"
#include "core/precision.h"
#include "model/model.h"
#if FLATPEAK_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace fp {

TEST(KernelCoverage, CpuIsTheContractAndMetaCoversIt) {
  for (const char* recipe : {"fp32", "bf16"}) {
    EXPECT_TRUE(ops::kernels_missing(ops::kernels_cpu(), precision_recipe(recipe)).empty()) << recipe;
    EXPECT_TRUE(ops::kernels_missing(ops::kernels_meta(), precision_recipe(recipe)).empty()) << recipe;
  }
  const uint32_t f32 = ops::dtype_bit(DType::DType_F32), bf16 = ops::dtype_bit(DType::DType_BF16);
  EXPECT_EQ(ops::kernel_contract_dtypes(ops::KernelId::KernelId_attention_forward), f32 | bf16);
  EXPECT_EQ(ops::kernel_contract_dtypes(ops::KernelId::KernelId_online_lse_init), f32);  // float* operands only
  EXPECT_TRUE(ops::kernels_cpu().supports(ops::KernelId::KernelId_gemm, DType::DType_BF16));
  EXPECT_STREQ(ops::kernel_name(ops::KernelId::KernelId_adamw_update), "adamw_update");
}

TEST(KernelCoverage, ATableWithoutAKernelIsNamed) {
  ops::Kernels t = ops::kernels_cpu();
  t.dtypes[static_cast<int>(ops::KernelId::KernelId_rope_forward)] = ops::dtype_bit(DType::DType_F32);
  EXPECT_TRUE(ops::kernels_missing(t, precision_recipe("fp32")).empty());
  EXPECT_EQ(ops::kernels_missing(t, precision_recipe("bf16")), std::vector<std::string>{"rope_forward (bf16)"});
}

// Note [Support by shape and options]: a table that refuses wide heads names each attention entry of a model
// with them, once per window its layers use, and nothing of a model without them; cpu and meta refuse nothing.
TEST(KernelCoverage, ARefusedCaseIsNamed) {
  ops::Kernels t = ops::kernels_cpu();
  t.refuses = [](const ops::KernelUse& u) -> std::string {
    const bool attention = u.head_dim > 0;
    if (attention && u.head_dim > 64) return "head widths up to 64";
    if (attention && u.sinks) return "no sinks";
    return "";
  };
  ModelConfig wide;
  wide.num_hidden_layers = 2;
  wide.head_dim = 128;
  wide.sliding_window = 32;
  wide.layer_types = {"sliding_attention", "full_attention"};
  const Precision bf16 = precision_recipe("bf16");
  const std::vector<std::string> refused = ops::kernels_refused(t, model_kernel_uses(wide, bf16));
  EXPECT_EQ(refused.size(), 8u);  // 4 attention entries x 2 windows; the grouped GEMMs are taken
  EXPECT_NE(std::find(refused.begin(), refused.end(), "attention_forward (head widths up to 64)"), refused.end());
  ModelConfig narrow = wide;
  narrow.head_dim = 64;
  EXPECT_TRUE(ops::kernels_refused(t, model_kernel_uses(narrow, bf16)).empty());
  narrow.model_type = ModelType::ModelType_gpt_oss;  // sinks
  EXPECT_EQ(ops::kernels_refused(t, model_kernel_uses(narrow, bf16)).size(), 8u);
  EXPECT_TRUE(ops::kernels_refused(ops::kernels_cpu(), model_kernel_uses(wide, bf16)).empty());
  EXPECT_TRUE(ops::kernels_refused(ops::kernels_meta(), model_kernel_uses(wide, bf16)).empty());
}

#if FLATPEAK_HAVE_CUDA
// The cuda table (built without a GPU: it is a static table): 50 entries (GEMMs,
// element-wise, reductions, AdamW, losses, routers, routing, permutes, embedding, RMSNorm, RoPE, SwiGLU;
// backend/cuda/cuda_backend.cpp).
TEST(KernelCoverage, CudaNamesWhatItLacks) {
  constexpr int kCudaEntries = 51;
  const std::vector<std::string> fp32 = ops::kernels_missing(kernels_cuda(), precision_recipe("fp32"));
  EXPECT_EQ(static_cast<int>(fp32.size()), ops::kKernelCount - kCudaEntries);
  EXPECT_NE(std::find(fp32.begin(), fp32.end(), "attention_forward (f32)"), fp32.end());
  for (const char* taken : {"gemm (f32)", "gemm_grouped (f32)", "adamw_update_multi (f32)", "online_lse_fold (f32)"})
    EXPECT_EQ(std::find(fp32.begin(), fp32.end(), taken), fp32.end()) << taken;
  const std::vector<std::string> bf16 = ops::kernels_missing(kernels_cuda(), precision_recipe("bf16"));
  // embedding_backward takes f32 tables only.
  EXPECT_EQ(static_cast<int>(bf16.size()), ops::kKernelCount - kCudaEntries + 1);
  EXPECT_NE(std::find(bf16.begin(), bf16.end(), "embedding_backward (bf16)"), bf16.end());
  EXPECT_EQ(std::find(bf16.begin(), bf16.end(), "gemm (f32, bf16)"), bf16.end());
  EXPECT_NE(std::find(bf16.begin(), bf16.end(), "attention_forward (f32, bf16)"), bf16.end());
  // Note [Support by shape and options]: its grouped GEMMs take gpt-oss's expert biases (gemm, then the
  // bias kernels); nothing it registers is refused.
  ModelConfig oss;
  oss.num_hidden_layers = 1;
  oss.head_dim = 64;
  oss.model_type = ModelType::ModelType_gpt_oss;
  EXPECT_TRUE(ops::kernels_refused(kernels_cuda(), model_kernel_uses(oss, precision_recipe("fp32"))).empty());
  EXPECT_TRUE(ops::kernels_refused(kernels_cuda(), model_kernel_uses(ModelConfig{}, precision_recipe("fp32"))).empty());
}
#endif

}  // namespace fp
