// llm.c token files: reader with validation, atomic writer (format in token_file.h).
//
// Dimensions: N tokens, V vocabulary.
#include "data/token_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "io/atomic_file.h"

namespace fp {
namespace {

constexpr const char* kFormatHint =
    "it must be an llm.c-format .bin: a 1024-byte header (int32 magic 20240520, version 1, token "
    "count) then uint16 tokens, or magic 20240801, version 7, then uint32 tokens; write one with "
    "scripts/make_token_file.py or llm.c's dev/data scripts";

int32_t le_i32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

void le_put_i32(char* p, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int b = 0; b < 4; ++b) p[b] = static_cast<char>((u >> (8 * b)) & 0xFF);
}

}  // namespace

TokenFile::TokenFile(const std::string& path, int64_t vocab_size, std::string flag)
    : path_(path), flag_(std::move(flag)) {
  std::error_code ec;
  FP_CHECK(!std::filesystem::is_directory(path, ec), flag_ + " must name a file", "token file '{}' is a directory",
           path);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  FP_CHECK(in.good(), "check the path (" + flag_ + ")", "cannot read token file '{}': {}", path,
           std::strerror(errno));
  const int64_t bytes = static_cast<int64_t>(in.tellg());
  FP_CHECK(bytes >= kTokenFileHeaderBytes, kFormatHint,
           "token file '{}' has {} bytes, fewer than its {}-byte header", path, bytes, kTokenFileHeaderBytes);
  in.seekg(0);
  unsigned char header[kTokenFileHeaderBytes];
  in.read(reinterpret_cast<char*>(header), kTokenFileHeaderBytes);
  FP_CHECK(in.good(), "check the file", "cannot read the header of token file '{}'", path);

  const int32_t magic = le_i32(header), version = le_i32(header + 4), count = le_i32(header + 8);
  FP_CHECK(magic == kTokenFileMagic || magic == kTokenFileMagic32, kFormatHint,
           "token file '{}' has magic {} (expected {} for uint16 tokens or {} for uint32)", path, magic,
           kTokenFileMagic, kTokenFileMagic32);
  wide_ = magic == kTokenFileMagic32;
  const int32_t want_version = wide_ ? kTokenFileVersion32 : kTokenFileVersion;
  FP_CHECK(version == want_version, kFormatHint, "token file '{}' has magic {} and version {} (expected {}: {} tokens)",
           path, magic, version, want_version, wide_ ? "uint32" : "uint16");
  FP_CHECK(count >= 0, kFormatHint, "token file '{}' has a negative token count {}", path, count);
  const int64_t width = wide_ ? 4 : 2;
  const int64_t expected = kTokenFileHeaderBytes + width * static_cast<int64_t>(count);
  FP_CHECK(bytes >= expected, "the file was cut short (an interrupted download or copy?): rewrite it",
           "token file '{}' is truncated: its header says {} tokens, so {} bytes expected, but it has {} bytes",
           path, count, expected, bytes);
  FP_CHECK(bytes <= expected, "the header's token count does not match the body: rewrite the file",
           "token file '{}' has trailing data: its header says {} tokens, so {} bytes expected, but it has {} bytes",
           path, count, expected, bytes);

  std::vector<unsigned char> body(static_cast<size_t>(width * count));
  in.read(reinterpret_cast<char*>(body.data()), static_cast<std::streamsize>(body.size()));
  FP_CHECK(in.good() || count == 0, "check the file", "cannot read the {} tokens of token file '{}'", count, path);
  tokens_.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {  // little-endian on any host
    const unsigned char* b = body.data() + width * i;
    tokens_[i] = wide_ ? (uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24)
                       : (uint32_t{b[0]} | uint32_t{b[1]} << 8);
  }

  for (int64_t i = 0; i < count; ++i)
    FP_CHECK(static_cast<int64_t>(tokens_[i]) < vocab_size,
             fmt::format("the tokenizer's vocabulary must not exceed model.vocab_size = {} (GPT-2 "
                         "tokens need model.vocab_size >= 50257)", vocab_size),
             "token file '{}': token {} at position {} is >= model.vocab_size = {}", path, tokens_[i], i,
             vocab_size);
}

namespace {
template <class T>
void token_file_write_as(const std::string& path, const std::vector<T>& tokens, int32_t magic, int32_t version) {
  const auto n = static_cast<int64_t>(tokens.size());
  FP_CHECK(n <= std::numeric_limits<int32_t>::max(), "split the tokens into several files",
           "cannot write {} tokens to '{}': the header's int32 count holds at most {}", n, path,
           std::numeric_limits<int32_t>::max());
  const int64_t width = sizeof(T);
  std::string buf(static_cast<size_t>(kTokenFileHeaderBytes + width * n), '\0');
  le_put_i32(buf.data(), magic);
  le_put_i32(buf.data() + 4, version);
  le_put_i32(buf.data() + 8, static_cast<int32_t>(n));
  char* body = buf.data() + kTokenFileHeaderBytes;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < width; ++k) body[width * i + k] = static_cast<char>((tokens[i] >> (8 * k)) & 0xFF);
  file_write_atomic(path, buf);
}
}  // namespace

void token_file_write(const std::string& path, const std::vector<uint16_t>& tokens) {
  token_file_write_as(path, tokens, kTokenFileMagic, kTokenFileVersion);
}

void token_file_write(const std::string& path, const std::vector<uint32_t>& tokens) {
  token_file_write_as(path, tokens, kTokenFileMagic32, kTokenFileVersion32);
}

}  // namespace fp
