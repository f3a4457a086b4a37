// A ledger without memory: the planner replays a step's allocation sequence (sizes from closed
// forms) through it and reads the same per-category and total peaks a real Ledger would record.
//
// Note [Why the planner replays instead of summing]: a category's peak is the most bytes that are
// live at one time, and the step's peak is the most bytes of all categories live at one time, which
// is not the sum of the category peaks (the head's logits are gone before the backward's expert
// intermediates exist). The model frees every intermediate as soon as it is consumed, so the peaks
// depend on the order of allocations and frees. The planner writes that order down phase by phase
// (plan/step_plan.cpp, mirroring model.cpp and the blocks) with every size in closed form, and this
// class keeps the running maxima. Pure arithmetic: no backend, no memory.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memory/category.h"

namespace fp::plan {

using CategoryBytes = std::array<uint64_t, kNumCategories>;

class PeakReplay {
 public:
  // A live allocation; -1 is "none" (freeing it does nothing, like Tensor::reset on an empty tensor).
  using Id = int64_t;
  static constexpr Id kNone = -1;

  // record_events: keep (alloc/free, category, bytes, tag) of every event, for diagnostics (the
  // meta-validation test prints the first event that differs from the real ledger's).
  explicit PeakReplay(bool record_events = false) : record_(record_events) {}

  Id alloc(Category c, uint64_t bytes, const char* tag = "");
  // Frees a live allocation and sets id to kNone; kNone is ignored.
  void free(Id& id);

  uint64_t current(Category c) const { return current_[static_cast<int>(c)]; }
  uint64_t peak(Category c) const { return peak_[static_cast<int>(c)]; }
  const CategoryBytes& peaks() const { return peak_; }
  uint64_t total_current() const { return total_; }
  uint64_t total_peak() const { return total_peak_; }
  // What each category held at the (first) moment the total reached its peak.
  const CategoryBytes& at_total_peak() const { return at_peak_; }
  // The tag of the allocation that set the total peak.
  const std::string& total_peak_tag() const { return peak_tag_; }

  struct Event {
    bool alloc;
    Category category;
    uint64_t bytes;
    std::string tag;
  };
  const std::vector<Event>& events() const { return events_; }

 private:
  struct Live {
    Category category;
    uint64_t bytes;
    const char* tag;
    bool live;
  };
  bool record_;
  std::vector<Live> live_;
  CategoryBytes current_{}, peak_{}, at_peak_{};
  uint64_t total_ = 0, total_peak_ = 0;
  std::string peak_tag_;
  std::vector<Event> events_;
};

}  // namespace fp::plan
