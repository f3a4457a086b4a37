#include <gtest/gtest.h>

#include "core/error.h"
#include "core/units.h"

namespace fp {

TEST(Units, ParsesEveryUnit) {
  EXPECT_EQ(bytes_parse("4096"), 4096u);
  EXPECT_EQ(bytes_parse("4096B"), 4096u);
  EXPECT_EQ(bytes_parse("2KiB"), 2048u);
  EXPECT_EQ(bytes_parse("512MiB"), 512ull << 20);
  EXPECT_EQ(bytes_parse("1.5GiB"), 3ull << 29);
  EXPECT_EQ(bytes_parse("2 TiB"), 2ull << 40);
  EXPECT_EQ(bytes_parse("3GB"), 3'000'000'000ull);
  EXPECT_EQ(bytes_parse("unlimited"), kUnlimitedBytes);
}

TEST(Units, RejectsGarbageWithAHint) {
  for (const char* bad : {"", "MiB", "12XB", "-5MiB", "1e30TiB", "abc"}) {
    try {
      bytes_parse(bad);
      FAIL() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("invalid size"), std::string::npos) << e.what();
      EXPECT_NE(e.hint().find("MiB"), std::string::npos);
    }
  }
}

TEST(Units, Formats) {
  EXPECT_EQ(bytes_format(512), "512 B");
  EXPECT_EQ(bytes_format(1536), "1.50 KiB");
  EXPECT_EQ(bytes_format(512ull << 20), "512.00 MiB");
  EXPECT_EQ(bytes_format(kUnlimitedBytes), "unlimited");
}

}  // namespace fp
