// Element types. Compute is fp32 on the cpu backend; bf16/f16 exist so the meta backend and the
// planner can account tensors in the dtypes real training uses.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fp {

enum class DType : uint8_t { DType_F32, DType_F64, DType_BF16, DType_F16, DType_I32, DType_I64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::DType_F64: case DType::DType_I64: return 8;
    case DType::DType_F32: case DType::DType_I32: return 4;
    case DType::DType_BF16: case DType::DType_F16: return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::DType_F32: return "f32";
    case DType::DType_F64: return "f64";
    case DType::DType_BF16: return "bf16";
    case DType::DType_F16: return "f16";
    case DType::DType_I32: return "i32";
    case DType::DType_I64: return "i64";
  }
  return "?";
}

// Note [Half-width floats]: conversions between float and the two 16-bit formats checkpoints use.
// Widening is exact (every bf16 and f16 is a float, subnormals included). Narrowing rounds to nearest,
// ties to even, as PyTorch's .to(torch.bfloat16) / .to(torch.float16) do: values beyond the largest
// finite f16 (65504; from the midpoint 65520 up) become infinity, NaN stays a quiet NaN of the same
// sign. tests/unit/test_dtype.cpp checks all 65536 patterns both ways and every rounding tie.
inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t bf16_from_float(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf, nan
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
  const float mag = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal: man * 2^-24
  return sign ? -mag : mag;
}

inline uint16_t f16_from_float(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));  // NaN
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to infinity
  if (mag < 0x38800000u) {  // below 2^-14: an f16 subnormal, mag * 2^24 rounded (exact product)
    const float scaled = std::bit_cast<float>(mag) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  const uint32_t r = mag + 0xfffu + ((mag >> 13) & 1u) - (112u << 23);  // round at bit 13, rebias 127 -> 15
  return static_cast<uint16_t>(sign | (r >> 13));
}

// Parses "f32", "fp32", "float32", "bf16", "bfloat16", ...; throws fp::Error otherwise.
DType dtype_parse(std::string_view s);

}  // namespace fp
