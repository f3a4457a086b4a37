// The synthetic long-context task: associative recall over a whole sequence (docs/data.md).
//
// Dimensions: B sequences per batch, T tokens per sequence (train.seq_len), V vocabulary
// (model.vocab_size), P key->value pairs per sequence (data.pairs).
//
// Note [Recall sequence layout]: sequence number n (a global index, not a row of one batch) is a
// stream s[0..T] of T+1 tokens made from an Rng seeded by (seed, n) alone; tokens = s[0..T), targets
// = s[1..T] (the model does not shift: targets[i] is what position i must predict).
//
//   s[0]                 BOS
//   s[1 .. C)            context: P triples [KEY, k, v] at uniformly random non-overlapping places,
//                        every other position a filler token (Zipf over the filler range)
//   s[C .. T]            queries: [QUERY, k, v] for every planted key, in a shuffled order
//                        (C = T + 1 - 3P)
//
// The token at each query's k predicts v: an answer position. Keys are distinct within a sequence
// and drawn from a key range that no filler or value uses, so the only earlier occurrence of a
// queried key is its planting, which may lie anywhere in the context: answering needs attention over
// the whole sequence (an induction head: find the earlier k, copy the token after it). Values are
// uniform over the value/filler range. Token ranges, for V tokens:
//   0 BOS, 1 KEY, 2 QUERY, keys [3, 3 + K) with K = (V - 3) / 2, values and filler [3 + K, V).
// The filler follows p(rank r) ~ 1 / (r + 1) (rank r = token 3 + K + r), so a model learns the
// unigram within a few steps and the loss (on all positions) falls visibly at once.
//
// Note [Packed recall] (data.task = "recall_packed"): the same task with each plant packed into ONE
// "pair token" that stands for (k, v), so answering needs one content-addressed attention hop (the
// query's k against the pair tokens of the context, then the pair's v out through the OV circuit)
// instead of an induction circuit (previous-token head + matching head):
//
//   s[0]                 BOS
//   s[1 .. C)            context: P pair tokens at uniformly random distinct places, every other
//                        position a filler token (Zipf over the value range)
//   s[C .. T]            queries: [QUERY, k, v] for every planted key, in a shuffled order
//
// With n = floor(sqrt(V - 2)) - 1 (the largest n with 3 + 2n + n^2 <= V): keys [3, 3 + n), values and
// filler [3 + n, 3 + 2n), pair tokens [3 + 2n, 3 + 2n + n^2), pair(k, v) = 3 + 2n + (k - 3) n +
// (v - 3 - n); ids from 3 + 2n + n^2 to V are unused. Token 1 (KEY) does not occur.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/batch.h"

namespace fp {

inline constexpr int32_t kRecallBos = 0;
inline constexpr int32_t kRecallKey = 1;
inline constexpr int32_t kRecallQuery = 2;
inline constexpr int64_t kRecallMinVocab = 64;

// Which variant of the task (data.task): "recall" plants [KEY, k, v] triples (an induction head answers),
// "recall_packed" plants one pair token per (k, v) (one attention hop answers; Note [Packed recall]).
enum class RecallTask { RecallTask_triples, RecallTask_packed };

// "recall" | "recall_packed" (data.task); anything else is fp::Error naming the value.
RecallTask recall_task_parse(const std::string& s);

// Which targets count: the next token everywhere, or only the answers (all others -100).
enum class LossOn { LossOn_all, LossOn_answers };

// "all" | "answers" (data.loss_on); anything else is fp::Error.
LossOn loss_on_parse(const std::string& s);

struct RecallTaskConfig {
  RecallTask task = RecallTask::RecallTask_triples;
  int64_t vocab_size = 0;  // V (model.vocab_size), >= 64
  int64_t seq_len = 0;     // T (train.seq_len)
  int64_t pairs = 0;       // P; 0: the default max(1, T / 64), capped at the K keys available
  uint64_t seed = 1;       // data.seed
  LossOn loss_on = LossOn::LossOn_all;
};

// Resolved layout of every sequence of a config (Note [Recall sequence layout]).
struct RecallLayout {
  int64_t pairs = 0;                       // P, default applied
  int32_t key_begin = 0, key_end = 0;      // keys in [key_begin, key_end)
  int32_t value_begin = 0, value_end = 0;  // values and filler in [value_begin, value_end)
  int32_t pair_begin = 0, pair_end = 0;    // recall_packed: pair tokens in [pair_begin, pair_end); else empty
  int64_t query_begin = 0;                 // C: stream index of the first QUERY token
};

// Validates the config (fp::Error naming the key, e.g. "data.pairs = 500 does not fit in
// train.seq_len = 256") and resolves the default pairs.
RecallLayout recall_layout(const RecallTaskConfig& cfg);

// recall_packed: the pair token of key k and value v (Note [Packed recall]).
int32_t recall_pair_token(const RecallLayout& lay, int32_t key, int32_t value);

// Sequences first_sequence .. first_sequence + B - 1, each depending only on (seed, its index), so any
// split into ranks or batches, and any resume, regenerates the same tokens. Targets follow
// cfg.loss_on. answer_mask (may be null): resized to (B * T), 1 at answer positions, else 0.
Batch recall_batch(const RecallTaskConfig& cfg, int64_t first_sequence, int64_t B,
                   std::vector<uint8_t>* answer_mask);

// The stream s[0..T] (T + 1 tokens) of one sequence; recall_batch is built from it (tests, docs).
std::vector<int32_t> recall_sequence(const RecallTaskConfig& cfg, int64_t sequence);

// Fraction of answer positions whose argmax over the logits (first maximum on ties) equals the target.
// logits: (B * T, V) for the batch; answer_mask: (B * T). 0 when there is no answer position.
double recall_accuracy(const std::vector<float>& logits, const Batch& batch,
                       const std::vector<uint8_t>& answer_mask);

}  // namespace fp
