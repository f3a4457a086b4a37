// The data channel: collectives on device buffers, ordered with a stream (comm/comm.h says how it
// splits from the control channel). Each backend makes its own (Backend::data_channel):
//
//   host   over a control-channel engine (MPI, the one-process world, a thread world), for backends
//          whose device memory the host addresses (cpu): each call first waits for the work enqueued
//          on its stream (the compute stream is inline on cpu: nothing to wait for), then moves the
//          data on the calling thread and returns when it has moved.
//   meta   moves nothing and meets no other rank: every call completes at once. The ranks of a meta
//          run still meet on every control-channel call (counts and plans are host data and move
//          for real), which is all a plan needs to stay matched.
//   (NCCL with the CUDA backend: enqueued on the stream and returns at once.)
//
// The calls have the control channel's semantics (comm/comm.h) on device pointers of the backend
// that made the channel; a pointer may be null only where its count is 0.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/comm.h"
#include "core/stream.h"

namespace fp {

class DataComm {
 public:
  virtual ~DataComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data (n) = the sum of every rank's data (n).
  virtual void all_reduce_sum(Stream& s, void* data, int64_t n, DType t) = 0;
  // recv (size * n) = every rank's send (n), in rank order.
  virtual void all_gather(Stream& s, const void* send, void* recv, int64_t n, DType t) = 0;
  // recv (n) = sum over ranks of their send[rank() * n, (rank() + 1) * n); send is (size * n).
  virtual void reduce_scatter_sum(Stream& s, const void* send, void* recv, int64_t n, DType t) = 0;
  // Rank r sends send_counts[d] elements to rank d and receives recv_counts[s] from rank s, packed by
  // rank in rank order on both sides. The counts are host memory.
  virtual void all_to_all_v(Stream& s, const void* send, const int64_t* send_counts, void* recv,
                            const int64_t* recv_counts, DType t) = 0;
  // Sends n elements to dst while receiving n_recv from src (send and recv must not overlap).
  virtual void send_recv(Stream& s, const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src,
                         DType t) = 0;
  // The same without blocking (Comm::send_recv_start): both buffers belong to the channel until
  // test() returned true or wait() returned.
  virtual CommRequest send_recv_start(Stream& s, const void* send, int64_t n, int dst, void* recv, int64_t n_recv,
                                      int src, DType t) = 0;
  virtual bool test(CommRequest& r) = 0;
  virtual void wait(CommRequest& r) = 0;
};

// The data channel over a control-channel engine (host-addressable device memory); engine must
// outlive it.
std::unique_ptr<DataComm> data_comm_host(Comm& engine);
// The data channel that moves nothing (the meta backend), for rank `rank` of `size`.
std::unique_ptr<DataComm> data_comm_meta(int rank, int size);

}  // namespace fp
