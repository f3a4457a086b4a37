// LM head with Ring-DTP (docs/design.md, Ring-DTP): the logits of the vocabulary projection exist only as
// strips of block_tokens rows, folded into a per-token online log-sum-exp state (ops/online_lse.h), so
// the vocab category holds one strip and 16 B per token instead of 3 x (n, V) fp32.
// Legend: n tokens, H hidden, V vocabulary, n_blk = min(block_tokens, n) strip height.
//
// Note [Ring-DTP on one rank]: with one rank the ring has one shard, the whole vocabulary, so each
// token block meets it once. Per block of n_blk tokens, in token order:
//   strip (n_blk, V) = xn_blk W^T                                   GEMM 1
//   fold the strip into (m, z, y) of the block's tokens, in vocabulary sub-blocks of
//   kRingVocabSubBlock columns (ring_dtp.h), the same online fold the ring applies to its shards;
//   after the sweep the block's lse = m + log z is final, and since the loss is the last node of the
//   graph the block's gradient is formed in the same sweep, in place:
//   strip <- scale (softmax - onehot)
//   dxn_blk (n_blk, H) = strip W                                    GEMM 2
//   dW (V, H) += strip^T xn_blk                                     GEMM 3
// Three GEMMs like the full variant, nothing recomputed. dW accumulates in fp32 block after block in
// token order, the GEMMs cut their outputs into a fixed grid of tiles (ops/gemm_tiled.h: OpenBLAS's
// own threading changes the bits with the thread count), and every other reduction has a fixed order
// (ops/online_lse.h, rmsnorm), so the results are bitwise reproducible across runs and thread counts.
// The working set (one strip and the state) is reserved once when the head starts and is the same on
// the meta backend, so meta peaks are exact (ring_dtp_vocab_bytes).
//
// With P > 1 ranks the ring itself runs in ring_dtp_ring.cpp (Note [Ring-DTP on P ranks]); the final
// RMSNorm around it is the same.
#include "sched/vocab/ring_dtp.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "sched/vocab/vocab_head.h"

namespace fp {

HeadResult head_ring_forward_backward(StepContext& s, const VocabSchedule& v, ParamStore& ps, const Tensor& xL,
                                      const Tensor& targets, float scale, Tensor& dxL, std::vector<float>* logits_out,
                                      bool backward, RingDtpStats* stats) {
  FP_CHECK(v.block_tokens >= 1, "set vocab.block_tokens to a positive number of tokens (e.g. 1024)",
           "vocab.block_tokens is {}", v.block_tokens);
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const int64_t n = s.n, H = s.cfg.hidden_size, V = s.cfg.vocab_size;
  const int64_t n_blk = ring_dtp_block_rows(v, n);
  double* gemm_s = stats != nullptr ? &stats->gemm_s : nullptr;
  double* lse_s = stats != nullptr ? &stats->lse_s : nullptr;

  // The final RMSNorm, as in the full variant.
  Tensor xn = be.alloc(kAct, {n, H}, s.precision.activations, "head.xn");
  Tensor rstd = be.alloc_f32(kAct, {n}, "head.rstd");
  K.rmsnorm_forward(xL.buf(), ps.norm->w.buf(), xn.buf(), rstd.f32(), n, H, static_cast<float>(s.cfg.rms_norm_eps));

  if (s.vocab.size() > 1) {
    Tensor dxn;
    if (backward) dxn = be.alloc(kAct, {n, H}, s.precision.activations, "head.dxn");  // (n, H)
    HeadResult r;
    r.loss_sum = ring_dtp_p_ranks(s, v, ps, xn, targets, scale, dxn, logits_out, backward, stats);
    xn.reset();
    if (backward)
      rmsnorm_backward(be, xL.buf(), ps.norm->w.buf(), rstd.f32(), dxn.buf(), dxL.buf(), ps.norm->g.buf(), n, H);
    return r;
  }
  const CBuf W = ps.lm_head->w.cbuf();  // (V, H)

  // The fixed working set (Note [Ring-DTP on one rank]).
  // (n_blk, V) logits, then their gradient
  Tensor strip = be.alloc(kVocab, {n_blk, V}, s.precision.logits, "ring.strip");
  Tensor m = be.alloc_f32(kVocab, {n}, "ring.m");                 // (n) running max
  Tensor z = be.alloc(kVocab, {n}, DType::DType_F64, "ring.z");    // (n) running sum of exponentials
  Tensor y = be.alloc_f32(kVocab, {n}, "ring.y");                 // (n) target logit
  Tensor loss_sum = be.alloc(Category::Category_workspace, {1}, DType::DType_F64, "ring.loss_sum");
  Tensor dxn;
  if (backward) dxn = be.alloc(kAct, {n, H}, s.precision.activations, "head.dxn");  // (n, H)
  K.online_lse_init(m.f32(), z.f64(), y.f32(), n);
  if (logits_out != nullptr && be.computes()) logits_out->resize(static_cast<size_t>(n * V));

  for (int64_t t0 = 0; t0 < n; t0 += n_blk) {
    const int64_t rows = std::min(n_blk, n - t0);
    const CBuf x_blk = ptr_at(xn.cbuf(), t0 * H);           // (rows, H)
    const int32_t* tgt_blk = ptr_at(targets.i32(), t0);     // (rows)
    float* m_blk = ptr_at(m.f32(), t0);                     // (rows)
    double* z_blk = ptr_at(z.f64(), t0);                    // (rows)
    float* y_blk = ptr_at(y.f32(), t0);                     // (rows)
    {
      RingDtpTimer t(gemm_s);
      K.gemm_tiled(false, true, rows, V, H, 1.0f, x_blk, H, W, H, 0.0f, strip.f32(), V);  // strip (rows, V)
    }
    if (logits_out != nullptr && be.computes())
      be.copy_to_host(logits_out->data() + t0 * V, strip.data(), static_cast<uint64_t>(rows * V) * sizeof(float));
    {
      RingDtpTimer t(lse_s);
      for (int64_t c0 = 0; c0 < V; c0 += kRingVocabSubBlock) {
        const int64_t c1 = std::min(V, c0 + kRingVocabSubBlock);
        K.online_lse_fold(ptr_at(strip.f32(), c0), V, tgt_blk, rows, c0, c1, m_blk, z_blk, y_blk);
      }
      if (backward) K.online_lse_backward(strip.f32(), V, tgt_blk, rows, 0, V, m_blk, z_blk, scale);
    }
    if (!backward) continue;
    RingDtpTimer t(gemm_s);
    K.gemm_tiled(false, false, rows, H, V, 1.0f, strip.f32(), V, W, H, 0.0f, ptr_at(dxn.buf(), t0 * H), H);
    K.gemm_tiled(true, false, V, H, rows, 1.0f, strip.f32(), V, x_blk, H, 1.0f, ps.lm_head->g.buf(), H);
  }

  HeadResult r;
  K.online_lse_loss(m.f32(), z.f64(), y.f32(), targets.i32(), n, loss_sum.f64());
  r.loss_sum = std::move(loss_sum);
  y.reset();
  z.reset();
  m.reset();
  strip.reset();
  if (!backward) return r;

  xn.reset();
  rmsnorm_backward(be, xL.buf(), ps.norm->w.buf(), rstd.f32(), dxn.buf(), dxL.buf(), ps.norm->g.buf(), n, H);
  return r;
}

}  // namespace fp
