// Byte sizes as users write them: "512MiB", "2GiB", "1.5 GiB", "4096", "unlimited".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fp {

inline constexpr uint64_t kUnlimitedBytes = UINT64_MAX;

// Units KiB/MiB/GiB/TiB (powers of 1024), KB/MB/GB/TB (powers of 1000), B or none (bytes).
// "unlimited"/"inf"/"0" ... see units.cpp. Throws fp::Error on anything else.
uint64_t bytes_parse(std::string_view s);

// 1536 -> "1.50 KiB"; kUnlimitedBytes -> "unlimited".
std::string bytes_format(uint64_t bytes);

}  // namespace fp
