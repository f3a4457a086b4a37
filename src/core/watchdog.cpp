#include "core/watchdog.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace fp {

namespace {
std::atomic<const char*> g_waiting{nullptr};  // the collective this process is in, or null
std::atomic<const char*> g_phase{nullptr};    // what the armed step does now
}  // namespace

WaitingOn::WaitingOn(const char* what) : prev_(g_waiting.exchange(what, std::memory_order_relaxed)) {}
WaitingOn::~WaitingOn() { g_waiting.store(prev_, std::memory_order_relaxed); }

StepWatchdog::StepWatchdog(double seconds, std::string who) : seconds_(seconds), who_(std::move(who)) {
  if (seconds_ > 0) thread_ = std::thread([this] { watch(); });
}

StepWatchdog::~StepWatchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepWatchdog::arm(int64_t step) {
  if (seconds_ <= 0) return;
  g_phase.store(nullptr, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = true;
  step_ = step;
  deadline_ = std::chrono::steady_clock::now() +
              std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds_));
  cv_.notify_all();
}

void StepWatchdog::phase(const char* what) { g_phase.store(what, std::memory_order_relaxed); }

void StepWatchdog::disarm() {
  if (seconds_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
}

void StepWatchdog::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!quit_) {
    if (!armed_) {
      cv_.wait(lock);
      continue;
    }
    // A wait on a steady clock: a host frozen and thawed finds its deadline long past and ends at once.
    if (cv_.wait_until(lock, deadline_) != std::cv_status::timeout || !armed_ || quit_) continue;
    if (std::chrono::steady_clock::now() < deadline_) continue;  // re-armed meanwhile
    const char* phase = g_phase.load(std::memory_order_relaxed);
    const char* waiting = g_waiting.load(std::memory_order_relaxed);
    std::string where = phase != nullptr ? std::string("in ") + phase : std::string();
    if (waiting != nullptr) where += std::string(where.empty() ? "" : ", ") + "waiting in " + waiting;
    std::fprintf(stderr,
                 "error%s: step %lld did not finish in %g s%s; a rank or host is lost or frozen "
                 "(train.step_timeout)\nhint: the run's newest checkpoint is intact; resume with --resume, or let "
                 "`flatpeak launch` restart it\n",
                 who_.c_str(), static_cast<long long>(step_), seconds_,
                 where.empty() ? "" : (" (" + where + ")").c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(kWatchdogExit);  // Note [A step that does not finish]: the main thread is blocked in MPI
  }
}

}  // namespace fp
