// Multi-head latent attention (DeepSeek-V2/V3, transformers' DeepseekV3Attention), forward and backward:
// the attention block of model_type "deepseek_v3" (Note [Two architectures, one layer] in model/config.h).
// Legend: n tokens (B sequences of T), H hidden, nh heads, dn = qk_nope_head_dim, dr = qk_rope_head_dim,
// dqk = dn + dr, dv = v_head_dim, kl = kv_lora_rank, ql = q_lora_rank (0: no query latent).
//
// Note [Multi-head latent attention]:
//   h1 = rmsnorm(x)
//   q  = q_b_proj(rmsnorm_qa(q_a_proj h1))  (ql > 0)   or   q_proj h1        (n, nh, dqk) = [q_nope | q_pe]
//   [c_kv | k_pe] = kv_a_proj_with_mqa h1                                     (n, kl), (n, dr): one RoPE key
//   [k_nope | v] per head = kv_b_proj(rmsnorm_kv(c_kv))                       (n, nh, dn), (n, nh, dv)
//   k = [k_nope | rope(k_pe) for every head],  q_pe = rope(q_pe)             (n, nh, dqk)
//   o = attention(q, k, v) scaled by dqk^-0.5 mscale^2 (YaRN's mscale_all_dim, as transformers)  (n, nh, dv)
//   x1 = x + o_proj o
// The tiled kernels take the different q/k and v widths (ops/attention.h); no T x T buffer exists. The
// two halves of kv_a_proj_with_mqa are two GEMMs on its row blocks (no strided split of the output), and
// kv_b_proj's output is split per head by strided copies. RoPE rotates the last dr numbers of each query
// head and the one shared key in place (rope_strided_forward; rope_interleave rotates adjacent
// pairs). Backward: d k_pe is the sum over heads of the keys' RoPE parts (fixed head order).
// Memory: with keep, h1, the latents before and after their norms, q, k, v, o and lse stay for backward.
#include <cmath>

#include "model/blocks.h"
#include "model/ring_attention.h"

namespace fp {

// transformers' DeepseekV3Attention.scaling: dqk^-0.5, times mscale^2 under YaRN with mscale_all_dim.
float mla_softmax_scale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_head_dim()));
  const RopeScaling& r = c.rope_scaling;
  if (r.kind != RopeScaling::Kind::Kind_default && r.mscale_all_dim != 0 && r.factor > 1) {
    const double m = 0.1 * r.mscale_all_dim * std::log(r.factor) + 1.0;
    scale *= m * m;
  }
  return static_cast<float>(scale);
}

void mla_queries_forward(StepContext& s, const LayerParams& lp, CBuf h1, int64_t r, const int32_t* pos, AttnActs& a,
                         bool keep) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, dqk = c.qk_head_dim(), ql = c.q_lora_rank;
  const DType dt = s.precision.activations;
  a.q = be.alloc(kAct, {r, nh * dqk}, dt, "attn.q");
  if (ql > 0) {
    a.q_a = be.alloc(kAct, {r, ql}, dt, "attn.q_a");
    linear_forward(be, h1, lp.q_a_proj->w.buf(), a.q_a.buf(), r, H, ql);
    a.q_a_n = be.alloc(kAct, {r, ql}, dt, "attn.q_a_normed");
    a.rstd_q = be.alloc_f32(kAct, {r}, "attn.rstd_q_a");
    K.rmsnorm_forward(a.q_a.buf(), lp.q_a_layernorm->w.buf(), a.q_a_n.buf(), a.rstd_q.f32(), r, ql,
                      static_cast<float>(c.rms_norm_eps));
    linear_forward(be, a.q_a_n.buf(), lp.q_b_proj->w.buf(), a.q.buf(), r, ql, nh * dqk);
    if (!keep) {
      a.q_a.reset();
      a.q_a_n.reset();
      a.rstd_q.reset();
    }
  } else {
    linear_forward(be, h1, lp.q_proj->w.buf(), a.q.buf(), r, H, nh * dqk);
  }
  K.rope_strided_forward(ptr_at(a.q.buf(), c.qk_nope_head_dim), pos, r, nh, c.qk_rope_head_dim, dqk, c.rope_interleave,
                         s.rope_freqs());
}

void mla_queries_backward(StepContext& s, const LayerParams& lp, Tensor& dq, CBuf h1, int64_t r, const int32_t* pos,
                          AttnActs& a, Buf dh1) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, dqk = c.qk_head_dim(), ql = c.q_lora_rank;
  const DType dt = s.precision.activations;
  K.rope_strided_backward(ptr_at(dq.buf(), c.qk_nope_head_dim), pos, r, nh, c.qk_rope_head_dim, dqk, c.rope_interleave,
                          s.rope_freqs());
  if (ql > 0) {
    Tensor dq_a_n = be.alloc(kAct, {r, ql}, dt, "attn.dq_a_normed");
    linear_backward_input(be, dq.buf(), lp.q_b_proj->w.buf(), dq_a_n.buf(), r, ql, nh * dqk);
    linear_backward_weight(be, dq.buf(), a.q_a_n.buf(), lp.q_b_proj->g.buf(), r, ql, nh * dqk);
    dq.reset();
    a.q_a_n.reset();
    Tensor dq_a = be.alloc(kAct, {r, ql}, dt, "attn.dq_a");
    rmsnorm_backward(be, a.q_a.buf(), lp.q_a_layernorm->w.buf(), a.rstd_q.f32(), dq_a_n.buf(), dq_a.buf(),
                     lp.q_a_layernorm->g.buf(), r, ql);
    dq_a_n.reset();
    a.q_a.reset();
    a.rstd_q.reset();
    linear_backward_input(be, dq_a.buf(), lp.q_a_proj->w.buf(), dh1, r, H, ql);
    linear_backward_weight(be, dq_a.buf(), h1, lp.q_a_proj->g.buf(), r, H, ql);
  } else {
    linear_backward_input(be, dq.buf(), lp.q_proj->w.buf(), dh1, r, H, nh * dqk);
    linear_backward_weight(be, dq.buf(), h1, lp.q_proj->g.buf(), r, H, nh * dqk);
    dq.reset();
  }
}

void mla_kv_a_backward(StepContext& s, const LayerParams& lp, CBuf dkv_a, CBuf dk_pe, CBuf h1, int64_t r, Buf dh1) {
  const int64_t H = s.cfg.hidden_size, kl = s.cfg.kv_lora_rank, dr = s.cfg.qk_rope_head_dim;
  Param& kva = *lp.kv_a_proj_with_mqa;
  linear_backward_input(s.be, dkv_a, kva.w.buf(), dh1, r, H, kl, 1.0f);
  linear_backward_weight(s.be, dkv_a, h1, kva.g.buf(), r, H, kl);
  linear_backward_input(s.be, dk_pe, ptr_at(kva.w.buf(), kl * H), dh1, r, H, dr, 1.0f);
  linear_backward_weight(s.be, dk_pe, h1, ptr_at(kva.g.buf(), kl * H), r, H, dr);
}

namespace {
// x1 = x + o_proj(a.o); frees a.o without keep.
Tensor mla_output(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs& a, bool keep) {
  Tensor x1 = attn_output(s, lp, x.cbuf(), a.o.cbuf(), s.n, s.cfg.num_attention_heads * s.cfg.v_head_dim);
  if (!keep) a.o.reset();
  return x1;
}

// cp > 1 (Note [MLA's ring on the latent] in model/ring_attention.h): the ring sends the latent rows
// [kv_a_n | k_pe] and expands them hop by hop; kv_a_n itself is not kept (the backward's kv_b_proj
// gradient comes from the ring).
Tensor mla_ring_forward(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs& a, Tensor& k_pe, bool keep) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, nh = c.num_attention_heads, dr = c.qk_rope_head_dim, dqk = c.qk_head_dim(), dv = c.v_head_dim,
                kl = c.kv_lora_rank;
  const DType dt = s.precision.activations;
  K.rope_strided_forward(k_pe.buf(), s.pos.i32(), n, 1, dr, dr, c.rope_interleave, s.rope_freqs());
  a.latent = be.alloc(kAct, {n, kl + dr}, dt, "attn.latent");
  K.copy_2d(a.latent.buf(), kl + dr, a.kv_a_n.cbuf(), kl, n, kl);
  K.copy_2d(ptr_at(a.latent.buf(), kl), kl + dr, k_pe.cbuf(), dr, n, dr);
  k_pe.reset();
  a.kv_a_n.reset();
  a.o = be.alloc(kAct, {n, nh * dv}, dt, "attn.o");
  a.lse = be.alloc_f32(kAct, {s.B, nh, s.T}, "attn.lse");
  ring_attention_mla_forward(s, lp, a.q, a.latent, a.o, a.lse,
                             s.attention_spec(nh, nh, dqk, dv, mla_softmax_scale(c), /*window=*/0));
  if (!keep) {
    a.q.reset();
    a.latent.reset();
    a.lse.reset();
  }
  return mla_output(s, lp, x, a, keep);
}
}  // namespace

Tensor mla_block_forward(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs* keep) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, nh = c.num_attention_heads, dn = c.qk_nope_head_dim,
                dr = c.qk_rope_head_dim, dqk = dn + dr, dv = c.v_head_dim, kl = c.kv_lora_rank;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const ops::RopeFreqs freqs = s.rope_freqs();
  const DType dt = s.precision.activations;
  AttnActs local;
  AttnActs& a = keep ? *keep : local;

  a.h1 = be.alloc(kAct, {n, H}, dt, "attn.h1");
  a.rstd1 = be.alloc_f32(kAct, {n}, "attn.rstd1");
  K.rmsnorm_forward(x.buf(), lp.input_layernorm->w.buf(), a.h1.buf(), a.rstd1.f32(), n, H, eps);

  // Queries (n, nh, dqk), RoPE'd.
  mla_queries_forward(s, lp, a.h1.buf(), n, s.pos.i32(), a, keep != nullptr);

  // The key/value latent and the shared RoPE key: the two row blocks of kv_a_proj_with_mqa.
  a.kv_a = be.alloc(kAct, {n, kl}, dt, "attn.kv_a");
  Tensor k_pe = be.alloc(kAct, {n, dr}, dt, "attn.k_pe");
  linear_forward(be, a.h1.buf(), lp.kv_a_proj_with_mqa->w.buf(), a.kv_a.buf(), n, H, kl);
  linear_forward(be, a.h1.buf(), ptr_at(lp.kv_a_proj_with_mqa->w.buf(), kl * H), k_pe.buf(), n, H, dr);
  if (!keep) {
    a.h1.reset();
    a.rstd1.reset();
  }
  a.kv_a_n = be.alloc(kAct, {n, kl}, dt, "attn.kv_a_normed");
  a.rstd_k = be.alloc_f32(kAct, {n}, "attn.rstd_kv_a");
  K.rmsnorm_forward(a.kv_a.buf(), lp.kv_a_layernorm->w.buf(), a.kv_a_n.buf(), a.rstd_k.f32(), n, kl, eps);
  if (!keep) {
    a.kv_a.reset();
    a.rstd_k.reset();
  }

  if (s.cp > 1) return mla_ring_forward(s, lp, x, a, k_pe, keep != nullptr);

  // Per head [k_nope | v] from the normed latent, split into k (n, nh, dqk) and v (n, nh, dv).
  a.k = be.alloc(kAct, {n, nh * dqk}, dt, "attn.k");
  a.v = be.alloc(kAct, {n, nh * dv}, dt, "attn.v");
  {
    Tensor kv = be.alloc(kAct, {n, nh * (dn + dv)}, dt, "attn.kv_b");
    linear_forward(be, a.kv_a_n.buf(), lp.kv_b_proj->w.buf(), kv.buf(), n, kl, nh * (dn + dv));
    K.copy_2d(a.k.buf(), dqk, kv.buf(), dn + dv, n * nh, dn);
    K.copy_2d(a.v.buf(), dv, ptr_at(kv.buf(), dn), dn + dv, n * nh, dv);
  }
  if (!keep) a.kv_a_n.reset();

  // RoPE on the shared key, which every head's key then carries.
  K.rope_strided_forward(k_pe.buf(), s.pos.i32(), n, 1, dr, dr, c.rope_interleave, freqs);
  for (int64_t h = 0; h < nh; ++h) K.copy_2d(ptr_at(a.k.buf(), h * dqk + dn), nh * dqk, k_pe.buf(), dr, n, dr);
  k_pe.reset();

  a.o = be.alloc(kAct, {n, nh * dv}, dt, "attn.o");
  a.lse = be.alloc_f32(kAct, {s.B, nh, s.T}, "attn.lse");
  const ops::AttentionSpec spec = s.attention_spec(nh, nh, dqk, dv, mla_softmax_scale(c), /*window=*/0);
  K.attention_forward(a.q.buf(), a.k.buf(), a.v.buf(), a.o.buf(), a.lse.f32(), spec);
  if (!keep) {
    a.q.reset();
    a.k.reset();
    a.v.reset();
    a.lse.reset();
  }
  return mla_output(s, lp, x, a, keep != nullptr);
}

void mla_block_backward(StepContext& s, const LayerParams& lp, const Tensor& x, AttnActs& a, Tensor& dx) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t n = s.n, H = c.hidden_size, nh = c.num_attention_heads, dn = c.qk_nope_head_dim,
                dr = c.qk_rope_head_dim, dqk = dn + dr, dv = c.v_head_dim, kl = c.kv_lora_rank;
  const ops::RopeFreqs freqs = s.rope_freqs();
  const DType dt = s.precision.activations;

  // o_proj: dx holds d x1; the residual part stays in dx.
  Tensor d_o = be.alloc(kAct, {n, nh * dv}, dt, "attn.d_o");
  linear_backward_input(be, dx.buf(), lp.o_proj->w.buf(), d_o.buf(), n, nh * dv, H);
  linear_backward_weight(be, dx.buf(), a.o.buf(), lp.o_proj->g.buf(), n, nh * dv, H);

  Tensor dq = be.alloc(kAct, {n, nh * dqk}, dt, "attn.dq");
  const ops::AttentionSpec spec = s.attention_spec(nh, nh, dqk, dv, mla_softmax_scale(c), /*window=*/0);
  Tensor dk_pe, dkv_a_n;
  if (s.cp > 1) {
    // Note [MLA's ring on the latent]: d kv_a_n and d k_pe come home with the latent rows (kv_b_proj's
    // gradient added on the way).
    Tensor dlat = be.alloc_f32(kAct, {n, kl + dr}, "attn.dlatent");
    ring_attention_mla_backward(s, lp, a.q, a.latent, a.o, a.lse, d_o, dq, dlat, spec);
    dk_pe = be.alloc(kAct, {n, dr}, dt, "attn.dk_pe");
    dkv_a_n = be.alloc(kAct, {n, kl}, dt, "attn.dkv_a_normed");
    K.copy_2d(dkv_a_n.buf(), kl, dlat.cbuf(), kl + dr, n, kl);
    K.copy_2d(dk_pe.buf(), dr, ptr_at(dlat.cbuf(), kl), kl + dr, n, dr);
    a.latent.reset();
  }
  Tensor dk = s.cp > 1 ? Tensor() : be.alloc(kAct, {n, nh * dqk}, dt, "attn.dk");
  Tensor dvv = s.cp > 1 ? Tensor() : be.alloc(kAct, {n, nh * dv}, dt, "attn.dv");
  if (s.cp == 1)
    K.attention_backward(a.q.buf(), a.k.buf(), a.v.buf(), a.o.buf(), a.lse.f32(), d_o.buf(), dq.buf(), dk.buf(),
                         dvv.buf(), spec);
  d_o.reset();
  a.o.reset();
  a.lse.reset();
  a.q.reset();
  a.k.reset();
  a.v.reset();

  // The shared RoPE key: the sum over heads of the keys' RoPE parts, rotated back.
  if (s.cp == 1) {
    dk_pe = be.alloc(kAct, {n, dr}, dt, "attn.dk_pe");
    K.fill(dk_pe.buf(), 0.0f, n * dr);
    for (int64_t h = 0; h < nh; ++h) K.add_2d(dk_pe.buf(), dr, ptr_at(dk.buf(), h * dqk + dn), nh * dqk, n, dr);
  }
  K.rope_strided_backward(dk_pe.buf(), s.pos.i32(), n, 1, dr, dr, c.rope_interleave, freqs);

  // kv_b_proj: its output gradient per head [d k_nope | d v].
  if (s.cp == 1) {
    dkv_a_n = be.alloc(kAct, {n, kl}, dt, "attn.dkv_a_normed");
    Tensor dkv = be.alloc(kAct, {n, nh * (dn + dv)}, dt, "attn.dkv_b");
    K.copy_2d(dkv.buf(), dn + dv, dk.buf(), dqk, n * nh, dn);
    K.copy_2d(ptr_at(dkv.buf(), dn), dn + dv, dvv.buf(), dv, n * nh, dv);
    dk.reset();
    dvv.reset();
    linear_backward_input(be, dkv.buf(), lp.kv_b_proj->w.buf(), dkv_a_n.buf(), n, kl, nh * (dn + dv));
    linear_backward_weight(be, dkv.buf(), a.kv_a_n.buf(), lp.kv_b_proj->g.buf(), n, kl, nh * (dn + dv));
  }
  a.kv_a_n.reset();
  Tensor dkv_a = be.alloc(kAct, {n, kl}, dt, "attn.dkv_a");
  rmsnorm_backward(be, a.kv_a.buf(), lp.kv_a_layernorm->w.buf(), a.rstd_k.f32(), dkv_a_n.buf(), dkv_a.buf(),
                   lp.kv_a_layernorm->g.buf(), n, kl);
  dkv_a_n.reset();
  a.kv_a.reset();
  a.rstd_k.reset();

  // Queries: RoPE back on their last dr numbers, then the projections; then kv_a_proj_with_mqa's two row blocks.
  Tensor dh1 = be.alloc(kAct, {n, H}, dt, "attn.dh1");
  mla_queries_backward(s, lp, dq, a.h1.buf(), n, s.pos.i32(), a, dh1.buf());
  mla_kv_a_backward(s, lp, dkv_a.buf(), dk_pe.buf(), a.h1.buf(), n, dh1.buf());
  dkv_a.reset();
  dk_pe.reset();
  a.h1.reset();

  // input_layernorm: dx += rmsnorm_backward(dh1).
  Tensor dnorm = be.alloc(kAct, {n, H}, dt, "attn.dnorm");
  rmsnorm_backward(be, x.buf(), lp.input_layernorm->w.buf(), a.rstd1.f32(), dh1.buf(), dnorm.buf(),
                   lp.input_layernorm->g.buf(), n, H);
  K.add_inplace(dx.buf(), dnorm.buf(), n * H);
  a.rstd1.reset();
}

}  // namespace fp
