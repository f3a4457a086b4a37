#include "backend/host_stream.h"

#include "core/error.h"

namespace fp {

namespace {

// A point of a HostStream's queue: set by the task record() enqueued.
class CpuEvent final : public EventImpl {
 public:
  void synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
  }
  bool query() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  void set() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

}  // namespace

HostStream::HostStream(std::string name, Mode mode) : Stream(std::move(name)), mode_(mode) {
  if (mode_ == Mode::Mode_worker) worker_ = std::thread([this] { run_worker(); });
}

HostStream::~HostStream() {
  if (mode_ == Mode::Mode_worker) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
}

void HostStream::run_task(std::function<void()>& fn) {
  try {
    fn();
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void HostStream::enqueue(std::function<void()> fn) {
  if (mode_ == Mode::Mode_inline) {
    run_task(fn);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    ++enqueued_;
  }
  cv_.notify_all();
}

void HostStream::run_worker() {
  for (;;) {
    std::function<void()> fn;
    std::function<void()> hook;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
      hook = delay_hook_;
    }
    if (hook) hook();
    run_task(fn);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++finished_;
    }
    cv_.notify_all();
  }
}

void HostStream::record(Event& e) {
  auto point = std::make_shared<CpuEvent>();
  event_set(e, point);
  enqueue([point] { point->set(); });
}

void HostStream::wait(const Event& e) {
  std::shared_ptr<EventImpl> point = event_impl(e);  // the point captured now
  if (!point) return;
  FP_ASSERT(dynamic_cast<CpuEvent*>(point.get()) != nullptr, "stream '{}' waits on another backend's event", name());
  enqueue([point] { point->synchronize(); });
}

void HostStream::synchronize() {
  if (mode_ == Mode::Mode_worker) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = enqueued_;
    cv_.wait(lock, [&] { return finished_ >= target; });
  }
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

void HostStream::set_delay_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_hook_ = std::move(hook);
}

}  // namespace fp
