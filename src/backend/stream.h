// Streams and events with CUDA semantics.
//
// A Stream runs the work enqueued on it in order. An Event marks a point in a stream's queue:
// Stream::record(e) captures "everything enqueued on this stream so far"; Stream::wait(e) makes
// everything enqueued afterwards on the waiting stream start only after that captured work finished;
// Event::synchronize() blocks the host until it has. Waiting on an event never recorded returns at once
// (as cudaStreamWaitEvent does). Re-recording an event moves it; a wait already enqueued keeps the
// point it captured.
//
// On the cpu backend a worker Stream owns one thread that runs its queue (copy streams h2d and d2h).
// The compute stream is an inline Stream: work runs on the calling thread at enqueue, which is a legal
// CUDA schedule (a stream whose host synchronizes after every launch); its waits block the caller.
//
// Note [Stream delays for testing]: set_delay_hook installs a function called before every task on a
// worker stream; tests use it to inject random sleeps and show that results depend only on the events,
// never on timing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace fp {

class Event {
 public:
  Event() = default;
  // Blocks the host until the captured work completed (no-op when never recorded).
  void synchronize() const;
  // True when never recorded or the captured work completed.
  bool query() const;

 private:
  friend class Stream;
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    void wait();
    void set();
  };
  std::shared_ptr<State> state_;
};

class Stream {
 public:
  enum class Mode { Mode_inline, Mode_worker };
  Stream(std::string name, Mode mode);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Runs fn after everything enqueued before it. An exception thrown by fn is kept and rethrown by
  // the next synchronize() (later tasks still run, as on a device after a failed kernel they would not
  // be observable either; the first error wins).
  void enqueue(std::function<void()> fn);
  void record(Event& e);
  void wait(const Event& e);
  // Blocks the host until everything enqueued so far has run; rethrows a task's error.
  void synchronize();

  const std::string& name() const { return name_; }
  Mode mode() const { return mode_; }
  void set_delay_hook(std::function<void()> hook);

 private:
  void run_worker();
  void run_task(std::function<void()>& fn);

  std::string name_;
  Mode mode_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  uint64_t enqueued_ = 0;
  uint64_t finished_ = 0;
  std::exception_ptr error_;
  std::function<void()> delay_hook_;
  std::thread worker_;
};

}  // namespace fp
