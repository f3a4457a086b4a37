// GEMM libraries side by side in one run (issue 14: "measure oneDNN 2.6.3 from Debian against 3.x from
// PyPI and pick"): for each shape, the rate of OpenBLAS's cblas_sgemm (core type as pinned by the
// caller's OPENBLAS_CORETYPE) and of oneDNN's matmul in f32 and in bf16 (bf16 inputs, f32 output, f32
// accumulation), each built once with a runtime M as an expert GEMM would be, and the name of the
// implementation oneDNN chose (e.g. "brg:avx512_core_amx", "gemm:jit", "ref:any").
//
// The layout is flatpeak's linear layer: y (M, N) = x (M, K) W^T, W stored (N, K) row-major.
// Rates are GFLOP/s (2 M N K per call), the median of `repeats` calls after one warm-up call.
// Usage: gemm_libs [repeats] ; prints one line per (shape, library); exits non-zero when an f32 matmul
// cannot be made (a bf16 one the CPU cannot run is reported, not an error).
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <dnnl.hpp>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

double median_rate(const std::function<void()>& call, double flops, int repeats) {
  call();
  std::vector<double> rates;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    rates.push_back(flops / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

// A matmul primitive for (runtime M, K) x (K, N)^T in dtype `in`, output f32, and the implementation name.
struct Matmul {
  dnnl::matmul prim;
  std::string impl;
};

Matmul matmul_make(const dnnl::engine& eng, int64_t N, int64_t K, dnnl::memory::data_type in) {
  using dnnl::memory;
  const memory::desc a({DNNL_RUNTIME_DIM_VAL, K}, in, {K, 1});
  const memory::desc b({K, N}, in, {1, K});  // W^T as a strided view of W (N, K)
  const memory::desc c({DNNL_RUNTIME_DIM_VAL, N}, memory::data_type::f32, {N, 1});
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::matmul::primitive_desc pd(eng, a, b, c);
#else
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
#endif
  return {dnnl::matmul(pd), pd.impl_info_str()};
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 9;
  const dnnl_version_t* v = dnnl_version();
  std::printf("oneDNN %d.%d.%d (cpu runtime %s); OpenBLAS %s\n", v->major, v->minor, v->patch,
              v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other", openblas_get_config());
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  // (M, N, K): MoE expert GEMMs of the shapes, the attention projections, a square reference.
  const int64_t shapes[][3] = {{4096, 256, 1024}, {4096, 1024, 256}, {8192, 1024, 1024}, {4096, 1024, 1024},
                               {2048, 2048, 2048}};
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int failures = 0;
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    std::vector<float> x(static_cast<size_t>(M * K)), w(static_cast<size_t>(N * K)), y(static_cast<size_t>(M * N));
    for (float& e : x) e = u(gen);
    for (float& e : w) e = u(gen);
    const double blas = median_rate(
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
                      static_cast<int>(K), 1.0f, x.data(), static_cast<int>(K), w.data(), static_cast<int>(K), 0.0f,
                      y.data(), static_cast<int>(N));
        },
        flops, repeats);
    std::printf("M=%-5lld N=%-5lld K=%-5lld  openblas f32  %7.1f GFLOP/s  (core %s)\n", static_cast<long long>(M),
                static_cast<long long>(N), static_cast<long long>(K), blas, openblas_get_corename());
    for (const auto dt : {dnnl::memory::data_type::f32, dnnl::memory::data_type::bf16}) {
      const char* dname = dt == dnnl::memory::data_type::f32 ? "f32 " : "bf16";
      try {
        const Matmul mm = matmul_make(eng, N, K, dt);
        const size_t es = dt == dnnl::memory::data_type::f32 ? 4 : 2;
        std::vector<char> xb(static_cast<size_t>(M * K) * es), wb(static_cast<size_t>(N * K) * es);
        if (es == 4) {
          std::copy_n(reinterpret_cast<const char*>(x.data()), xb.size(), xb.data());
          std::copy_n(reinterpret_cast<const char*>(w.data()), wb.size(), wb.data());
        } else {  // bf16: the high half of each float (truncation is fine for a rate)
          for (size_t i = 0; i < x.size(); ++i) std::copy_n(reinterpret_cast<const char*>(&x[i]) + 2, 2, &xb[2 * i]);
          for (size_t i = 0; i < w.size(); ++i) std::copy_n(reinterpret_cast<const char*>(&w[i]) + 2, 2, &wb[2 * i]);
        }
        using dnnl::memory;
        memory xm(memory::desc({M, K}, dt, {K, 1}), eng, xb.data());
        memory wm(memory::desc({K, N}, dt, {1, K}), eng, wb.data());
        memory ym(memory::desc({M, N}, memory::data_type::f32, {N, 1}), eng, y.data());
        const double rate = median_rate(
            [&] {
              mm.prim.execute(strm, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
              strm.wait();
            },
            flops, repeats);
        std::printf("M=%-5lld N=%-5lld K=%-5lld  onednn   %s %7.1f GFLOP/s  (%s; %.2fx openblas f32)\n",
                    static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K), dname, rate,
                    mm.impl.c_str(), rate / blas);
      } catch (const dnnl::error& e) {
        std::printf("M=%-5lld N=%-5lld K=%-5lld  onednn   %s unavailable: %s\n", static_cast<long long>(M),
                    static_cast<long long>(N), static_cast<long long>(K), dname, e.what());
        if (dt == dnnl::memory::data_type::f32) ++failures;  // bf16 without hardware support: expected
      }
    }
  }
  return failures == 0 ? 0 : 1;
}
