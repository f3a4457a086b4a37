// What every engine shares: the bf16 sum over ranks (Note [Summing bf16 over ranks] in comm.h).
#include <algorithm>

#include "comm/comm.h"

namespace fp {

void comm_sum_bf16(const uint16_t* const* in, int P, int64_t n, uint16_t* out) {
  constexpr int64_t kBlock = 512;  // f32 partial sums on the stack, a block of elements at a time
  float acc[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t m = std::min(kBlock, n - i0);
    for (int64_t i = 0; i < m; ++i) acc[i] = bf16_to_float(in[0][i0 + i]);
    for (int r = 1; r < P; ++r) {
      const uint16_t* x = in[r] + i0;
      for (int64_t i = 0; i < m; ++i) acc[i] += bf16_to_float(x[i]);
    }
    for (int64_t i = 0; i < m; ++i) out[i0 + i] = bf16_from_float(acc[i]);
  }
}

}  // namespace fp
