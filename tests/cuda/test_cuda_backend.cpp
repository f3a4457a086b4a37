// The cuda backend (src/backend/cuda) on a GPU: arenas and their ledger, copies both ways and on the copy
// streams, fill / add / scale against the same loops on the host, GEMM through cuBLASLt against the cpu
// kernel (OpenBLAS) on the same inputs, and a missing kernel's error (every kernel against the cpu's:
// test_cuda_matches_cpu.cpp). Every test skips
// (GTEST_SKIP, with the runtime's reason) on a machine without a GPU, so the binary runs everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/units.h"

namespace fp {

namespace {

#define FP_SKIP_WITHOUT_GPU()                                          \
  do {                                                                 \
    std::string why;                                                   \
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

std::vector<float> random_vector(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

}  // namespace

TEST(CudaBackend, ArenasLedgerAndCopies) {
  FP_SKIP_WITHOUT_GPU();
  auto be = backend_create("cuda", kUnlimitedBytes, kUnlimitedBytes);
  EXPECT_EQ(be->name(), "cuda");
  const int64_t n = 1 << 20;
  {
    Tensor d = be->alloc_f32(Category::Category_activations, {n}, "x");
    Tensor h = be->alloc_host(Category::Category_checkpoints, {n}, DType::DType_F32, "x.host");
    EXPECT_EQ(be->device_ledger().current(Category::Category_activations), static_cast<uint64_t>(n) * 4);
    EXPECT_EQ(be->host_ledger().current(Category::Category_checkpoints), static_cast<uint64_t>(n) * 4);
    const std::vector<float> x = random_vector(n, 1);
    be->copy_from_host(d.data(), x.data(), d.bytes());
    // device -> pinned host on the d2h stream, then pinned host -> plain memory
    be->copy_async(be->d2h_stream(), h.data(), d.data(), d.bytes());
    be->d2h_stream().synchronize();
    std::vector<float> back(static_cast<size_t>(n));
    std::memcpy(back.data(), h.data(), h.bytes());
    EXPECT_EQ(back, x);
  }
  EXPECT_EQ(be->device_ledger().current(Category::Category_activations), 0u);
  EXPECT_EQ(be->device_ledger().peak(Category::Category_activations), static_cast<uint64_t>(n) * 4);
}

TEST(CudaBackend, ElementwiseKernelsMatchTheHost) {
  FP_SKIP_WITHOUT_GPU();
  auto be = backend_create("cuda", kUnlimitedBytes, kUnlimitedBytes);
  const ops::KernelLauncher K = be->kernels();
  for (const int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{20000003}}) {
    const std::vector<float> x = random_vector(n, 2), y = random_vector(n, 3);
    Tensor dx = be->alloc_f32(Category::Category_workspace, {n}, "x");
    Tensor dy = be->alloc_f32(Category::Category_workspace, {n}, "y");
    be->copy_from_host(dx.data(), x.data(), dx.bytes());
    be->copy_from_host(dy.data(), y.data(), dy.bytes());
    K.add_inplace(dy.f32(), dx.f32(), n);
    K.scale_inplace(dy.f32(), 0.5f, n);
    std::vector<float> got(static_cast<size_t>(n));
    be->copy_to_host(got.data(), dy.data(), dy.bytes());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], (y[i] + x[i]) * 0.5f) << "n=" << n << " i=" << i;
    K.fill(dy.f32(), 3.25f, n);
    K.copy(dx.f32(), dy.f32(), n);
    be->copy_to_host(got.data(), dx.data(), dx.bytes());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], 3.25f) << "n=" << n << " i=" << i;
  }
}

TEST(CudaBackend, GemmMatchesTheCpuKernel) {
  FP_SKIP_WITHOUT_GPU();
  auto be = backend_create("cuda", kUnlimitedBytes, kUnlimitedBytes);
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      const int64_t M = 129, N = 67, K = 300;
      const std::vector<float> A = random_vector(M * K, 4), B = random_vector(K * N, 5), C0 = random_vector(M * N, 6);
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      std::vector<float> want = C0;
      ops::cpu::gemm(ta, tb, M, N, K, 0.75f, A.data(), lda, B.data(), ldb, 0.5f, want.data(), N);
      Tensor dA = be->alloc_f32(Category::Category_workspace, {M * K}, "A");
      Tensor dB = be->alloc_f32(Category::Category_workspace, {K * N}, "B");
      Tensor dC = be->alloc_f32(Category::Category_workspace, {M * N}, "C");
      be->copy_from_host(dA.data(), A.data(), dA.bytes());
      be->copy_from_host(dB.data(), B.data(), dB.bytes());
      be->copy_from_host(dC.data(), C0.data(), dC.bytes());
      be->kernels().gemm(ta, tb, M, N, K, 0.75f, dA.f32(), lda, dB.f32(), ldb, 0.5f, dC.f32(), N);
      std::vector<float> got(static_cast<size_t>(M * N));
      be->copy_to_host(got.data(), dC.data(), dC.bytes());
      double worst = 0, scale = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
        scale = std::max(scale, std::abs(static_cast<double>(want[i])));
      }
      EXPECT_LE(worst / scale, 1e-5) << "trans_a=" << ta << " trans_b=" << tb;  // fp32 sums of 300 terms
    }
}

TEST(CudaBackend, MissingKernelIsNamed) {
  FP_SKIP_WITHOUT_GPU();
  auto be = backend_create("cuda", kUnlimitedBytes, kUnlimitedBytes);
  try {
    be->kernels().attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, ops::AttentionSpec{});
    ADD_FAILURE() << "a missing kernel ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_forward"), std::string::npos) << e.what();
  }
}

// No data channel yet (NCCL): one rank gets one that refuses calls by name, more ranks are refused.
TEST(CudaBackend, DataChannelIsRefusedByName) {
  FP_SKIP_WITHOUT_GPU();
  auto be = backend_create("cuda", kUnlimitedBytes, kUnlimitedBytes);
  std::unique_ptr<Comm> one = comm_single();
  std::unique_ptr<DataComm> data = be->data_channel(*one);
  try {
    data->all_gather(be->compute_stream(), nullptr, nullptr, 0, DType::DType_F32);
    ADD_FAILURE() << "the cuda data channel moved something";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather"), std::string::npos) << e.what();
  }
}

// Without a GPU the backend is refused with the runtime's reason, not a crash (runs everywhere).
TEST(CudaBackend, NoGpuIsAClearError) {
  std::string why;
  if (cuda_device_available(&why)) GTEST_SKIP() << "a GPU is present";
  try {
    backend_create("cuda", kUnlimitedBytes, kUnlimitedBytes);
    ADD_FAILURE() << "created a cuda backend without a GPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no usable GPU"), std::string::npos) << e.what();
  }
}

}  // namespace fp
