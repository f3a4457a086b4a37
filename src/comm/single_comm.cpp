// The one-process world: every collective over one rank is a copy or nothing.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "comm/comm.h"
#include "core/error.h"

namespace fp {

namespace {

class SingleComm final : public Comm {
 public:
  std::string_view name() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(void*, int64_t, DType) override {}
  void all_reduce_max(void*, int64_t, DType) override {}
  void all_gather(const void* send, void* recv, int64_t n, DType t) override { copy(recv, send, n, t); }
  void reduce_scatter_sum(const void* send, void* recv, int64_t n, DType t) override { copy(recv, send, n, t); }
  void all_to_all_v(const void* send, const int64_t* send_counts, void* recv, const int64_t* recv_counts,
                    DType t) override {
    FP_ASSERT(send_counts[0] == recv_counts[0]);
    copy(recv, send, send_counts[0], t);
  }
  void send_recv(const void* send, int64_t n, int dst, void* recv, int64_t n_recv, int src, DType t) override {
    FP_ASSERT(dst == 0 && src == 0 && n == n_recv);
    copy(recv, send, n, t);
  }
  void barrier() override {}
  std::unique_ptr<Comm> split(int) override { return std::make_unique<SingleComm>(); }
  [[noreturn]] void abort(int code) override { std::exit(code); }

 private:
  static void copy(void* dst, const void* src, int64_t n, DType t) {
    comm_buffer_check(src, n, "single");
    comm_buffer_check(dst, n, "single");
    if (dst != src && n > 0)
      std::memmove(dst, src, static_cast<size_t>(n) * dtype_size(t));
  }
};

}  // namespace

std::unique_ptr<Comm> comm_single() { return std::make_unique<SingleComm>(); }

Comm& comm_world() {
  static std::unique_ptr<Comm> world = comm_create();
  return *world;
}

bool comm_launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::atoi(v) > 1) return true;
  }
  return false;
}

}  // namespace fp
