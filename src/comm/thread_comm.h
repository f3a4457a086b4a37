// W ranks in one process, one thread each, joined by a control channel (comm/comm.h) that really
// exchanges what it is given: the world `flatpeak plan` runs the engine in (the meta backend on every
// rank), and the tests' W-rank worlds. LLEP's plan sends a rank rows by their global position, so what
// rank r receives differs from what it sends itself: every rank must run its own step, and host
// buffers (counts, loads, token counts) move for real.
//
// Every call meets. On the meta backend the device buffers go through the meta data channel
// (comm/data_comm.h), which never reaches the world, so a W-rank plan costs one meeting per
// control-channel call, not one per hop (W = 64 ranks on 2 cores: 64 thread switches per meeting); on
// the cpu backend the data channel runs on this world, so device buffers meet too.
//
// Every call is a collective of all W threads, send_recv included (each rank posts what it sends to
// whom and takes what its source posted for it): the engine's ring hops and LLEP's weight rounds are
// called by every rank in the same order. A rank that throws breaks the world: the others throw from
// their next meeting, so run() never hangs, and it rethrows the first error. split() makes a world of
// each color's ranks (the first of them builds it, the parent keeps it until its next run()); a world
// broken breaks the worlds split from it.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/comm.h"

namespace fp {

class ThreadWorld {
 public:
  explicit ThreadWorld(int world);
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
  };

  // A barrier of all W threads that throws once any rank has failed.
  void wait();
  void breaks();
  // A world of n ranks split from this one (RankComm::split), kept until the next run().
  ThreadWorld* child(int n);

  int world_;
  std::mutex children_mu_;
  std::vector<std::unique_ptr<ThreadWorld>> children_;
  std::vector<ThreadWorld*> made_;  // split(): made_[r], the world whose first rank is r
  std::vector<Post> posts_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> broken_{false};
  uint64_t meetings_ = 0;
};

}  // namespace fp
