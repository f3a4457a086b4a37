// The recall task (Note [Recall sequence layout] in recall_task.h).
//
// Dimensions: B sequences, T tokens per sequence, V vocabulary, P pairs, K keys available,
// F value/filler tokens (V - 3 - K; K when packed), R = T - 3P context positions after BOS.
#include "data/recall_task.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace fp {
namespace {

// splitmix64's finaliser: a bijective mix, so (seed, sequence) pairs give unrelated Rng seeds.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t sequence_seed(uint64_t seed, int64_t sequence) {
  return mix64(mix64(seed + 0x9E3779B97F4A7C15ull) ^ static_cast<uint64_t>(sequence));
}

// Cumulative Zipf weights over the F filler ranks: cdf[r] = sum_{j <= r} 1 / (j + 1).
std::vector<double> zipf_cdf(int64_t F) {
  std::vector<double> cdf(static_cast<size_t>(F));
  double acc = 0;
  for (int64_t r = 0; r < F; ++r) cdf[r] = acc += 1.0 / static_cast<double>(r + 1);
  return cdf;
}

// Writes the T + 1 tokens of one sequence into s; answer positions are query_begin + 3j + 1.
void sequence_fill(const RecallTaskConfig& cfg, const RecallLayout& lay, const std::vector<double>& cdf,
                   int64_t sequence, int32_t* s /* (T + 1) */) {
  const bool packed = cfg.task == RecallTask::RecallTask_packed;
  const int64_t T = cfg.seq_len, P = lay.pairs, C = lay.query_begin;
  const int64_t R = C - 1;  // context positions s[1 .. C)
  // "items": P plants + the fillers, each plant one item (a triple, or one pair token when packed)
  const int64_t m = packed ? R : R - 2 * P;
  const int64_t K = lay.key_end - lay.key_begin;
  const int64_t F = lay.value_end - lay.value_begin;
  Rng rng(sequence_seed(cfg.seed, sequence));

  // Places: P distinct items of m by Floyd's algorithm, so every non-overlapping placement of the
  // plants is equally likely; item i (the j-th chosen) starts its triple at 1 + i + 2j (its pair
  // token at 1 + i when packed).
  std::vector<uint8_t> chosen(static_cast<size_t>(m), 0);
  for (int64_t j = m - P; j < m; ++j) {
    const int64_t t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(j + 1)));
    chosen[chosen[t] ? j : t] = 1;
  }
  // Keys: the first P of a partial Fisher-Yates shuffle of the K keys (distinct by construction).
  std::vector<int32_t> keys(static_cast<size_t>(K));
  std::iota(keys.begin(), keys.end(), lay.key_begin);
  for (int64_t j = 0; j < P; ++j)
    std::swap(keys[j], keys[j + static_cast<int64_t>(rng.below(static_cast<uint64_t>(K - j)))]);
  std::vector<int32_t> values(static_cast<size_t>(P));
  for (auto& v : values) v = lay.value_begin + static_cast<int32_t>(rng.below(static_cast<uint64_t>(F)));

  s[0] = kRecallBos;
  int64_t pos = 1, j = 0;
  const double total = cdf.back();
  for (int64_t i = 0; i < m; ++i) {
    if (chosen[i] && packed) {
      s[pos++] = recall_pair_token(lay, keys[j], values[j]);
      ++j;
    } else if (chosen[i]) {
      s[pos] = kRecallKey;
      s[pos + 1] = keys[j];
      s[pos + 2] = values[j];
      pos += 3;
      ++j;
    } else {
      const double u = rng.uniform() * total;
      const int64_t r = std::min<int64_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), F - 1);
      s[pos++] = lay.value_begin + static_cast<int32_t>(r);
    }
  }
  FP_ASSERT(pos == C && j == P, "recall layout: pos {} C {} j {} P {}", pos, C, j, P);

  // Queries in a shuffled order.
  std::vector<int64_t> order(static_cast<size_t>(P));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t q = P - 1; q > 0; --q) std::swap(order[q], order[rng.below(static_cast<uint64_t>(q + 1))]);
  for (int64_t q = 0; q < P; ++q) {
    s[C + 3 * q] = kRecallQuery;
    s[C + 3 * q + 1] = keys[order[q]];
    s[C + 3 * q + 2] = values[order[q]];
  }
  FP_ASSERT(C + 3 * P == T + 1);
}

}  // namespace

RecallTask recall_task_parse(const std::string& s) {
  if (s == "recall") return RecallTask::RecallTask_triples;
  if (s == "recall_packed") return RecallTask::RecallTask_packed;
  throw Error(fmt::format("data.task = \"{}\" is neither \"recall\" nor \"recall_packed\"", s),
              "write \"recall\" ([KEY, k, v] triples: an induction head answers) or \"recall_packed\" (one pair "
              "token per (k, v): one attention hop answers); docs/data.md");
}

int32_t recall_pair_token(const RecallLayout& lay, int32_t key, int32_t value) {
  const int32_t n = lay.value_end - lay.value_begin;
  FP_ASSERT(lay.pair_end - lay.pair_begin == n * n && key >= lay.key_begin && key < lay.key_end &&
                value >= lay.value_begin && value < lay.value_end,
            "pair token of key {} value {} in a layout with pairs [{}, {})", key, value, lay.pair_begin, lay.pair_end);
  return lay.pair_begin + (key - lay.key_begin) * n + (value - lay.value_begin);
}

LossOn loss_on_parse(const std::string& s) {
  if (s == "all") return LossOn::LossOn_all;
  if (s == "answers") return LossOn::LossOn_answers;
  throw Error(fmt::format("data.loss_on = \"{}\" is neither \"all\" nor \"answers\"", s),
              "write \"all\" (next token everywhere) or \"answers\" (only the recalled values)");
}

RecallLayout recall_layout(const RecallTaskConfig& cfg) {
  const int64_t V = cfg.vocab_size, T = cfg.seq_len;
  FP_CHECK(V >= kRecallMinVocab && V <= std::numeric_limits<int32_t>::max(),
           "the recall task needs 3 special tokens, keys and values: set model.vocab_size >= 64",
           "model.vocab_size = {} is out of range for the recall task (needs >= {})", V, kRecallMinVocab);
  FP_CHECK(T >= 6, "one key->value pair takes 3 tokens in the context and 3 in the queries",
           "train.seq_len = {} is too short for the recall task (needs >= 6)", T);
  RecallLayout lay;
  const bool packed = cfg.task == RecallTask::RecallTask_packed;
  // Triples: K = (V - 3) / 2 keys, the rest values and filler. Packed (Note [Packed recall]): n keys,
  // n values and n^2 pair tokens, n the largest with 3 + 2n + n^2 <= V.
  int64_t K = (V - 3) / 2;
  if (packed) {
    K = static_cast<int64_t>(std::sqrt(static_cast<double>(V - 2)));
    while (K * K > V - 2) --K;
    while ((K + 1) * (K + 1) <= V - 2) ++K;
    K -= 1;  // (K + 1)^2 <= V - 2, i.e. 3 + 2K + K^2 <= V
  }
  lay.key_begin = 3;
  lay.key_end = static_cast<int32_t>(3 + K);
  lay.value_begin = lay.key_end;
  lay.value_end = static_cast<int32_t>(packed ? 3 + 2 * K : V);
  lay.pair_begin = lay.pair_end = lay.value_end;
  if (packed) lay.pair_end = static_cast<int32_t>(lay.pair_begin + K * K);
  FP_CHECK(cfg.pairs >= 0, "set data.pairs >= 1, or 0 for the default train.seq_len / 64",
           "data.pairs = {} must be >= 0", cfg.pairs);
  lay.pairs = cfg.pairs > 0 ? cfg.pairs : std::min(std::max<int64_t>(1, T / 64), K);
  // A triple takes 3 context tokens, a pair token 1; each query takes 3.
  const int64_t per_pair = packed ? 4 : 6;
  FP_CHECK(lay.pairs * per_pair <= T,
           fmt::format("each pair takes {} in the context and 3 tokens in the queries: data.pairs <= "
                       "train.seq_len / {} = {}",
                       packed ? "1 token (data.task = \"recall_packed\")" : "3 tokens", per_pair, T / per_pair),
           "data.pairs = {} does not fit in train.seq_len = {}", lay.pairs, T);
  if (packed)
    FP_CHECK(lay.pairs <= K,
             fmt::format("data.task = \"recall_packed\" uses n keys, n values and n^2 pair tokens, "
                         "n = floor(sqrt(model.vocab_size - 2)) - 1 = {}: lower data.pairs to <= {} or raise "
                         "model.vocab_size to >= {} (3 + 2n + n^2 for n = {})",
                         K, K, 3 + 2 * lay.pairs + lay.pairs * lay.pairs, lay.pairs),
             "data.pairs = {} exceeds the {} distinct keys of model.vocab_size = {} (data.task = \"recall_packed\")",
             lay.pairs, K, V);
  else
    FP_CHECK(lay.pairs <= K,
             fmt::format("keys are distinct and use ids [3, {}): lower data.pairs to <= {} or raise "
                         "model.vocab_size to >= {}", 3 + K, K, 2 * lay.pairs + 3),
             "data.pairs = {} exceeds the {} distinct keys of model.vocab_size = {}", lay.pairs, K, V);
  lay.query_begin = T + 1 - 3 * lay.pairs;
  return lay;
}

std::vector<int32_t> recall_sequence(const RecallTaskConfig& cfg, int64_t sequence) {
  const RecallLayout lay = recall_layout(cfg);
  FP_ASSERT(sequence >= 0);
  std::vector<int32_t> s(static_cast<size_t>(cfg.seq_len + 1));
  sequence_fill(cfg, lay, zipf_cdf(lay.value_end - lay.value_begin), sequence, s.data());
  return s;
}

Batch recall_batch(const RecallTaskConfig& cfg, int64_t first_sequence, int64_t B,
                   std::vector<uint8_t>* answer_mask) {
  const RecallLayout lay = recall_layout(cfg);
  FP_ASSERT(first_sequence >= 0 && B >= 0, "first_sequence {} B {}", first_sequence, B);
  const int64_t T = cfg.seq_len, P = lay.pairs, C = lay.query_begin;
  const std::vector<double> cdf = zipf_cdf(lay.value_end - lay.value_begin);
  const bool answers_only = cfg.loss_on == LossOn::LossOn_answers;
  Batch b;
  b.B = B;
  b.T = T;
  b.tokens.resize(static_cast<size_t>(B * T));
  b.targets.resize(static_cast<size_t>(B * T));
  if (answer_mask) answer_mask->assign(static_cast<size_t>(B * T), 0);

  // Sequences are independent (each has its own Rng), so the result is the same for any thread count.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < B; ++i) {
    std::vector<int32_t> s(static_cast<size_t>(T + 1));
    sequence_fill(cfg, lay, cdf, first_sequence + i, s.data());
    int32_t* tok = b.tokens.data() + i * T;  // (T)
    int32_t* tgt = b.targets.data() + i * T;  // (T)
    std::memcpy(tok, s.data(), sizeof(int32_t) * T);
    if (answers_only) {
      std::fill(tgt, tgt + T, -100);
      for (int64_t q = 0; q < P; ++q) tgt[C + 3 * q + 1] = s[C + 3 * q + 2];
    } else {
      std::memcpy(tgt, s.data() + 1, sizeof(int32_t) * T);
    }
    if (answer_mask)
      for (int64_t q = 0; q < P; ++q) (*answer_mask)[i * T + C + 3 * q + 1] = 1;
  }
  return b;
}

double recall_accuracy(const std::vector<float>& logits, const Batch& batch,
                       const std::vector<uint8_t>& answer_mask) {
  const int64_t N = batch.B * batch.T;
  FP_ASSERT(N > 0 && static_cast<int64_t>(answer_mask.size()) == N && static_cast<int64_t>(batch.targets.size()) == N,
            "N {} mask {} targets {}", N, answer_mask.size(), batch.targets.size());
  FP_ASSERT(logits.size() % static_cast<size_t>(N) == 0, "logits {} not a multiple of B*T = {}", logits.size(), N);
  const int64_t V = static_cast<int64_t>(logits.size()) / N;
  int64_t answers = 0, correct = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (!answer_mask[i]) continue;
    const float* row = logits.data() + i * V;  // (V)
    const int64_t arg = std::max_element(row, row + V) - row;  // first maximum
    ++answers;
    correct += arg == batch.targets[i];
  }
  return answers ? static_cast<double>(correct) / static_cast<double>(answers) : 0.0;
}

}  // namespace fp
