#include "plan/plan_json.h"

#include "core/error.h"

namespace fp::plan {

namespace {

nlohmann::ordered_json bytes_or_null(uint64_t b) {
  return b == kUnlimitedBytes ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(b);
}

nlohmann::ordered_json precision_json(const Precision& d) {
  return {{"params", dtype_name(d.params)},   {"grads", dtype_name(d.grads)},   {"activations", dtype_name(d.activations)},
          {"master", dtype_name(d.master)},   {"moments", dtype_name(d.moments)}, {"logits", dtype_name(d.logits)},
          {"router", dtype_name(d.router)}};
}

nlohmann::ordered_json schedule_json(const Schedules& s) {
  // The families under their short keys (scripts read schedule.optim); every setting under the
  // key of its run-config name (pipelined.chunk_cap is "chunk_cap", ckpt.host_budget "host_budget").
  const DispatchSchedule& d = s.dispatch;
  nlohmann::ordered_json j = {{"dispatch", schedule_name(d.kind)},
                              {"vocab", schedule_name(s.vocab.kind)},
                              {"ckpt", schedule_name(s.ckpt.kind)},
                              {"optim", schedule_name(s.optim.kind)}};
  if (s.vocab.kind == VocabSchedule::Kind::Kind_ring) j["block_tokens"] = s.vocab.block_tokens;
  if (d.kind != DispatchSchedule::Kind::Kind_standard) {
    j["lambda"] = d.lambda;
    j["alpha"] = d.alpha;
    j["min_tokens_per_gemm"] = d.min_tokens_per_gemm;
  }
  j["token_chunk"] = d.token_chunk;
  j["layer_tile"] = s.ckpt.layer_tile;
  if (d.kind == DispatchSchedule::Kind::Kind_pipelined_llep) {
    j["chunk_cap"] = d.chunk_cap;
    j["max_chunks"] = d.max_chunks;
    j["membership"] = d.strided ? "strided" : "contiguous";
  }
  if (s.ckpt.kind == CkptSchedule::Kind::Kind_sco) j["host_budget"] = bytes_or_null(s.ckpt.host_budget);
  j["recompute"] = s.ckpt.recompute;
  if (s.optim.kind == OptimSchedule::Kind::Kind_offload_stream) {
    j["bucket_params"] = s.optim.bucket_params;
    j["slots"] = s.optim.slots;
    j["update_on"] = update_on_name(s.optim);
  }
  return j;
}

}  // namespace

std::string category_status(const Result& r) {
  return r.exact() ? "exact (the engine ran it on meta)" : "approximate: the model is approximated (see approximate)";
}

nlohmann::ordered_json plan_json(const Model& m, const Input& in, const Result& r) {
  const ModelConfig& c = in.model;
  nlohmann::ordered_json j;
  j["model"] = {{"name", m.name},
                {"source", m.source},
                {"params", c.param_count()},
                {"hidden_size", c.hidden_size},
                {"num_hidden_layers", c.num_hidden_layers},
                {"num_attention_heads", c.num_attention_heads},
                {"num_key_value_heads", c.num_key_value_heads},
                {"head_dim", c.head_dim},
                {"num_experts", c.num_experts},
                {"num_experts_per_tok", c.num_experts_per_tok},
                {"moe_intermediate_size", c.moe_intermediate_size},
                {"vocab_size", c.vocab_size},
                {"notes", m.notes},
                {"approximate", m.approximate}};
  j["context"] = in.context;
  j["ranks"] = r.sizes.ranks;
  j["device_mem"] = bytes_or_null(in.device_mem);
  j["host_mem"] = bytes_or_null(in.host_mem);
  const Sizes& z = r.sizes;
  j["layout"] = {{"ranks", z.ranks},
                 {"batch", in.settings.layout.batch},
                 {"expert_ranks", in.settings.layout.expert_ranks()},
                 {"shard_ranks", in.settings.layout.shard_ranks()},
                 {"tokens_per_rank", z.tokens},
                 {"params_per_rank", z.params_per_rank},
                 {"routing", in.settings.routing.str()},
                 {"routes_sent", z.routes_sent}};
  if (z.ranks > 1) j["layout"]["rank"] = z.rank;
  if (z.chunks > 0) {
    j["layout"]["chunks"] = z.chunks;
    j["layout"]["chunk_tokens"] = z.chunk_tokens;
  }
  if (r.sched.vocab.kind == VocabSchedule::Kind::Kind_ring) {
    j["layout"]["vocab_ring"] = z.vocab_ring;
    if (z.vocab_ring > 1) j["layout"]["ring_mode"] = z.ring_mode;
  }
  if (r.sched.ckpt.kind == CkptSchedule::Kind::Kind_sco) j["layout"]["boundaries_offloaded"] = z.boundaries_offloaded;
  j["precision"] = precision_json(r.precision);
  j["schedule"] = schedule_json(r.sched);
  j["schedule"]["optim_requested"] = schedule_name(in.settings.sched.optim.kind);
  nlohmann::ordered_json peaks;
  for (Category cat : kAllCategories) {
    const int i = static_cast<int>(cat);
    peaks[std::string(category_name(cat))] = {{"bytes", r.peak[i]},
                                              {"at_step_peak", r.at_peak[i]},
                                              {"status", category_status(r)},
                                              {"formula", r.formula[i]}};
  }
  j["peaks"] = peaks;
  j["step_peak"] = r.step_peak;
  j["binding"] = category_name(r.binding);
  j["step_peak_at"] = r.peak_tag;
  j["fits"] = r.fits();
  j["fits_device"] = r.fits_device;
  j["fits_host"] = r.fits_host;
  nlohmann::ordered_json host;
  for (Category cat : kAllCategories)
    if (r.host_peak[static_cast<int>(cat)] > 0) host[std::string(category_name(cat))] = r.host_peak[static_cast<int>(cat)];
  j["host"] = {{"needed", r.host_needed}, {"by_category", host.is_null() ? nlohmann::ordered_json::object() : host}};
  // train.checkpoint_async: the named host category of the checkpoint's copy (rank 0's).
  if (r.host_checkpoint_copy > 0) j["host"]["by_category"]["checkpoint_copy"] = r.host_checkpoint_copy;
  j["exact"] = r.exact();
  j["approximate"] = r.approximate;
  j["plan_seconds"] = r.seconds;
  j["time"] = step_time_json(r.time);
  return j;
}

nlohmann::ordered_json step_time_json(const StepTime& t) {
  nlohmann::ordered_json j;
  // Counts (Note [Meta counts the work]): exact for the engine's calls, per rank.
  j["counted"] = {{"flops", t.flops},
                  {"gemm_flops", t.gemm_flops},
                  {"attention_flops", t.attention_flops},
                  {"model_flops_estimate", t.model_flops},
                  {"kernel_calls", t.kernel_calls}};
  nlohmann::ordered_json links;
  for (int l = 0; l < kNumLinks; ++l) links[link_name(static_cast<Link>(l))] = t.link_bytes[static_cast<size_t>(l)];
  j["counted"]["link_bytes"] = links;
  if (!t.predicted) {
    j["predicted"] = nullptr;
    return j;
  }
  nlohmann::ordered_json busy;
  for (int c = 0; c < kNumTimeClasses; ++c)
    busy[time_class_name(static_cast<TimeClass>(c))] = t.busy[static_cast<size_t>(c)];
  // Note [Time in the planner]: predictions under the profile, never measurements.
  j["predicted"] = {{"profile", t.profile}, {"step_seconds", t.seconds},  {"tokens_per_s_per_device", t.tokens_per_s},
                    {"mfu", t.mfu},         {"peak_flops", t.peak_flops}, {"binding_time", time_class_name(t.binding)},
                    {"busy_seconds", busy}};
  return j;
}

std::string step_time_line(const StepTime& t) {
  if (!t.predicted)
    return fmt::format("time: not predicted (no --profile); counted {:.3g} FLOPs per rank ({:.0f}% GEMM)\n", t.flops,
                       t.flops > 0 ? 100 * t.gemm_flops / t.flops : 0.0);
  std::string busy;
  for (int c = 0; c < kNumTimeClasses; ++c)
    busy += fmt::format("{}{} {:.3g} s", c == 0 ? "" : ", ", time_class_name(static_cast<TimeClass>(c)),
                        t.busy[static_cast<size_t>(c)]);
  return fmt::format(
      "predicted on {} (a prediction, not a measurement): {:.4g} s per step, {:.4g} tokens/s per device, MFU {:.1f}% "
      "of "
      "{:.4g} TFLOP/s; binding time: {} (busy: {}); counted {:.3g} FLOPs per rank ({:.0f}% GEMM, model estimate "
      "{:.3g})\n",
      t.profile, t.seconds, t.tokens_per_s, 100 * t.mfu, t.peak_flops / 1e12, time_class_name(t.binding), busy, t.flops,
      t.flops > 0 ? 100 * t.gemm_flops / t.flops : 0.0, t.model_flops);
}

nlohmann::ordered_json reach_json(const Reach& r) {
  nlohmann::ordered_json j = {{"max_context", r.max_context},
                              {"max_context_str", context_format(r.max_context)},
                              {"max_pow2", r.max_pow2},
                              {"capped", r.capped},
                              {"points", r.points},
                              {"seconds", r.seconds}};
  if (r.max_context > 0) {
    j["step_peak_at_max"] = r.at_max.step_peak;
    j["binding_at_max"] = category_name(r.at_max.binding);
    j["host_needed_at_max"] = r.at_max.host_needed;
    j["schedule"] = schedule_json(r.at_max.sched);
    j["exact"] = r.at_max.exact();
  }
  return j;
}

std::string plan_table(const Model& m, const Input& in, const Result& r) {
  const ModelConfig& c = in.model;
  const Sizes& z = r.sizes;
  std::string out;
  out += fmt::format("model {} ({}): {}, {:.1f} B parameters, {} layers, hidden {}, {} experts top-{}, expert width {}, "
                     "vocab {}\n",
                     m.name, m.source, model_type_name(c.model_type), static_cast<double>(c.param_count()) / 1e9,
                     c.num_hidden_layers,
                     c.hidden_size, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.vocab_size);
  out += fmt::format("context {} ({} tokens) x batch {} on {} rank(s): {} tokens per rank, routing {}\n",
                     context_format(in.context), in.context, in.settings.layout.batch, z.ranks, z.tokens,
                     in.settings.routing.str());
  if (z.ranks > 1)
    out += fmt::format("rank {}{}{}\n", z.rank, in.settings.layout.rank < 0 ? " (the largest step peak)" : "",
                       z.chunks > 0 ? fmt::format(": {} chunks of {} tokens per source", z.chunks, z.chunk_tokens)
                                    : std::string());
  const Precision& d = r.precision;
  out += fmt::format("precision: params {}, grads {}, activations {}, master {}, moments {}, logits {}, router {}\n",
                     dtype_name(d.params), dtype_name(d.grads), dtype_name(d.activations), dtype_name(d.master),
                     dtype_name(d.moments), dtype_name(d.logits), dtype_name(d.router));
  const int64_t tile = r.sched.ckpt.layer_tile;
  const std::string tiles = tile > 0 ? fmt::format(" (layers in tiles of {} tokens)", tile) : "";
  const std::string strip = r.sched.vocab.kind == VocabSchedule::Kind::Kind_ring
                                ? fmt::format(" (strips of {} tokens)", r.sched.vocab.block_tokens)
                                : "";
  out += fmt::format("schedule: dispatch {}, vocab {}{}, ckpt {}{}{}, optim {}{}\n",
                     schedule_name(r.sched.dispatch.kind), schedule_name(r.sched.vocab.kind), strip,
                     schedule_name(r.sched.ckpt.kind), tiles,
                     r.sched.ckpt.recompute ? "" : " (no recompute: every layer's activations kept)",
                     schedule_name(r.sched.optim.kind),
                     in.settings.sched.optim.kind == OptimSchedule::Kind::Kind_auto
                         ? " (auto: device when it fits, else serial offload)"
                         : "");
  out += fmt::format("  {:<12} {:>12} {:>14}  {}\n", "category", "peak", "at step peak", "status");
  for (Category cat : kAllCategories) {
    const int i = static_cast<int>(cat);
    out += fmt::format("  {:<12} {:>12} {:>14}  {}\n", category_name(cat), bytes_format(r.peak[i]),
                       bytes_format(r.at_peak[i]), r.exact() ? "exact" : "approximate");
  }
  out += fmt::format("  {:<12} {:>12}    binding: {} (at '{}'); device {}: {}\n", "step peak", bytes_format(r.step_peak),
                     category_name(r.binding), r.peak_tag, bytes_format(in.device_mem),
                     r.fits_device ? "fits" : "does NOT fit");
  out += fmt::format("  {:<12} {:>12}    host {}: {}\n", "host needed", bytes_format(r.host_needed),
                     bytes_format(in.host_mem), r.fits_host ? "fits" : "does NOT fit");
  if (r.host_checkpoint_copy > 0)
    out += fmt::format("  {:<12} {:>12}    rank 0's host copy of the checkpoint (train.checkpoint_async = true){}\n",
                       "ckpt copy", bytes_format(r.host_checkpoint_copy),
                       r.fits_host ? "" : "; without it: train.checkpoint_async = false, or raise --host-mem");
  out += fmt::format("planned by the engine on meta: {} rank(s) in {:.2f} s\n", z.ranks, r.seconds);
  out += step_time_line(r.time);
  for (const std::string& x : r.approximate) out += "APPROXIMATE: " + x + "\n";
  for (const std::string& n : m.notes) out += "note: " + n + "\n";
  return out;
}

}  // namespace fp::plan
