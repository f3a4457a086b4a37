// flatpeak train and flatpeak eval.
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/commands.h"
#include "core/log.h"
#include "core/units.h"
#include "data/documents.h"
#include "data/loader.h"
#include "data/token_file.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/hf_config.h"
#include "step/step.h"
#include "train/checkpoint.h"
#include "train/config_keys.h"
#include "train/session.h"
#include "train/trainer.h"

namespace fp::cli {

void train_register(CLI::App& app, Runner& run) {
  auto opts = std::make_shared<TrainOptions>();
  TrainOptions& o = *opts;
  CLI::App* sub = app.add_subcommand("train", "train a model: progress per step, metrics.jsonl, checkpoints");
  sub->callback([&run, opts] { run = [opts] { return train_run(*opts); }; });
  sub->add_option("--config", o.config, "model and run configuration (TOML), e.g. configs/tiny.toml")->required();
  sub->add_option("--set", o.overrides, "override a config key: --set table.key=value (repeatable)");
  sub->add_option("--device", o.device, "cpu (computes) or meta (allocations only: exact peaks at any scale)")
      ->check(CLI::IsMember({"cpu", "meta"}));
  sub->add_option("--device-mem", o.device_mem, "device memory capacity: 512MiB, 2GiB, ... or unlimited");
  sub->add_option("--host-mem", o.host_mem, "host memory for offload schedules (default unlimited)");
  sub->add_option("--steps", o.steps, "steps of the run (default: train.steps of the config)")->check(at_least(1));
  sub->add_option("--out", o.out, "output directory: metrics.jsonl, memory_trace.json, checkpoints")->required();
  sub->add_option("--resume", o.resume, "continue from the checkpoint in this directory (bit-exact)");
  sub->add_option("--init-from", o.init_from,
                  "start from the weights in this directory (a flatpeak checkpoint or a Hugging Face Qwen3-MoE model "
                  "directory: config.json with model.safetensors or a sharded index), with a fresh optimizer at step "
                  "0; --config's [model] table may then be left out");
  sub->add_option("--shard-size", o.shard_size,
                  "checkpoints whose weights exceed this are split into shards with an index, as transformers "
                  "does (default 5GB)");
  sub->add_flag("--extend", o.extend,
                "with --resume and --steps N: continue a run past its last step to N, at the learning rate "
                "its schedule ended on");
  sub->add_flag("--overwrite", o.overwrite,
                "replace the earlier run in --out (otherwise a folder holding one is refused)");
  sub->add_option("--stop-after", o.stop_after,
                  "stop after this many steps of this invocation, with a checkpoint (preemptible jobs)")
      ->check(at_least(1));
  sub->add_flag("--quiet", o.quiet, "no progress lines");
  sub->add_option("--log-every", o.log_every,
                  "when stdout is not a terminal, a progress line every N steps (default 10; a terminal gets one "
                  "live line)")
      ->check(at_least(1));
  sub->add_option("--link-gbps", o.link_gbps,
                  "emulate a host-device link of X GB/s for the offload copies (schedule studies; 0: off)")
      ->check(CLI::NonNegativeNumber);
}

void eval_register(CLI::App& app, Runner& run) {
  auto opts = std::make_shared<EvalOptions>();
  EvalOptions& o = *opts;
  CLI::App* sub = app.add_subcommand("eval", "mean loss of a checkpoint on a token file");
  sub->callback([&run, opts] { run = [opts] { return eval_run(*opts); }; });
  sub->add_option("--checkpoint", o.checkpoint,
                  "checkpoint directory: a train --out directory, a step directory, or a Hugging Face model directory "
                  "(config.json with model.safetensors or a sharded model.safetensors.index.json)")
      ->required();
  sub->add_option("--data", o.data, "token file in llm.c's format (see docs/data.md)")->required();
  sub->add_option("--seq-len", o.seq_len, "tokens per sequence (default 1024, or fewer if the file is short)")
      ->check(at_least(2));
  sub->add_option("--batch", o.batch, "sequences per forward pass")->check(at_least(1));
  sub->add_option("--json", o.json, "write {loss, tokens, sequences, ...} here");
  sub->add_option("--device-mem", o.device_mem, "device memory capacity");
  sub->add_option("--set", o.overrides,
                  "how the data is read, as in training: --set data.documents=eos --set data.eos_id=N, or "
                  "data.documents=index (--data's FILE.docs) (repeatable; "
                  "`flatpeak keys` marks the keys eval takes)");
  sub->add_option("--dump-logits", o.dump_logits,
                  "write the first batch's inputs and logits (B, T, V) here as safetensors (scripts/interop)");
}

int eval_run(const EvalOptions& o) {
  // The data keys of a run config (Note [One key registry]): documents are marked as training marks them.
  RunConfig data_cfg;
  for (const std::string& ov : o.overrides) {
    const size_t eq = ov.find('=');
    const std::string name = ov.substr(0, eq);
    const ConfigKey* k = config_key_find(name);
    FP_CHECK(eq != std::string::npos && k != nullptr && (k->commands & kKeyEval) != 0,
             "eval takes --set data.documents=... and data.eos_id=... (`flatpeak keys` marks the keys eval takes)",
             "--set {}: {} is not a key flatpeak eval takes", ov, name);
    config_key_set_text(data_cfg, *k, ov.substr(eq + 1), "--set " + ov);
  }
  documents_parse(data_cfg.data.documents);  // a bad value before any file is read
  // The architecture comes from the checkpoint's own config.json, read strictly (model/hf_config.h).
  const CheckpointModel cm = checkpoint_model_load(o.checkpoint, bytes_parse(o.device_mem));
  const std::string& ck = cm.dir;
  Model& model = *cm.model;
  const ModelConfig& m = model.config();
  TokenFile file(o.data, m.vocab_size, "--data");
  int64_t T = o.seq_len;
  if (T <= 0) T = std::min<int64_t>(1024, file.size() - 1);  // a window holds T + 1 tokens
  const int32_t eos_id = documents_eos_id(data_cfg.data.documents, data_cfg.data.eos_id, ck, m.vocab_size);
  const DocumentMarker documents = DocumentMarker::make(data_cfg.data.documents, eos_id, o.data, file.size());
  const std::vector<Batch> batches = eval_batches_read(file, T, o.batch, 0, documents, "--seq-len");
  FP_CHECK(!batches.empty(), "use a shorter --seq-len", "'{}' holds {} tokens: not one sequence of {}", o.data,
           file.size(), T);
  if (documents.kind != Documents::Documents_none)
    log_info("{}: attention and RoPE restart per document", documents.describe());
  double aux_sum = 0;
  int64_t sequences = 0;
  std::vector<float> logits;
  const HeldOutLoss held = held_out_loss(
      batches.size(),
      [&](size_t i) { return step_forward(model, batches[i], i == 0 && !o.dump_logits.empty() ? &logits : nullptr); },
      [&](size_t i, const StepOutputs& out) {
        const Batch& b = batches[i];
        if (i == 0 && !o.dump_logits.empty())
          safetensors_write(o.dump_logits,
                            {{"input_ids", DType::DType_I32, {b.B, b.T}, b.tokens.data()},
                             {"targets", DType::DType_I32, {b.B, b.T}, b.targets.data()},
                             {"logits", DType::DType_F32, {b.B, b.T, m.vocab_size}, logits.data()}},
                            {});
        aux_sum += out.aux_loss * static_cast<double>(b.B);
        sequences += b.B;
        log_info("eval batch {}/{}: loss {:.6f}", i + 1, batches.size(), out.ce_loss);
      });
  const double loss = held.loss;
  const int64_t tokens = held.targets;
  fmt::print("loss {:.6f} over {} target tokens ({} sequences of {})\n", loss, tokens, sequences, T);
  FP_CHECK(std::isfinite(loss), "the checkpoint's weights are finite (checked at load), so check the data file",
           "the evaluation loss of '{}' on '{}' is {}", ck, o.data, loss);
  if (!o.json.empty()) {
    nlohmann::json j = {{"loss", loss},
                        {"tokens", tokens},
                        {"sequences", sequences},
                        {"seq_len", T},
                        {"aux_loss_mean", aux_sum / static_cast<double>(sequences)},
                        {"checkpoint", ck},
                        {"data", o.data},
                        {"documents", data_cfg.data.documents}};
    file_write_atomic(o.json, j.dump(2) + "\n");
  }
  return 0;
}

namespace {
struct ConvertOptions {
  std::string checkpoint, out, dtype, shard_size = "5GB";
};

int convert_run(const ConvertOptions& o) {
  // Every tensor read, or the conversion stops naming it (Note [No weight is dropped silently]).
  const CheckpointModel cm = checkpoint_model_load(o.checkpoint);
  const std::string& ck = cm.dir;
  const ModelConfig& m = cm.model->config();
  const TrainerState& read = cm.read;
  CheckpointFormat format;
  format.weights = o.dtype.empty() ? read.weights_dtype : dtype_parse(o.dtype);
  FP_CHECK(
      format.weights == DType::DType_F32 || format.weights == DType::DType_BF16 || format.weights == DType::DType_F16,
      "pass --dtype f32, bf16 or f16", "--dtype {}: weights are written as f32, bf16 or f16", o.dtype);
  format.shard_bytes = bytes_parse(o.shard_size);
  format.base_config = read.config_json;
  checkpoint_export(o.out, m, cm.model->params(), format);
  log_info("wrote {} ({} weights{}) from {}", o.out, dtype_name(format.weights),
           format.weights != read.weights_dtype ? fmt::format(", read as {}", dtype_name(read.weights_dtype)) : "", ck);
  return 0;
}
}  // namespace

void convert_register(CLI::App& app, Runner& run) {
  auto opts = std::make_shared<ConvertOptions>();
  ConvertOptions& o = *opts;
  CLI::App* sub = app.add_subcommand(
      "convert",
      "read a checkpoint strictly (every config key, every tensor) and write it as a Hugging Face directory");
  sub->callback([&run, opts] { run = [opts] { return convert_run(*opts); }; });
  sub->add_option("--checkpoint", o.checkpoint, "a flatpeak run or step directory, or a Hugging Face model directory")
      ->required();
  sub->add_option("--out", o.out, "the directory to write (must not exist)")->required();
  sub->add_option("--dtype", o.dtype, "weights dtype: f32, bf16 or f16 (default: the input's)");
  sub->add_option("--shard-size", o.shard_size, "shard the weights above this size, with an index (default 5GB)");
}

}  // namespace fp::cli
