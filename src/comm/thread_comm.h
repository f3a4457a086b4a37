// W ranks in one process, one thread each, joined by a Comm that really
// exchanges what it is given: the world `flatpeak plan` runs the engine in (the
// meta backend on every rank), and the tests' W-rank worlds. LLEP's plan sends
// a rank rows by their global position, so what rank r receives differs from
// what it sends itself: every rank must run its own step, and host buffers
// (counts, loads, token counts) move for real.
//
// Note [Calls without data in a thread world]
// On the meta backend every device buffer is null and every host buffer is not.
// A call whose buffers on this rank are all null (a ring-attention hop, an FSDP
// gather, a dispatch all-to-all) moves nothing on any rank, so it completes at
// once without meeting the other ranks: a W-rank step then costs one meeting
// per host exchange, not one per hop (W = 64 ranks on 2 cores: 64 thread
// switches per meeting). That is sound only when every rank agrees on which
// calls carry data; mode ThreadWorldMode::ThreadWorldMode_checked meets on
// every call and asserts that agreement (tests use it), ThreadWorldMode_fast
// trusts it (the planner).
//
// Every call that meets is a collective of all W threads, send_recv included
// (each rank posts what it sends to whom and takes what its source posted for
// it): the engine's ring hops and LLEP's weight rounds are called by every rank
// in the same order. A rank that throws breaks the world: the others throw from
// their next meeting, so run() never hangs, and it rethrows the first error.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <vector>

#include "comm/comm.h"

namespace fp {

enum class ThreadWorldMode { ThreadWorldMode_fast, ThreadWorldMode_checked };

class ThreadWorld {
 public:
  explicit ThreadWorld(int world, ThreadWorldMode mode = ThreadWorldMode::ThreadWorldMode_checked);
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  // Runs body(comm) for every rank on its own thread; returns when all have
  // ended, rethrowing the first rank's error (by rank order) if any failed. One
  // run at a time.
  void run(const std::function<void(Comm&)>& body);

  int size() const { return world_; }
  // Meetings (collectives that synchronised the ranks) of the last run(),
  // counted once per call.
  uint64_t meetings() const { return meetings_; }

 private:
  class RankComm;
  friend class RankComm;
  struct Post {
    const void* send = nullptr;
    const int64_t* send_counts = nullptr;
    int64_t n = 0;
    int dst = -1;
    bool data = false;  // this rank's call carries data (checked mode)
  };

  // A barrier of all W threads that throws once any rank has failed.
  void wait();
  void breaks();

  int world_;
  ThreadWorldMode mode_;
  std::vector<Post> posts_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> broken_{false};
  uint64_t meetings_ = 0;
};

}  // namespace fp
