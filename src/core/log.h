// Progress lines for long work go to stderr so stdout stays machine-readable.
#pragma once

#include <fmt/format.h>

#include <cstdio>

namespace fp {

template <class... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  fmt::print(stderr, "[flatpeak] {}\n", fmt::format(f, std::forward<Args>(args)...));
  std::fflush(stderr);
}

}  // namespace fp
