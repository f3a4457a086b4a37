// Ring-DTP over P > 1 ranks (docs/design.md, Ring-DTP): the vocabulary projection and loss of every rank's
// tokens against a vocabulary sharded over the ranks, with no rank ever holding more than a strip of
// logits, and the lm_head gradient of each shard summed along the ring and delivered to its owner.
// Legend: P ranks, r this rank, n its tokens, ns (P) every rank's tokens, n_max their max, H hidden,
// V vocabulary, Vp = ceil(V / P) rows of a shard (ring_dtp_shard: rows_s of shard s, the last ones
// fewer), n_blk = min(block_tokens, n_max) strip height, xn (n, H) the final norm's output.
//
// Note [Ring-DTP on P ranks]: shard s holds vocabulary ids [v0_s, v0_s + rows_s) and is rank s's own
// rows of lm_head. Each token's state (m, z, y) is folded with ops/online_lse.h, one (batch, shard)
// pair at a time, strip by strip (rows of n_blk tokens, columns in kRingVocabSubBlock sub-blocks), so
// after every shard has met every batch the loss is m + log z - y, exactly the full head's function.
//   move weights (X stays): in round i = 0 .. P-1 rank r holds shard (r - i) mod P and folds its own
//     tokens against it while that shard moves on to r + 1 and the next one arrives from r - 1.
//     After P rounds its own tokens' states are complete.
//   move activations (W stays): in round i rank r holds batch b = (r - i) mod P (xn, targets, state)
//     and folds it against its own shard; the batch moves on to r + 1. A P-th hop brings each state
//     home.
// Backward is a second ring pass over the same rounds with the final (m, z): each (batch, shard)
// strip is recomputed (GEMM 1; or read back with vocab.keep_strips, which keeps the strips of the
// whole forward pass: (n, V) or (sum ns, rows_r) fp32, memory for one GEMM in four) and turned in
// place into scale (softmax - onehot), then dX (rows, H) += strip W_s (GEMM 2) and dW_s (rows_s, H)
// += strip^T xn (GEMM 3). What is summed where:
//   move weights: dX of this rank's tokens accumulates at home over the rounds (shard order r, r-1,
//     ...); dW_s travels with its shard: rank r adds its contribution C of round i to the partial sum
//     A that arrived (T = C + A) and passes T on; after round P-1 the shard's next rank is its owner,
//     so one more hop delivers the complete dW_s home, where it is added to lm_head's g.
//   move activations: dW of the own shard accumulates at home into g (batch order r, r-1, ...); the
//     batch's dX travels with it (T = C + A as above) and a P-th hop brings it home.
// Every sum runs in an order fixed by (r, i), never by timing, and every GEMM is ops/gemm_tiled, so
// the results are bitwise reproducible for a given P (and equal the full head's within rounding).
//
// Note [Overlapping a ring hop]: the comm interface has a nonblocking send_recv (send_recv_start,
// test, wait; MPI_Isend/MPI_Irecv underneath). Each round starts its hops before its strips and waits
// for them after, so the next shard (or batch) arrives while the current one is folded; between
// strips the pass calls test() on what is in flight, because MPI moves a large message only inside
// MPI calls (there is no progress thread; MPI runs FUNNELED, every call on this thread). What cannot
// move early is what the round itself writes: the forward state of a travelling batch (16 B per
// token, sent after its fold: under 0.4% of the batch's bytes at H >= 1024), and the dW (dX) partial
// sums, which would otherwise wait for the whole round; those are sent one round late instead: the
// sum T of round i leaves while round i + 1 computes its own contribution into a fresh buffer, which
// is why backward holds three of them (arriving, accumulating, leaving). A copy-stream worker was the
// other choice; it would need MPI_THREAD_MULTIPLE and buys nothing over MPI's own nonblocking calls.
//
// Note [Where the local shard comes from]: local_shard() is the one place that says where this rank's
// lm_head rows are. Under FSDP (Note [FSDP layout], model/params.h) they are the rank's own shard of
// the parameter, ParamStore::lm_head_shard(): the ring reads W_r there and adds the complete dW_r
// (every rank's tokens) to the shard's gradient, so the step neither gathers lm_head nor
// reduce-scatters its gradient (step/step.cpp, kRingReadsLmHeadShard). A store whose lm_head is whole on
// every rank (replicated parameters, whose gradients are summed over the ranks after the step; the
// head-level tests and bench vocab) is sliced instead, and dW written into this rank's rows only:
// the sum over ranks is then the whole gradient.
#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "sched/vocab/ring_dtp.h"
#include "sched/vocab/vocab_head.h"

namespace fp {

namespace {

// count elements of T at byte offset `offset` into base (then moved past them), null on meta.
template <class T>
T* carve(void* base, uint64_t& offset, uint64_t count, uint64_t elem_bytes = sizeof(T)) {
  T* p = base == nullptr ? nullptr : reinterpret_cast<T*>(static_cast<char*>(base) + offset);
  offset += count * elem_bytes;
  return p;
}

// This rank's rows of lm_head (Note [Where the local shard comes from]).
struct LocalShard {
  VocabShard ids;
  CBuf w;  // (rows, H) params dtype
  Buf g;   // (rows, H) grads dtype, accumulated (+=)
};
LocalShard local_shard(ParamStore& ps, int rank, int P, int64_t V, int64_t H) {
  LocalShard l;
  l.ids = ring_dtp_shard(V, P, rank);
  if (ps.lm_head->placement == Placement::Placement_rows) {
    const ParamShard sh = ps.lm_head_shard();
    FP_ASSERT(sh.row0 == l.ids.v0 && sh.rows == l.ids.rows, "lm_head shard rows [{}, +{}) vs the ring's [{}, +{})",
              sh.row0, sh.rows, l.ids.v0, l.ids.rows);
    l.w = sh.w;
    l.g = sh.g;
    return l;
  }
  l.w = ptr_at(ps.lm_head->w.cbuf(), l.ids.v0 * H);
  l.g = ptr_at(ps.lm_head->g.buf(), l.ids.v0 * H);
  return l;
}

// The hops of a round and the two kinds of work on one (batch, shard) pair.
class RingPass {
 public:
  RingPass(StepContext& s, const VocabSchedule& v, float scale, RingDtpStats* stats)
      : be_(s.be), K_(s.be.kernels()), comm_(s.vocab_data), scale_(scale), stats_(stats) {
    P = comm_.size();
    r = comm_.rank();
    next = (r + 1) % P;
    prev = (r + P - 1) % P;
    H = s.cfg.hidden_size;
    V = s.cfg.vocab_size;
    n_blk = v.block_tokens;
    inflight_.reserve(8);
  }

  int P = 1, r = 0, next = 0, prev = 0;
  int64_t H = 0, V = 0, n_blk = 1;

  // Starts a hop: n elements of send to the next rank while n_recv arrive from the previous one.
  void hop_start(const void* send, int64_t n, void* recv, int64_t n_recv, DType t) {
    if (stats_ != nullptr) stats_->comm_bytes += static_cast<uint64_t>(n) * dtype_size(t);
    inflight_.push_back(comm_.send_recv_start(be_.compute_stream(), send, n, next, recv, n_recv, prev, t));
  }
  // A hop of a typed operand: its dtype travels (send and recv must agree).
  void hop_start(CBuf send, int64_t n, Buf recv, int64_t n_recv) {
    FP_ASSERT(send.dtype == recv.dtype, "ring hop sends {} into {}", dtype_name(send.dtype), dtype_name(recv.dtype));
    hop_start(send.p, n, recv.p, n_recv, send.dtype);
  }
  // Blocks until every hop started completed.
  void hops_wait() {
    RingDtpTimer t(stats_ != nullptr ? &stats_->comm_wait_s : nullptr);
    for (CommRequest& q : inflight_) comm_.wait(q);
    inflight_.clear();
  }

  // Folds the batch x (nb, H), tg (nb) against shard sh, w (rows_s, H), into its state m, z, y (nb).
  // The strips go to `strips`: one (n_blk, rows_s) buffer reused, or with `kept` the batch's own
  // (nb, rows_s) block. logits (host, rows of stride V) receives them when not null.
  void fold(CBuf x, const int32_t* tg, int64_t nb, CBuf w, VocabShard sh, float* m, double* z,
            float* y, float* strips, bool kept, float* logits) {
    const int64_t w_cols = sh.rows;
    if (w_cols == 0) return;  // an empty shard (V < P Vp) holds no id
    for (int64_t t0 = 0; t0 < nb; t0 += n_blk) {
      const int64_t rows = std::min(n_blk, nb - t0);
      float* st = kept ? ptr_at(strips, t0 * w_cols) : strips;  // (rows, rows_s)
      {
        RingDtpTimer t(gemm_s());
        K_.gemm_tiled(false, true, rows, w_cols, H, 1.0f, ptr_at(x, t0 * H), H, w, H, 0.0f, st, w_cols);
      }
      if (logits != nullptr && be_.computes())
        for (int64_t t = 0; t < rows; ++t)
          be_.copy_to_host(logits + (t0 + t) * V + sh.v0, st + t * w_cols, static_cast<uint64_t>(w_cols) * 4);
      {
        RingDtpTimer t(lse_s());
        for (int64_t c0 = 0; c0 < w_cols; c0 += kRingVocabSubBlock) {
          const int64_t c1 = std::min(w_cols, c0 + kRingVocabSubBlock);
          K_.online_lse_fold(ptr_at(st, c0), w_cols, ptr_at(tg, t0), rows, sh.v0 + c0, sh.v0 + c1, ptr_at(m, t0),
                             ptr_at(z, t0), ptr_at(y, t0));
        }
      }
      progress();
    }
  }

  // The gradient of the pair (batch, shard sh) from the final m, z (nb): dx (nb, H) = beta_dx dx +
  // strip w, dW (rows_s, H) += strip^T x (or = when dW_fresh). strips as in fold (with `kept` they
  // hold the forward's logits and are not recomputed).
  void grad(CBuf x, const int32_t* tg, int64_t nb, CBuf w, VocabShard sh, const float* m, const double* z,
            float* strips, bool kept, Buf dx, float beta_dx, Buf dW, bool dW_fresh) {
    const int64_t w_cols = sh.rows;
    if (w_cols == 0) {
      if (beta_dx == 0.0f) K_.fill(dx, 0.0f, nb * H);  // an empty shard adds nothing
      return;
    }
    for (int64_t t0 = 0; t0 < nb; t0 += n_blk) {
      const int64_t rows = std::min(n_blk, nb - t0);
      const CBuf x_blk = ptr_at(x, t0 * H);  // (rows, H)
      float* st = kept ? ptr_at(strips, t0 * w_cols) : strips;  // (rows, rows_s)
      if (!kept) {
        RingDtpTimer t(gemm_s());
        K_.gemm_tiled(false, true, rows, w_cols, H, 1.0f, x_blk, H, w, H, 0.0f, st, w_cols);
      }
      {
        RingDtpTimer t(lse_s());
        K_.online_lse_backward(st, w_cols, ptr_at(tg, t0), rows, sh.v0, sh.v0 + w_cols, ptr_at(m, t0), ptr_at(z, t0),
                               scale_);
      }
      RingDtpTimer t(gemm_s());
      K_.gemm_tiled(false, false, rows, H, w_cols, 1.0f, st, w_cols, w, H, beta_dx, ptr_at(dx, t0 * H), H);
      K_.gemm_tiled(true, false, w_cols, H, rows, 1.0f, st, w_cols, x_blk, H, dW_fresh && t0 == 0 ? 0.0f : 1.0f, dW,
                    H);
      progress();
    }
  }

 private:
  // Note [Overlapping a ring hop]: MPI moves the hops in flight only when called.
  void progress() {
    for (CommRequest& q : inflight_) comm_.test(q);
  }
  double* gemm_s() { return stats_ != nullptr ? &stats_->gemm_s : nullptr; }
  double* lse_s() { return stats_ != nullptr ? &stats_->lse_s : nullptr; }

  Backend& be_;
  const ops::KernelLauncher K_;
  DataComm& comm_;  // the data channel (the hops' strips)
  float scale_;
  RingDtpStats* stats_;
  std::vector<CommRequest> inflight_;
};

}  // namespace

Tensor ring_dtp_p_ranks(StepContext& s, const VocabSchedule& v, ParamStore& ps, const Tensor& xn, const Tensor& targets,
                        float scale, Tensor& dxn, std::vector<float>* logits_out, bool backward, RingDtpStats* stats) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  RingPass R(s, v, scale, stats);
  const int P = R.P, r = R.r;
  const int64_t n = s.n, H = R.H, V = R.V;

  // Every rank's token count (host): buffers are sized by the largest, a hop carries the batch's own.
  std::vector<int64_t> ns(static_cast<size_t>(P), n);
  s.vocab.all_gather(&n, ns.data(), 1, DType::DType_I64);
  const int64_t n_max = *std::max_element(ns.begin(), ns.end());
  std::vector<int64_t> row0(static_cast<size_t>(P) + 1, 0);  // first row of each batch in (sum ns, .)
  for (int b = 0; b < P; ++b) row0[b + 1] = row0[b] + ns[b];
  const RingMode mode = ring_dtp_mode(v, n_max, V, P);
  const bool weights = mode == RingMode::RingMode_weights;
  FP_CHECK(logits_out == nullptr || weights, "set vocab.ring_mode = \"weights\" (or vocab.schedule = \"full\")",
           "the logits of this rank's tokens are only seen here with vocab.ring_mode = weights");
  R.n_blk = ring_dtp_block_rows(v, n_max);
  const int64_t Vp = ring_dtp_shard_rows_max(V, P);
  const LocalShard own = local_shard(ps, r, P, V, H);
  const RingDtpWorkingSet ws = ring_dtp_working_set(v, mode, r, ns, V, H, backward, s.precision);

  // The fixed working set, reserved here for both passes (ring_dtp_working_set).
  // (n_blk, Vp), or the whole pass
  const DType lg = s.precision.logits;
  Tensor strips = v.keep_strips ? be.alloc(kVocab, {weights ? n * V : row0[P] * own.ids.rows}, lg, "ring.strips_kept")
                                : be.alloc(kVocab, {R.n_blk, Vp}, lg, "ring.strip");
  Tensor m = be.alloc_f32(kVocab, {n}, "ring.m");               // (n) running max
  Tensor z = be.alloc(kVocab, {n}, DType::DType_F64, "ring.z");  // (n) running sum of exponentials
  Tensor y = be.alloc_f32(kVocab, {n}, "ring.y");               // (n) target logit
  Tensor loss_sum = be.alloc(Category::Category_workspace, {1}, DType::DType_F64, "ring.loss_sum");
  FP_ASSERT(ws.comm_bytes % 4 == 0, "the in-flight buffer is {} B", ws.comm_bytes);
  Tensor fly = be.alloc_f32(kComm, {static_cast<int64_t>(ws.comm_bytes / 4)},
                            weights ? "ring.shards" : "ring.activations");
  FP_ASSERT(strips.bytes() + m.bytes() + z.bytes() + y.bytes() == ws.vocab_bytes);
  // What travels, carved from `fly` (f64 first: aligned at any n_max and H). The shards are carved in
  // the params dtype and the batches in the activations dtype; the dW and dX partial sums, the state
  // and the targets in f32, f64 and i32 whatever the recipe (Note [Which dtype each allocation gets]
  // in core/precision.h).
  const DType wt = s.precision.params, act = s.precision.activations;
  uint64_t off = 0;
  Buf Wb[2];           // weights: (Vp, H) the shard arriving
  float* G[3] = {};    // weights, backward: (Vp, H) dW partial sums
  double* Sz[2] = {};  // activations: (n_max) the batch's z
  Buf X[2];            // activations: (n_max, H) xn
  float *D[3] = {}, *Sm[2] = {}, *Sy[2] = {};  // (n_max, H) dX sums, (n_max) m, y
  int32_t* Tg[2] = {};                         // (n_max) targets
  const uint64_t nm = static_cast<uint64_t>(n_max), nH = nm * static_cast<uint64_t>(H);
  if (weights) {
    for (Buf& p : Wb) p = Buf(carve<char>(fly.data(), off, static_cast<uint64_t>(Vp * H), dtype_size(wt)), wt);
    if (backward)
      for (float*& p : G) p = carve<float>(fly.data(), off, static_cast<uint64_t>(Vp * H));
  } else {
    for (double*& p : Sz) p = carve<double>(fly.data(), off, nm);
    for (Buf& p : X) p = Buf(carve<char>(fly.data(), off, nH, dtype_size(act)), act);
    if (backward)
      for (float*& p : D) p = carve<float>(fly.data(), off, nH);
    for (float*& p : Sm) p = carve<float>(fly.data(), off, nm);
    for (float*& p : Sy) p = carve<float>(fly.data(), off, nm);
    for (int32_t*& p : Tg) p = carve<int32_t>(fly.data(), off, nm);
  }
  FP_ASSERT(off == ws.comm_bytes, "carved {} of {} bytes", off, ws.comm_bytes);

  const CBuf x_home = xn.cbuf();           // (n, H)
  const int32_t* tg_home = targets.i32();  // (n)
  float* strip0 = strips.f32();  // the strip, or the kept strips of the whole pass
  const bool keep = v.keep_strips;
  float* logits = nullptr;
  if (logits_out != nullptr && be.computes()) {
    logits_out->resize(static_cast<size_t>(n * V));
    logits = logits_out->data();
  }
  K.online_lse_init(m.f32(), z.f64(), y.f32(), n);
  const auto shard = [&](int q) { return ring_dtp_shard(V, P, q); };
  const auto ring_prev = [&](int q) { return (q + P - 1) % P; };

  // ---- forward (Note [Ring-DTP on P ranks])
  if (weights) {
    CBuf w = own.w;  // (rows_s, H) the shard held this round
    for (int i = 0; i < P; ++i) {
      const int q = (r - i + P) % P;
      const VocabShard sh = shard(q);
      if (i + 1 < P) R.hop_start(w, sh.rows * H, Wb[i % 2], shard(ring_prev(q)).rows * H);
      R.fold(x_home, tg_home, n, w, sh, m.f32(), z.f64(), y.f32(), keep ? ptr_at(strip0, n * sh.v0) : strip0, keep,
             logits);
      R.hops_wait();
      w = Wb[i % 2];
    }
  } else {
    CBuf x = x_home;  // (nb, H) the batch held this round, its targets and state
    const int32_t* tg = tg_home;
    float *cm = m.f32(), *cy = y.f32();
    double* cz = z.f64();
    for (int i = 0; i < P; ++i) {
      const int b = (r - i + P) % P, k = i % 2;
      const int64_t nb = ns[b], n_in = ns[ring_prev(b)];
      if (i + 1 < P) {
        R.hop_start(x, nb * H, X[k], n_in * H);
        R.hop_start(tg, nb, Tg[k], n_in, DType::DType_I32);
      }
      R.fold(x, tg, nb, own.w, own.ids, cm, cz, cy, keep ? ptr_at(strip0, row0[b] * own.ids.rows) : strip0, keep, nullptr);
      R.hops_wait();
      // The state follows its batch once folded; after the last round it goes home (ns[r] tokens).
      const bool home = i + 1 == P;
      R.hop_start(cm, nb, home ? m.f32() : Sm[k], n_in, DType::DType_F32);
      R.hop_start(cz, nb, home ? z.f64() : Sz[k], n_in, DType::DType_F64);
      R.hop_start(cy, nb, home ? y.f32() : Sy[k], n_in, DType::DType_F32);
      R.hops_wait();
      x = X[k], tg = Tg[k], cm = Sm[k], cz = Sz[k], cy = Sy[k];
    }
  }

  K.online_lse_loss(m.f32(), z.f64(), y.f32(), tg_home, n, loss_sum.f64());

  // ---- backward: the second pass (Note [Ring-DTP on P ranks])
  if (backward && weights) {
    K.fill(dxn.buf(), 0.0f, n * H);
    CBuf w = own.w;
    float *in = G[0], *acc = G[1], *out = G[2];  // dW partial sums: arriving, accumulating, leaving
    VocabShard last;                             // the shard of the previous round (its sum leaves)
    for (int i = 0; i < P; ++i) {
      const int q = (r - i + P) % P;
      const VocabShard sh = shard(q);
      if (i + 1 < P) R.hop_start(w, sh.rows * H, Wb[i % 2], shard(ring_prev(q)).rows * H);
      if (i > 0) R.hop_start(out, last.rows * H, in, sh.rows * H, DType::DType_F32);
      // dX of this rank's tokens accumulates at home in dxn's dtype (with bf16 activations one rounding
      // per round; the travelling sums stay f32).
      R.grad(x_home, tg_home, n, w, sh, m.f32(), z.f64(), keep ? ptr_at(strip0, n * sh.v0) : strip0, keep, dxn.buf(),
             1.0f, acc, true);
      R.hops_wait();
      if (i > 0) K.add_inplace(acc, in, sh.rows * H);  // T = C + A
      std::swap(out, acc);
      w = Wb[i % 2];
      last = sh;
    }
    // The last round's shard is the next rank's own: its sum goes home, this rank's own arrives.
    R.hop_start(out, last.rows * H, in, own.ids.rows * H, DType::DType_F32);
    R.hops_wait();
    K.add_inplace(own.g, in, own.ids.rows * H);
  } else if (backward) {
    CBuf x = x_home;
    const int32_t* tg = tg_home;
    const float* cm = m.f32();
    const double* cz = z.f64();
    float *in = D[0], *acc = D[1], *out = D[2];  // dX partial sums: arriving, accumulating, leaving
    int64_t n_last = 0;                          // tokens of the previous round's batch (its sum leaves)
    for (int i = 0; i < P; ++i) {
      const int b = (r - i + P) % P, k = i % 2;
      const int64_t nb = ns[b], n_in = ns[ring_prev(b)];
      if (i + 1 < P) {
        R.hop_start(x, nb * H, X[k], n_in * H);
        R.hop_start(tg, nb, Tg[k], n_in, DType::DType_I32);
        R.hop_start(cm, nb, Sm[k], n_in, DType::DType_F32);
        R.hop_start(cz, nb, Sz[k], n_in, DType::DType_F64);
      }
      if (i > 0) R.hop_start(out, n_last * H, in, nb * H, DType::DType_F32);
      R.grad(x, tg, nb, own.w, own.ids, cm, cz, keep ? ptr_at(strip0, row0[b] * own.ids.rows) : strip0, keep, acc, 0.0f,
             own.g, false);
      R.hops_wait();
      if (i > 0) K.add_inplace(acc, in, nb * H);  // T = C + A
      std::swap(out, acc);
      x = X[k], tg = Tg[k], cm = Sm[k], cz = Sz[k];
      n_last = nb;
    }
    // The last round's batch is the next rank's: its dX goes home, this rank's own arrives. The f32
    // sum lands in dxn itself, or, when dxn is bf16, in the free partial-sum buffer and is rounded
    // into dxn once.
    const bool f32_dx = dxn.dtype() == DType::DType_F32;
    R.hop_start(out, n_last * H, f32_dx ? dxn.data() : static_cast<void*>(in), n * H, DType::DType_F32);
    R.hops_wait();
    if (!f32_dx) K.copy(dxn.buf(), in, n * H);
  }
  fly.reset();
  y.reset();
  z.reset();
  m.reset();
  strips.reset();
  return loss_sum;
}

}  // namespace fp
