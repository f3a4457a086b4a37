// Rotary position embedding, rotate-half layout (Hugging Face Llama/Qwen):
//   for i < hd/2: a = pos * inv_freq[i] (computed in double),
//   y[i] = s (x[i] cos a - x[i + hd/2] sin a);  y[i + hd/2] = s (x[i + hd/2] cos a + x[i] sin a),
// with inv_freq and the factor s from the model's RoPE (model/rope_scaling.h: default RoPE has
// inv_freq[i] = theta^(-2i/hd) and s = 1; linear, YaRN and llama3 scaling change inv_freq, and YaRN
// multiplies cos and sin by its attention factor s, as transformers does).
// n tokens, heads heads, hd head_dim (even).
//
// bf16 (Note [Kernel operands carry their dtype] in core/buf.h): x and dx are f32 or bf16. cos and sin
// are float whatever the storage, and each head's hd numbers are rotated in f32 from their exact
// widening and rounded once, so a bf16 result has the bits of the f32 kernel on the widened x, rounded.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/buf.h"

namespace fp::ops {

// The frequencies of one model: inv_freq (hd/2 f64 values, a device buffer: the step uploads the table,
// model/blocks.h StepContext::rope_inv_freq) and the factor s.
struct RopeFreqs {
  const double* inv_freq = nullptr;
  float scale = 1.0f;
};

// Default RoPE: inv_freq[i] = theta^(-2i/hd), i < hd/2.
inline std::vector<double> rope_default_inv_freq(double theta, int64_t hd) {
  std::vector<double> f(static_cast<size_t>(hd / 2));
  for (int64_t i = 0; i < hd / 2; ++i) f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
  return f;
}

}  // namespace fp::ops

namespace fp::ops {

// The contract of each kernel: its signature, shapes, dtypes and what must hold bit for bit. A backend's
// table entry adds an ExecContext first (backend/kernels.h); each backend implements it in its own room
// (backend/cpu/kernels, backend/cuda).

// x (n, heads, hd) rotated in place; pos (n) the position of each token in its sequence.
using rope_forward_fn = void(Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, RopeFreqs f);

// dx (n, heads, hd) in place: the transpose rotation (times s).
using rope_backward_fn = void(Buf dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd, RopeFreqs f);

// The same rotation on the first hd numbers of rows that lie head_stride apart: token t's head h starts at
// x + (t * heads + h) * head_stride (head_stride >= hd), so RoPE can rotate the last qk_rope_head_dim
// numbers of MLA's query heads in place (x = q + qk_nope_head_dim, head_stride = qk_head_dim). With
// interleaved the pairs are adjacent, (2i, 2i + 1) rotated by angle i (DeepSeek's rope_interleave):
// transformers rotates the same pairs and writes them de-interleaved, a permutation applied alike to queries
// and keys, which leaves every score q.k unchanged. interleaved = false, head_stride = hd is rope_forward.
using rope_strided_forward_fn = void(Buf x, const int32_t* pos, int64_t n, int64_t heads, int64_t hd,
                                     int64_t head_stride, bool interleaved, RopeFreqs f);

using rope_strided_backward_fn = void(Buf dx, const int32_t* pos, int64_t n, int64_t heads, int64_t hd,
                                      int64_t head_stride, bool interleaved, RopeFreqs f);

}  // namespace fp::ops
