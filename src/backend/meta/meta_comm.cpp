// The meta backend's data channel: moves nothing and meets no other rank (comm/data_comm.h), and counts every
// message this rank would send, with its group and link, as a task of its stream (Note [Meta counts the work]
// in backend/work_log.h).
//
// Bytes are what this rank sends under the usual algorithms (a collective library's ring, NCCL's):
//   all_reduce_sum        2 (g - 1) / g x n elements, 2 (g - 1) steps (reduce-scatter, then all-gather);
//   all_gather            (g - 1) x n, g - 1 steps;   reduce_scatter_sum  (g - 1) x n, g - 1 steps;
//   all_to_all_v          the counts to the other ranks, g - 1 steps;   send_recv  n when dst is another rank.
// A group of one sends nothing.
#include "backend/meta/meta_comm.h"

#include "backend/meta/meta_stream.h"

namespace fp {

namespace {

class MetaCountingComm final : public DataComm {
 public:
  MetaCountingComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Stream& s, void*, int64_t n, DType t) override {
    const double g = size_;
    count(s, "all_reduce", 2 * (g - 1) / g * bytes(n, t), 2 * (size_ - 1));
  }
  void all_gather(Stream& s, const void*, void*, int64_t n, DType t) override {
    count(s, "all_gather", (size_ - 1) * bytes(n, t), size_ - 1);
  }
  void reduce_scatter_sum(Stream& s, const void*, void*, int64_t n, DType t) override {
    count(s, "reduce_scatter", (size_ - 1) * bytes(n, t), size_ - 1);
  }
  void all_to_all_v(Stream& s, const void*, const int64_t* send_counts, void*, const int64_t*, DType t) override {
    int64_t n = 0;
    for (int r = 0; r < size_ && send_counts != nullptr; ++r)
      if (r != rank_) n += send_counts[r];
    count(s, "all_to_all", bytes(n, t), size_ - 1);
  }
  void send_recv(Stream& s, const void*, int64_t n, int dst, void*, int64_t, int, DType t) override {
    if (dst != rank_) count(s, "send_recv", bytes(n, t), 1);
  }
  CommRequest send_recv_start(Stream& s, const void*, int64_t n, int dst, void*, int64_t, int, DType t) override {
    const MetaStream* ms = meta_stream_of(s);
    if (ms == nullptr || dst == rank_ || size_ <= 1) return {};
    log_ = &ms->log();
    lane_ = ms->lane();
    return {ms->log().transfer_start("send_recv", size_, ms->lane(), bytes(n, t))};
  }
  bool test(CommRequest& r) override {
    wait(r);
    return true;
  }
  void wait(CommRequest& r) override {
    if (r.active() && log_ != nullptr) log_->transfer_wait(r.slot, lane_);
    r.slot = -1;
  }

 private:
  static double bytes(int64_t n, DType t) { return static_cast<double>(n) * static_cast<double>(dtype_size(t)); }
  void count(Stream& s, const char* op, double b, int steps) {
    const MetaStream* ms = meta_stream_of(s);
    if (ms == nullptr || size_ <= 1) return;
    log_ = &ms->log();
    lane_ = ms->lane();
    ms->log().message(op, size_, ms->lane(), b, steps);
  }

  int rank_, size_;
  WorkLog* log_ = nullptr;  // the log and lane of the last call (a transfer's wait joins its stream)
  Lane lane_ = Lane::Lane_compute;
};

}  // namespace

std::unique_ptr<DataComm> data_comm_meta_counting(int rank, int size) {
  return std::make_unique<MetaCountingComm>(rank, size);
}

}  // namespace fp
