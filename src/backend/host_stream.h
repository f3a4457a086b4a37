// Streams and events on host threads (core/stream.h): the cpu backend's streams, every stream of the meta
// backend, and the host stream of every backend (Backend::host_kernels, backend/backend.h).
//
// A worker HostStream owns one thread that runs its queue (the cpu backend's copy streams h2d and d2h).
// An inline HostStream runs work on the calling thread at enqueue, which is a legal CUDA schedule (a
// stream whose host synchronizes after every launch); its waits block the caller (the compute stream;
// every stream of the meta backend, where a copy moves nothing, so a W-rank plan does not wake 2W
// threads per copy).
//
// Note [Stream delays for testing]: set_delay_hook installs a function called before every task on a
// worker stream; tests use it to inject random sleeps and show that results depend only on the events,
// never on timing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/stream.h"

namespace fp {

class HostStream final : public Stream {
 public:
  enum class Mode { Mode_inline, Mode_worker };
  HostStream(std::string name, Mode mode);
  ~HostStream() override;

  void enqueue(std::function<void()> fn) override;
  void record(Event& e) override;
  void wait(const Event& e) override;
  void synchronize() override;
  void set_delay_hook(std::function<void()> hook) override;

  bool runs_inline() const override { return mode_ == Mode::Mode_inline; }
  Mode mode() const { return mode_; }

 private:
  void run_worker();
  void run_task(std::function<void()>& fn);

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
