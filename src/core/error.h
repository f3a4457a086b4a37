// flatpeak errors.
//
// Two kinds of checks (see STYLE.md):
//   FP_CHECK(cond, hint, fmt, args...)  a user error (bad config, bad file, out of memory): throws
//                                       fp::Error with a message a user can act on and a hint.
//   FP_ASSERT(cond)                     an internal invariant: throws fp::InternalError naming the
//                                       file and line. Never caused by user input.
// The library never calls exit(); the CLI prints the error and exits non-zero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace fp {

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string hint = {})
      : std::runtime_error(std::move(what)), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void throw_internal(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace fp

#define FP_CHECK(cond, hint, ...)                                                   \
  do {                                                                              \
    if (!(cond)) throw ::fp::Error(::fmt::format(__VA_ARGS__), (hint));             \
  } while (0)

#define FP_ASSERT(cond, ...)                                                        \
  do {                                                                              \
    if (!(cond)) ::fp::throw_internal(#cond, __FILE__, __LINE__, ::fmt::format("" __VA_ARGS__)); \
  } while (0)
