// Token files in llm.c's format (docs/data.md), so llm.c's dev/data scripts produce them directly.
//
// Dimensions: N tokens in the file, V vocabulary (model.vocab_size).
//
// Layout, little-endian:
//   header  256 x int32 (1024 bytes): [0] = 20240520 (magic), [1] = 1 (version), [2] = N; rest 0
//   body    N x uint16 token ids
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderBytes = 256 * 4;

// The whole file in host memory (2 bytes per token), validated on load.
class TokenFile {
 public:
  // Reads and validates path; every problem is fp::Error with a hint: unreadable, shorter than the
  // header, wrong magic or version, length != 1024 + 2N (truncated or trailing data), an id >= V
  // (naming the first offending position and id).
  // flag: how the user named the file, for errors ("data.source" in a config, "--data" for eval).
  explicit TokenFile(const std::string& path, int64_t vocab_size, std::string flag = "data.source");

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }  // N
  const uint16_t* data() const { return tokens_.data(); }                  // (N)
  const std::string& path() const { return path_; }
  const std::string& flag() const { return flag_; }

 private:
  std::string path_;
  std::string flag_;
  std::vector<uint16_t> tokens_;  // (N)
};

// Writes tokens in the format above via file_write_atomic (no torn file on a crash).
// Throws fp::Error if N does not fit the int32 count or the write fails.
void token_file_write(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace fp
