// flatpeak bench checkpoint (bench/checkpoint.h): the two variants, the bitwise check, the timed steps.
#include "bench/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench/bench_common.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "data/random_batch.h"
#include "step/step.h"
#include "train/run_config.h"
#include "train/session.h"

namespace fp::bench {

namespace {

// One variant: its own backend (its own ledgers), the model built from the same seed.
struct CkptVariant {
  std::string name;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::vector<double> seconds;
  uint64_t ckpt_peak = 0, device_peak = 0, host_peak = 0;
  double loss = 0;
};

double step_timed(CkptVariant& v, const Batch& batch) {
  v.be->device_ledger().peaks_reset();
  v.be->host_ledger().peaks_reset();
  const auto t0 = Clock::now();
  v.model->zero_grads();
  v.loss = step_forward_backward(*v.model, batch).loss;
  v.be->synchronize();
  const double s = seconds_since(t0);
  v.ckpt_peak = v.be->device_ledger().peak(Category::Category_checkpoints);
  v.device_peak = v.be->device_ledger().total_peak();
  v.host_peak = v.be->host_ledger().total_peak();
  return s;
}

// Bit-identical loss and gradients, or an error naming the first difference.
void variants_check(CkptVariant& a, CkptVariant& b) {
  FP_CHECK(std::memcmp(&a.loss, &b.loss, sizeof(double)) == 0, "this is a bug in the sco checkpoint store",
           "bench checkpoint: loss differs: {} {:.17g} vs {} {:.17g}", a.name, a.loss, b.name, b.loss);
  auto& pa = a.model->params().all();
  auto& pb = b.model->params().all();
  for (size_t i = 0; i < pa.size(); ++i) {
    FP_CHECK(std::memcmp(pa[i].g.data(), pb[i].g.data(), pa[i].g.bytes()) == 0,
             "this is a bug in the sco checkpoint store", "bench checkpoint: gradient of {} differs between {} and {}",
             pa[i].name, a.name, b.name);
  }
}

nlohmann::json variant_json(const CkptVariant& v, uint64_t boundary) {
  return {{"checkpoints_peak_bytes", v.ckpt_peak},
          {"checkpoints_peak_boundaries", static_cast<double>(v.ckpt_peak) / static_cast<double>(boundary)},
          {"device_peak_bytes", v.device_peak},
          {"host_peak_bytes", v.host_peak},
          {"step_seconds_median", median(v.seconds)},
          {"step_seconds_min", *std::min_element(v.seconds.begin(), v.seconds.end())},
          {"step_seconds", v.seconds}};
}

}  // namespace

int bench_checkpoint_run(const BenchCheckpointOptions& o) {
  std::vector<std::string> overrides = o.overrides;
  if (o.layers > 0) overrides.push_back(fmt::format("model.num_hidden_layers={}", o.layers));
  FP_CHECK(o.repeats >= 1 && o.warmup >= 0, "use --repeats >= 1 and --warmup >= 0", "bench checkpoint: --repeats {} --warmup {}",
           o.repeats, o.warmup);
  RunConfig cfg = config_load(o.config, overrides);
  const ModelConfig& m = cfg.model;
  Batch batch = batch_random(cfg.train.batch_size, cfg.train.seq_len, m.vocab_size, cfg.data.seed);
  const int64_t n = batch.B * batch.T, L = m.num_hidden_layers;
  const uint64_t boundary = static_cast<uint64_t>(n * m.hidden_size) * 4;  // (n, H) fp32

  CkptVariant vars[2];
  for (int i = 0; i < 2; ++i) {
    CkptVariant& v = vars[i];
    RunConfig c = cfg;
    c.schedules.ckpt.kind = i == 0 ? CkptSchedule::Kind::Kind_device : CkptSchedule::Kind::Kind_sco;
    v.name = i == 0 ? "device" : "sco";
    v.be = backend_create(o.device, bytes_parse(o.device_mem), bytes_parse(o.host_mem));
    v.be->link_set_gbps(o.link_gbps);
    v.model = run_model_create(c, *v.be);
  }
  log_info("bench checkpoint: {} layers, {} x {} = {} tokens, hidden {}: one boundary {}; {} warmup + {} timed steps "
           "(forward+backward) on {}{}",
           L, batch.B, batch.T, n, m.hidden_size, bytes_format(boundary), o.warmup, o.repeats, o.device,
           o.link_gbps > 0 ? fmt::format(", copies over an emulated {} GB/s link", o.link_gbps) : "");

  // Check first (one step each), then time; the check step also serves as warmup.
  for (CkptVariant& v : vars) step_timed(v, batch);
  if (vars[0].be->computes()) variants_check(vars[0], vars[1]);
  for (int i = 1; i < o.warmup; ++i)
    for (CkptVariant& v : vars) step_timed(v, batch);
  // Alternating order (device, sco, sco, device, ...) so a drift in machine load hits both alike.
  for (int r = 0; r < o.repeats; ++r)
    for (int i = 0; i < 2; ++i) {
      CkptVariant& v = vars[(r + i) % 2];
      v.seconds.push_back(step_timed(v, batch));
    }

  const CkptVariant& d = vars[0];
  const CkptVariant& s = vars[1];
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  auto fastest = [](const std::vector<double>& t) { return *std::min_element(t.begin(), t.end()); };
  const double t_ratio = ratio(median(s.seconds), median(d.seconds));
  const double t_min_ratio = ratio(fastest(s.seconds), fastest(d.seconds));
  fmt::print("{:<8} {:>14} {:>11} {:>14} {:>14} {:>12} {:>12}\n", "variant", "ckpt peak", "boundaries", "device peak",
             "host peak", "step s (med)", "step s (min)");
  for (const CkptVariant& v : vars)
    fmt::print("{:<8} {:>14} {:>11.2f} {:>14} {:>14} {:>12.4f} {:>12.4f}\n", v.name, bytes_format(v.ckpt_peak),
               static_cast<double>(v.ckpt_peak) / static_cast<double>(boundary), bytes_format(v.device_peak),
               bytes_format(v.host_peak), median(v.seconds), fastest(v.seconds));
  fmt::print("sco / device: checkpoints peak {:.3f}x, device peak {:.3f}x, step time {:.3f}x (medians of {}; "
             "fastest {:.3f}x){}\n",
             ratio(static_cast<double>(s.ckpt_peak), static_cast<double>(d.ckpt_peak)),
             ratio(static_cast<double>(s.device_peak), static_cast<double>(d.device_peak)), t_ratio, o.repeats,
             t_min_ratio, d.be->computes() ? "; losses and gradients bit-identical" : " (meta: times are not compute)");

  if (!o.json.empty()) {
    nlohmann::json j;
    j["bench"] = "checkpoint";
    j["device"] = o.device;
    j["layers"] = L;
    j["tokens"] = n;
    j["hidden"] = m.hidden_size;
    j["boundary_bytes"] = boundary;
    j["host_budget_bytes"] = cfg.schedules.ckpt.host_budget;
    j["repeats"] = o.repeats;
    j["link_gbps_emulated"] = o.link_gbps;
    j["checked_bitwise"] = d.be->computes();
    j["variants"] = {{"device", variant_json(d, boundary)}, {"sco", variant_json(s, boundary)}};
    j["ratio_sco_over_device"] = {
        {"checkpoints_peak", ratio(static_cast<double>(s.ckpt_peak), static_cast<double>(d.ckpt_peak))},
        {"device_peak", ratio(static_cast<double>(s.device_peak), static_cast<double>(d.device_peak))},
        {"step_seconds", t_ratio},
        {"step_seconds_min", t_min_ratio}};
    json_write(o.json, j);
  }
  return 0;
}

}  // namespace fp::bench
