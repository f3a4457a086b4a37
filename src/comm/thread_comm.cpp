// ThreadWorld: W ranks as threads of one process (thread_comm.h).
#include "comm/thread_comm.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include "core/error.h"

namespace fp {

ThreadWorld::ThreadWorld(int world)
    : world_(world), made_(static_cast<size_t>(std::max(world, 1))), posts_(static_cast<size_t>(std::max(world, 1))) {
  FP_CHECK(world >= 1, "give at least one rank", "a thread world of {} ranks", world);
}

namespace {
// What a rank throws from a meeting once another rank has failed: run() reports the failing rank's
// own error, not these.
struct WorldBroken : Error {
  WorldBroken() : Error("another rank of the thread world failed") {}
};
}  // namespace

void ThreadWorld::wait() {
  const uint64_t gen = generation_.load(std::memory_order_acquire);
  if (broken_.load(std::memory_order_acquire)) throw WorldBroken();
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == world_) {
    arrived_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    return;
  }
  while (generation_.load(std::memory_order_acquire) == gen) generation_.wait(gen, std::memory_order_acquire);
  if (broken_.load(std::memory_order_acquire)) throw WorldBroken();
}

void ThreadWorld::breaks() {
  broken_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  std::lock_guard<std::mutex> lock(children_mu_);
  for (auto& c : children_) c->breaks();
}

ThreadWorld* ThreadWorld::child(int n) {
  std::lock_guard<std::mutex> lock(children_mu_);
  children_.push_back(std::make_unique<ThreadWorld>(n));
  if (broken_.load(std::memory_order_acquire)) children_.back()->breaks();
  return children_.back().get();
}

class ThreadWorld::RankComm final : public Comm {
 public:
  RankComm(ThreadWorld& w, int rank) : w_(w), rank_(rank) {}
  std::string_view name() const override { return "thread-world"; }
  int rank() const override { return rank_; }
  int size() const override { return w_.world_; }

  void all_reduce_sum(void* data, int64_t n, DType t) override { reduce(data, n, t, false); }
  void all_reduce_max(void* data, int64_t n, DType t) override { reduce(data, n, t, true); }

  void all_gather(const void* send, void* recv, int64_t n, DType t) override {
    comm_buffer_check(send, n, "all_gather");
    comm_buffer_check(recv, n, "all_gather");
    meet({send, nullptr, n, -1});
    const size_t b = static_cast<size_t>(n) * dtype_size(t);
    if (b > 0)
      for (int r = 0; r < size(); ++r) std::memcpy(static_cast<char*>(recv) + r * b, w_.posts_[r].send, b);
    w_.wait();
  }

  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t) override {
    comm_buffer_check(send, n, "reduce_scatter_sum");
    comm_buffer_check(recv, n, "reduce_scatter_sum");
    meet({send, nullptr, n, -1});
    if (n > 0 && t == DType::DType_BF16) {
      std::vector<const uint16_t*> in(static_cast<size_t>(size()));
      for (int r = 0; r < size(); ++r) in[r] = static_cast<const uint16_t*>(w_.posts_[r].send) + rank_ * n;
      comm_sum_bf16(in.data(), size(), n, static_cast<uint16_t*>(recv));
    } else if (n > 0) {
      std::vector<char> acc(static_cast<size_t>(n) * dtype_size(t), 0);
      for (int r = 0; r < size(); ++r)
        accumulate(acc.data(), static_cast<const char*>(w_.posts_[r].send) + rank_ * acc.size(), n, t, false, r == 0);
      std::memcpy(recv, acc.data(), acc.size());
    }
    w_.wait();
  }

  void all_to_all_v(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                    DType t) override {
    comm_buffer_check(send, comm_count_sum(send_counts, size()), "all_to_all_v");
    comm_buffer_check(recv, comm_count_sum(recv_counts, size()), "all_to_all_v");
    meet({send, send_counts, 0, -1});
    const size_t b = dtype_size(t);
    int64_t recv_off = 0;
    for (int src = 0; src < size(); ++src) {
      const Post& p = w_.posts_[src];
      int64_t off = 0;
      for (int d = 0; d < rank_; ++d) off += p.send_counts[d];
      FP_ASSERT(p.send_counts[rank_] == recv_counts[src],
                "thread world: rank {} expects {} elements from rank {}, which sends {}", rank_, recv_counts[src], src,
                p.send_counts[rank_]);
      if (recv_counts[src] > 0)
        std::memcpy(static_cast<char*>(recv) + recv_off * b, static_cast<const char*>(p.send) + off * b,
                    static_cast<size_t>(recv_counts[src]) * b);
      recv_off += recv_counts[src];
    }
    w_.wait();
  }

  void send_recv(const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src, DType t) override {
    comm_buffer_check(send, n, "send_recv");
    comm_buffer_check(recv, n_recv, "send_recv");
    meet({send, nullptr, n, dst});
    const Post& p = w_.posts_[src];
    FP_ASSERT(p.dst == rank_, "thread world: rank {} receives from {}, which sends to {}", rank_, src, p.dst);
    FP_ASSERT(p.n == n_recv, "thread world: rank {} expects {} elements from rank {}, which sends {}", rank_, n_recv,
              src, p.n);
    if (n_recv > 0) std::memcpy(recv, p.send, static_cast<size_t>(n_recv) * dtype_size(t));
    w_.wait();
  }

  void barrier() override { w_.wait(); }
  std::unique_ptr<Comm> split(int color) override {
    meet({nullptr, nullptr, color, -1});
    int first = -1, index = 0, count = 0;  // this rank's group: the ranks of its color, in rank order
    for (int r = 0; r < size(); ++r) {
      if (w_.posts_[r].n != color) continue;
      if (first < 0) first = r;
      index += r < rank_ ? 1 : 0;
      ++count;
    }
    if (rank_ == first) w_.made_[first] = w_.child(count);
    w_.wait();  // every group's world is made
    ThreadWorld* sub = w_.made_[first];
    w_.wait();  // every rank has its world before another split reuses made_
    return std::make_unique<RankComm>(*sub, index);
  }
  [[noreturn]] void abort(int code) override {
    throw Error(fmt::format("rank {} aborted the thread world with code {}", rank_, code), "");
  }

 private:
  // Publishes this rank's side of a call and waits until every rank has published. The caller then
  // reads the posts and calls w_.wait() once more.
  void meet(const Post& p) {
    w_.posts_[rank_] = p;
    w_.wait();
    if (rank_ == 0) ++w_.meetings_;
  }

  void reduce(void* data, int64_t n, DType t, bool max) {
    comm_buffer_check(data, n, "all_reduce");
    meet({data, nullptr, n, -1});
    std::vector<char> acc(static_cast<size_t>(n) * dtype_size(t), 0);
    if (t == DType::DType_BF16 && !max && n > 0) {
      std::vector<const uint16_t*> in(static_cast<size_t>(size()));
      for (int r = 0; r < size(); ++r) in[r] = static_cast<const uint16_t*>(w_.posts_[r].send);
      comm_sum_bf16(in.data(), size(), n, reinterpret_cast<uint16_t*>(acc.data()));
    } else {
      for (int r = 0; r < size() && n > 0; ++r)
        accumulate(acc.data(), static_cast<const char*>(w_.posts_[r].send), n, t, max, r == 0);
    }
    w_.wait();  // every rank has read every input before any rank overwrites its own
    if (n > 0) std::memcpy(data, acc.data(), acc.size());
    w_.wait();
  }

  // acc op= in (n), op = sum or max; first: acc = in.
  static void accumulate(char* acc, const char* in, int64_t n, DType t, bool max, bool first) {
    auto run = [&](auto* a, const auto* x) {
      for (int64_t i = 0; i < n; ++i) a[i] = first ? x[i] : max ? std::max(a[i], x[i]) : a[i] + x[i];
    };
    switch (t) {
      case DType::DType_F32:
        run(reinterpret_cast<float*>(acc), reinterpret_cast<const float*>(in));
        break;
      case DType::DType_F64:
        run(reinterpret_cast<double*>(acc), reinterpret_cast<const double*>(in));
        break;
      case DType::DType_I32:
        run(reinterpret_cast<int32_t*>(acc), reinterpret_cast<const int32_t*>(in));
        break;
      case DType::DType_I64:
        run(reinterpret_cast<int64_t*>(acc), reinterpret_cast<const int64_t*>(in));
        break;
      default:
        FP_ASSERT(false, "the thread world cannot reduce dtype {}", dtype_name(t));
    }
  }

  ThreadWorld& w_;
  int rank_;
};

void ThreadWorld::run(const std::function<void(Comm&)>& body) {
  children_.clear();  // the last run's splits: their comms went with its bodies
  arrived_.store(0);
  broken_.store(false);
  meetings_ = 0;
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_));
  threads.reserve(static_cast<size_t>(world_));
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
  // The first rank that failed for a reason of its own, not because another rank broke the world.
  std::exception_ptr broken;
  for (std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const WorldBroken&) {
      if (!broken) broken = e;
    } catch (...) {
      throw;
    }
  }
  if (broken) std::rethrow_exception(broken);
}

}  // namespace fp
