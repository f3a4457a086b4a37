#include "core/error.h"

namespace fp {

void throw_internal(const char* cond, const char* file, int line, const std::string& msg) {
  throw InternalError(fmt::format("internal error: {} failed at {}:{}{}{} (please report this)", cond,
                                  file, line, msg.empty() ? "" : ": ", msg));
}

}  // namespace fp
