#include "backend/meta/meta_stream.h"

#include "core/error.h"

namespace fp {

namespace {

// A point of a meta stream: its lane's clock when recorded. Complete at once (nothing runs on meta).
class MetaEvent final : public EventImpl {
 public:
  MetaEvent(std::shared_ptr<WorkLog> log, double t) : log_(std::move(log)), t_(t) {}
  void synchronize() override { log_->timeline().wait_until(Lane::Lane_host, t_); }
  bool query() override { return true; }
  double time() const { return t_; }

 private:
  std::shared_ptr<WorkLog> log_;
  double t_;
};

}  // namespace

void MetaStream::record(Event& e) { event_set(e, std::make_shared<MetaEvent>(log_, log_->timeline().at(lane_))); }

void MetaStream::wait(const Event& e) {
  const std::shared_ptr<EventImpl>& impl = event_impl(e);
  if (!impl) return;
  const auto* ev = dynamic_cast<const MetaEvent*>(impl.get());
  FP_ASSERT(ev != nullptr, "meta stream '{}' waits on another backend's event", name());
  log_->timeline().wait_until(lane_, ev->time());
}

}  // namespace fp
