// Note [A step that does not finish]: a rank whose peer is lost without a closed connection (a host
// frozen by SIGSTOP, a link cut) waits in a collective forever: MPI has no timeout, and Open MPI's TCP
// keepalives take about 8 minutes to notice (docs/cluster.md). With train.step_timeout = S > 0 a
// watchdog thread gives every step (its forward, backward, update, metrics and checkpoint) S seconds;
// past them it prints one error naming the step, what the step was doing and the collective it waits
// in ("step 12 did not finish in 60 s (in the forward, backward and update, waiting in all-to-all-v)"),
// and ends the process with exit 124 at once (_Exit). Why not an exception: the main thread is blocked
// inside MPI and cannot unwind; why not MPI_Abort: under MPI_THREAD_FUNNELED another thread may not call
// MPI, and an abort that must reach a lost peer could block too. The rank's own Open MPI daemon sees it
// end without MPI_Finalize and mpirun ends the other ranks, as for a rank killed outright; every rank
// of a live host times out by itself in any case. `flatpeak launch` sets the bound and restarts the run
// from its newest checkpoint (src/cli/launch.cpp).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace fp {

// The exit status of a process ended by the watchdog (as timeout(1)'s).
inline constexpr int kWatchdogExit = 124;

// What this process waits on now (a static string such as "all-reduce"), for the watchdog's message;
// restores the previous value when it goes. One atomic store each way.
class WaitingOn {
 public:
  explicit WaitingOn(const char* what);
  ~WaitingOn();
  WaitingOn(const WaitingOn&) = delete;
  WaitingOn& operator=(const WaitingOn&) = delete;

 private:
  const char* prev_;
};

// Note [A step that does not finish]. seconds <= 0: off (no thread). who: the error's prefix after
// "error", e.g. " [rank 3]".
class StepWatchdog {
 public:
  StepWatchdog(double seconds, std::string who);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;
  // Step `step` starts now and must end within the bound (the next arm() or disarm()).
  void arm(int64_t step);
  // What the step does now (a static string: "the checkpoint"), named if it does not finish.
  void phase(const char* what);
  void disarm();

 private:
  void watch();
  double seconds_;
  std::string who_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, quit_ = false;
  int64_t step_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::thread thread_;
};

}  // namespace fp
