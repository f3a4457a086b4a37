// The meta backend's streams and events: inline (nothing runs), each a lane of its rank's timeline (Note [The
// step's critical path] in backend/work_log.h). A record captures the lane's clock; a wait moves the
// waiting lane to it; a synchronize moves the host. Work enqueued as a function runs at once (a copy's empty
// task, an event's host callback), as on the cpu backend's inline streams.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <typeinfo>

#include "backend/work_log.h"
#include "core/stream.h"

namespace fp {

class MetaStream final : public Stream {
 public:
  // The log is shared with the events recorded here: an arena may wait on one while the backend goes.
  MetaStream(std::string name, std::shared_ptr<WorkLog> log, Lane lane)
      : Stream(std::move(name)), log_(std::move(log)), lane_(lane) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void record(Event& e) override;
  void wait(const Event& e) override;
  void synchronize() override { log_->host_sync(lane_); }
  bool runs_inline() const override { return true; }
  WorkLog& log() const { return *log_; }
  Lane lane() const { return lane_; }

 private:
  std::shared_ptr<WorkLog> log_;
  Lane lane_;
};

// The stream's lane and log when it is a meta stream, else null (a kernel of the meta table called on another
// backend's stream counts nothing).
// MetaStream is final, so a comparison of typeids decides it (cheaper than a dynamic_cast on every kernel call).
inline const MetaStream* meta_stream_of(const Stream& s) {
  return typeid(s) == typeid(MetaStream) ? static_cast<const MetaStream*>(&s) : nullptr;
}

}  // namespace fp
