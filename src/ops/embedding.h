// Token embedding. n tokens, H hidden, V vocabulary (the table's rows).
#pragma once

#include <cstdint>

namespace fp::ops::cpu {

// out (n, H) = table (V, H) [tokens (n)]. Ids are validated before (data loader); asserts 0 <= id.
void embedding_forward(const int32_t* tokens, const float* table, float* out, int64_t n, int64_t H);
// dtable (V, H) += scatter of dout (n, H) by tokens; deterministic (same bits for any thread count).
void embedding_backward(const int32_t* tokens, const float* dout, float* dtable, int64_t n, int64_t H);

}  // namespace fp::ops::cpu
