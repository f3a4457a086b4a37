// bf16 GEMMs through oneDNN (Note [bf16 GEMMs on the matrix units] in backend/cpu/kernels/gemm_onednn.h).
#include "backend/cpu/kernels/gemm_onednn.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "backend/cpu/kernels/cpu_features.h"
#include "backend/cpu/kernels/ops.h"
#include "core/error.h"

#if FLATPEAK_HAVE_ONEDNN
#include <dnnl.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>
#endif

namespace fp::ops::cpu {

namespace {

// Whether bf16 GEMMs go to oneDNN, decided once (FLATPEAK_BF16_GEMM, the CPU, the build), and why.
struct Bf16Route {
  bool onednn = false;
  std::string why;
};

const Bf16Route& bf16_route() {
  static const Bf16Route r = [] {
    const CpuFeatures& f = cpu_features();
    const bool units = f.avx512_bf16 || f.amx_bf16;
    const char* env = std::getenv("FLATPEAK_BF16_GEMM");
    const std::string_view v = env != nullptr ? env : "";
    Bf16Route out;
    if (!v.empty() && v != "widen" && v != "onednn")
      std::fprintf(stderr, "[flatpeak] FLATPEAK_BF16_GEMM=%s is not one of widen, onednn: choosing as if unset\n", env);
    if (v == "widen") {
      out.why = "FLATPEAK_BF16_GEMM=widen";
      return out;
    }
#if FLATPEAK_HAVE_ONEDNN
    if (!units) {
      FP_CHECK(v != "onednn", "unset FLATPEAK_BF16_GEMM, or run on a CPU with AVX512_BF16 or AMX-BF16",
               "FLATPEAK_BF16_GEMM=onednn: this CPU has no bf16 units (AVX512_BF16 or AMX-BF16)");
      out.why = "no AVX512_BF16 or AMX-BF16";
      return out;
    }
    out.onednn = true;
    out.why = v == "onednn" ? "FLATPEAK_BF16_GEMM=onednn" : f.amx_bf16 ? "AMX-BF16" : "AVX512_BF16";
#else
    FP_CHECK(v != "onednn", "install libdnnl-dev (scripts/deps build does) and rebuild",
             "FLATPEAK_BF16_GEMM=onednn: this flatpeak was built without oneDNN");
    out.why = units ? "built without oneDNN" : "no AVX512_BF16 or AMX-BF16";
#endif
    return out;
  }();
  return r;
}

#if FLATPEAK_HAVE_ONEDNN

using dnnl::memory;
using Dims = memory::dims;

// What a primitive is built for: the transposes, C's dtype and beta (a sum post-op's scale is fixed
// at creation in oneDNN 2.x). M, N, K, the leading dimensions and alpha are run-time arguments, so a
// run builds a handful of primitives whatever its shapes: keyed by the dimensions, the experts' weight
// gradients (K = the tokens an expert got, new every step) grew the cache by 52 MiB per 1000 steps
// (cli_soak_short). kMaxMatmuls bounds it should a caller bring many betas: past it, the widening path.
using Key = std::tuple<bool, bool, bool, float>;
constexpr size_t kMaxMatmuls = 64;

struct Matmul {
  dnnl::matmul prim;
  std::string impl;  // the implementation oneDNN chose ("gemm:jit", "brg:avx512_core_amx", ...)
  size_t scratch = 0;
};

struct OneDnn {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<Key, std::shared_ptr<const Matmul>> cache;  // null: oneDNN had no primitive for the key
  std::string impls;                                   // every implementation built so far, once each
};

OneDnn& onednn() {
  static OneDnn o;
  return o;
}

// op(A) (M, K) of A stored (M, K) with rows lda apart, or (K, M) when transposed; likewise op(B) (K, N).
memory::desc operand(int64_t rows, int64_t cols, bool trans, int64_t ld, memory::data_type t) {
  return memory::desc(Dims{rows, cols}, t, trans ? Dims{1, ld} : Dims{ld, 1});
}
constexpr int64_t kRt = DNNL_RUNTIME_DIM_VAL;

std::shared_ptr<const Matmul> matmul_get(const Key& key) {
  OneDnn& o = onednn();
  std::lock_guard<std::mutex> lock(o.mu);
  auto it = o.cache.find(key);
  if (it != o.cache.end()) return it->second;
  if (o.cache.size() >= kMaxMatmuls) return nullptr;
  const auto [ta, tb, c_bf16, beta] = key;
  const auto bf16 = memory::data_type::bf16;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});  // alpha
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  std::shared_ptr<const Matmul> m;
  try {
    const dnnl::matmul::desc d(operand(kRt, kRt, ta, kRt, bf16), operand(kRt, kRt, tb, kRt, bf16),
                               memory::desc(Dims{kRt, kRt}, c_bf16 ? bf16 : memory::data_type::f32, Dims{kRt, 1}));
    const dnnl::matmul::primitive_desc pd(d, attr, o.eng);
    auto mm = std::make_shared<Matmul>();
    mm->prim = dnnl::matmul(pd);
    mm->impl = pd.impl_info_str();
    mm->scratch = pd.scratchpad_desc().get_size();
    if (o.impls.find(mm->impl) == std::string::npos) o.impls += (o.impls.empty() ? "" : ", ") + mm->impl;
    m = std::move(mm);
  } catch (const dnnl::error&) {
    // No primitive for this layout (oneDNN 2.6 builds every matmul we ask for on AVX512_BF16; kept so a
    // shape it refuses still computes, on the widening path).
  }
  o.cache.emplace(key, m);
  return m;
}

#endif  // FLATPEAK_HAVE_ONEDNN

}  // namespace

bool gemm_bf16_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, CBuf A, int64_t lda,
                      CBuf B, int64_t ldb, float beta, Buf C, int64_t ldc) {
  if (A.dtype != DType::DType_BF16 || B.dtype != DType::DType_BF16 || M == 0 || N == 0 || K == 0) return false;
  if (!bf16_route().onednn) return false;
#if FLATPEAK_HAVE_ONEDNN
  const bool c_bf16 = C.dtype == DType::DType_BF16;
  const std::shared_ptr<const Matmul> mm = matmul_get(Key{trans_a, trans_b, c_bf16, beta});
  if (!mm) return false;
  const auto bf16 = memory::data_type::bf16;
  const dnnl::engine& eng = onednn().eng;
  thread_local std::vector<char> scratch;
  if (scratch.size() < mm->scratch) scratch.resize(mm->scratch);
  memory a(operand(M, K, trans_a, lda, bf16), eng, const_cast<void*>(A.p));
  memory b(operand(K, N, trans_b, ldb, bf16), eng, const_cast<void*>(B.p));
  memory c(memory::desc(Dims{M, N}, c_bf16 ? bf16 : memory::data_type::f32, Dims{ldc, 1}), eng, C.p);
  memory s(memory::desc(Dims{static_cast<int64_t>(mm->scratch)}, memory::data_type::u8, Dims{1}), eng,
           scratch.data());
  float scale = alpha;
  memory sc(memory::desc(Dims{1}, memory::data_type::f32, Dims{1}), eng, &scale);
  thread_local dnnl::stream strm(eng);  // in-order, synchronous on the OpenMP runtime: one per thread
  mm->prim.execute(strm, {{DNNL_ARG_SRC, a},
                          {DNNL_ARG_WEIGHTS, b},
                          {DNNL_ARG_DST, c},
                          {DNNL_ARG_SCRATCHPAD, s},
                          {DNNL_ARG_ATTR_OUTPUT_SCALES, sc}});
  strm.wait();
  return true;
#else
  return false;
#endif
}

bool gemm_bf16_onednn_active() { return bf16_route().onednn; }

std::string gemm_bf16_library() {
  const Bf16Route& r = bf16_route();
  if (!r.onednn) return fmt::format("widened to f32, OpenBLAS sgemm ({})", r.why);
#if FLATPEAK_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  std::string isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx:
      isa = "avx512_core_amx";
      break;
    case dnnl::cpu_isa::avx512_core_bf16:
      isa = "avx512_core_bf16";
      break;
    default:
      isa = fmt::format("cpu_isa {}", static_cast<int>(dnnl::get_effective_cpu_isa()));
  }
  OneDnn& o = onednn();
  std::lock_guard<std::mutex> lock(o.mu);
  return fmt::format("oneDNN {}.{}.{} matmul, isa {} ({}); implementations: {}", v->major, v->minor, v->patch, isa,
                     r.why, o.impls.empty() ? "none built yet" : o.impls);
#else
  return "";
#endif
}

}  // namespace fp::ops::cpu
