// Note [CRC32C] (io/crc32c.h): the hardware and the table version against the standard's check values
// and each other.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "io/crc32c.h"

namespace fp {

TEST(Crc32c, StandardCheckValues) {
  const char* digits = "123456789";
  EXPECT_EQ(crc32c(digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_extend_portable(0, digits, 9), 0xE3069283u);
  // RFC 3720 (iSCSI), B.4: 32 bytes of zeros, of 0xFF, and 0, 1, ..., 31.
  std::vector<unsigned char> b(32, 0);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x8A9136AAu);
  std::fill(b.begin(), b.end(), 0xFF);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, HardwareEqualsTableAtEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(4096 + 16);
  for (auto& c : buf) c = static_cast<unsigned char>(rng());
  for (size_t off = 0; off < 9; ++off)
    for (size_t n : {0, 1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4096}) {
      const uint32_t want = crc32c_extend_portable(0, buf.data() + off, n);
      EXPECT_EQ(crc32c(buf.data() + off, n), want) << "offset " << off << ", " << n << " bytes";
      // In two pieces: extending equals the whole.
      const size_t cut = n / 3;
      EXPECT_EQ(crc32c_extend(crc32c(buf.data() + off, cut), buf.data() + off + cut, n - cut), want);
    }
}

TEST(Crc32c, FileInBlocksEqualsTheBuffer) {
  test_files::TempDir tmp("fp_crc32c");
  std::vector<unsigned char> data((3u << 20) + 12345);
  std::mt19937 rng(3);
  for (auto& c : data) c = static_cast<unsigned char>(rng());
  {
    std::ofstream f(tmp.file("x"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  const FileChecksum c = file_crc32c(tmp.file("x"));
  EXPECT_EQ(c.bytes, data.size());
  EXPECT_EQ(c.crc32c, crc32c(data.data(), data.size()));
  data[data.size() / 2] ^= 1;  // one bit flipped changes it
  EXPECT_NE(c.crc32c, crc32c(data.data(), data.size()));
  test_files::expect_error([&] { file_crc32c(tmp.file("missing")); }, {"cannot read", "missing"});
}

}  // namespace fp
