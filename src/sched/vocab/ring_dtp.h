// Ring-DTP's layout and fixed working set (docs/design.md, Ring-DTP), for the head, the planner and the
// benchmarks: which vocabulary shard a rank holds, which ring mode runs, and what the head reserves
// when it starts, from the schedule, the ranks' token counts, V / P and H.
// Legend: n tokens on this rank, P ranks (the ring), V vocabulary, Vp = ceil(V / P) rows of a shard,
// V_shard the vocabulary one strip spans (V on one rank, a shard's rows on P), H hidden.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/precision.h"
#include "core/timing.h"
#include "model/schedules.h"

namespace fp {

// Vocabulary sub-block folded at a time (columns of a strip). A constant, not a config key: it
// changes no peak (the strip spans the shard anyway) and the results only at the ulp level. 8192
// fp32 columns are 32 KiB, one L1-sized row segment for the fold's max and sum passes.
inline constexpr int64_t kRingVocabSubBlock = 8192;

// Strip height: block_tokens, or all the tokens when there are fewer.
inline int64_t ring_dtp_block_rows(const VocabSchedule& v, int64_t n) { return std::min(v.block_tokens, n); }

// One rank. Bytes of category vocab: one strip (n_blk, V_shard) fp32 plus the online state of every
// token, m (n) fp32, z (n) f64, y (n) fp32. Only the state grows with n (16 B per token).
inline uint64_t ring_dtp_vocab_bytes(const VocabSchedule& v, int64_t n, int64_t V_shard) {
  const uint64_t strip = static_cast<uint64_t>(ring_dtp_block_rows(v, n)) * static_cast<uint64_t>(V_shard) * 4;
  return strip + static_cast<uint64_t>(n) * (4 + 8 + 4);
}

// ---- P ranks (sched/vocab/ring_dtp_ring.cpp)

// Shard s of P: vocabulary ids (rows of lm_head) [v0, v0 + rows). Every shard has Vp rows but the
// last ones, which may hold fewer, even none: the FSDP layout of lm_head (Note [FSDP layout],
// model/params.h), so a rank's shard is exactly its own rows of the parameter.
struct VocabShard {
  int64_t v0 = 0, rows = 0;
};
inline int64_t ring_dtp_shard_rows_max(int64_t V, int P) { return (V + P - 1) / P; }
inline VocabShard ring_dtp_shard(int64_t V, int P, int s) {
  const int64_t Vp = ring_dtp_shard_rows_max(V, P);
  const int64_t v0 = std::min(V, static_cast<int64_t>(s) * Vp);
  return {v0, std::min(Vp, V - v0)};
}

// What travels the ring (docs/design.md): the vocabulary shards (weights), or the token batches with
// their running state (activations).
enum class RingMode { RingMode_weights, RingMode_activations };
// vocab.ring_mode resolved; "auto" moves the activations when n_max <= Vp (a hop then moves n x H
// numbers instead of Vp x H). n_max: the most tokens any rank holds, so every rank decides alike.
inline RingMode ring_dtp_mode(const VocabSchedule& v, int64_t n_max, int64_t V, int P) {
  if (v.ring_mode == "weights") return RingMode::RingMode_weights;
  if (v.ring_mode == "activations") return RingMode::RingMode_activations;
  return n_max <= ring_dtp_shard_rows_max(V, P) ? RingMode::RingMode_activations : RingMode::RingMode_weights;
}

// The working set the head reserves when it starts on P > 1 ranks, in bytes (Note [Ring-DTP on P
// ranks], ring_dtp_ring.cpp). ns (P): every rank's token count. Dtypes from p (Note [Which dtype
// each allocation gets] in core/precision.h): strips in p.logits, shards in p.params, batches in
// p.activations; the state and the partial sums are always f32 (z f64).
//   vocab: the strip (n_blk, Vp) and the state, 16 B per token; with keep_strips the strips of
//          the whole pass instead of the one strip: (n, V) (weights) or (sum ns, Vp of this rank)
//          (activations). Without keep_strips nothing but the state grows with n.
//   comm:  what is in flight. weights: the shard in use and the one arriving (2 Vp H), in
//          backward also three dW shards fp32 (the one arriving, the one being accumulated, the one
//          leaving). activations: the batch in use and the one arriving (2 n_max H, their
//          targets 2 n_max i32, their states 2 n_max 16 B), in backward also three dX accumulators
//          (3 n_max H fp32).
struct RingDtpWorkingSet {
  uint64_t vocab_bytes = 0, comm_bytes = 0;
};
inline RingDtpWorkingSet ring_dtp_working_set(const VocabSchedule& v, RingMode mode, int rank,
                                              const std::vector<int64_t>& ns, int64_t V, int64_t H, bool backward,
                                              const Precision& p = {}) {
  const uint64_t lg = dtype_size(p.logits), wt = dtype_size(p.params), act = dtype_size(p.activations);
  const int P = static_cast<int>(ns.size());
  const uint64_t n = static_cast<uint64_t>(ns[rank]);
  const uint64_t Vp = static_cast<uint64_t>(ring_dtp_shard_rows_max(V, P));
  uint64_t n_max = 0, n_total = 0;
  for (const int64_t c : ns) {
    n_max = std::max(n_max, static_cast<uint64_t>(c));
    n_total += static_cast<uint64_t>(c);
  }
  RingDtpWorkingSet w;
  const bool weights = mode == RingMode::RingMode_weights;
  if (v.keep_strips)
    w.vocab_bytes = lg * (weights ? n * static_cast<uint64_t>(V)
                                  : n_total * static_cast<uint64_t>(ring_dtp_shard(V, P, rank).rows));
  else
    w.vocab_bytes = lg * static_cast<uint64_t>(ring_dtp_block_rows(v, static_cast<int64_t>(n_max))) * Vp;
  w.vocab_bytes += 16 * n;
  const uint64_t H64 = static_cast<uint64_t>(H);
  if (weights)
    w.comm_bytes = 2 * wt * Vp * H64 + (backward ? 3 * 4 * Vp * H64 : 0);
  else
    w.comm_bytes = 2 * (act * n_max * H64 + 4 * n_max + 16 * n_max) + (backward ? 3 * 4 * n_max * H64 : 0);
  return w;
}

// Where the time of one Ring-DTP head call went (benchmarks; filled when a pointer is given).
struct RingDtpStats {
  double gemm_s = 0;        // the strips' GEMMs: logits, and in backward dX and dW
  double lse_s = 0;         // the online log-sum-exp fold and the softmax gradient
  double comm_wait_s = 0;   // blocked on the ring's transfers: what the overlap did not hide
  uint64_t comm_bytes = 0;  // sent by this rank
};

// Adds the wall seconds of its scope to *acc; does nothing (reads no clock) when acc is null.
class RingDtpTimer {
 public:
  explicit RingDtpTimer(double* acc) : acc_(acc) {
    if (acc_ != nullptr) t0_ = Clock::now();
  }
  ~RingDtpTimer() {
    if (acc_ != nullptr) *acc_ += seconds_since(t0_);
  }
  RingDtpTimer(const RingDtpTimer&) = delete;
  RingDtpTimer& operator=(const RingDtpTimer&) = delete;

 private:
  double* acc_;
  Clock::time_point t0_;
};

}  // namespace fp
