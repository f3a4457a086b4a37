#include "memory/ledger.h"

#include <chrono>

#include "core/units.h"

namespace fp {

static int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Ledger::Ledger(std::string space, uint64_t capacity, size_t max_events)
    : space_(std::move(space)), capacity_(capacity), max_events_(max_events), t0_ns_(now_ns()) {}

void Ledger::on_alloc(Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype) {
  if (!overcommit_ && capacity_ != kUnlimitedBytes && (bytes > capacity_ || total_current_ > capacity_ - bytes)) {
    std::string what = fmt::format(
        "out of {} memory in category '{}': tensor '{}' {} {} needs {} ({} bytes); capacity {}, in use {}, "
        "free {}. Held now: {}",
        space_, category_name(c), tag, shape.str(), dtype_name(dtype), bytes_format(bytes), bytes,
        bytes_format(capacity_), bytes_format(total_current_), bytes_format(capacity_ - total_current_),
        holdings_str());
    // The host holds what the offload schedules moved there: more host memory is the remedy, not a
    // schedule (the run config's own hint, run_config.h oom_hint, says which settings size it).
    std::string hint = space_ == "host" ? fmt::format(
                                              "raise --host-mem (host memory holds the {} the offload "
                                              "schedules moved off the device)",
                                              category_name(c))
                                        : std::string(category_hint(c));
    throw OutOfMemoryError(std::move(what), std::move(hint), c, space_);
  }
  const int i = static_cast<int>(c);
  current_[i] += bytes;
  total_current_ += bytes;
  if (current_[i] > peak_[i]) peak_[i] = current_[i];
  if (total_current_ > total_peak_) {
    total_peak_ = total_current_;
    at_peak_ = current_;
    peak_tag_ = tag;
  }
  record(true, c, bytes, tag, shape, dtype);
}

void Ledger::on_free(Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype) {
  const int i = static_cast<int>(c);
  FP_ASSERT(current_[i] >= bytes, "ledger {}: freeing {} bytes of '{}' from category {} holding {}", space_, bytes, tag,
            category_name(c), current_[i]);
  current_[i] -= bytes;
  total_current_ -= bytes;
  record(false, c, bytes, tag, shape, dtype);
}

void Ledger::record(bool alloc, Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype) {
  ++seq_;
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  LedgerEvent e;
  e.seq = seq_;
  e.time_us = static_cast<double>(now_ns() - t0_ns_) * 1e-3;
  e.alloc = alloc;
  e.category = c;
  e.bytes = bytes;
  e.total_after = total_current_;
  e.tag = tag;
  e.shape = shape;
  e.dtype = dtype;
  events_.push_back(std::move(e));
}

void Ledger::events_limit_set(size_t n) {
  FP_ASSERT(n == 0 || !repeats_, "ledger {}: a timeline with repeats counted, not replayed", space_);
  max_events_ = n;
}

void Ledger::repeats_set(bool on) {
  FP_ASSERT(!on || max_events_ == 0, "ledger {}: repeats are counted only without a timeline (events_limit 0)", space_);
  repeats_ = on;
}

void Ledger::repeat(const LedgerMark& m, uint64_t times) {
  FP_ASSERT(repeats_ && seq_ >= m.seq, "ledger {}: a repeat without repeats_set", space_);
  FP_ASSERT(holds_as(m), "ledger {}: a block counted as repeats does not end where it began: {} held, {} before it",
            space_, bytes_format(total_current_), bytes_format(m.total));
  const uint64_t n = (seq_ - m.seq) * times;
  seq_ += n;
  repeated_ += n;
  dropped_ += n;  // no timeline (repeats_set): every event is a dropped one
}

void Ledger::peaks_reset() {
  peak_ = current_;
  total_peak_ = total_current_;
  at_peak_ = current_;
  peak_tag_.clear();
}

std::string Ledger::holdings_str() const {
  std::string s;
  for (Category c : kAllCategories) {
    uint64_t b = current(c);
    if (b == 0) continue;
    if (!s.empty()) s += ", ";
    s += fmt::format("{} {}", category_name(c), bytes_format(b));
  }
  return s.empty() ? "nothing" : s;
}

}  // namespace fp
