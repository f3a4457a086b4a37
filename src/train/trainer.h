// The training job: `flatpeak train`. Steps the model with AdamW over the configured data, prints a
// progress line per step, writes DIR/metrics.jsonl, DIR/memory_trace.json and checkpoints
// (train/checkpoint.h), and resumes bit-exactly from one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string device = "cpu";
  std::string device_mem = "unlimited";
  std::string host_mem = "unlimited";
  int64_t steps = 0;               // 0: train.steps of the config
  std::string out;                 // output directory (required)
  std::string resume;              // checkpoint directory to continue from
  std::string init_from;           // checkpoint or Hugging Face model directory to take the weights from (step 0)
  std::string shard_size = "5GB";  // model.safetensors above this is sharded (Note [Checkpoint dtype and shards])
  bool overwrite = false;          // replace an earlier run's files in out (Note [A run owns its output folder])
  bool extend = false;             // with resume: continue past the run's train.steps (Note [Extending a finished run])
  int64_t stop_after = 0;          // stop (with a checkpoint) after this many steps of this invocation
  bool quiet = false;              // no progress lines
  int64_t log_every = 0;           // not on a terminal: a progress line every this many steps (0: 10)
  double link_gbps = 0;            // > 0: the copy streams emulate a host-device link of this many GB/s
};

// Returns the process exit code (0, or 128 + the signal after a clean stop on SIGINT/SIGTERM: Note
// [Stopping on a signal] in core/signals.h); throws fp::Error on bad input (config, data, checkpoint,
// an --out holding another run, a non-finite or spiking loss, out of memory).
int train_run(const TrainOptions& o);

// The EOS id that ends documents (Note [Documents from EOS] in data/documents.h), -1 with documents =
// "none": eos_id when >= 0, else the eos_token_id of the config.json in from_dir (the checkpoint or
// Hugging Face model a run starts from or continues; "" for none). Throws fp::Error naming data.eos_id
// when neither gives one id below vocab_size.
int32_t documents_eos_id(const std::string& documents, int64_t eos_id, const std::string& from_dir, int64_t vocab_size);

}  // namespace fp
