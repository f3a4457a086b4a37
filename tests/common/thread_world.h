// W ranks in one process, one thread each, joined by a Comm that really exchanges what it is given:
// a multi-rank world for tests that need every rank's own view (LLEP's plan sends a rank rows by
// their global position, so what rank r receives differs from what it sends itself). Meant for the
// meta backend, whose device buffers are null (they move nothing, comm.h); host buffers (counts,
// plans' inputs) and cpu buffers are copied.
//
// Every call is a collective of all W threads, send_recv included (each rank posts what it sends to
// whom and takes what its source posted for it): the engine's ring hops and LLEP's weight rounds are
// called by every rank in the same order. A rank that throws breaks the world: the others throw from
// their next call, so run() never hangs, and it rethrows the first error.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "core/error.h"

namespace fp::test {

class ThreadWorld {
 public:
  explicit ThreadWorld(int world) : world_(world), posts_(static_cast<size_t>(world)) {}

  // Runs body(comm) for every rank on its own thread; returns when all have ended.
  void run(const std::function<void(Comm&)>& body) {
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(static_cast<size_t>(world_));
    for (int r = 0; r < world_; ++r)
      threads.emplace_back([&, r] {
        RankComm comm(*this, r);
        try {
          body(comm);
        } catch (...) {
          errors[r] = std::current_exception();
          breaks();
        }
      });
    for (std::thread& t : threads) t.join();
    for (std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  struct Post {
    const void* send = nullptr;
    const int64_t* send_counts = nullptr;
    int64_t n = 0;
    int dst = -1;
  };

  // A barrier that throws once any rank has failed.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    FP_CHECK(!broken_, "", "another rank of the test world failed");
    const uint64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || broken_; });
    FP_CHECK(generation_ != gen, "", "another rank of the test world failed");
  }
  void breaks() {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    cv_.notify_all();
  }

  class RankComm final : public Comm {
   public:
    RankComm(ThreadWorld& w, int rank) : w_(w), rank_(rank) {}
    std::string_view name() const override { return "thread-world"; }
    int rank() const override { return rank_; }
    int size() const override { return w_.world_; }
    void all_reduce_sum(void* data, int64_t n, DType t) override { reduce(data, n, t, false); }
    void all_reduce_max(void* data, int64_t n, DType t) override { reduce(data, n, t, true); }
    void all_gather(const void* send, void* recv, int64_t n, DType t) override {
      post({send, nullptr, n, -1});
      const size_t b = static_cast<size_t>(n) * dtype_size(t);
      for (int r = 0; r < size(); ++r)
        if (recv != nullptr && w_.posts_[r].send != nullptr)
          std::memcpy(static_cast<char*>(recv) + r * b, w_.posts_[r].send, b);
      w_.wait();
    }
    void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t) override {
      post({send, nullptr, n, -1});
      if (recv != nullptr) {
        std::vector<char> acc(static_cast<size_t>(n) * dtype_size(t), 0);
        for (int r = 0; r < size(); ++r)
          if (w_.posts_[r].send != nullptr)
            accumulate(acc.data(), static_cast<const char*>(w_.posts_[r].send) + rank_ * acc.size(), n, t, false,
                       r == 0);
        std::memcpy(recv, acc.data(), acc.size());
      }
      w_.wait();
    }
    void all_to_all_v(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                      DType t) override {
      post({send, send_counts, 0, -1});
      const size_t b = dtype_size(t);
      int64_t recv_off = 0;
      for (int src = 0; src < size(); ++src) {
        const Post& p = w_.posts_[src];
        int64_t off = 0;
        for (int d = 0; d < rank_; ++d) off += p.send_counts[d];
        FP_ASSERT(p.send == nullptr || recv == nullptr || p.send_counts[rank_] == recv_counts[src],
                  "thread world: rank {} expects {} elements from rank {}, which sends {}", rank_, recv_counts[src],
                  src, p.send_counts[rank_]);
        if (recv != nullptr && p.send != nullptr)
          std::memcpy(static_cast<char*>(recv) + recv_off * b, static_cast<const char*>(p.send) + off * b,
                      static_cast<size_t>(recv_counts[src]) * b);
        recv_off += recv_counts[src];
      }
      w_.wait();
    }
    void send_recv(const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src, DType t) override {
      post({send, nullptr, n, dst});
      const Post& p = w_.posts_[src];
      FP_ASSERT(p.dst == rank_, "thread world: rank {} receives from {}, which sends to {}", rank_, src, p.dst);
      FP_ASSERT(p.send == nullptr || recv == nullptr || p.n == n_recv,
                "thread world: rank {} expects {} elements from rank {}, which sends {}", rank_, n_recv, src, p.n);
      if (recv != nullptr && p.send != nullptr) std::memcpy(recv, p.send, static_cast<size_t>(n_recv) * dtype_size(t));
      w_.wait();
    }
    void barrier() override { w_.wait(); }
    [[noreturn]] void abort(int code) override {
      throw Error(fmt::format("rank {} aborted the test world with code {}", rank_, code), "");
    }

   private:
    // Publishes this rank's side of a call; returns once every rank has published.
    void post(const Post& p) {
      w_.posts_[rank_] = p;
      w_.wait();
    }
    void reduce(void* data, int64_t n, DType t, bool max) {
      post({data, nullptr, n, -1});
      std::vector<char> acc(static_cast<size_t>(n) * dtype_size(t), 0);
      if (data != nullptr)
        for (int r = 0; r < size(); ++r)
          if (w_.posts_[r].send != nullptr)
            accumulate(acc.data(), static_cast<const char*>(w_.posts_[r].send), n, t, max, r == 0);
      w_.wait();  // every rank has read every input before any rank overwrites its own
      if (data != nullptr) std::memcpy(data, acc.data(), acc.size());
      w_.wait();
    }
    // acc op= in (n), op = sum or max; first: acc = in.
    static void accumulate(char* acc, const char* in, int64_t n, DType t, bool max, bool first) {
      auto run = [&](auto* a, const auto* x) {
        for (int64_t i = 0; i < n; ++i) a[i] = first ? x[i] : max ? std::max(a[i], x[i]) : a[i] + x[i];
      };
      switch (t) {
        case DType::DType_F32: run(reinterpret_cast<float*>(acc), reinterpret_cast<const float*>(in)); break;
        case DType::DType_F64: run(reinterpret_cast<double*>(acc), reinterpret_cast<const double*>(in)); break;
        case DType::DType_I32: run(reinterpret_cast<int32_t*>(acc), reinterpret_cast<const int32_t*>(in)); break;
        case DType::DType_I64: run(reinterpret_cast<int64_t*>(acc), reinterpret_cast<const int64_t*>(in)); break;
        default: FP_ASSERT(false, "thread world cannot reduce dtype {}", static_cast<int>(t));
      }
    }
    ThreadWorld& w_;
    int rank_;
  };

  int world_;
  std::vector<Post> posts_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
};

}  // namespace fp::test
