// The background checkpoint writer (Note [Checkpoints off the critical path] in train/checkpoint_writer.h).
#include "train/checkpoint_writer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "core/timing.h"

namespace fp {

namespace {

// How much nicer than the training thread the writer runs: CFS gives it about a third of the training
// thread's share of a contended core (weights 1024 vs 335), so the step keeps its pace and the write still
// advances on a busy host; not 19, under which a loaded host can starve the write past a preemption's grace
// period.
constexpr int kWriterNice = 5;

}  // namespace

CheckpointWriter::CheckpointWriter(const ModelConfig& cfg, ParamStore& params, const Optimizer* optim,
                                   const CheckpointFormat& format)
    : cfg_(cfg), params_(params), optim_(optim), format_(format) {
  bytes_ = checkpoint_image_bytes(cfg, params, optim != nullptr, format);
  if (params.rank() != 0) return;
  // Once, for the whole run: every save reuses it (the pages are touched by the first snapshot).
  arena_ = std::make_unique_for_overwrite<unsigned char[]>(bytes_.arena);
  image_.arena = arena_.get();
  image_.capacity = bytes_.arena;
  image_.stage.reserve(bytes_.stage / 4);
}

CheckpointWriter::~CheckpointWriter() {
  if (!thread_.joinable()) return;
  if (busy_.load()) log_info("waiting for the checkpoint of step {} being written", image_.step);
  thread_.join();
}

void CheckpointWriter::wait_thread() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::error_agree(Comm& comm) {
  int64_t failed = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed = error_ != nullptr ? 1 : 0;
  }
  if (comm.size() > 1) comm.all_reduce_max(&failed, 1, DType::DType_I64);
  if (failed == 0) return;
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = std::exchange(error_, nullptr);
  }
  if (e != nullptr) std::rethrow_exception(e);
  throw Error("the checkpoint written in the background on rank 0 failed (rank 0 says why)",
              "see rank 0's error; the previous checkpoint stays the latest");
}

CheckpointWriter::SaveCost CheckpointWriter::save(const std::string& dir, const TrainerState& state, int64_t keep,
                                                  Comm& comm) {
  SaveCost cost;
  const Clock::time_point t0 = Clock::now();
  if (params_.rank() == 0) {
    const bool stalled = busy_.load();
    if (stalled)
      log_info("checkpoint of step {}: waiting for the checkpoint of step {} still being written (one save in flight)",
               state.step, image_.step);
    wait_thread();
    ++saves_;
    if (stalled) {
      ++stalls_;
      stall_seconds_ += seconds_since(t0);
    }
  }
  error_agree(comm);  // a failed write stops every rank here, before the copy is overwritten
  cost.wait_seconds = seconds_since(t0);
  const Clock::time_point t1 = Clock::now();
  checkpoint_snapshot(image_, dir, cfg_, params_, optim_, state, format_);  // collective
  cost.snapshot_seconds = seconds_since(t1);
  if (params_.rank() != 0) return cost;
  // The copy fills exactly what was allocated at the start, and the stage never grew (its reserve is exact):
  // the planned bytes are the bytes held.
  FP_ASSERT(image_.used == bytes_.arena && image_.stage.capacity() * 4 <= bytes_.stage,
            "the checkpoint copy outgrew its planned {} + {} bytes", bytes_.arena, bytes_.stage);
  busy_.store(true);
  thread_ = std::thread([this, dir, keep] {
    // Below the training thread (Note [Checkpoints off the critical path]; Linux: nice applies per thread).
    errno = 0;
    const int nice_now = getpriority(PRIO_PROCESS, 0);
    if (errno == 0)
      setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), std::min(nice_now + kWriterNice, 19));
    const Clock::time_point t = Clock::now();
    try {
      const std::string where = checkpoint_image_write(dir, image_, keep);
      std::lock_guard<std::mutex> lock(mu_);
      done_.push_back({image_.step, where, seconds_since(t)});
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    busy_.store(false);
  });
  return cost;
}

std::vector<CheckpointWriter::Done> CheckpointWriter::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(done_, {});
}

std::vector<CheckpointWriter::Done> CheckpointWriter::finish(Comm& comm) {
  if (params_.rank() == 0) {
    if (busy_.load()) log_info("waiting for the checkpoint of step {} being written", image_.step);
    wait_thread();
  }
  error_agree(comm);
  return poll();
}

}  // namespace fp
