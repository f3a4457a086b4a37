#include "step/step.h"

#include <filesystem>

#include "backend/backend.h"
#include "cli/commands.h"
#include "core/log.h"
#include "core/timing.h"
#include "core/units.h"
#include "data/random_batch.h"
#include "io/atomic_file.h"
#include "memory/report.h"
#include "memory/trace.h"
#include "train/run_config.h"
#include "train/session.h"

namespace fp::cli {

void common_register(CLI::App& sub, CommonOptions& o) {
  sub.add_option("--config", o.config, "model and run configuration (TOML), e.g. configs/tiny.toml")->required();
  sub.add_option("--set", o.overrides, "override a config key: --set table.key=value (repeatable)");
  sub.add_option("--device", o.device, "cpu (computes) or meta (allocations only: exact peaks at any scale)")
      ->check(CLI::IsMember({"cpu", "meta"}));
  sub.add_option("--device-mem", o.device_mem,
                 "device memory capacity: 512MiB, 2GiB, ... or unlimited (the default on cpu)");
  sub.add_option("--host-mem", o.host_mem, "host memory for offload schedules (default unlimited)");
}

void step_register(CLI::App& app, Runner& run) {
  auto opts = std::make_shared<StepOptions>();
  StepOptions& o = *opts;
  CLI::App* sub = app.add_subcommand("step", "one forward+backward on a random batch: loss and per-category peaks");
  sub->callback([&run, opts] { run = [opts] { return step_run(*opts); }; });
  common_register(*sub, o.common);
  sub->add_option("--out", o.out, "directory for memory_trace.json and step.json (created)");
  sub->add_option("--data-seed", o.data_seed, "seed of the random batch");
}

namespace {
int step_with(const StepOptions& o, RunConfig& cfg);
}  // namespace

int step_run(const StepOptions& o) {
  RunConfig cfg = config_load(o.common.config, o.common.overrides);
  try {
    return step_with(o, cfg);
  } catch (const OutOfMemoryError& e) {
    throw Error(e.what(), oom_hint(e.category(), e.space(), cfg));  // the hint that knows the schedules in use
  }
}

namespace {
int step_with(const StepOptions& o, RunConfig& cfg) {
  auto be = backend_create(o.common.device, bytes_parse(o.common.device_mem), bytes_parse(o.common.host_mem));
  const ModelConfig& m = cfg.model;
  log_info(
      "{}: {} layers, hidden {}, {} experts (top-{}), vocab {}, {:.2f} M parameters; batch {} x {} tokens on {}; "
      "precision {}{}",
      cfg.source, m.num_hidden_layers, m.hidden_size, m.num_experts, m.num_experts_per_tok, m.vocab_size,
      static_cast<double>(m.param_count()) / 1e6, cfg.train.batch_size, cfg.train.seq_len, be->name(),
      precision_describe(cfg.precision),
      cfg.schedules.ckpt.recompute ? "" : "; every layer's activations kept (ckpt.recompute = false)");
  const std::unique_ptr<Model> model = run_model_create(cfg, *be);
  Batch batch = batch_random(cfg.train.batch_size, cfg.train.seq_len, m.vocab_size, o.data_seed);
  be->device_ledger().peaks_reset();
  const Clock::time_point t0 = Clock::now();
  StepOutputs out = step_forward_backward(*model, batch);
  const double secs = seconds_since(t0);
  const Ledger& led = be->device_ledger();
  fmt::print("loss {:.6f} (cross-entropy {:.6f}, aux {:.6f}) in {:.3f} s, {:.0f} tokens/s\n", out.loss, out.ce_loss,
             out.aux_loss, secs, static_cast<double>(batch.B * batch.T) / secs);
  fmt::print("device memory peaks ({}):\n{}", be->name(), ledger_peaks_table(led));
  if (!o.out.empty()) {
    std::filesystem::create_directories(o.out);
    trace_write_chrome(led, o.out + "/memory_trace.json");
    nlohmann::json j = ledger_peaks_json(led);
    j["loss"] = out.loss;
    j["ce_loss"] = out.ce_loss;
    j["aux_loss"] = out.aux_loss;
    j["seconds"] = secs;
    j["device"] = std::string(be->name());
    file_write_atomic(o.out + "/step.json", j.dump(2) + "\n");
    log_info("wrote {0}/memory_trace.json (open in ui.perfetto.dev) and {0}/step.json", o.out);
  }
  return 0;
}
}  // namespace

}  // namespace fp::cli
