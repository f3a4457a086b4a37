// Token embedding. n tokens, H hidden, V vocabulary (the table's rows).
//
// bf16 (Note [Kernel operands carry their dtype] in core/buf.h): table, out, dout and dtable are each
// f32 or bf16 on its own; token ids stay int32. Forward copies rows, converting when out's dtype is not
// the table's. Backward adds in f32 in token order and rounds a bf16 dtable row once per call (not
// once per token, which would lose a frequent token's small gradients), so a bf16 dtable has the bits
// of the f32 kernel on the widened operands, rounded.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// out (n, H) = table (V, H) [tokens (n)]. Ids are validated before (data loader); asserts 0 <= id.
using embedding_forward_fn = void(const int32_t* tokens, CBuf table, Buf out, int64_t n, int64_t H);

// dtable (V, H) += scatter of dout (n, H) by tokens; deterministic (same bits for any thread count).
using embedding_backward_fn = void(const int32_t* tokens, CBuf dout, Buf dtable, int64_t n, int64_t H);

}  // namespace fp::ops
