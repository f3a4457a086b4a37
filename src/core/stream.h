// Streams and events with CUDA semantics: the interfaces every backend implements (PyTorch's c10
// Stream/Event are the model).
//
// A Stream runs the work enqueued on it in order. An Event marks a point in a stream's queue:
// Stream::record(e) captures "everything enqueued on this stream so far"; Stream::wait(e) makes
// everything enqueued afterwards on the waiting stream start only after that captured work finished;
// Event::synchronize() blocks the host until it has. Waiting on an event never recorded returns at once
// (as cudaStreamWaitEvent does). Re-recording an event moves it; a wait already enqueued keeps the
// point it captured.
//
// Event is a value handle (copies share the captured point) over the recording backend's own event
// (EventImpl): the cpu backend's is a flag and a condition variable, the cuda backend's a cudaEvent_t.
// An event is waited on only by streams of the backend that recorded it.
//
// Implementations: backend/host_stream.h (worker threads and inline streams: cpu and meta),
// backend/cuda (cudaStream_t).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>

namespace fp {

// One recorded point of one stream, as its backend represents it.
class EventImpl {
 public:
  virtual ~EventImpl() = default;
  // Blocks the host until the captured work completed.
  virtual void synchronize() = 0;
  // True when the captured work completed.
  virtual bool query() = 0;
};

class Event {
 public:
  Event() = default;
  // Blocks the host until the captured work completed (no-op when never recorded).
  void synchronize() const {
    if (impl_) impl_->synchronize();
  }
  // True when never recorded or the captured work completed.
  bool query() const { return !impl_ || impl_->query(); }
  bool recorded() const { return impl_ != nullptr; }

 private:
  friend class Stream;
  std::shared_ptr<EventImpl> impl_;
};

class Stream {
 public:
  explicit Stream(std::string name) : name_(std::move(name)) {}
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Runs fn on the host after everything enqueued before it (cudaLaunchHostFunc on a device). An
  // exception thrown by fn is kept and rethrown by the next synchronize() (the first error wins).
  virtual void enqueue(std::function<void()> fn) = 0;
  virtual void record(Event& e) = 0;
  virtual void wait(const Event& e) = 0;
  // Blocks the host until everything enqueued so far has run; rethrows a task's error.
  virtual void synchronize() = 0;
  // True when enqueue runs the work on the calling thread before returning (the cpu backend's inline
  // streams): a cpu kernel on such a stream is a plain call (backend/kernels.cpp).
  virtual bool runs_inline() const { return false; }
  // Note [Stream delays for testing] (backend/host_stream.h): a hook called before every task of
  // a stream that runs its tasks on a thread of its own; ignored by the others.
  virtual void set_delay_hook(std::function<void()> hook) { (void)hook; }

  const std::string& name() const { return name_; }

 protected:
  // For implementations: the backend event behind e, and setting it (record).
  static const std::shared_ptr<EventImpl>& event_impl(const Event& e) { return e.impl_; }
  static void event_set(Event& e, std::shared_ptr<EventImpl> impl) { e.impl_ = std::move(impl); }

 private:
  std::string name_;
};

}  // namespace fp
