// Communication between the ranks of a run, in two channels (PyTorch's c10d splits them alike):
//
//   Comm      the control channel (this file): host memory, blocking. Counts, plans, token totals,
//             loss sums, signals; and the engine the data channel of a host-memory backend runs on.
//             MPI when launched by mpirun, the one-process world, or a thread world (thread_comm.h).
//   DataComm  the data channel (comm/data_comm.h): device buffers, ordered with a stream. Each backend
//             makes its own over the control channel (Backend::data_channel): the cpu backend's runs on
//             this engine (its device memory is host memory), the meta backend's moves nothing, a CUDA
//             backend's will be NCCL.
//
// Buffers are host memory of this process. A pointer may be null only where its count is 0 (an
// empty tensor's data pointer is null); nothing else is read from a null pointer: "no data at all"
// is the meta backend's data channel, never a convention of this one.
// Counts are elements of the given dtype (f32, f64, i64, i32, bf16, or bytes for raw transfers).
//
// Note [Summing bf16 over ranks]: MPI has no bf16 sum, and a reduction that rounds every partial sum
// depends on the engine's algorithm. So a bf16 all_reduce_sum or reduce_scatter_sum moves bf16 bytes
// only (an all-gather, or an all-to-all of the rank's blocks: the same bytes a ring moves) and every
// rank then sums its P inputs itself, widened to f32 in rank order, rounded to bf16 once
// (comm_sum_bf16). The result is a function of the inputs alone: every engine (MPI, the thread world)
// gives the same bits. f16 is moved, never summed.
//
// Errors: every engine call goes through one checking macro (FP_MPI_CHECK in mpi_comm.cpp) that
// names the call, file and line and throws fp::Error. A rank that fails calls abort(): every rank of
// the run exits non-zero promptly (Note [A failed rank stops the run] in cli/main.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "core/dtype.h"
#include "core/error.h"

namespace fp {

// A send_recv in flight (Comm::send_recv_start). Both buffers belong to the engine until test() has
// returned true or wait() has returned. A default-constructed request is complete.
struct CommRequest {
  int64_t slot = -1;  // the engine's handle; -1: nothing in flight
  bool active() const { return slot >= 0; }
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place, element-wise over ranks: data (n) = sum (or max) of every rank's data (n).
  virtual void all_reduce_sum(void* data, int64_t n, DType t) = 0;
  virtual void all_reduce_max(void* data, int64_t n, DType t) = 0;
  // recv (size * n) = every rank's send (n), in rank order.
  virtual void all_gather(const void* send, void* recv, int64_t n, DType t) = 0;
  // recv (n) = sum over ranks of their send[rank() * n, (rank() + 1) * n); send is (size * n).
  virtual void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t) = 0;
  // Rank r sends send_counts[d] elements to rank d (from send, packed by destination in rank order)
  // and receives recv_counts[s] elements from rank s (into recv, packed by source in rank order).
  virtual void all_to_all_v(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                            DType t) = 0;
  // Sends `n` elements to dst while receiving `n_recv` from src (a ring shift when dst = rank + 1,
  // src = rank - 1). send and recv must not overlap.
  virtual void send_recv(const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src, DType t) = 0;
  // send_recv without blocking (Note [Overlapping a ring hop] in sched/vocab/ring_dtp_ring.cpp):
  // starts the same transfer and returns at once. test() drives it (MPI moves a large message only
  // inside MPI calls) and returns true once it completed; wait() blocks until it has. Transfers in
  // flight at once between the same pair of ranks are matched in the order they were started, so
  // every rank must start its transfers in the same order. The default runs the blocking send_recv
  // at start: an engine without nonblocking calls stays correct, only without overlap.
  virtual CommRequest send_recv_start(const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src,
                                      DType t) {
    send_recv(send, n, dst, recv, n_recv, src, t);
    return {};
  }
  virtual bool test(CommRequest& r) { return !r.active(); }
  virtual void wait(CommRequest& r) { r.slot = -1; }
  virtual void barrier() = 0;
  // The ranks of this comm with the same color, as a comm of their own, in this comm's rank order
  // (MPI_Comm_split). Collective: every rank calls it, in the same order as its other calls. The
  // result may be used alongside this comm (Note [A device mesh] in train/trainer.cpp: the experts'
  // groups) and must be destroyed before it.
  virtual std::unique_ptr<Comm> split(int color) = 0;
  // Ends every rank of the run with this exit code (never returns).
  [[noreturn]] virtual void abort(int code) = 0;
};

// The engines' check of the rule above: a null buffer with a count (the old meta convention) is a bug.
inline void comm_buffer_check(const void* p, int64_t n, const char* call) {
  FP_ASSERT(p != nullptr || n == 0, "{}: {} elements to or from a null buffer", call, n);
}
// out (n) = the bf16 sum of P inputs in rank order: in[r] (n each) widened to f32, added for r = 0 ..
// P-1, rounded once (Note [Summing bf16 over ranks]). out may be one of the inputs.
void comm_sum_bf16(const uint16_t* const* in, int P, int64_t n, uint16_t* out);

inline int64_t comm_count_sum(const int64_t* counts, int size) {
  int64_t n = 0;
  for (int i = 0; i < size; ++i) n += counts[i];
  return n;
}

// The single-process world (rank 0 of 1): collectives are copies or nothing.
std::unique_ptr<Comm> comm_single();
// MPI's world when this process was started by mpirun (and flatpeak was built with MPI), else
// comm_single(). Initialises MPI on first use.
std::unique_ptr<Comm> comm_create();
// The process's world communicator, created by comm_create() on first use (the CLI's entry point
// calls it first, so MPI starts before any work).
Comm& comm_world();
// True when the environment says this process was started by mpirun/srun with more than one rank.
bool comm_launched_by_mpi();

}  // namespace fp
