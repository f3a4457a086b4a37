// flatpeak bench step (bench/step.h): the timed steps, the GEMM peak rate of the run's dtype and the
// model FLOPs.
#include "bench/step.h"

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cpu/gemm_profile.h"
#include "backend/cpu/kernels/ops.h"
#include "bench/bench_common.h"
#include "core/buf.h"
#include "core/log.h"
#include "core/precision.h"
#include "core/rng.h"
#include "core/units.h"
#include "data/random_batch.h"
#include "io/safetensors.h"
#include "memory/report.h"
#include "ops/gemm.h"
#include "sched/optim/optimizer.h"
#include "step/step.h"
#include "train/run_config.h"
#include "train/session.h"

namespace fp::bench {

namespace {

// Model FLOPs of one training step without recompute: 6 per matmul parameter touched per token
// (forward 2, backward 4) plus causal attention (forward 2 x 2 x T^2/2 x hd x nh per sequence, x3).
double model_flops_per_step(const ModelConfig& m, int64_t B, int64_t T) {
  const double n = static_cast<double>(B * T);
  const double H = static_cast<double>(m.hidden_size), hd = static_cast<double>(m.head_dim);
  const double attn_proj = H * hd * static_cast<double>(2 * m.num_attention_heads + 2 * m.num_key_value_heads);
  const double experts = 3.0 * H * static_cast<double>(m.moe_intermediate_size * m.num_experts_per_tok);
  const double router = H * static_cast<double>(m.num_experts);
  const double per_token = static_cast<double>(m.num_hidden_layers) * (attn_proj + experts + router) +
                           H * static_cast<double>(m.vocab_size);
  const double attn = static_cast<double>(m.num_hidden_layers * B) * 2.0 * 2.0 * static_cast<double>(T) *
                      static_cast<double>(T) / 2.0 * hd * static_cast<double>(m.num_attention_heads);
  return 6.0 * per_token * n + 3.0 * attn;
}

}  // namespace

int bench_step_run(const BenchStepOptions& o) {
  RunConfig cfg = config_load(o.config, o.overrides);
  const ModelConfig& m = cfg.model;
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  be->kernels_set(ops::kernels_cpu_gemm_profiled());
  const std::unique_ptr<Model> model_ptr = run_model_create(cfg, *be);
  Model& model = *model_ptr;
  std::unique_ptr<Optimizer> optim_ptr = optimizer_create(cfg.optim, cfg.schedules.optim, model.params(), *be);
  Optimizer& optim = *optim_ptr;
  Batch batch = batch_random(cfg.train.batch_size, cfg.train.seq_len, m.vocab_size, cfg.data.seed);
  if (!o.case_path.empty()) {
    std::vector<std::vector<float>> host;
    std::vector<SafetensorsView> views;
    for (Param& p : model.params().all()) {
      host.emplace_back(static_cast<size_t>(p.w.numel()));  // the twins take the (rounded) weights as f32
      device_read_f32(*be, p.w.cbuf(), p.w.numel(), host.back().data());
      views.push_back({p.name, DType::DType_F32, p.w.shape(), host.back().data()});
    }
    views.push_back({"input_ids", DType::DType_I32, {batch.B, batch.T}, batch.tokens.data()});
    views.push_back({"targets", DType::DType_I32, {batch.B, batch.T}, batch.targets.data()});
    safetensors_write(o.case_path, views, {{"config", model_config_hf_json(m)}});
  }
  log_info("bench step: {} x {} tokens, {:.2f} M parameters, {} warmup + {} timed steps; {}", batch.B, batch.T,
           static_cast<double>(m.param_count()) / 1e6, o.warmup, o.repeats,
           cfg.schedules.ckpt.recompute ? "each layer recomputed in the backward (ckpt.recompute = true)"
                                        : "every layer's activations kept, none recomputed (ckpt.recompute = false)");
  std::vector<double> times, gemm_secs, gemm_flops;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    ops::gemm_profile() = {};
    be->device_ledger().peaks_reset();
    const auto t0 = Clock::now();
    train_step(model, optim, i + 1, o.warmup + o.repeats, cfg.moe.bias_update_rate,
               [&] { return step_forward_backward(model, batch); });
    const double t = seconds_since(t0);
    if (i >= o.warmup) {
      times.push_back(t);
      gemm_secs.push_back(ops::gemm_profile().seconds);
      gemm_flops.push_back(ops::gemm_profile().flops);
    }
  }
  const double step_s = median(times);
  const double sgemm = gemm_rate_measure(DType::DType_F32, 1024, 5);
  // The peak of the run's own dtype (the activations': GEMM operands are weights and activations).
  const DType gemm_t = cfg.precision.activations;
  const double peak = gemm_t == DType::DType_F32 ? sgemm : gemm_rate_measure(gemm_t, 1024, 5);
  const double g_s = median(gemm_secs), g_f = median(gemm_flops);
  const double mflops = model_flops_per_step(m, batch.B, batch.T);
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  nlohmann::json j = ledger_peaks_json(be->device_ledger());
  j["engine"] = "flatpeak";
  j["tokens"] = batch.B * batch.T;
  j["recompute"] = cfg.schedules.ckpt.recompute;  // Note [No recompute] in step/step.h
  j["step_seconds_median"] = step_s;
  j["step_seconds"] = times;
  j["tokens_per_s"] = static_cast<double>(batch.B * batch.T) / step_s;
  j["max_rss_bytes"] = static_cast<int64_t>(ru.ru_maxrss) * 1024;
  j["sgemm_flops_per_s"] = sgemm;
  j["precision"] = precision_describe(cfg.precision);
  j["gemm_peak_dtype"] = dtype_name(gemm_t);
  j["gemm_peak_flops_per_s"] = peak;
  machine_json(j);
  j["gemm_seconds"] = g_s;
  j["gemm_share_of_step"] = g_s / step_s;
  j["gemm_flops_per_s"] = g_f / g_s;
  j["gemm_fraction_of_sgemm"] = g_f / g_s / sgemm;
  j["gemm_fraction_of_peak"] = g_f / g_s / peak;
  j["model_flops_per_step"] = mflops;
  j["mfu_vs_sgemm"] = mflops / step_s / sgemm;
  fmt::print(
      "flatpeak step ({}): {:.4f} s median of {} ({:.0f} tokens/s); GEMMs {:.0f}% of the step at {:.1f} "
      "GFLOP/s = {:.0f}% of the {} GEMM peak {:.1f} GFLOP/s (sgemm {:.1f}); MFU {:.0f}% of sgemm; device "
      "peak {}; max RSS {}\n",
      precision_describe(cfg.precision), step_s, times.size(), j["tokens_per_s"].get<double>(), 100 * g_s / step_s,
      g_f / g_s / 1e9, 100 * g_f / g_s / peak, dtype_name(gemm_t), peak / 1e9, sgemm / 1e9,
      100 * mflops / step_s / sgemm, bytes_format(be->device_ledger().total_peak()),
      bytes_format(static_cast<uint64_t>(ru.ru_maxrss) * 1024));
  machine_print();
  json_write(o.json, j);
  return 0;
}

}  // namespace fp::bench
