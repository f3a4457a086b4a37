// Test helpers for files: a fresh temporary directory, and an expected fp::Error.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace fp::test_files {

// A fresh directory under /tmp (named by `tag`, the process and a counter), removed with everything in it at
// the end of the test.
struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const char* tag = "fp_test") {
    static int counter = 0;
    dir = std::filesystem::temp_directory_path() / fmt::format("{}_{}_{}", tag, ::getpid(), counter++);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

// Runs f, which must throw fp::Error whose message contains every one of `parts` and has a hint.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    EXPECT_FALSE(e.hint().empty()) << "no hint for: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected fp::Error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected fp::Error mentioning '" << (parts.empty() ? "" : parts[0]) << "', nothing thrown";
}

}  // namespace fp::test_files
