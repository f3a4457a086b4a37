// RMSNorm over the last dimension: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// rows independent rows of width d (d = H for layer norms, d = head_dim for q_norm/k_norm).
//
// bf16 (Note [Kernel operands carry their dtype] in core/buf.h): x, w, y, dy, dx and dw are each f32 or
// bf16 on its own (bf16 activations with an f32 or a bf16 weight). The math stays f32 with double row
// sums: bf16 loads are exact and each output is rounded once per call (dw += too), so a bf16 result
// has the bits of the f32 kernel on the widened operands, rounded. rstd and the workspace are f32
// whatever the recipe: statistics, kept at the precision the backward needs.
#pragma once

#include <cstdint>

#include "core/buf.h"

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// x (rows, d), w (d) -> y (rows, d); rstd (rows) is written when not null. y may alias x (then both
// have the same dtype).
using rmsnorm_forward_fn = void(CBuf x, CBuf w, Buf y, float* rstd, int64_t rows, int64_t d, float eps);

// Given x, w, rstd from forward and dy (rows, d): dx (rows, d) is overwritten, dw (d) accumulated (+=).
// dw's reduction order is fixed (independent of the thread count), so results are bitwise reproducible.
// workspace: rmsnorm_backward_workspace(rows, d) floats of scratch (the dw partials), which the caller
// allocates through the ledger (category workspace), so that no op holds memory the ledger cannot see.
using rmsnorm_backward_fn = void(CBuf x, CBuf w, const float* rstd, CBuf dy, Buf dx, Buf dw, int64_t rows, int64_t d,
                                 float* workspace);

// The floats rmsnorm_backward needs for (rows, d): a host query of the shapes, each backend's own (the
// cpu's: B x d for B <= 256 row blocks, Note [Deterministic rmsnorm dw] in backend/cpu/kernels/rmsnorm.cpp).
using rmsnorm_backward_workspace_fn = int64_t(int64_t rows, int64_t d);

}  // namespace fp::ops
