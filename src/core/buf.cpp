#include "core/buf.h"

#include "core/error.h"

namespace fp {

void buf_dtype_mismatch(DType stored, DType read) {
  throw_internal("dtype == dtype_of<T>()", __FILE__, __LINE__,
                 fmt::format("kernel operand is {}, read as {}", dtype_name(stored), dtype_name(read)));
}

void buf_dtype_refused(const char* kernel, DType t) {
  throw Error(fmt::format("kernel {} does not take {} operands", kernel, dtype_name(t)),
              "the cpu kernels read and write f32 and bf16");
}

}  // namespace fp
