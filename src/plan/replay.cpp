#include "plan/replay.h"

#include "core/error.h"

namespace fp::plan {

PeakReplay::Id PeakReplay::alloc(Category c, uint64_t bytes, const char* tag) {
  const int i = static_cast<int>(c);
  current_[i] += bytes;
  total_ += bytes;
  if (current_[i] > peak_[i]) peak_[i] = current_[i];
  if (total_ > total_peak_) {
    total_peak_ = total_;
    at_peak_ = current_;
    peak_tag_ = tag;
  }
  if (record_) events_.push_back({true, c, bytes, tag});
  live_.push_back({c, bytes, tag, true});
  return static_cast<Id>(live_.size()) - 1;
}

void PeakReplay::free(Id& id) {
  if (id == kNone) return;
  FP_ASSERT(id >= 0 && id < static_cast<Id>(live_.size()) && live_[id].live, "plan replay: double free of id {}",
            id);
  Live& l = live_[id];
  l.live = false;
  current_[static_cast<int>(l.category)] -= l.bytes;
  total_ -= l.bytes;
  if (record_) events_.push_back({false, l.category, l.bytes, l.tag});
  id = kNone;
}

}  // namespace fp::plan
