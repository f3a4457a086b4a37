#include "backend/stream.h"

#include "core/error.h"

namespace fp {

void Event::State::wait() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
}

void Event::State::set() {
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
}

void Event::synchronize() const {
  if (state_) state_->wait();
}

bool Event::query() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

Stream::Stream(std::string name, Mode mode) : name_(std::move(name)), mode_(mode) {
  if (mode_ == Mode::Mode_worker) worker_ = std::thread([this] { run_worker(); });
}

Stream::~Stream() {
  if (mode_ == Mode::Mode_worker) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
}

void Stream::run_task(std::function<void()>& fn) {
  try {
    fn();
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
  }
}

void Stream::enqueue(std::function<void()> fn) {
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

void Stream::run_worker() {
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

void Stream::record(Event& e) {
  auto state = std::make_shared<Event::State>();
  e.state_ = state;
  enqueue([state] { state->set(); });
}

void Stream::wait(const Event& e) {
  auto state = e.state_;  // the point captured now
  if (!state) return;
  enqueue([state] { state->wait(); });
}

void Stream::synchronize() {
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

void Stream::set_delay_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  delay_hook_ = std::move(hook);
}

}  // namespace fp
