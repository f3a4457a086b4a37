// Element types. Compute is fp32 on the cpu backend; bf16/f16 exist so the meta backend and the
// planner can account tensors in the dtypes real training uses.
#pragma once

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

// Parses "f32", "fp32", "float32", "bf16", "bfloat16", ...; throws fp::Error otherwise.
DType dtype_parse(std::string_view s);

}  // namespace fp
