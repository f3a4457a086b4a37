// CPUID leaves used: 0 (vendor), 1 (family, model; ECX: FMA bit 12, OSXSAVE bit 27, AVX bit 28),
// 7.0 (EBX: AVX2 bit 5, AVX512F 16, AVX512DQ 17, AVX512BW 30, AVX512VL 31; EDX: AMX-BF16 bit 22),
// 7.1 (EAX: AVX512_BF16 bit 5), 0x80000002-4 (brand string). XCR0 (XGETBV 0): bits 1-2 SSE/AVX state,
// 5-7 the AVX-512 state, 17-18 the AMX tile state; a feature counts only when its state is enabled.
#include "backend/cpu/kernels/cpu_features.h"

#include <cpuid.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backend/cpu/kernels/ops.h"

namespace fp::ops::cpu {

namespace {

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(uint32_t r, int b) { return ((r >> b) & 1u) != 0; }

CpuFeatures read() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return f;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;

  __get_cpuid(1, &a, &b, &c, &d);
  const int base_family = static_cast<int>((a >> 8) & 0xF), base_model = static_cast<int>((a >> 4) & 0xF);
  f.family = base_family == 0xF ? base_family + static_cast<int>((a >> 20) & 0xFF) : base_family;
  f.model =
      (base_family == 0x6 || base_family == 0xF) ? base_model + (static_cast<int>((a >> 16) & 0xF) << 4) : base_model;
  const bool osxsave = bit(c, 27);
  const uint64_t x = osxsave ? xcr0() : 0;
  const bool ymm = (x & 0x6) == 0x6, zmm = ymm && (x & 0xE0) == 0xE0, tiles = (x & 0x60000) == 0x60000;
  f.avx = ymm && bit(c, 28);
  f.fma = ymm && bit(c, 12);
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    const unsigned sub_leaves = a;
    f.avx2 = ymm && bit(b, 5);
    f.avx512f = zmm && bit(b, 16);
    f.avx512dq = zmm && bit(b, 17);
    f.avx512bw = zmm && bit(b, 30);
    f.avx512vl = zmm && bit(b, 31);
    f.amx_bf16 = tiles && bit(d, 22);
    if (sub_leaves >= 1) {
      __get_cpuid_count(7, 1, &a, &b, &c, &d);
      f.avx512_bf16 = zmm && bit(a, 5);
    }
  }
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) != 0 && a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
    while (!f.brand.empty() && f.brand.front() == ' ') f.brand.erase(0, 1);
  }
  return f;
}

}  // namespace

std::string CpuFeatures::simd_class() const {
  if (avx512f && avx512bw && avx512dq && avx512vl) return "avx512";
  if (avx2 && fma) return "avx2";
  if (avx) return "avx";
  return "sse";
}

std::string CpuFeatures::str() const {
  std::string have, lack;
  auto add = [&](bool on, const char* name) {
    std::string& s = on ? have : lack;
    s += s.empty() ? "" : on ? " " : ", ";
    s += name;
  };
  add(avx2, "avx2");
  add(fma, "fma");
  add(avx512f && avx512bw && avx512dq && avx512vl, "avx512");
  add(avx512_bf16, "avx512_bf16");
  add(amx_bf16, "amx_bf16");
  return fmt::format("{} family {} model {}{}: {}{}", vendor, family, model, brand.empty() ? "" : " (" + brand + ")",
                     have.empty() ? "-" : have, lack.empty() ? "" : "; lacks " + lack);
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = read();
  return f;
}

SimdLevel simd_level() {
  static const SimdLevel level = [] {
    const CpuFeatures& f = cpu_features();
    const SimdLevel best = !f.avx2             ? SimdLevel::sse2
                           : !f.fma            ? SimdLevel::avx2
                           : f.simd_class() == "avx512" ? SimdLevel::avx512
                                                        : SimdLevel::fma;
    const char* force = std::getenv("FLATPEAK_SIMD");
    const std::string_view v = force != nullptr ? force : "";
    SimdLevel want = best;
    if (v == "baseline" || v == "sse2") {
      want = SimdLevel::sse2;
    } else if (v == "avx2") {
      want = SimdLevel::avx2;
    } else if (v == "fma") {
      want = SimdLevel::fma;
    } else if (!v.empty() && v != "avx512") {  // often read during static initialisation: say it, do not throw
      std::fprintf(stderr,
                   "[flatpeak] FLATPEAK_SIMD=%s is not one of baseline, avx2, fma, avx512: using the best this CPU "
                   "has\n",
                   force);
    }
    return want < best ? want : best;
  }();
  return level;
}

const char* simd_level_name(SimdLevel s) {
  switch (s) {
    case SimdLevel::sse2:
      return "sse2";
    case SimdLevel::avx2:
      return "avx2";
    case SimdLevel::fma:
      return "avx2+fma";
    case SimdLevel::avx512:
      return "avx512";
  }
  return "?";
}

}  // namespace fp::ops::cpu
