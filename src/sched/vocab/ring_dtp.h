// Ring-DTP's fixed working set (DESIGN.md, Ring-DTP), for the planner and the benchmarks: what the
// head reserves in category vocab, from the schedule, the rank's tokens and its vocabulary shard.
// Legend: n tokens on this rank, V_shard = V / P the vocabulary of one shard (V on one rank).
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/schedules.h"

namespace fp {

// Vocabulary sub-block folded at a time on one rank (columns of a strip). A constant, not a config
// key: it changes no peak (the strip spans the shard anyway) and the results only at the ulp level.
// 8192 fp32 columns are 32 KiB, one L1-sized row segment for the fold's max and sum passes.
inline constexpr int64_t kRingVocabSubBlock = 8192;

// Strip height: block_tokens, or all the tokens when there are fewer.
inline int64_t ring_dtp_block_rows(const VocabSchedule& v, int64_t n) { return std::min(v.block_tokens, n); }

// Bytes of category vocab: one strip (n_blk, V_shard) fp32 plus the online state of every token,
// m (n) fp32, z (n) f64, y (n) fp32. Only the state grows with n (16 B per token).
inline uint64_t ring_dtp_vocab_bytes(const VocabSchedule& v, int64_t n, int64_t V_shard) {
  const uint64_t strip = static_cast<uint64_t>(ring_dtp_block_rows(v, n)) * static_cast<uint64_t>(V_shard) * 4;
  return strip + static_cast<uint64_t>(n) * (4 + 8 + 4);
}

}  // namespace fp
