// Training checkpoints.
//
// Layout of an output directory DIR:
//   DIR/step-00000050/model.safetensors      weights, Hugging Face names (loads in transformers)
//   DIR/step-00000050/config.json            Qwen3MoeForCausalLM config (model_type qwen3_moe)
//   DIR/step-00000050/optimizer.safetensors  AdamW state: "<param>.exp_avg", "<param>.exp_avg_sq"
//   DIR/step-00000050/trainer_state.json     step, data position, run config, format version
//   DIR/step-00000050/manifest.json          every other file's size and CRC32C (Note [Checkpoint checksums])
//   DIR/checkpoint -> step-00000050          the latest complete checkpoint (a symlink)
//
// Note [Atomic checkpoints]: a checkpoint is written into "step-N.tmp", every file fsynced, the
// directory renamed to "step-N" and fsynced, and only then the "checkpoint" symlink is replaced
// atomically (a new link renamed over it). A process killed at any point leaves "checkpoint" pointing
// at the previous complete step; stray ".tmp" directories are ignored and cleaned by the next save.
// The previous checkpoint is kept until the next one is complete; of this run's checkpoints the newest
// train.keep_checkpoints (default 2) are kept, the older ones removed once the new one is linked.
//
// Note [Checkpoint checksums]: the last file written into "step-N.tmp" is manifest.json, the size and
// CRC32C (Note [CRC32C] in io/crc32c.h) of every other file, computed from the files as they lie on
// disk once fsynced:
//   {"format": "flatpeak-checkpoint-manifest", "version": 1,
//    "files": {"config.json": {"bytes": 812, "crc32c": "1c2f03aa"}, "model.safetensors": {...}, ...}}
// checkpoint_load checks every file the manifest names before it reads a tensor: a file missing, of
// another size or another checksum is refused with an error naming the file (and the earlier checkpoints
// of the run); so is a file the load reads (config.json, trainer_state.json, model* and optimizer*
// safetensors and indexes) that the manifest does not name. Other files (a tokenizer copied in) are
// neither checked nor read. A flatpeak checkpoint without manifest.json (it has trainer_state.json: a
// flatpeak before checksums wrote it) loads with a warning that names it as unverified, never silently;
// a Hugging Face directory (no trainer_state.json) has no manifest and loads as before. Checking costs
// one more read of the files (page cache; CRC32C runs at several GB/s). checkpoint_export writes a
// manifest too.
//
// Note [Resuming from the newest sound checkpoint]: --resume DIR (a run's folder, or DIR/checkpoint)
// takes the checkpoint the "checkpoint" link names; when its files fail the check (or the link names a
// directory that is gone), the previous complete checkpoint of the run (the newest step-N below it that
// checks) is taken instead, and the run says which it skipped and why. A step-N directory named
// explicitly is that checkpoint or an error: no other is taken in its place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/params.h"
#include "sched/optim/optimizer.h"

namespace fp {

// Note [Checkpoint dtype and shards]: model.safetensors is written in the dtype of the weights a run
// started from (a bf16 Hugging Face model is written back in bf16; a fresh run in its precision's
// parameter dtype), rounded to nearest even from the f32 weights the run trains. When that dtype is
// not f32, or the weights are stored in bf16 (the bf16 recipe: AdamW's f32 master), optimizer.safetensors
// also holds "<param>.master", the f32 weights, and a resume reads those, so it stays bit-exact.
// Weights above shard_bytes are split into model-0000i-of-0000N.safetensors with
// model.safetensors.index.json (Note [Sharded checkpoints] in io/safetensors_set.h), in parameter
// order, as transformers' save_pretrained does. config.json keeps every key of the config.json the run
// started from (its architecture keys are the run's by construction), with use_cache true and its
// torch_dtype / dtype set to what was written. DeepSeek-V3's routers (mlp.gate.weight and
// e_score_correction_bias) are written in F32 whatever the weights' dtype, as transformers keeps them
// (Note [Tensors transformers keeps in f32] in checkpoint.cpp).
struct CheckpointFormat {
  DType weights = DType::DType_F32;         // F32, BF16 or F16
  uint64_t shard_bytes = 5'000'000'000;     // transformers 4.x's default max_shard_size, "5GB"
  std::string base_config;                  // config.json text the run started from ("": flatpeak's own)
};

struct TrainerState {
  int64_t step = 0;            // optimizer steps taken
  int64_t data_position = 0;   // where the data source resumes (sequence index or token offset)
  std::string run_config;      // JSON of the run's config (checked on resume)
  // The length of the learning-rate schedule when it differs from the run's train.steps (a run
  // continued with --extend: Note [Extending a finished run] in trainer.cpp); 0: train.steps.
  int64_t schedule_steps = 0;
  // What checkpoint_load found, for the run's CheckpointFormat: the weights' stored dtype (F32 when
  // they mix dtypes; DeepSeek-V3's f32 routers do not count) and the text of config.json.
  DType weights_dtype = DType::DType_F32;
  std::string config_json;
};

// Writes a checkpoint of `step` under dir (Note [Atomic checkpoints]). Returns the step directory.
// Collective over params.comm(): every rank calls it; the whole tensors are gathered to rank 0, which
// alone writes (Note [Checkpoints over W ranks] in checkpoint.cpp: the files do not depend on W).
// keep: how many of the run's checkpoints stay (the new one and the keep - 1 before it; >= 1).
std::string checkpoint_save(const std::string& dir, const ModelConfig& cfg, ParamStore& params, const Optimizer* optim,
                            const TrainerState& state, Backend& be, const CheckpointFormat& format = {},
                            int64_t keep = 2);

// A checkpoint held in host memory, ready to be written without the model (Note [Checkpoints off the
// critical path] in train/checkpoint_writer.h). Rank 0's holds every tensor, in the file's dtype, in arena
// (capacity bytes, owned by the caller, reused save after save); other ranks' hold nothing.
struct CheckpointImage {
  struct File {
    std::string name;  // e.g. "model.safetensors", "trainer_state.json"
    bool safetensors = false;
    std::vector<SafetensorsView> tensors;  // safetensors: its tensors, into arena
    std::string text;                      // otherwise: its contents
  };
  unsigned char* arena = nullptr;  // (capacity) rank 0 only
  uint64_t capacity = 0;
  uint64_t used = 0;
  std::vector<float> stage;  // (numel of the largest tensor) f32 gather of a tensor written in bf16 / f16
  int64_t step = 0;
  std::vector<File> files;  // in the order checkpoint_save writes them; the manifest comes last
};

// The host bytes a CheckpointImage of this model holds on rank 0 (none on other ranks): arena, every tensor
// of model*.safetensors in its file dtype and, with_optimizer, of optimizer.safetensors in f32, each rounded
// up to 64 bytes; stage, the f32 of the largest tensor written in bf16 or f16 (0 when none is). What
// train.checkpoint_async allocates (CheckpointWriter), and what the plan reports.
struct CheckpointImageBytes {
  uint64_t arena = 0;
  uint64_t stage = 0;
  uint64_t total() const { return arena + stage; }
};
CheckpointImageBytes checkpoint_image_bytes(const ModelConfig& cfg, ParamStore& params, bool with_optimizer,
                                            const CheckpointFormat& format);

// Fills image (whose arena the caller sized with checkpoint_image_bytes) with what checkpoint_save would
// write for `state`, gathering the shards to rank 0 as it does: collective, every rank calls it, the same
// checks (a non-finite number is refused before anything is written).
// dir: where it will be written (errors name the checkpoint's directory).
void checkpoint_snapshot(CheckpointImage& image, const std::string& dir, const ModelConfig& cfg, ParamStore& params,
                         const Optimizer* optim, const TrainerState& state, const CheckpointFormat& format);

// Rank 0: writes image under dir as checkpoint_save does (Note [Atomic checkpoints]: the same files,
// byte for byte, the manifest last, the rename, the link, then keep), without the model and without a
// collective, so any thread may call it. Returns the step directory.
std::string checkpoint_image_write(const std::string& dir, const CheckpointImage& image, int64_t keep);

// Writes the model alone as a Hugging Face directory: out/config.json and the weights in format.weights,
// sharded above format.shard_bytes (Note [Checkpoint dtype and shards]). Written into "out.tmp" and
// renamed, so out appears complete or not at all; out must not exist. Collective like checkpoint_save.
void checkpoint_export(const std::string& out, const ModelConfig& cfg, ParamStore& params,
                       const CheckpointFormat& format);

// The directory of the latest complete checkpoint: dir itself when it holds model.safetensors, else
// dir/checkpoint. Throws fp::Error when there is none.
std::string checkpoint_resolve(const std::string& dir);

// What checkpoint_verify found (Note [Checkpoint checksums]).
enum class CheckpointCheck {
  CheckpointCheck_verified,     // every file the manifest names has its size and CRC32C
  CheckpointCheck_unverified,   // a flatpeak checkpoint without a manifest (written before checksums)
  CheckpointCheck_no_manifest,  // no trainer_state.json and no manifest: a Hugging Face directory
};

// Checks the files of the checkpoint directory ck (as checkpoint_resolve returns it) against its
// manifest; throws fp::Error naming the first damaged file.
CheckpointCheck checkpoint_verify(const std::string& ck);

// The checkpoint --resume dir continues (Note [Resuming from the newest sound checkpoint]), checked.
struct ResumePoint {
  std::string dir;                   // the checkpoint directory to load
  std::vector<std::string> skipped;  // one line per newer checkpoint passed over, naming it and its damage
  CheckpointCheck check = CheckpointCheck::CheckpointCheck_verified;
};
ResumePoint checkpoint_resume_point(const std::string& dir);

// Loads weights (and, when optim is not null, the optimizer state) from a checkpoint directory into
// already allocated tensors; every name, shape and dtype is checked, and the model config must
// match cfg. Returns the trainer state (step 0 when the directory has none, e.g. weights only).
// On W ranks every rank reads the files and keeps its own rows (a checkpoint of any W loads).
// verify: check the files against the manifest first (false: the caller has, e.g. checkpoint_resume_point).
TrainerState checkpoint_load(const std::string& dir, const ModelConfig& cfg, ParamStore& params, Optimizer* optim,
                             Backend& be, bool verify = true);

}  // namespace fp
