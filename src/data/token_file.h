// Token files in llm.c's format (docs/data.md), so llm.c's dev/data scripts produce them directly.
//
// Dimensions: N tokens in the file, V vocabulary (model.vocab_size).
//
// Layout, little-endian, in one of llm.c's two variants:
//   header  256 x int32 (1024 bytes): [0] = magic, [1] = version, [2] = N; rest 0
//   body    N token ids: uint16 for magic 20240520, version 1 (GPT-2 sized vocabularies);
//                        uint32 for magic 20240801, version 7 (llm.c's "llama-3" variant: any vocabulary
//                        above 65,536 ids, e.g. Qwen's 151,936)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp {

inline constexpr int32_t kTokenFileMagic = 20240520;  // uint16 ids
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int32_t kTokenFileMagic32 = 20240801;  // uint32 ids
inline constexpr int32_t kTokenFileVersion32 = 7;
inline constexpr int64_t kTokenFileHeaderBytes = 256 * 4;

// The whole file in host memory (4 bytes per token whatever the variant), validated on load.
class TokenFile {
 public:
  // Reads and validates path; every problem is fp::Error with a hint: unreadable, shorter than the
  // header, wrong magic or version, length != 1024 + N x (2 or 4) (truncated or trailing data), an id >= V
  // (naming the first offending position and id).
  // flag: how the user named the file, for errors ("data.source" in a config, "--data" for eval).
  explicit TokenFile(const std::string& path, int64_t vocab_size, std::string flag = "data.source");

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }  // N
  const uint32_t* data() const { return tokens_.data(); }                  // (N)
  bool wide() const { return wide_; }  // the uint32 variant
  const std::string& path() const { return path_; }
  const std::string& flag() const { return flag_; }

 private:
  std::string path_;
  std::string flag_;
  std::vector<uint32_t> tokens_;  // (N)
  bool wide_ = false;
};

// Writes tokens in the format above via file_write_atomic (no torn file on a crash): the uint16
// variant, or with the second form the uint32 one. Throws fp::Error if N does not fit the int32 count
// or the write fails.
void token_file_write(const std::string& path, const std::vector<uint16_t>& tokens);
void token_file_write(const std::string& path, const std::vector<uint32_t>& tokens);

}  // namespace fp
