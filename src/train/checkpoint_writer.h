// Checkpoints written in the background (train.checkpoint_async).
//
// Note [Checkpoints off the critical path]: with train.checkpoint_async = true a checkpoint step does not
// wait for the files. It copies what the checkpoint holds (weights in the file's dtype, AdamW's moments and
// master, config.json and trainer_state.json: the data position and the step) into a host copy, a
// CheckpointImage (train/checkpoint.h), gathering FSDP / EP shards to rank 0 exactly as checkpoint_save
// does: every collective is issued here, by the training thread, in the step. Then a writer thread of
// rank 0 writes that copy with checkpoint_image_write: the same files byte for byte, the same temporary
// directory, manifest, rename and link (Note [Atomic checkpoints]), keep_checkpoints applied once the new
// one is linked, while the next steps run. The thread runs 5 nice levels below the training thread, so
// on a contended host the step keeps most of the CPU and the write still advances.
//
// - The host copy is allocated once, when the run starts, on rank 0 (other ranks hold none): exactly
//   checkpoint_image_bytes, what `flatpeak plan --schedule train.checkpoint_async=true` reports, and a
//   --host-mem that cannot hold it besides the run's other host memory is refused by name.
// - One save in flight: a checkpoint step that comes while the previous write is unfinished waits for it
//   (logged, and counted in the metrics as checkpoint_wait_seconds) before it overwrites the copy.
// - The end of the run, a stop by signal and an error wait for the write in flight, so the run ends with
//   its newest checkpoint complete; a process killed meanwhile leaves the previous one as the latest
//   (the protocol is atomic at every moment). The last checkpoint of a run is waited for before exit.
// - A write that fails (a full disk) stops the run at the next checkpoint step or at its end, every rank
//   alike, with the writer's error; the previous checkpoint stays the latest.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "train/checkpoint.h"

namespace fp {

class CheckpointWriter {
 public:
  // Allocates the host copy (rank 0): checkpoint_image_bytes(cfg, params, optim != null, format).
  CheckpointWriter(const ModelConfig& cfg, ParamStore& params, const Optimizer* optim, const CheckpointFormat& format);
  // Waits for a write in flight (Note [Checkpoints off the critical path]); never throws.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Host bytes held for the copy on this rank (0 on ranks other than 0).
  uint64_t host_bytes() const { return bytes_.total(); }

  // What a save cost the training thread.
  struct SaveCost {
    double wait_seconds = 0;      // waiting for the previous write to finish
    double snapshot_seconds = 0;  // the gathers and the copy into host memory
  };
  // Collective: waits for the previous write (rank 0), snapshots the checkpoint of state.step, then (rank 0)
  // starts writing it under dir in the background. Throws the previous write's error, on every rank, before
  // anything is copied (a collective decides, so every rank stops alike).
  SaveCost save(const std::string& dir, const TrainerState& state, int64_t keep, Comm& comm);

  // The writes that finished since the last call (rank 0): each one's step, directory and seconds.
  struct Done {
    int64_t step = 0;
    std::string dir;
    double seconds = 0;
  };
  std::vector<Done> poll();
  // Whether a write is in flight (rank 0).
  bool busy() const { return busy_.load(); }
  // Collective: waits for the write in flight; throws its error on every rank. Returns what finished.
  std::vector<Done> finish(Comm& comm);
  // Rank 0: saves started, and those that waited for the previous write (and how long in all).
  int64_t saves() const { return saves_; }
  int64_t stalls() const { return stalls_; }
  double stall_seconds() const { return stall_seconds_; }

 private:
  void wait_thread();            // joins the thread (rank 0)
  void error_agree(Comm& comm);  // throws the writer's error on every rank when rank 0 has one

  const ModelConfig& cfg_;
  ParamStore& params_;
  const Optimizer* optim_;
  CheckpointFormat format_;
  CheckpointImageBytes bytes_;
  std::unique_ptr<unsigned char[]> arena_;  // (bytes_.arena) rank 0
  CheckpointImage image_;
  std::thread thread_;
  std::atomic<bool> busy_{false};
  std::mutex mu_;           // guards done_ and error_
  std::vector<Done> done_;  // the writes finished and not yet polled
  int64_t saves_ = 0, stalls_ = 0;
  double stall_seconds_ = 0;
  std::exception_ptr error_;  // the writer's failure, until thrown
  std::string error_text_;
};

}  // namespace fp
