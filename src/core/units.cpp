#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/dtype.h"
#include "core/error.h"

namespace fp {

uint64_t bytes_parse(std::string_view s) {
  std::string str(s);
  auto bad = [&] {
    return Error(fmt::format("invalid size '{}'", str),
                 "write a number with an optional unit: 4096, 512KiB, 512MiB, 2GiB, 1TiB (or KB/MB/GB/TB "
                 "for powers of 1000), or 'unlimited'");
  };
  size_t i = 0;
  while (i < str.size() && std::isspace(static_cast<unsigned char>(str[i]))) ++i;
  std::string rest = str.substr(i);
  if (rest == "unlimited" || rest == "inf") return kUnlimitedBytes;
  const char* begin = rest.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(value) || value < 0) throw bad();
  std::string unit(end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KiB" || unit == "K" || unit == "k") mult = 1024.0;
  else if (unit == "MiB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB" || unit == "kB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else throw bad();
  double bytes = value * mult;
  if (bytes >= 1.8e19) throw bad();
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string bytes_format(uint64_t bytes) {
  if (bytes == kUnlimitedBytes) return "unlimited";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", v, units[u]);
}

DType dtype_parse(std::string_view s) {
  if (s == "f32" || s == "fp32" || s == "float32") return DType::DType_F32;
  if (s == "f64" || s == "fp64" || s == "float64") return DType::DType_F64;
  if (s == "bf16" || s == "bfloat16") return DType::DType_BF16;
  if (s == "f16" || s == "fp16" || s == "float16") return DType::DType_F16;
  if (s == "i32" || s == "int32") return DType::DType_I32;
  if (s == "i64" || s == "int64") return DType::DType_I64;
  throw Error(fmt::format("unknown dtype '{}'", s), "use one of f32, bf16, f16, f64, i32, i64");
}

}  // namespace fp
