#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/units.h"
#include "memory/arena.h"
#include "memory/trace.h"

namespace fp {

TEST(Ledger, TracksCurrentAndPeakPerCategory) {
  Arena a("device", kUnlimitedBytes, allocator_host_aligned());
  {
    Tensor p(a, Category::Category_params, {10, 10}, DType::DType_F32, "w");
    Tensor x(a, Category::Category_activations, {100}, DType::DType_F32, "x");
    {
      Tensor y(a, Category::Category_activations, {50}, DType::DType_BF16, "y");
      EXPECT_EQ(a.ledger().current(Category::Category_activations), 400u + 100u);
    }
    EXPECT_EQ(a.ledger().current(Category::Category_activations), 400u);
    EXPECT_EQ(a.ledger().peak(Category::Category_activations), 500u);
    EXPECT_EQ(a.ledger().total_peak(), 900u);
  }
  EXPECT_EQ(a.ledger().total_current(), 0u);
  EXPECT_EQ(a.ledger().events().size(), 6u);
  a.ledger().peaks_reset();
  EXPECT_EQ(a.ledger().total_peak(), 0u);
}

TEST(Ledger, MovedTensorFreesOnce) {
  Arena a("device", kUnlimitedBytes, allocator_host_aligned());
  Tensor t(a, Category::Category_vocab, {4}, DType::DType_F32, "t");
  Tensor u = std::move(t);
  EXPECT_FALSE(t.defined());
  u.reset();
  u.reset();
  EXPECT_EQ(a.ledger().total_current(), 0u);
  EXPECT_EQ(a.ledger().events().size(), 2u);
}

TEST(Ledger, OverCapacityNamesCategoryShapeHoldingsAndSchedule) {
  Arena a("device", 1000, allocator_host_aligned());
  Tensor p(a, Category::Category_params, {100}, DType::DType_F32, "w");
  try {
    Tensor big(a, Category::Category_vocab, {8, 32}, DType::DType_F32, "head.logits");
    FAIL() << "no error";
  } catch (const OutOfMemoryError& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.category(), Category::Category_vocab);
    EXPECT_NE(w.find("'vocab'"), std::string::npos) << w;
    EXPECT_NE(w.find("head.logits"), std::string::npos) << w;
    EXPECT_NE(w.find("(8, 32)"), std::string::npos) << w;
    EXPECT_NE(w.find("1024 bytes"), std::string::npos) << w;
    EXPECT_NE(w.find("params 400 B"), std::string::npos) << w;
    EXPECT_NE(e.hint().find("Ring-DTP"), std::string::npos) << e.hint();
  }
  // The refused request left no trace.
  EXPECT_EQ(a.ledger().total_current(), 400u);
  EXPECT_EQ(a.ledger().events().size(), 1u);
}

TEST(Ledger, EveryFlattenedCategoryHintsItsSchedule) {
  EXPECT_NE(category_hint(Category::Category_dispatch).find("PipelinedLLEP"), std::string_view::npos);
  EXPECT_NE(category_hint(Category::Category_vocab).find("Ring-DTP"), std::string_view::npos);
  EXPECT_NE(category_hint(Category::Category_checkpoints).find("SCO"), std::string_view::npos);
  EXPECT_NE(category_hint(Category::Category_optimizer).find("OffloadStreamAdamW"), std::string_view::npos);
  for (Category c : kAllCategories) EXPECT_EQ(category_parse(category_name(c)), c);
  EXPECT_THROW(category_parse("weights"), Error);
}

TEST(Ledger, MetaArenaAccountsWithoutMemory) {
  Arena a("device", kUnlimitedBytes, allocator_null());
  Tensor t(a, Category::Category_checkpoints, {1 << 20, 1 << 10}, DType::DType_BF16, "huge");
  EXPECT_EQ(t.data(), nullptr);
  EXPECT_EQ(t.f32(), nullptr);
  EXPECT_EQ(a.ledger().peak(Category::Category_checkpoints), 2ull << 30);
}

TEST(Trace, ChromeCounterTracksPerCategory) {
  Arena a("device", kUnlimitedBytes, allocator_null());
  {
    Tensor p(a, Category::Category_params, {10}, DType::DType_F32, "w");
    Tensor x(a, Category::Category_activations, {5}, DType::DType_F32, "x");
  }
  auto doc = nlohmann::json::parse(trace_chrome_json(a.ledger()));
  const auto& ev = doc["traceEvents"];
  ASSERT_EQ(ev.size(), 1u + 2u * 4u);
  EXPECT_EQ(ev[1]["ph"], "C");
  EXPECT_EQ(ev[1]["name"], "params");
  EXPECT_EQ(ev[1]["args"]["bytes"], 40);
  EXPECT_EQ(ev[3]["name"], "activations");
  EXPECT_EQ(ev[4]["name"], "total");
  EXPECT_EQ(ev[4]["args"]["bytes"], 60);
  EXPECT_EQ(ev.back()["args"]["bytes"], 0);
  EXPECT_EQ(doc["otherData"]["peak_bytes"], 60);
}

}  // namespace fp
