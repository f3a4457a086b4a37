// Memory ledger: current and peak bytes per category and in total, and the timeline of events.
//
// One Ledger per memory space (the device arena, the host pool). It does not allocate memory itself;
// an Arena asks it before every allocation (on_alloc, which may refuse with OutOfMemoryError) and
// tells it after every free (on_free). Peaks are exact bytes, the same on every backend.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/units.h"
#include "memory/category.h"

namespace fp {

struct LedgerEvent {
  uint64_t seq = 0;    // position in the sequence of this ledger's events
  double time_us = 0;  // microseconds since the ledger was created
  bool alloc = true;   // false: a free
  Category category{};
  uint64_t bytes = 0;
  uint64_t total_after = 0;  // bytes in use, all categories, after the event
  std::string tag;           // tensor name
  Shape shape;
  DType dtype{};
};

// The one error for a request over capacity. what() names the memory space, the category, the
// request (bytes, tensor name, shape, dtype), what every category holds now; hint() names the
// schedule that flattens the category (category_hint).
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(std::string what, std::string hint, Category c, std::string space)
      : Error(std::move(what), std::move(hint)), category_(c), space_(std::move(space)) {}
  Category category() const { return category_; }
  const std::string& space() const { return space_; }  // the ledger's: "device" or "host"

 private:
  Category category_;
  std::string space_;
};

// Note [Repeats replayed once]
// Since layers run in sequence tiles, a plan's step repeats the same blocks of allocations many times over: a
// ring hop's (W per chunk of keys), a chunk of MLA's expanded keys, a ring chunk, with the context. On a
// backend that computes nothing, such a block changes nothing but the ledgers, and what a ledger keeps of it
// without a timeline is counters: current and peak bytes per category and in total, what each category held
// at the total's first peak and that allocation's tag, and the count of events. A block that allocates and
// frees the same tensors in the same order each time and holds nothing after it (it ends where it began)
// starts every repeat from the counters the first one started from, so it reaches the same totals again and
// moves no peak: strictly higher totals move a peak, equal ones do not. So the first repeat is replayed and
// the others are counted (repeat), which leaves every counter where the full replay leaves it, the count of
// events included. The caller states that the repeats are alike (repeat_same in model/blocks.h); whether a
// block ends where it began is checked (LedgerMark, repeat refuses one that does not). Only where
// nothing reads the timeline (events_limit 0: the planner's meta runs) and only when asked (repeats_set):
// tests/unit/test_plan.cpp (PlanRepeats) compares both replays on every preset.
struct LedgerMark {
  uint64_t seq = 0;
  uint64_t total = 0;
  std::array<uint64_t, kNumCategories> current{};
};

class Ledger {
 public:
  // capacity: bytes (kUnlimitedBytes for none). max_events bounds the stored timeline; events past
  // it still update the counters and are counted in dropped_events().
  Ledger(std::string space, uint64_t capacity, size_t max_events = 2'000'000);

  // Records an allocation or throws OutOfMemoryError (recording nothing). With overcommit (the
  // planner's meta runs) a request over capacity is recorded too, so a plan sees the whole step's
  // peaks while decisions that read capacity() still see the real one.
  void on_alloc(Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype);
  void on_free(Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype);

  const std::string& space() const { return space_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t current(Category c) const { return current_[static_cast<int>(c)]; }
  uint64_t peak(Category c) const { return peak_[static_cast<int>(c)]; }
  uint64_t total_current() const { return total_current_; }
  uint64_t total_peak() const { return total_peak_; }
  // What each category held at the first moment the total reached total_peak(), and the tag of the
  // allocation that set it.
  const std::array<uint64_t, kNumCategories>& at_total_peak() const { return at_peak_; }
  const std::string& total_peak_tag() const { return peak_tag_; }
  // Peaks restart from the current values (per-step peaks).
  void peaks_reset();

  void overcommit_set(bool on) { overcommit_ = on; }
  // Keep at most n events from now on (0: counters only; the planner's meta runs need no timeline).
  void events_limit_set(size_t n);

  // Note [Repeats replayed once]: whether blocks that repeat may be replayed once and counted (only without a
  // timeline: events_limit 0).
  void repeats_set(bool on);
  bool repeats() const { return repeats_; }
  // The counters a block starts from; whether the ledger holds now what it held at m; and `times` more
  // repeats of the events since m counted (the ledger must hold what it held at m).
  LedgerMark mark() const { return {seq_, total_current_, current_}; }
  bool holds_as(const LedgerMark& m) const { return total_current_ == m.total && current_ == m.current; }
  void repeat(const LedgerMark& m, uint64_t times);
  // Every event so far, stored, dropped or counted by repeat; and those counted by repeat, not replayed.
  uint64_t events_seen() const { return seq_; }
  uint64_t events_repeated() const { return repeated_; }

  const std::vector<LedgerEvent>& events() const { return events_; }
  size_t dropped_events() const { return dropped_; }
  void events_clear() {
    events_.clear();
    dropped_ = 0;
  }

  // "params 1.00 MiB, grads 1.00 MiB, ..." of the current holdings (non-zero categories).
  std::string holdings_str() const;

 private:
  void record(bool alloc, Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype);

  std::string space_;
  uint64_t capacity_;
  size_t max_events_;
  std::array<uint64_t, kNumCategories> current_{};
  std::array<uint64_t, kNumCategories> peak_{};
  uint64_t total_current_ = 0;
  uint64_t total_peak_ = 0;
  std::array<uint64_t, kNumCategories> at_peak_{};
  std::string peak_tag_;
  bool overcommit_ = false;
  bool repeats_ = false;
  uint64_t repeated_ = 0;
  std::vector<LedgerEvent> events_;
  size_t dropped_ = 0;
  uint64_t seq_ = 0;
  int64_t t0_ns_;
};

}  // namespace fp
