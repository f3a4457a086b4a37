// The MPI engine (OpenMPI). Built only when CMake finds MPI (FLATPEAK_HAVE_MPI); otherwise
// comm_create() always gives the single-process world and says so when launched under mpirun.
#include "comm/comm.h"
#include "core/error.h"
#include "core/watchdog.h"

#ifdef FLATPEAK_HAVE_MPI
#include <mpi.h>

#include <array>
#include <climits>
#include <cstdlib>
#include <memory>
#include <vector>

// Each blocking call names itself for the step watchdog (WaitingOn, Note [A step that does not finish]).
// Every MPI call goes through this macro: on failure it names the call, file and line and the MPI
// error text, and throws fp::Error (the communicator returns errors instead of aborting).
#define FP_MPI_CHECK(call)                                                                            \
  do {                                                                                                \
    const int fp_mpi_rc = (call);                                                                     \
    if (fp_mpi_rc != MPI_SUCCESS) ::fp::mpi_fail(#call, __FILE__, __LINE__, fp_mpi_rc);               \
  } while (0)

namespace fp {

[[noreturn]] void mpi_fail(const char* call, const char* file, int line, int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(fmt::format("MPI call {} failed at {}:{}: {}", call, file, line, std::string(text, len)),
              "another rank may have failed first; see its error above");
}

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::DType_F32: return MPI_FLOAT;
    case DType::DType_F64: return MPI_DOUBLE;
    case DType::DType_I32: return MPI_INT32_T;
    case DType::DType_I64: return MPI_INT64_T;
    case DType::DType_BF16:
    case DType::DType_F16: return MPI_UINT16_T;  // moved; bf16 is summed by comm_sum_bf16
  }
  return MPI_BYTE;
}

int count_of(int64_t n) {
  FP_ASSERT(n >= 0 && n <= INT_MAX, "MPI message of {} elements exceeds the int count", n);
  return static_cast<int>(n);
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    int inited = 0;
    FP_MPI_CHECK(MPI_Initialized(&inited));
    if (!inited) {
      int provided = 0;
      FP_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    }
    FP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    FP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    FP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    FP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  // A sub-communicator (split): owns comm, leaves MPI running when it goes.
  explicit MpiComm(MPI_Comm comm) : comm_(comm), world_(false) {
    FP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    FP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    FP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiComm() override {
    MPI_Comm_free(&comm_);
    if (!world_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(void* data, int64_t n, DType t) override {
    if (t != DType::DType_BF16) return reduce(data, n, t, MPI_SUM);
    // Note [Summing bf16 over ranks]: every rank's data to every rank, summed here in rank order.
    comm_buffer_check(data, n, "all_reduce_sum");
    scratch_.resize(static_cast<size_t>(n) * size_);
    const WaitingOn waiting("all-gather (a bf16 sum)");
    FP_MPI_CHECK(MPI_Allgather(data, count_of(n), MPI_UINT16_T, scratch_.data(), count_of(n), MPI_UINT16_T, comm_));
    sum_scratch(n, static_cast<uint16_t*>(data));
  }
  void all_reduce_max(void* data, int64_t n, DType t) override { reduce(data, n, t, MPI_MAX); }

  void all_gather(const void* send, void* recv, int64_t n, DType t) override {
    comm_buffer_check(send, n, "all_gather");
    comm_buffer_check(recv, n, "all_gather");
    const WaitingOn waiting("all-gather");
    FP_MPI_CHECK(MPI_Allgather(send, count_of(n), mpi_type(t), recv, count_of(n), mpi_type(t), comm_));
  }
  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t) override {
    comm_buffer_check(send, n, "reduce_scatter_sum");
    comm_buffer_check(recv, n, "reduce_scatter_sum");
    if (t != DType::DType_BF16) {
      const WaitingOn waiting("reduce-scatter");
      FP_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, count_of(n), mpi_type(t), MPI_SUM, comm_));
      return;
    }
    // Note [Summing bf16 over ranks]: block r of every rank to rank r, summed there in rank order.
    scratch_.resize(static_cast<size_t>(n) * size_);
    const WaitingOn waiting("all-to-all (a bf16 reduce-scatter)");
    FP_MPI_CHECK(MPI_Alltoall(send, count_of(n), MPI_UINT16_T, scratch_.data(), count_of(n), MPI_UINT16_T, comm_));
    sum_scratch(n, static_cast<uint16_t*>(recv));
  }
  void all_to_all_v(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                    DType t) override {
    comm_buffer_check(send, comm_count_sum(send_counts, size_), "all_to_all_v");
    comm_buffer_check(recv, comm_count_sum(recv_counts, size_), "all_to_all_v");
    std::vector<int> sc(size_), rc(size_), sd(size_), rd(size_);
    int64_t so = 0, ro = 0;
    for (int i = 0; i < size_; ++i) {
      sc[i] = count_of(send_counts[i]);
      rc[i] = count_of(recv_counts[i]);
      sd[i] = count_of(so);
      rd[i] = count_of(ro);
      so += sc[i];
      ro += rc[i];
    }
    const WaitingOn waiting("all-to-all-v");
    FP_MPI_CHECK(MPI_Alltoallv(send, sc.data(), sd.data(), mpi_type(t), recv, rc.data(), rd.data(), mpi_type(t),
                               comm_));
  }
  void send_recv(const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src, DType t) override {
    comm_buffer_check(send, n, "send_recv");
    comm_buffer_check(recv, n_recv, "send_recv");
    const WaitingOn waiting("send-recv");
    FP_MPI_CHECK(MPI_Sendrecv(send, count_of(n), mpi_type(t), dst, kTagShift, recv, count_of(n_recv), mpi_type(t),
                              src, kTagShift, comm_, MPI_STATUS_IGNORE));
  }
  CommRequest send_recv_start(const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src,
                              DType t) override {
    comm_buffer_check(send, n, "send_recv_start");
    comm_buffer_check(recv, n_recv, "send_recv_start");
    // A free slot, or a new one: the pool grows to the most transfers ever in flight at once, then
    // starting a transfer allocates nothing.
    int64_t slot;
    if (free_slots_.empty()) {
      slot = static_cast<int64_t>(slots_.size());
      slots_.push_back({MPI_REQUEST_NULL, MPI_REQUEST_NULL});
    } else {
      slot = free_slots_.back();
      free_slots_.pop_back();
    }
    MPI_Request* q = slots_[slot].data();
    // The receive first, so a rank that sends to itself (P = 1) finds it posted.
    FP_MPI_CHECK(MPI_Irecv(recv, count_of(n_recv), mpi_type(t), src, kTagStart, comm_, &q[0]));
    FP_MPI_CHECK(MPI_Isend(send, count_of(n), mpi_type(t), dst, kTagStart, comm_, &q[1]));
    return CommRequest{slot};
  }
  bool test(CommRequest& r) override {
    if (!r.active()) return true;
    int done = 0;
    FP_MPI_CHECK(MPI_Testall(2, slots_[r.slot].data(), &done, MPI_STATUSES_IGNORE));
    if (done) slot_release(r);
    return done != 0;
  }
  void wait(CommRequest& r) override {
    if (!r.active()) return;
    MPI_Status st[2];
    const WaitingOn waiting("wait for a send-recv");
    const int rc = MPI_Waitall(2, slots_[r.slot].data(), st);
    if (rc == MPI_ERR_IN_STATUS) FP_MPI_CHECK(st[0].MPI_ERROR != MPI_SUCCESS ? st[0].MPI_ERROR : st[1].MPI_ERROR);
    FP_MPI_CHECK(rc);
    slot_release(r);
  }
  void barrier() override {
    const WaitingOn waiting("barrier");
    FP_MPI_CHECK(MPI_Barrier(comm_));
  }
  std::unique_ptr<Comm> split(int color) override {
    MPI_Comm sub = MPI_COMM_NULL;
    const WaitingOn waiting("comm split");
    FP_MPI_CHECK(MPI_Comm_split(comm_, color, rank_, &sub));
    return std::make_unique<MpiComm>(sub);
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  static constexpr int kTagShift = 17;
  static constexpr int kTagStart = 18;  // send_recv_start: apart from the blocking shifts
  void slot_release(CommRequest& r) {
    free_slots_.push_back(r.slot);
    r.slot = -1;
  }
  // out (n) = the bf16 sum of the size_ blocks of n in scratch_, in rank order.
  void sum_scratch(int64_t n, uint16_t* out) {
    ins_.resize(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) ins_[r] = scratch_.data() + r * n;
    comm_sum_bf16(ins_.data(), size_, n, out);
  }
  void reduce(void* data, int64_t n, DType t, MPI_Op op) {
    FP_ASSERT(t != DType::DType_F16 && (t != DType::DType_BF16 || op == MPI_SUM), "MPI cannot reduce {} this way",
              dtype_name(t));
    comm_buffer_check(data, n, "all_reduce");
    const WaitingOn waiting("all-reduce");
    FP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count_of(n), mpi_type(t), op, comm_));
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool world_ = true;  // the world's dup: MPI ends with it
  int rank_ = 0, size_ = 1;
  std::vector<std::array<MPI_Request, 2>> slots_;  // (receive, send) of each transfer started
  std::vector<int64_t> free_slots_;
  // bf16 sums: every rank's contribution (grows to the largest sum, then is reused), and its blocks.
  std::vector<uint16_t> scratch_;
  std::vector<const uint16_t*> ins_;
};

}  // namespace

std::unique_ptr<Comm> comm_create() {
  if (!comm_launched_by_mpi()) return comm_single();
  return std::make_unique<MpiComm>();
}

}  // namespace fp

#else  // !FLATPEAK_HAVE_MPI

namespace fp {

std::unique_ptr<Comm> comm_create() {
  FP_CHECK(!comm_launched_by_mpi(), "install OpenMPI (apt-get install libopenmpi-dev openmpi-bin) and rebuild",
           "launched by mpirun, but this flatpeak was built without MPI");
  return comm_single();
}

}  // namespace fp

#endif
