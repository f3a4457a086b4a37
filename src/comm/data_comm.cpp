// The host and meta data channels (data_comm.h).
#include "comm/data_comm.h"

namespace fp {

namespace {

class HostDataComm final : public DataComm {
 public:
  explicit HostDataComm(Comm& engine) : e_(engine) {}
  int rank() const override { return e_.rank(); }
  int size() const override { return e_.size(); }
  void all_reduce_sum(Stream& s, void* data, int64_t n, DType t) override {
    s.synchronize();
    e_.all_reduce_sum(data, n, t);
  }
  void all_gather(Stream& s, const void* send, void* recv, int64_t n, DType t) override {
    s.synchronize();
    e_.all_gather(send, recv, n, t);
  }
  void reduce_scatter_sum(Stream& s, const void* send, void* recv, int64_t n, DType t) override {
    s.synchronize();
    e_.reduce_scatter_sum(send, recv, n, t);
  }
  void all_to_all_v(Stream& s, const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                    DType t) override {
    s.synchronize();
    e_.all_to_all_v(send, send_counts, recv, recv_counts, t);
  }
  void send_recv(Stream& s, const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src,
                 DType t) override {
    s.synchronize();
    e_.send_recv(send, n, dst, recv, n_recv, src, t);
  }
  CommRequest send_recv_start(Stream& s, const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src,
                              DType t) override {
    s.synchronize();
    return e_.send_recv_start(send, n, dst, recv, n_recv, src, t);
  }
  bool test(CommRequest& r) override { return e_.test(r); }
  void wait(CommRequest& r) override { e_.wait(r); }

 private:
  Comm& e_;
};

class MetaDataComm final : public DataComm {
 public:
  MetaDataComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(Stream&, void*, int64_t, DType) override {}
  void all_gather(Stream&, const void*, void*, int64_t, DType) override {}
  void reduce_scatter_sum(Stream&, const void*, void*, int64_t, DType) override {}
  void all_to_all_v(Stream&, const void*, const int64_t*, void*, const int64_t*, DType) override {}
  void send_recv(Stream&, const void*, int64_t, int, void*, int64_t, int, DType) override {}
  CommRequest send_recv_start(Stream&, const void*, int64_t, int, void*, int64_t, int, DType) override { return {}; }
  bool test(CommRequest& r) override { return !r.active(); }
  void wait(CommRequest& r) override { r.slot = -1; }

 private:
  int rank_, size_;
};

}  // namespace

std::unique_ptr<DataComm> data_comm_host(Comm& engine) { return std::make_unique<HostDataComm>(engine); }
std::unique_ptr<DataComm> data_comm_meta(int rank, int size) { return std::make_unique<MetaDataComm>(rank, size); }

}  // namespace fp
