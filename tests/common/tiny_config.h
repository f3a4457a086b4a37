// The text of configs/tiny.toml (tests that parse or edit the demo config).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace fp {

inline std::string tiny_text() {
  std::ifstream in(std::string(FLATPEAK_SOURCE_DIR) + "/configs/tiny.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace fp
