// Attention block of a decoder layer, forward and backward (with attention_bias, q/k/v/o add their biases
// after the projections, as nn.Linear does).
// Legend: n tokens (B sequences of T), H hidden, nh/nkv heads, hd head_dim.
#include <cmath>

#include "model/blocks.h"
#include "model/ring_attention.h"

namespace fp {

namespace {}

void linear_forward(Backend& be, CBuf x, CBuf W, Buf y, int64_t n, int64_t in, int64_t out, float beta) {
  be.kernels().gemm(false, true, n, out, in, 1.0f, x, in, W, in, beta, y, out);
}

void linear_backward_input(Backend& be, CBuf dy, CBuf W, Buf dx, int64_t n, int64_t in, int64_t out, float beta) {
  be.kernels().gemm(false, false, n, in, out, 1.0f, dy, out, W, in, beta, dx, in);
}

void linear_backward_weight(Backend& be, CBuf dy, CBuf x, Buf dW, int64_t n, int64_t in, int64_t out) {
  be.kernels().gemm(true, false, out, in, n, 1.0f, dy, out, x, in, 1.0f, dW, in);
}

void rmsnorm_backward(Backend& be, CBuf x, CBuf w, const float* rstd, CBuf dy, Buf dx, Buf dw, int64_t rows,
                      int64_t d) {
  Tensor ws = be.alloc_f32(Category::Category_workspace, {be.kernels().rmsnorm_backward_workspace(rows, d)},
                           "rmsnorm.dw_partials");
  be.kernels().rmsnorm_backward(x, w, rstd, dy, dx, dw, rows, d, ws.f32());
}

Tensor attn_output(StepContext& s, const LayerParams& lp, CBuf x, CBuf o, int64_t rows, int64_t width) {
  const int64_t H = s.cfg.hidden_size;
  Tensor x1 = s.be.alloc(kAct, {rows, H}, s.precision.activations, "attn.x1");
  s.be.kernels().copy(x1.buf(), x, rows * H);
  linear_forward(s.be, o, lp.o_proj->w.buf(), x1.buf(), rows, width, H, /*beta=*/1.0f);
  if (s.cfg.attention_bias) s.be.kernels().bias_add(x1.buf(), lp.o_bias->w.buf(), rows, H);
  return x1;
}

ops::AttentionSpec layer_attention_spec(const StepContext& s, const LayerParams& lp) {
  const ModelConfig& c = s.cfg;
  const int64_t hd = c.head_dim;
  ops::AttentionSpec a = s.attention_spec(c.num_attention_heads, c.num_key_value_heads, hd, hd,
                                          1.0f / std::sqrt(static_cast<float>(hd)), c.layer_window(lp.index));
  if (c.attention_sinks()) a.sinks = lp.sinks->w.buf();
  return a;
}

Tensor attn_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs* keep) {
  if (s.cfg.is_deepseek()) return mla_block_forward(s, lp, x, keep);
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const ops::RopeFreqs freqs = s.rope_freqs();
  AttnActs local;
  AttnActs& a = keep ? *keep : local;

  a.h1 = be.alloc(kAct, {n, H}, s.precision.activations, "attn.h1");
  a.rstd1 = be.alloc_f32(kAct, {n}, "attn.rstd1");
  K.rmsnorm_forward(x.buf(), lp.input_layernorm->w.buf(), a.h1.buf(), a.rstd1.f32(), n, H, eps);

  a.q_raw = be.alloc(kAct, {n, nh * hd}, s.precision.activations, "attn.q_raw");
  a.k_raw = be.alloc(kAct, {n, nkv * hd}, s.precision.activations, "attn.k_raw");
  a.v = be.alloc(kAct, {n, nkv * hd}, s.precision.activations, "attn.v");
  linear_forward(be, a.h1.buf(), lp.q_proj->w.buf(), a.q_raw.buf(), n, H, nh * hd);
  linear_forward(be, a.h1.buf(), lp.k_proj->w.buf(), a.k_raw.buf(), n, H, nkv * hd);
  linear_forward(be, a.h1.buf(), lp.v_proj->w.buf(), a.v.buf(), n, H, nkv * hd);
  if (c.attention_bias) {
    K.bias_add(a.q_raw.buf(), lp.q_bias->w.buf(), n, nh * hd);
    K.bias_add(a.k_raw.buf(), lp.k_bias->w.buf(), n, nkv * hd);
    K.bias_add(a.v.buf(), lp.v_bias->w.buf(), n, nkv * hd);
  }
  if (!keep) {
    a.h1.reset();
    a.rstd1.reset();
  }

  if (c.qk_norm()) {
    a.q = be.alloc(kAct, {n, nh * hd}, s.precision.activations, "attn.q");
    a.k = be.alloc(kAct, {n, nkv * hd}, s.precision.activations, "attn.k");
    a.rstd_q = be.alloc_f32(kAct, {n * nh}, "attn.rstd_q");
    a.rstd_k = be.alloc_f32(kAct, {n * nkv}, "attn.rstd_k");
    K.rmsnorm_forward(a.q_raw.buf(), lp.q_norm->w.buf(), a.q.buf(), a.rstd_q.f32(), n * nh, hd, eps);
    K.rmsnorm_forward(a.k_raw.buf(), lp.k_norm->w.buf(), a.k.buf(), a.rstd_k.f32(), n * nkv, hd, eps);
  } else {  // RoPE in place on the projections (gpt_oss): q and k are q_raw and k_raw
    a.q = std::move(a.q_raw);
    a.k = std::move(a.k_raw);
  }
  K.rope_forward(a.q.buf(), s.pos.i32(), n, nh, hd, freqs);
  K.rope_forward(a.k.buf(), s.pos.i32(), n, nkv, hd, freqs);
  if (!keep) {
    a.q_raw.reset();
    a.k_raw.reset();
    a.rstd_q.reset();
    a.rstd_k.reset();
  }

  a.o = be.alloc(kAct, {n, nh * hd}, s.precision.activations, "attn.o");
  a.lse = be.alloc_f32(kAct, {s.B, nh, s.T}, "attn.lse");
  const ops::AttentionSpec spec = layer_attention_spec(s, lp);
  if (s.cp > 1) {
    ring_attention_forward(s, a.q, a.k, a.v, a.o, a.lse, spec);
  } else {
    K.attention_forward(a.q.buf(), a.k.buf(), a.v.buf(), a.o.buf(), a.lse.f32(), spec);
  }
  if (!keep) {
    a.q.reset();
    a.k.reset();
    a.v.reset();
    a.lse.reset();
  }

  Tensor x1 = attn_output(s, lp, x.cbuf(), a.o.cbuf(), n, nh * hd);
  if (!keep) a.o.reset();
  return x1;
}

void attn_block_backward(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs& a, Tensor& dx) {
  if (s.cfg.is_deepseek()) return mla_block_backward(s, lp, x, a, dx);
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const ops::RopeFreqs freqs = s.rope_freqs();

  // o_proj: dx holds d x1 = d (x + o W_o^T); the residual part stays in dx.
  Tensor d_o = be.alloc(kAct, {n, nh * hd}, s.precision.activations, "attn.d_o");
  linear_backward_input(be, dx.buf(), lp.o_proj->w.buf(), d_o.buf(), n, nh * hd, H);
  linear_backward_weight(be, dx.buf(), a.o.buf(), lp.o_proj->g.buf(), n, nh * hd, H);
  if (c.attention_bias) K.bias_backward(dx.buf(), lp.o_bias->g.buf(), n, H);

  Tensor dq = be.alloc(kAct, {n, nh * hd}, s.precision.activations, "attn.dq");
  Tensor dk = be.alloc(kAct, {n, nkv * hd}, s.precision.activations, "attn.dk");
  Tensor dv = be.alloc(kAct, {n, nkv * hd}, s.precision.activations, "attn.dv");
  const ops::AttentionSpec spec = layer_attention_spec(s, lp);
  // Note [Attention sinks]: the sinks' gradient from this rank's query rows (o, lse final).
  if (c.attention_sinks()) K.attention_sink_backward(a.o.buf(), d_o.buf(), a.lse.f32(), lp.sinks->g.buf(), spec);
  if (s.cp > 1) {
    ring_attention_backward(s, a.q, a.k, a.v, a.o, a.lse, d_o, dq, dk, dv, spec);
  } else {
    K.attention_backward(a.q.buf(), a.k.buf(), a.v.buf(), a.o.buf(), a.lse.f32(), d_o.buf(), dq.buf(), dk.buf(),
                         dv.buf(), spec);
  }
  d_o.reset();
  a.o.reset();
  a.lse.reset();
  a.q.reset();
  a.k.reset();

  K.rope_backward(dq.buf(), s.pos.i32(), n, nh, hd, freqs);
  K.rope_backward(dk.buf(), s.pos.i32(), n, nkv, hd, freqs);
  Tensor dq_raw, dk_raw;
  if (c.qk_norm()) {
    dq_raw = be.alloc(kAct, {n, nh * hd}, s.precision.activations, "attn.dq_raw");
    dk_raw = be.alloc(kAct, {n, nkv * hd}, s.precision.activations, "attn.dk_raw");
    rmsnorm_backward(be, a.q_raw.buf(), lp.q_norm->w.buf(), a.rstd_q.f32(), dq.buf(), dq_raw.buf(), lp.q_norm->g.buf(),
                     n * nh, hd);
    rmsnorm_backward(be, a.k_raw.buf(), lp.k_norm->w.buf(), a.rstd_k.f32(), dk.buf(), dk_raw.buf(), lp.k_norm->g.buf(),
                     n * nkv, hd);
  } else {  // no q/k norm: the projections' gradients are RoPE's
    dq_raw = std::move(dq);
    dk_raw = std::move(dk);
  }
  dq.reset();
  dk.reset();
  a.q_raw.reset();
  a.k_raw.reset();
  a.rstd_q.reset();
  a.rstd_k.reset();

  // q, k, v projections: d h1 = dq W_q + dk W_k + dv W_v.
  if (c.attention_bias) {
    K.bias_backward(dq_raw.buf(), lp.q_bias->g.buf(), n, nh * hd);
    K.bias_backward(dk_raw.buf(), lp.k_bias->g.buf(), n, nkv * hd);
    K.bias_backward(dv.buf(), lp.v_bias->g.buf(), n, nkv * hd);
  }
  Tensor dh1 = be.alloc(kAct, {n, H}, s.precision.activations, "attn.dh1");
  linear_backward_input(be, dq_raw.buf(), lp.q_proj->w.buf(), dh1.buf(), n, H, nh * hd);
  linear_backward_input(be, dk_raw.buf(), lp.k_proj->w.buf(), dh1.buf(), n, H, nkv * hd, 1.0f);
  linear_backward_input(be, dv.buf(), lp.v_proj->w.buf(), dh1.buf(), n, H, nkv * hd, 1.0f);
  linear_backward_weight(be, dq_raw.buf(), a.h1.buf(), lp.q_proj->g.buf(), n, H, nh * hd);
  linear_backward_weight(be, dk_raw.buf(), a.h1.buf(), lp.k_proj->g.buf(), n, H, nkv * hd);
  linear_backward_weight(be, dv.buf(), a.h1.buf(), lp.v_proj->g.buf(), n, H, nkv * hd);
  dq_raw.reset();
  dk_raw.reset();
  dv.reset();
  a.v.reset();
  a.h1.reset();

  // input_layernorm: dx += rmsnorm_backward(dh1).
  Tensor dnorm = be.alloc(kAct, {n, H}, s.precision.activations, "attn.dnorm");
  rmsnorm_backward(be, x.buf(), lp.input_layernorm->w.buf(), a.rstd1.f32(), dh1.buf(), dnorm.buf(),
                   lp.input_layernorm->g.buf(), n, H);
  K.add_inplace(dx.buf(), dnorm.buf(), n * H);
  a.rstd1.reset();
}

}  // namespace fp
