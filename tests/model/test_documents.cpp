// Packed documents through the whole step (Note [Documents from EOS], data/documents.h): a batch of
// windows, each holding several documents that end with EOS (and a last fragment that runs past the
// window), against every document run alone as its own sequence on the same weights:
//   - the logits of every position within 1e-6 (norm-relative per position);
//   - the loss: the packed mean over the remaining targets is the target-weighted mean of the documents';
//   - every gradient: the packed one is the target-weighted sum of the documents' (1e-6 norm-relative);
// for Qwen3-MoE (with and without a sliding window shorter than a document), DeepSeek-V3's MLA, and the
// bf16 recipe against its own runs alone. A boundary left out (data.documents = "none") is caught. The
// load-balancing loss is a statistic of the whole batch (transformers takes it over every token of a
// forward call), not a sum over documents, so these models run with router_aux_loss_coef = 0.
// Ring attention over W ranks with documents: tests/dist (dist_check.py grads_documents).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "../common/deepseek_config.h"
#include "../common/norm_rel.h"
#include "backend/backend.h"
#include "core/rng.h"
#include "core/units.h"
#include "data/context_split.h"
#include "data/documents.h"
#include "step/step.h"

namespace fp {

namespace {

constexpr int32_t kEos = 3;

ModelConfig qwen_config(int64_t window) {
  ModelConfig m;
  m.hidden_size = 24, m.num_hidden_layers = 2, m.num_attention_heads = 4, m.num_key_value_heads = 2, m.head_dim = 8;
  m.num_experts = 6, m.num_experts_per_tok = 2, m.moe_intermediate_size = 20, m.vocab_size = 50;
  m.norm_topk_prob = true, m.router_aux_loss_coef = 0, m.seed = 5;
  m.sliding_window = window;
  return m;
}

// Documents of the given lengths packed into one window each (B windows of T tokens): each but the
// last of a window ends with EOS, the last is a fragment; targets are the next token of the stream.
struct Packed {
  Batch batch;
  std::vector<std::vector<int64_t>> docs;
};

Packed packed_batch(const std::vector<std::vector<int64_t>>& docs, int64_t V, uint64_t seed) {
  Rng rng(seed);
  Packed p;
  p.docs = docs;
  p.batch.B = static_cast<int64_t>(docs.size());
  p.batch.T = std::accumulate(docs[0].begin(), docs[0].end(), int64_t{0});
  for (const auto& lens : docs) {
    std::vector<int32_t> stream;
    for (size_t d = 0; d < lens.size(); ++d)
      for (int64_t t = 0; t < lens[d]; ++t) {
        const bool end = t + 1 == lens[d] && d + 1 < lens.size();
        int32_t id = static_cast<int32_t>(rng.below(V - 1));
        if (id >= kEos) ++id;  // EOS only where a document ends
        stream.push_back(end ? kEos : id);
      }
    stream.push_back(static_cast<int32_t>(rng.below(V)));  // the token after the window
    p.batch.tokens.insert(p.batch.tokens.end(), stream.begin(), stream.end() - 1);
    p.batch.targets.insert(p.batch.targets.end(), stream.begin() + 1, stream.end());
  }
  return p;
}

struct StepRun {
  StepOutputs out;
  std::vector<float> logits;               // (B, T, V)
  std::vector<std::vector<float>> grads;   // every parameter's
};

StepRun step(const ModelConfig& m, const Batch& b, const Precision& precision = {}) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  Model model(m, *be, RoutingProfile{}, Schedules{}, precision);
  model.init_weights(m.seed);
  StepRun r;
  r.out = step_forward_backward(model, b, &r.logits);
  for (Param& q : model.params().all()) {
    std::vector<float> g(static_cast<size_t>(q.g.numel()));
    if (q.g.dtype() == DType::DType_F32) {
      be->copy_to_host(g.data(), q.g.data(), q.g.bytes());
    } else {
      std::vector<uint16_t> h(g.size());
      be->copy_to_host(h.data(), q.g.data(), q.g.bytes());
      for (size_t i = 0; i < g.size(); ++i) g[i] = bf16_to_float(h[i]);
    }
    r.grads.push_back(std::move(g));
  }
  return r;
}

// The packed step against every document alone; returns the worst logits and gradient differences.
struct Compared {
  double logits = 0, grads = 0, loss = 0;
};

Compared compare(const ModelConfig& m, const Packed& p, const Precision& precision = {}) {
  Batch packed = p.batch;
  batch_documents_from_eos(packed, kEos);
  const StepRun whole = step(m, packed, precision);
  const int64_t T = packed.T, V = m.vocab_size;
  Compared c;
  double loss_sum = 0;
  int64_t targets = 0;
  std::vector<std::vector<double>> grads(whole.grads.size());
  for (size_t i = 0; i < grads.size(); ++i) grads[i].assign(whole.grads[i].size(), 0.0);
  for (int64_t b = 0; b < packed.B; ++b) {
    int64_t t0 = 0;
    for (const int64_t len : p.docs[b]) {
      Batch alone;
      alone.B = 1;
      alone.T = len;
      alone.tokens.assign(packed.tokens.begin() + b * T + t0, packed.tokens.begin() + b * T + t0 + len);
      alone.targets.assign(packed.targets.begin() + b * T + t0, packed.targets.begin() + b * T + t0 + len);
      int64_t n = 0;
      for (const int32_t t : alone.targets) n += t != -100;
      if (n == 0) {  // a lone EOS: no target, nothing to compare but its logits (a step needs a target)
        alone.targets.back() = 0;
      }
      const StepRun r = step(m, alone, precision);
      for (int64_t t = 0; t < len; ++t)
        c.logits = std::max(c.logits, norm_rel(whole.logits.data() + ((b * T + t0 + t) * V),
                                               r.logits.data() + t * V, static_cast<size_t>(V)));
      if (n > 0) {
        loss_sum += r.out.ce_loss * static_cast<double>(n);
        targets += n;
        for (size_t i = 0; i < grads.size(); ++i)
          for (size_t j = 0; j < grads[i].size(); ++j) grads[i][j] += static_cast<double>(n) * r.grads[i][j];
      }
      t0 += len;
    }
  }
  EXPECT_EQ(whole.out.target_tokens, targets);
  c.loss = std::fabs(whole.out.ce_loss - loss_sum / static_cast<double>(targets)) / std::fabs(whole.out.ce_loss);
  for (size_t i = 0; i < grads.size(); ++i) {
    std::vector<float> want(grads[i].size());
    for (size_t j = 0; j < want.size(); ++j) want[j] = static_cast<float>(grads[i][j] / static_cast<double>(targets));
    c.grads = std::max(c.grads, norm_rel(whole.grads[i].data(), want.data(), want.size()));
  }
  return c;
}

// Documents of 1 token, several in a window, a window that is one fragment; 64-token tiles crossed.
const std::vector<std::vector<int64_t>> kDocs = {{17, 1, 30, 12, 70}, {100, 30}};

}  // namespace

TEST(Documents, PackedWindowEqualsEachDocumentAlone) {
  for (const ModelConfig& m : {qwen_config(0), qwen_config(9), deepseek_small_config(2, 0, 1)}) {
    SCOPED_TRACE(::testing::Message() << model_type_name(m.model_type) << " window " << m.sliding_window);
    const Compared c = compare(m, packed_batch(kDocs, m.vocab_size, 11));
    std::printf("%s window %lld: logits %.2e, loss %.2e, gradients %.2e (norm-relative, worst)\n",
                model_type_name(m.model_type), static_cast<long long>(m.sliding_window), c.logits, c.loss, c.grads);
    EXPECT_LE(c.logits, 1e-6);
    EXPECT_LE(c.loss, 1e-6);
    // The packed weight gradients sum the whole batch's tokens in one float GEMM, the reference each
    // document's and then the documents in double: measured 5-6e-7 (Haswell kernels), bound 3e-6.
    EXPECT_LE(c.grads, 3e-6);
  }
}

// bf16 activations round each document's tensors where it lies in its window: rows are rounded alike,
// but the attention sums are blocked differently, so the comparison is to the bf16 recipe's own
// rounding, 1e-2 (the f32 comparison above is the exact one).
TEST(Documents, Bf16PackedWindowFollowsEachDocumentAlone) {
  Precision bf16 = precision_recipe("bf16");
  const ModelConfig m = qwen_config(0);
  const Compared c = compare(m, packed_batch(kDocs, m.vocab_size, 12), bf16);
  std::printf("bf16: logits %.2e, loss %.2e, gradients %.2e (norm-relative, worst)\n", c.logits, c.loss, c.grads);
  EXPECT_LE(c.logits, 1e-2);
  EXPECT_LE(c.loss, 1e-2);
  EXPECT_LE(c.grads, 5e-2);
}

// Without the boundaries the packed window is one stream: its logits differ from the documents'.
TEST(Documents, AWindowWithoutBoundariesIsCaught) {
  const ModelConfig m = qwen_config(0);
  const Packed p = packed_batch(kDocs, m.vocab_size, 13);
  const StepRun none = step(m, p.batch);
  Batch packed = p.batch;
  batch_documents_from_eos(packed, kEos);
  const StepRun docs = step(m, packed);
  // The first document is the same either way; the second (from position 17) sees the first without
  // boundaries.
  const int64_t V = m.vocab_size;
  EXPECT_EQ(norm_rel(none.logits.data(), docs.logits.data(), 17 * V), 0.0);
  EXPECT_GT(norm_rel(none.logits.data() + 18 * V, docs.logits.data() + 18 * V, 30 * V), 1e-3);
}

TEST(Documents, EosMarksStartsAndIgnoresTheTargetAcrossTheBoundary) {
  Batch b;
  b.B = 2, b.T = 6;
  b.tokens = {5, kEos, 7, 8, kEos, kEos, kEos, 1, 2, 3 + 1, 5, 6};
  b.targets = {kEos, 7, 8, kEos, kEos, 9, 1, 2, 4, 5, 6, 7};
  batch_documents_from_eos(b, kEos);
  EXPECT_EQ(b.doc_start, (std::vector<int32_t>{0, 0, 2, 2, 2, 5, 0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{kEos, -100, 8, kEos, -100, -100, -100, 2, 4, 5, 6, 7}));
  EXPECT_NO_THROW(batch_validate(b, 50));
  Batch bad = b;
  bad.doc_start[3] = 4;  // past its token
  EXPECT_THROW(batch_validate(bad, 50), Error);
  bad = b;
  bad.doc_start[4] = 0;  // descends
  EXPECT_THROW(batch_validate(bad, 50), Error);
  EXPECT_EQ(documents_parse("eos"), Documents::Documents_eos);
  EXPECT_THROW(documents_parse("bos"), Error);
}

// Note [Balanced rings] (data/context_split.h): every rank holds N sorted positions, together every position
// once; on windows of long-tailed documents the balanced split's most loaded rank carries less work than
// zig-zag's; without documents it balances the causal sequence as well as zig-zag does.
TEST(Documents, BalancedSplitDealsEveryPositionOnceAndEvensTheWork) {
  const int64_t T = 4096;
  for (const int W : {2, 4, 8}) {
    Batch g;
    g.B = 2, g.T = T;
    Rng rng(W);
    for (int64_t b = 0; b < g.B; ++b) {
      int32_t start = 0;
      for (int64_t t = 0; t < T; ++t) {
        if (t > 0 && rng.below(300) == 0) start = static_cast<int32_t>(t);  // documents of ~300 tokens
        g.doc_start.push_back(start);
      }
    }
    for (const bool docs : {true, false}) {
      Batch x = g;
      if (!docs) x.doc_start.clear();
      const auto zz = context_assignment(x, W, ContextSplit::ContextSplit_zigzag);
      const auto bal = context_assignment(x, W, ContextSplit::ContextSplit_balanced);
      std::vector<int> seen(T, 0);
      int64_t zz_max = 0, bal_max = 0, total = 0;
      for (int r = 0; r < W; ++r) {
        ASSERT_EQ(static_cast<int64_t>(bal[r].size()), T / W);
        EXPECT_TRUE(std::is_sorted(bal[r].begin(), bal[r].end()));
        for (const int32_t p : bal[r]) ++seen[p];
        zz_max = std::max(zz_max, context_work(x, zz[r]));
        bal_max = std::max(bal_max, context_work(x, bal[r]));
        total += context_work(x, bal[r]);
      }
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
      const double mean = static_cast<double>(total) / W;
      std::printf("W=%d %s: max/mean work zigzag %.3f, balanced %.3f\n", W, docs ? "documents" : "one sequence",
                  zz_max / mean, bal_max / mean);
      EXPECT_LE(bal_max / mean, 1.10);
      if (docs) {
        EXPECT_LT(bal_max, zz_max);
      }
    }
  }
}

// Note [A document index]: documents from the token file's index, for windows at any offset: a window
// starting inside a document starts that fragment at 0, a document starting at the window's first token
// too, and a document's last token takes no loss; the index round-trips and a bad one is refused.
TEST(Documents, IndexMarksStartsAndIgnoresEachDocumentsLastTarget) {
  DocumentIndex idx;
  idx.starts = {0, 5, 6, 12};  // documents [0, 5), [5, 6), [6, 12), [12, ...)
  Batch b;
  b.B = 2, b.T = 4;
  b.tokens.assign(8, 1);
  b.targets.assign(8, 2);
  b.offsets = {3, 8};  // windows [3, 7) and [8, 12)
  batch_documents_from_index(b, idx);
  EXPECT_EQ(b.doc_start, (std::vector<int32_t>{0, 0, 2, 3, 0, 0, 0, 0}));
  // Tokens 4 (last of [0, 5)), 5 (the one-token document) and 11 (last of [6, 12)) take no loss.
  EXPECT_EQ(b.targets, (std::vector<int32_t>{2, -100, -100, 2, 2, 2, 2, -100}));
  EXPECT_NO_THROW(batch_validate(b, 50));
  const std::string path = ::testing::TempDir() + "/flatpeak_index.docs";
  document_index_write(path, idx);
  EXPECT_EQ(document_index_read(path, 20).starts, idx.starts);
  EXPECT_THROW(document_index_read(path, 12), Error);  // a start at the file's end
  idx.starts = {0, 6, 5};
  document_index_write(path, idx);
  EXPECT_THROW(document_index_read(path, 20), Error);  // not ascending
  EXPECT_THROW(document_index_read(path + ".missing", 20), Error);
}

}  // namespace fp
