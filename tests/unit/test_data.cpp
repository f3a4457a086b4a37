// The training data: recall task, llm.c token files, token-file loader (docs/data.md).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "core/error.h"
#include "data/loader.h"
#include "data/recall_task.h"
#include "data/token_file.h"
#include "io/atomic_file.h"

namespace fp {
namespace {

RecallTaskConfig recall_cfg(int64_t V = 64, int64_t T = 256, int64_t pairs = 0, uint64_t seed = 7) {
  RecallTaskConfig c;
  c.vocab_size = V;
  c.seq_len = T;
  c.pairs = pairs;
  c.seed = seed;
  return c;
}

// Runs f, which must throw fp::Error, and returns "what\nhint".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what()) + "\n" + e.hint();
  }
  ADD_FAILURE() << "no fp::Error thrown";
  return {};
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "missing '" << (part) << "' in: " << (text)

// ---------------------------------------------------------------------------------------------
// Recall task

// Row i's stream s[0..T] (loss on all positions): its tokens, then its last target; every target is the
// next token.
std::vector<int32_t> stream_of(const Batch& b, int64_t i, int64_t T) {
  std::vector<int32_t> s(b.tokens.begin() + i * T, b.tokens.begin() + (i + 1) * T);
  s.push_back(b.targets[(i + 1) * T - 1]);
  for (int64_t t = 0; t + 1 < T; ++t) EXPECT_EQ(b.targets[i * T + t], s[t + 1]) << "target not next token at " << t;
  return s;
}

TEST(RecallTask, SameIndexSameBatchOtherIndexOrSeedDiffers) {
  const RecallTaskConfig c = recall_cfg();
  std::vector<uint8_t> m1, m2;
  const Batch a = recall_batch(c, 5, 3, &m1), b = recall_batch(c, 5, 3, &m2);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_EQ(m1, m2);
  EXPECT_NE(recall_batch(c, 6, 3, nullptr).tokens, a.tokens);
  EXPECT_NE(recall_batch(recall_cfg(64, 256, 0, 8), 5, 3, nullptr).tokens, a.tokens);
  // Rows of one batch are different sequences.
  EXPECT_FALSE(std::equal(a.tokens.begin(), a.tokens.begin() + a.T, a.tokens.begin() + a.T));
}

TEST(RecallTask, IndependentOfBatchSplit) {
  for (LossOn lo : {LossOn::LossOn_all, LossOn::LossOn_answers}) {
    RecallTaskConfig c = recall_cfg(100, 300, 0, 3);
    c.loss_on = lo;
    std::vector<uint8_t> m, m0, m1;
    const Batch all = recall_batch(c, 0, 4, &m);
    const Batch lo_half = recall_batch(c, 0, 2, &m0), hi_half = recall_batch(c, 2, 2, &m1);
    std::vector<int32_t> tok = lo_half.tokens, tgt = lo_half.targets;
    tok.insert(tok.end(), hi_half.tokens.begin(), hi_half.tokens.end());
    tgt.insert(tgt.end(), hi_half.targets.begin(), hi_half.targets.end());
    m0.insert(m0.end(), m1.begin(), m1.end());
    EXPECT_EQ(all.B, 4);
    EXPECT_EQ(all.T, 300);
    EXPECT_EQ(all.tokens, tok);
    EXPECT_EQ(all.targets, tgt);
    EXPECT_EQ(m, m0);
  }
}

// Checks Note [Recall sequence layout] on many sequences and configs.
TEST(RecallTask, LayoutPlantsAnswersAndRanges) {
  struct Case { int64_t V, T, pairs; };
  for (const Case& k : {Case{64, 256, 0}, Case{64, 4096, 0}, Case{64, 6, 1}, Case{97, 61, 10}, Case{1000, 999, 100},
                        Case{64, 180, 30}}) {
    const RecallTaskConfig c = recall_cfg(k.V, k.T, k.pairs, 11);
    const RecallLayout lay = recall_layout(c);
    const int64_t T = k.T, P = lay.pairs, C = lay.query_begin;
    EXPECT_EQ(C, T + 1 - 3 * P);
    EXPECT_EQ(lay.value_end, k.V);
    std::vector<uint8_t> mask;
    const Batch b = recall_batch(c, 100, 5, &mask);
    ASSERT_EQ(static_cast<int64_t>(mask.size()), 5 * T);
    for (int64_t i = 0; i < 5; ++i) {
      SCOPED_TRACE(::testing::Message() << "V " << k.V << " T " << T << " row " << i);
      const std::vector<int32_t> s = stream_of(b, i, T);
      if (::testing::Test::HasFailure()) return;
      EXPECT_EQ(s, recall_sequence(c, 100 + i));
      EXPECT_EQ(s[0], kRecallBos);
      std::map<int32_t, std::pair<int32_t, int64_t>> planted;  // key -> (value, position)
      for (int64_t t = 1; t < C; ++t) {
        if (s[t] == kRecallKey) {
          ASSERT_LE(t + 2, C - 1) << "triple crosses into the queries";
          const int32_t key = s[t + 1], value = s[t + 2];
          EXPECT_TRUE(key >= lay.key_begin && key < lay.key_end) << "key " << key;
          EXPECT_TRUE(value >= lay.value_begin && value < lay.value_end) << "value " << value;
          EXPECT_TRUE(planted.emplace(key, std::make_pair(value, t + 1)).second) << "key " << key << " planted twice";
          t += 2;
        } else {
          // Filler: never a special token or a key.
          EXPECT_TRUE(s[t] >= lay.value_begin && s[t] < lay.value_end) << "filler " << s[t] << " at " << t;
        }
      }
      ASSERT_EQ(static_cast<int64_t>(planted.size()), P);
      std::set<int32_t> queried;
      for (int64_t t = 0; t < T; ++t) {
        const bool answer = t >= C && (t - C) % 3 == 1;
        EXPECT_EQ(mask[i * T + t], answer ? 1 : 0) << "mask at " << t;
      }
      for (int64_t q = 0; q < P; ++q) {
        const int64_t t = C + 3 * q;
        EXPECT_EQ(s[t], kRecallQuery);
        const int32_t key = s[t + 1];
        auto it = planted.find(key);
        ASSERT_NE(it, planted.end()) << "queried key " << key << " was never planted";
        EXPECT_LT(it->second.second, t + 1);
        EXPECT_EQ(b.targets[i * T + t + 1], it->second.first) << "answer at " << t + 1;
        EXPECT_TRUE(queried.insert(key).second) << "key " << key << " queried twice";
      }
    }
  }
}

TEST(RecallTask, PlantsSpreadOverTheContextAndQueriesShuffled) {
  const RecallTaskConfig c = recall_cfg(64, 1024, 4, 5);
  const int64_t C = recall_layout(c).query_begin;
  int64_t first_quarter = 0, last_quarter = 0, in_order = 0;
  const int64_t n = 200;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int32_t> s = recall_sequence(c, i);
    std::vector<int32_t> plant_order;
    for (int64_t t = 1; t < C; ++t)
      if (s[t] == kRecallKey) {
        first_quarter += t < C / 4;
        last_quarter += t >= 3 * C / 4;
        plant_order.push_back(s[t + 1]);
      }
    std::vector<int32_t> query_order;
    for (int64_t q = 0; q < 4; ++q) query_order.push_back(s[C + 3 * q + 1]);
    in_order += query_order == plant_order;
  }
  // 800 plants, a quarter expected in each quarter of the context.
  EXPECT_GT(first_quarter, 120);
  EXPECT_GT(last_quarter, 120);
  EXPECT_LT(in_order, 40);  // 1 in 24 expected
}

TEST(RecallTask, FillerIsZipf) {
  const RecallTaskConfig c = recall_cfg(64, 4096, 1, 9);
  const RecallLayout lay = recall_layout(c);
  std::vector<int64_t> count(64, 0);
  for (int64_t i = 0; i < 8; ++i) {
    const std::vector<int32_t> s = recall_sequence(c, i);
    for (int64_t t = 1; t < lay.query_begin; ++t) ++count[s[t]];
  }
  const double r0 = count[lay.value_begin], r1 = count[lay.value_begin + 1], r3 = count[lay.value_begin + 3];
  // p(rank r) ~ 1/(r+1): rank 0 twice rank 1 and four times rank 3 (32K samples: a few % noise).
  EXPECT_NEAR(r0 / r1, 2.0, 0.25);
  EXPECT_NEAR(r0 / r3, 4.0, 0.6);
}

TEST(RecallTask, LossOnAnswersMasksEverythingElse) {
  RecallTaskConfig c = recall_cfg(64, 512, 0, 2);
  std::vector<uint8_t> mask;
  const Batch all = recall_batch(c, 0, 3, &mask);
  c.loss_on = LossOn::LossOn_answers;
  std::vector<uint8_t> mask2;
  const Batch ans = recall_batch(c, 0, 3, &mask2);
  EXPECT_EQ(all.tokens, ans.tokens);
  EXPECT_EQ(mask, mask2);
  int64_t answers = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i]) {
      ++answers;
      EXPECT_EQ(ans.targets[i], all.targets[i]) << i;
    } else {
      EXPECT_EQ(ans.targets[i], -100) << i;
    }
  }
  EXPECT_EQ(answers, 3 * recall_layout(c).pairs);
  EXPECT_EQ(answers, 3 * 8);
}

TEST(RecallTask, AccuracyCountsArgmaxAtAnswers) {
  const RecallTaskConfig c = recall_cfg(64, 128, 0, 4);
  std::vector<uint8_t> mask;
  const Batch b = recall_batch(c, 0, 2, &mask);
  const int64_t N = b.B * b.T, V = 64;
  std::vector<float> right(N * V), wrong(N * V), half(N * V);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t v = 0; v < V; ++v) {
      const bool hit = v == b.targets[i];
      right[i * V + v] = hit ? 3.0f : -1.0f + 0.01f * v;
      wrong[i * V + v] = hit ? -5.0f : 0.5f;
      half[i * V + v] = right[i * V + v];
    }
  // Spoil half of the answers.
  int64_t seen = 0, answers = 0;
  for (int64_t i = 0; i < N; ++i) answers += mask[i];
  for (int64_t i = 0; i < N && seen < answers / 2; ++i)
    if (mask[i]) {
      std::copy(wrong.begin() + i * V, wrong.begin() + (i + 1) * V, half.begin() + i * V);
      ++seen;
    }
  EXPECT_EQ(recall_accuracy(right, b, mask), 1.0);
  EXPECT_EQ(recall_accuracy(wrong, b, mask), 0.0);
  EXPECT_DOUBLE_EQ(recall_accuracy(half, b, mask), static_cast<double>(answers - answers / 2) / answers);
}

TEST(RecallTask, DefaultPairsScaleWithSeqLen) {
  EXPECT_EQ(recall_layout(recall_cfg(64, 63)).pairs, 1);
  EXPECT_EQ(recall_layout(recall_cfg(64, 256)).pairs, 4);
  EXPECT_EQ(recall_layout(recall_cfg(64, 4096)).pairs, 30);  // capped at the (64 - 3) / 2 keys
  EXPECT_EQ(recall_layout(recall_cfg(50257, 4096)).pairs, 64);
  EXPECT_EQ(recall_layout(recall_cfg(64, 256, 9)).pairs, 9);
}

TEST(RecallTask, BadConfigNamesTheKey) {
  EXPECT_HAS(error_of([] { recall_layout(recall_cfg(64, 256, 500)); }),
             "data.pairs = 500 does not fit in train.seq_len = 256");
  EXPECT_HAS(error_of([] { recall_layout(recall_cfg(64, 256, 43)); }), "train.seq_len / 6 = 42");
  EXPECT_HAS(error_of([] { recall_layout(recall_cfg(64, 1024, 31)); }), "data.pairs = 31 exceeds the 30 distinct keys");
  EXPECT_HAS(error_of([] { recall_layout(recall_cfg(32, 256)); }), "model.vocab_size = 32");
  EXPECT_HAS(error_of([] { recall_layout(recall_cfg(64, 5)); }), "train.seq_len = 5");
  EXPECT_HAS(error_of([] { recall_layout(recall_cfg(64, 256, -1)); }), "data.pairs = -1");
  EXPECT_HAS(error_of([] { recall_batch(recall_cfg(64, 256, 500), 0, 1, nullptr); }), "data.pairs = 500");
  EXPECT_EQ(loss_on_parse("all"), LossOn::LossOn_all);
  EXPECT_EQ(loss_on_parse("answers"), LossOn::LossOn_answers);
  EXPECT_HAS(error_of([] { loss_on_parse("everything"); }), "data.loss_on = \"everything\"");
}

// ---------------------------------------------------------------------------------------------
// Packed recall (data.task = "recall_packed", Note [Packed recall])

RecallTaskConfig packed_cfg(int64_t V = 83, int64_t T = 256, int64_t pairs = 0, uint64_t seed = 7) {
  RecallTaskConfig c = recall_cfg(V, T, pairs, seed);
  c.task = RecallTask::RecallTask_packed;
  return c;
}

TEST(RecallPacked, TokenRangesFollowTheVocabulary) {
  // n = floor(sqrt(V - 2)) - 1: keys [3, 3 + n), values [3 + n, 3 + 2n), pairs [3 + 2n, 3 + 2n + n^2).
  struct Case { int64_t V, n; };
  for (const Case& k : {Case{64, 6}, Case{82, 7}, Case{83, 8}, Case{123, 10}, Case{256, 14}, Case{258, 15},
                        Case{50257, 223}}) {
    SCOPED_TRACE(::testing::Message() << "V " << k.V);
    const RecallLayout lay = recall_layout(packed_cfg(k.V, 4096, 1));
    EXPECT_EQ(lay.key_begin, 3);
    EXPECT_EQ(lay.key_end, 3 + k.n);
    EXPECT_EQ(lay.value_begin, 3 + k.n);
    EXPECT_EQ(lay.value_end, 3 + 2 * k.n);
    EXPECT_EQ(lay.pair_begin, 3 + 2 * k.n);
    EXPECT_EQ(lay.pair_end, 3 + 2 * k.n + k.n * k.n);
    EXPECT_LE(lay.pair_end, k.V);
    // Every (k, v) has its own pair token.
    std::set<int32_t> ids;
    for (int32_t key = lay.key_begin; key < lay.key_end; ++key)
      for (int32_t v = lay.value_begin; v < lay.value_end; ++v) ids.insert(recall_pair_token(lay, key, v));
    EXPECT_EQ(static_cast<int64_t>(ids.size()), k.n * k.n);
    EXPECT_EQ(*ids.begin(), lay.pair_begin);
    EXPECT_EQ(*ids.rbegin(), lay.pair_end - 1);
  }
  // The triples' layout has no pair tokens.
  const RecallLayout tri = recall_layout(recall_cfg(83, 256));
  EXPECT_EQ(tri.pair_begin, tri.pair_end);
  EXPECT_EQ(tri.value_end, 83);
}

// Every queried key's pair token lies in the context, before its query, with the answer's value.
TEST(RecallPacked, LayoutPlantsAnswersAndRanges) {
  struct Case { int64_t V, T, pairs; };
  for (const Case& k : {Case{83, 256, 0}, Case{83, 1024, 8}, Case{83, 6, 1}, Case{83, 8, 2}, Case{256, 64, 14},
                        Case{64, 24, 6}, Case{1000, 999, 30}}) {
    const RecallTaskConfig c = packed_cfg(k.V, k.T, k.pairs, 11);
    const RecallLayout lay = recall_layout(c);
    const int64_t T = k.T, P = lay.pairs, C = lay.query_begin;
    EXPECT_EQ(C, T + 1 - 3 * P);
    std::vector<uint8_t> mask;
    const Batch b = recall_batch(c, 100, 5, &mask);
    ASSERT_EQ(static_cast<int64_t>(mask.size()), 5 * T);
    for (int64_t i = 0; i < 5; ++i) {
      SCOPED_TRACE(::testing::Message() << "V " << k.V << " T " << T << " row " << i);
      const std::vector<int32_t> s = stream_of(b, i, T);
      if (::testing::Test::HasFailure()) return;
      EXPECT_EQ(s, recall_sequence(c, 100 + i));
      EXPECT_EQ(s[0], kRecallBos);
      std::map<int32_t, std::pair<int32_t, int64_t>> planted;  // key -> (value, position of the pair token)
      for (int64_t t = 1; t < C; ++t) {
        if (s[t] >= lay.pair_begin && s[t] < lay.pair_end) {
          const int32_t n = lay.value_end - lay.value_begin, off = s[t] - lay.pair_begin;
          const int32_t key = lay.key_begin + off / n, value = lay.value_begin + off % n;
          EXPECT_EQ(recall_pair_token(lay, key, value), s[t]);
          EXPECT_TRUE(planted.emplace(key, std::make_pair(value, t)).second) << "key " << key << " planted twice";
        } else {
          // Filler: a value token, never a special token, a key or a pair token.
          EXPECT_TRUE(s[t] >= lay.value_begin && s[t] < lay.value_end) << "filler " << s[t] << " at " << t;
        }
      }
      ASSERT_EQ(static_cast<int64_t>(planted.size()), P);
      for (int64_t t = 0; t < T; ++t) {
        const bool answer = t >= C && (t - C) % 3 == 1;
        EXPECT_EQ(mask[i * T + t], answer ? 1 : 0) << "mask at " << t;
      }
      std::set<int32_t> queried;
      for (int64_t q = 0; q < P; ++q) {
        const int64_t t = C + 3 * q;
        EXPECT_EQ(s[t], kRecallQuery);
        const int32_t key = s[t + 1];
        EXPECT_TRUE(key >= lay.key_begin && key < lay.key_end) << "query key " << key;
        auto it = planted.find(key);
        ASSERT_NE(it, planted.end()) << "queried key " << key << " has no pair token in the context";
        EXPECT_LT(it->second.second, C);
        EXPECT_EQ(s[t + 2], it->second.first);
        EXPECT_EQ(b.targets[i * T + t + 1], it->second.first) << "answer at " << t + 1;
        EXPECT_TRUE(queried.insert(key).second) << "key " << key << " queried twice";
      }
      // A key occurs only in its pair token and its query: no key token and no KEY marker in the context.
      for (int64_t t = 0; t < C; ++t) EXPECT_FALSE(s[t] == kRecallKey || (s[t] >= lay.key_begin && s[t] < lay.key_end));
    }
  }
}

TEST(RecallPacked, DeterministicSplittableAndOtherThanTriples) {
  const RecallTaskConfig c = packed_cfg(83, 512, 8, 3);
  std::vector<uint8_t> m, m0, m1, m2;
  const Batch all = recall_batch(c, 0, 4, &m), again = recall_batch(c, 0, 4, &m2);
  EXPECT_EQ(all.tokens, again.tokens);
  EXPECT_EQ(all.targets, again.targets);
  EXPECT_EQ(m, m2);
  const Batch lo = recall_batch(c, 0, 2, &m0), hi = recall_batch(c, 2, 2, &m1);
  std::vector<int32_t> joined = lo.tokens;
  joined.insert(joined.end(), hi.tokens.begin(), hi.tokens.end());
  EXPECT_EQ(joined, all.tokens);
  m0.insert(m0.end(), m1.begin(), m1.end());
  EXPECT_EQ(m0, m);
  EXPECT_NE(recall_batch(packed_cfg(83, 512, 8, 4), 0, 4, nullptr).tokens, all.tokens);
  EXPECT_NE(recall_batch(recall_cfg(83, 512, 8, 3), 0, 4, nullptr).tokens, all.tokens);
}

TEST(RecallPacked, PlantsSpreadOverTheContext) {
  const RecallTaskConfig c = packed_cfg(83, 1024, 4, 5);
  const RecallLayout lay = recall_layout(c);
  const int64_t C = lay.query_begin;
  int64_t first_quarter = 0, last_quarter = 0, plants = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const std::vector<int32_t> s = recall_sequence(c, i);
    for (int64_t t = 1; t < C; ++t)
      if (s[t] >= lay.pair_begin) {
        ++plants;
        first_quarter += t < C / 4;
        last_quarter += t >= 3 * C / 4;
      }
  }
  EXPECT_EQ(plants, 800);
  EXPECT_GT(first_quarter, 120);  // 200 expected in each quarter
  EXPECT_GT(last_quarter, 120);
}

TEST(RecallPacked, LossOnAnswersMasksEverythingElse) {
  RecallTaskConfig c = packed_cfg(83, 1024, 8, 2);
  std::vector<uint8_t> mask, mask2;
  const Batch all = recall_batch(c, 0, 3, &mask);
  c.loss_on = LossOn::LossOn_answers;
  const Batch ans = recall_batch(c, 0, 3, &mask2);
  EXPECT_EQ(all.tokens, ans.tokens);
  EXPECT_EQ(mask, mask2);
  int64_t answers = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    answers += mask[i];
    EXPECT_EQ(ans.targets[i], mask[i] ? all.targets[i] : -100) << i;
  }
  EXPECT_EQ(answers, 3 * 8);
  // recall_accuracy: a model that reads the answer off the targets scores 1.
  const int64_t N = ans.B * ans.T, V = 83;
  std::vector<float> logits(static_cast<size_t>(N * V), 0.0f);
  for (int64_t i = 0; i < N; ++i)
    if (mask[i]) logits[i * V + ans.targets[i]] = 1.0f;
  EXPECT_EQ(recall_accuracy(logits, ans, mask), 1.0);
}

TEST(RecallPacked, BadConfigSaysWhatVocabularyItNeeds) {
  EXPECT_EQ(recall_layout(packed_cfg(83, 1024)).pairs, 8);  // T / 64 = 16, capped at the n = 8 keys
  EXPECT_EQ(recall_layout(packed_cfg(83, 128)).pairs, 2);
  const std::string many = error_of([] { recall_layout(packed_cfg(83, 1024, 9)); });
  EXPECT_HAS(many, "data.pairs = 9 exceeds the 8 distinct keys of model.vocab_size = 83");
  EXPECT_HAS(many, "model.vocab_size to >= 102");  // 3 + 2 * 9 + 81
  EXPECT_HAS(error_of([] { recall_layout(packed_cfg(83, 31, 8)); }), "train.seq_len / 4 = 7");
  EXPECT_EQ(recall_layout(packed_cfg(83, 32, 8)).query_begin, 9);  // 8 pair tokens + 24 query tokens + BOS
  EXPECT_HAS(error_of([] { recall_layout(packed_cfg(32, 256)); }), "model.vocab_size = 32");
  EXPECT_EQ(recall_task_parse("recall"), RecallTask::RecallTask_triples);
  EXPECT_EQ(recall_task_parse("recall_packed"), RecallTask::RecallTask_packed);
  EXPECT_HAS(error_of([] { recall_task_parse("packed"); }), "data.task = \"packed\"");
}

// ---------------------------------------------------------------------------------------------
// Token files

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("flatpeak_test_data_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Writes tokens then lets edit change the raw bytes.
  template <class F>
  std::string corrupt(const std::vector<uint16_t>& tokens, F&& edit) {
    const std::string p = path("corrupt.bin");
    token_file_write(p, tokens);
    std::string bytes = file_read(p);
    edit(bytes);
    file_write_atomic(p, bytes);
    return p;
  }
  static void put_i32(std::string& b, size_t at, int32_t v) {
    for (int k = 0; k < 4; ++k) b[at + k] = static_cast<char>((static_cast<uint32_t>(v) >> (8 * k)) & 0xFF);
  }
  std::filesystem::path dir_;
};

std::vector<uint16_t> iota_tokens(int64_t n, int64_t modulo = 65536) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i % modulo);
  return t;
}

TEST_F(TokenFileTest, RoundTripInLlmcLayout) {
  std::vector<uint16_t> tokens = {0, 1, 255, 256, 50256, 65535, 7};
  const std::string p = path("a.bin");
  token_file_write(p, tokens);
  const std::string bytes = file_read(p);
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  auto u8 = [&](size_t i) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[i])); };
  EXPECT_EQ(u8(0) | u8(1) << 8 | u8(2) << 16 | u8(3) << 24, 20240520u);  // little-endian magic
  EXPECT_EQ(u8(4), 1u);
  EXPECT_EQ(u8(8), 7u);
  for (size_t i = 12; i < 1024; ++i) ASSERT_EQ(u8(i), 0u) << "header byte " << i;
  EXPECT_EQ(u8(1024 + 2 * 4), 50256u & 0xFF);  // tokens little-endian too
  EXPECT_EQ(u8(1024 + 2 * 4 + 1), 50256u >> 8);
  const TokenFile f(p, 65536);
  ASSERT_EQ(f.size(), 7);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), f.data()));

  token_file_write(p, std::vector<uint16_t>{});
  EXPECT_EQ(TokenFile(p, 64).size(), 0);
}

// llm.c's uint32 variant (magic 20240801, version 7), for vocabularies above 65,536 ids (Qwen: 151,936).
TEST_F(TokenFileTest, Uint32VariantRoundTripAndChecks) {
  const std::vector<uint32_t> tokens = {0, 65535, 65536, 151935, 7};
  const std::string p = path("wide.bin");
  token_file_write(p, tokens);
  const std::string bytes = file_read(p);
  ASSERT_EQ(bytes.size(), 1024u + 4 * tokens.size());
  auto u8 = [&](size_t i) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[i])); };
  EXPECT_EQ(u8(0) | u8(1) << 8 | u8(2) << 16 | u8(3) << 24, 20240801u);
  EXPECT_EQ(u8(4), 7u);
  EXPECT_EQ(u8(1024 + 4 * 3) | u8(1024 + 4 * 3 + 1) << 8 | u8(1024 + 4 * 3 + 2) << 16, 151935u);
  const TokenFile f(p, 151936);
  ASSERT_TRUE(f.wide());
  ASSERT_EQ(f.size(), 5);
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), f.data()));
  // The ids are checked against the vocabulary as in the uint16 variant.
  EXPECT_HAS(error_of([&] { TokenFile(p, 100000); }), "token 151935 at position 3 is >= model.vocab_size = 100000");
  // A version that is not llm.c's for this magic, and a body of the wrong width, are refused.
  std::string b = bytes;
  b[4] = 1;
  file_write_atomic(p, b);
  EXPECT_HAS(error_of([&] { TokenFile(p, 151936); }), "version 1 (expected 7: uint32 tokens)");
  b = bytes;
  b.resize(1024 + 2 * tokens.size());
  file_write_atomic(p, b);
  EXPECT_HAS(error_of([&] { TokenFile(p, 151936); }), "truncated");
}

TEST_F(TokenFileTest, EachCorruptionSaysWhatIsWrong) {
  const std::vector<uint16_t> good = {3, 4, 5, 6, 7, 8};
  {
    const std::string p = corrupt(good, [](std::string& b) { put_i32(b, 0, 12345); });
    const std::string e = error_of([&] { TokenFile(p, 64); });
    EXPECT_HAS(e, "magic 12345 (expected 20240520 for uint16 tokens or 20240801 for uint32)");
    EXPECT_HAS(e, "llm.c-format .bin");
  }
  {
    const std::string p = corrupt(good, [](std::string& b) { put_i32(b, 4, 2); });
    EXPECT_HAS(error_of([&] { TokenFile(p, 64); }), "version 2 (expected 1");
  }
  {
    const std::string p = corrupt(good, [](std::string& b) { b.pop_back(); });
    const std::string e = error_of([&] { TokenFile(p, 64); });
    EXPECT_HAS(e, "truncated");
    EXPECT_HAS(e, "1036 bytes expected, but it has 1035 bytes");
  }
  {
    const std::string p = corrupt(good, [](std::string& b) { b += "xyz"; });
    const std::string e = error_of([&] { TokenFile(p, 64); });
    EXPECT_HAS(e, "trailing data");
    EXPECT_HAS(e, "1036 bytes expected, but it has 1039 bytes");
  }
  {
    const std::string p = corrupt(good, [](std::string& b) { b.resize(1000); });
    EXPECT_HAS(error_of([&] { TokenFile(p, 64); }), "1000 bytes, fewer than its 1024-byte header");
  }
  {
    std::vector<uint16_t> bad = good;
    bad[3] = 70;
    bad[5] = 90;
    const std::string p = path("ids.bin");
    token_file_write(p, bad);
    const std::string e = error_of([&] { TokenFile(p, 64); });
    EXPECT_HAS(e, "token 70 at position 3 is >= model.vocab_size = 64");
    EXPECT_HAS(e, "tokenizer's vocabulary must not exceed model.vocab_size");
    EXPECT_EQ(TokenFile(p, 91).size(), 6);
  }
  EXPECT_HAS(error_of([&] { TokenFile(path("missing.bin"), 64); }), "cannot read token file");
  EXPECT_HAS(error_of([&] { TokenFile(dir_.string(), 64); }), "is a directory");
}

// The loader over tokens 0, 1, 2, ...: every token is its own offset, so windows are readable.
TEST_F(TokenFileTest, LoaderTakesWindowsInOrderAndWraps) {
  const std::string p = path("seq.bin");
  token_file_write(p, iota_tokens(11));
  const TokenFile f(p, 65536);
  TokenFileLoader loader(f, 2, 4);
  auto expect_rows = [](const Batch& b, std::vector<int32_t> starts) {
    ASSERT_EQ(b.B, static_cast<int64_t>(starts.size()));
    ASSERT_EQ(b.T, 4);
    for (int64_t r = 0; r < b.B; ++r)
      for (int64_t t = 0; t < 4; ++t) {
        EXPECT_EQ(b.tokens[r * 4 + t], starts[r] + t) << "row " << r << " t " << t;
        EXPECT_EQ(b.targets[r * 4 + t], starts[r] + t + 1) << "row " << r << " t " << t;
      }
  };
  EXPECT_EQ(loader.position(), 0);
  expect_rows(loader.next(), {0, 4});
  EXPECT_EQ(loader.position(), 8);
  expect_rows(loader.next(), {0, 4});  // 8 + 4 + 1 > 11: wraps
  // A batch that straddles the wrap: with T = 3 windows start at 0, 3, 6 then wrap (9 + 4 > 11).
  TokenFileLoader l3(f, 2, 3);
  l3.next();
  const Batch b = l3.next();
  EXPECT_EQ(b.tokens[0], 6);
  EXPECT_EQ(b.tokens[3], 0);
  EXPECT_EQ(l3.position(), 3);
  // The last window may end exactly at the file's end: 9 tokens hold (9 - 1) / 4 = 2 windows.
  const std::string e = path("even.bin");
  token_file_write(e, iota_tokens(9));
  const TokenFile h(e, 65536);
  TokenFileLoader two(h, 3, 4);
  expect_rows(two.next(), {0, 4, 0});
  // Exactly T + 1 tokens: one window, repeated.
  const std::string q = path("short.bin");
  token_file_write(q, iota_tokens(5));
  const TokenFile g(q, 65536);
  TokenFileLoader one(g, 3, 4);
  expect_rows(one.next(), {0, 0, 0});
}

TEST_F(TokenFileTest, LoaderResumesFromPosition) {
  const std::string p = path("long.bin");
  token_file_write(p, iota_tokens(1000));
  const TokenFile f(p, 65536);
  TokenFileLoader a(f, 3, 16);
  std::vector<Batch> ref;
  int64_t saved = -1;
  for (int s = 0; s < 40; ++s) {  // 40 x 3 x 16 tokens: passes the wrap twice
    if (s == 25) saved = a.position();
    ref.push_back(a.next());
  }
  TokenFileLoader b(f, 3, 16);
  b.seek(saved);
  EXPECT_EQ(b.position(), saved);
  for (int s = 25; s < 40; ++s) {
    const Batch got = b.next();
    EXPECT_EQ(got.tokens, ref[s].tokens) << "step " << s;
    EXPECT_EQ(got.targets, ref[s].targets) << "step " << s;
  }
  EXPECT_HAS(error_of([&] { b.seek(1001); }), "cannot seek token file");
  EXPECT_HAS(error_of([&] { b.seek(-1); }), "cannot seek token file");
  b.seek(1000);  // the end is a valid position: the next sequence wraps
  EXPECT_EQ(b.next().tokens[0], 0);
}

TEST_F(TokenFileTest, TooShortForOneSequence) {
  const std::string p = path("tiny.bin");
  token_file_write(p, iota_tokens(4));
  const TokenFile f(p, 65536);
  const std::string e = error_of([&] { TokenFileLoader(f, 1, 4); });
  EXPECT_HAS(e, "has 4 tokens, fewer than train.seq_len + 1 = 5");
  EXPECT_HAS(error_of([&] { token_file_eval_batches(f, 4, 2); }), "fewer than train.seq_len + 1 = 5");
}

TEST_F(TokenFileTest, EvalBatchesCoverEverySequenceOnce) {
  const std::string p = path("val.bin");
  token_file_write(p, iota_tokens(23));
  const TokenFile f(p, 65536);
  const std::vector<Batch> bs = token_file_eval_batches(f, 4, 2);  // (23 - 1) / 4 = 5 sequences
  ASSERT_EQ(bs.size(), 3u);
  EXPECT_EQ(bs[0].B, 2);
  EXPECT_EQ(bs[1].B, 2);
  EXPECT_EQ(bs[2].B, 1);
  int64_t seq = 0;
  for (const Batch& b : bs) {
    ASSERT_EQ(b.T, 4);
    ASSERT_EQ(b.tokens.size(), static_cast<size_t>(b.B * 4));
    for (int64_t r = 0; r < b.B; ++r, ++seq)
      for (int64_t t = 0; t < 4; ++t) {
        EXPECT_EQ(b.tokens[r * 4 + t], seq * 4 + t);
        EXPECT_EQ(b.targets[r * 4 + t], seq * 4 + t + 1);
      }
  }
  EXPECT_EQ(seq, 5);
  EXPECT_EQ(token_file_eval_batches(f, 22, 8).size(), 1u);  // exactly T + 1 tokens
}

// scripts/make_token_file.py writes files this reader accepts (skipped without python3).
TEST_F(TokenFileTest, PythonScriptWritesReadableFiles) {
  if (std::system("python3 -c pass >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  const std::string script = std::string(FLATPEAK_SOURCE_DIR) + "/scripts/make_token_file.py";
  const std::string text = "héllo, flatpeak\n";
  std::ofstream(path("in.txt"), std::ios::binary) << text;
  ASSERT_EQ(std::system(("python3 " + script + " --text " + path("in.txt") + " -o " + path("t.bin") +
                         " >/dev/null").c_str()), 0);
  const TokenFile t(path("t.bin"), 256);
  ASSERT_EQ(t.size(), static_cast<int64_t>(text.size()));  // bytes, not characters
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(t.data()[i], static_cast<unsigned char>(text[i])) << i;

  std::ofstream(path("ids.txt")) << "5 50256\n0,65535 7\n";
  ASSERT_EQ(std::system(("python3 " + script + " --ids " + path("ids.txt") + " -o " + path("i.bin") +
                         " >/dev/null").c_str()), 0);
  const TokenFile i(path("i.bin"), 65536);
  const std::vector<uint16_t> want = {5, 50256, 0, 65535, 7};
  ASSERT_EQ(i.size(), 5);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), i.data()));
  // Ids above uint16 give llm.c's uint32 variant; a negative id is refused and nothing is written.
  std::ofstream(path("big.txt")) << "1 65536 151935\n";
  ASSERT_EQ(std::system(("python3 " + script + " --ids " + path("big.txt") + " -o " + path("w.bin") +
                         " >/dev/null").c_str()), 0);
  const TokenFile w(path("w.bin"), 151936);
  EXPECT_TRUE(w.wide());
  const std::vector<uint32_t> want_wide = {1, 65536, 151935};
  ASSERT_EQ(w.size(), 3);
  EXPECT_TRUE(std::equal(want_wide.begin(), want_wide.end(), w.data()));
  std::ofstream(path("neg.txt")) << "1 -3\n";
  EXPECT_NE(std::system(("python3 " + script + " --ids " + path("neg.txt") + " -o " + path("b.bin") +
                         " >/dev/null 2>&1").c_str()), 0);
  EXPECT_FALSE(std::filesystem::exists(path("b.bin")));
}

}  // namespace
}  // namespace fp
