#include "plan/plan_json.h"

#include "core/error.h"

namespace fp::plan {

namespace {

nlohmann::ordered_json bytes_or_null(uint64_t b) {
  return b == kUnlimitedBytes ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(b);
}

bool all_f32(const Dtypes& d) {
  for (DType t : {d.weights, d.grads, d.activations, d.master, d.moments, d.logits, d.router})
    if (t != DType::DType_F32) return false;
  return true;
}

nlohmann::ordered_json schedule_json(const Schedules& s) {
  nlohmann::ordered_json j = {{"dispatch", dispatch_name(s.dispatch)},
                              {"vocab", vocab_name(s.vocab)},
                              {"ckpt", ckpt_name(s.ckpt)},
                              {"optim", optim_name(s.optim)}};
  if (s.vocab == Vocab::Vocab_ring) j["block_tokens"] = s.block_tokens;
  if (s.dispatch != Dispatch::Dispatch_standard) {
    j["lambda"] = s.lambda;
    j["alpha"] = s.alpha;
    j["min_tokens_per_gemm"] = s.min_tokens_per_gemm;
  }
  if (s.dispatch == Dispatch::Dispatch_pipelined_llep) {
    j["chunk_tokens"] = s.chunk_tokens;
    j["max_chunks"] = s.max_chunks;
    j["membership"] = s.strided ? "strided" : "contiguous";
  }
  if (s.ckpt == Ckpt::Ckpt_sco) j["ckpt_host_budget"] = bytes_or_null(s.ckpt_host_budget);
  if (s.optim == Optim::Optim_offload_stream) {
    j["bucket_params"] = s.bucket_params;
    j["slots"] = s.slots;
    j["update_on"] = s.update_on_host ? "host" : "device";
  }
  return j;
}

}  // namespace

std::string category_status(const Result& r, Category c) {
  return r.validated[static_cast<int>(c)] ? "exact (validated against meta)"
                                          : "predicted, not yet validated against meta";
}

nlohmann::ordered_json plan_json(const Model& m, const Input& in, const Result& r) {
  const ModelConfig& c = in.model;
  const Dtypes& d = in.settings.dtypes;
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
                {"notes", m.notes}};
  j["context"] = in.context;
  j["ranks"] = r.sizes.ranks;
  j["device_mem"] = bytes_or_null(in.device_mem);
  j["host_mem"] = bytes_or_null(in.host_mem);
  const Sizes& z = r.sizes;
  j["layout"] = {{"cp", z.cp},
                 {"ep", z.ep},
                 {"fsdp", z.fsdp},
                 {"dp", z.dp},
                 {"batch", in.settings.layout.batch},
                 {"tokens_per_rank", z.tokens},
                 {"params_per_rank", z.params_per_rank},
                 {"routing", in.settings.routing.str()},
                 {"routes_sent", z.routes_sent},
                 {"routes_received", z.routes_received}};
  if (z.ranks > 1) j["layout"]["rank"] = z.rank;
  if (z.ep > 1 && r.sched.dispatch != Dispatch::Dispatch_standard) {
    j["layout"]["llep_active"] = z.llep_active;
    j["layout"]["guest_experts"] = z.guests;
  }
  if (z.chunks > 0) {
    j["layout"]["chunks"] = z.chunks;
    j["layout"]["chunk_tokens"] = z.chunk_tokens;
    j["layout"]["chunk_recv_max"] = z.chunk_recv_max;
  }
  if (r.sched.vocab == Vocab::Vocab_ring) {
    j["layout"]["vocab_ring"] = z.vocab_ring;
    if (z.vocab_ring > 1) j["layout"]["ring_mode"] = z.ring_mode;
  }
  if (r.sched.ckpt == Ckpt::Ckpt_sco) j["layout"]["boundaries_offloaded"] = z.boundaries_offloaded;
  if (r.sched.optim == Optim::Optim_offload_stream) j["layout"]["bucket_largest"] = z.bucket_largest;
  j["dtypes"] = {{"weights", dtype_name(d.weights)},   {"grads", dtype_name(d.grads)},
                 {"activations", dtype_name(d.activations)}, {"master", dtype_name(d.master)},
                 {"moments", dtype_name(d.moments)},   {"logits", dtype_name(d.logits)},
                 {"router", dtype_name(d.router)}};
  if (!all_f32(d))
    j["dtype_note"] =
        "the engine computes in f32: validated categories replay the exact allocation sequence of a meta run, "
        "with each tensor's bytes taken from these dtypes";
  j["schedule"] = schedule_json(r.sched);
  j["schedule"]["optim_requested"] = optim_name(in.settings.sched.optim);
  nlohmann::ordered_json peaks;
  for (Category cat : kAllCategories) {
    const int i = static_cast<int>(cat);
    peaks[std::string(category_name(cat))] = {{"bytes", r.peak[i]},
                                              {"at_step_peak", r.at_peak[i]},
                                              {"status", category_status(r, cat)},
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
  j["predicted"] = r.predicted;
  return j;
}

nlohmann::ordered_json reach_json(const Reach& r) {
  nlohmann::ordered_json j = {{"max_context", r.max_context},
                              {"max_context_str", context_format(r.max_context)},
                              {"max_pow2", r.max_pow2},
                              {"capped", r.capped}};
  if (r.max_context > 0) {
    j["step_peak_at_max"] = r.at_max.step_peak;
    j["binding_at_max"] = category_name(r.at_max.binding);
    j["host_needed_at_max"] = r.at_max.host_needed;
    j["schedule"] = schedule_json(r.at_max.sched);
    j["predicted"] = r.at_max.predicted;
  }
  return j;
}

std::string plan_table(const Model& m, const Input& in, const Result& r) {
  const ModelConfig& c = in.model;
  const Sizes& z = r.sizes;
  std::string out;
  out += fmt::format("model {} ({}): {:.1f} B parameters, {} layers, hidden {}, {} experts top-{}, expert width {}, "
                     "vocab {}\n",
                     m.name, m.source, static_cast<double>(c.param_count()) / 1e9, c.num_hidden_layers,
                     c.hidden_size, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.vocab_size);
  out += fmt::format("context {} ({} tokens) x batch {} on {} rank(s): {} tokens per rank (cp {}, ep {}, dp {}), "
                     "routing {}\n",
                     context_format(in.context), in.context, in.settings.layout.batch, z.ranks, z.tokens, z.cp, z.ep,
                     z.dp, in.settings.routing.str());
  if (z.ranks > 1)
    out += fmt::format("rank {}{}: its experts compute {} routed rows{}\n", z.rank,
                       in.settings.layout.rank < 0 ? " (the largest step peak)" : "", z.routes_received,
                       z.chunks > 0 ? fmt::format(", at most {} per chunk ({} chunks of {} tokens per source)",
                                                  z.chunk_recv_max, z.chunks, z.chunk_tokens)
                                    : std::string());
  const Dtypes& d = in.settings.dtypes;
  out += fmt::format("dtypes: weights {}, grads {}, activations {}, master {}, moments {}, logits {}, router {}\n",
                     dtype_name(d.weights), dtype_name(d.grads), dtype_name(d.activations), dtype_name(d.master),
                     dtype_name(d.moments), dtype_name(d.logits), dtype_name(d.router));
  out += fmt::format("schedule: dispatch {}, vocab {}, ckpt {}, optim {}{}\n", dispatch_name(r.sched.dispatch),
                     vocab_name(r.sched.vocab), ckpt_name(r.sched.ckpt), optim_name(r.sched.optim),
                     in.settings.sched.optim == Optim::Optim_auto ? " (auto: device when it fits, else serial offload)"
                                                                   : "");
  out += fmt::format("  {:<12} {:>12} {:>14}  {}\n", "category", "peak", "at step peak", "status");
  for (Category cat : kAllCategories) {
    const int i = static_cast<int>(cat);
    out += fmt::format("  {:<12} {:>12} {:>14}  {}\n", category_name(cat), bytes_format(r.peak[i]),
                       bytes_format(r.at_peak[i]), r.validated[i] ? "exact" : "predicted");
  }
  out += fmt::format("  {:<12} {:>12}    binding: {} (at '{}'); device {}: {}\n", "step peak", bytes_format(r.step_peak),
                     category_name(r.binding), r.peak_tag, bytes_format(in.device_mem),
                     r.fits_device ? "fits" : "does NOT fit");
  out += fmt::format("  {:<12} {:>12}    host {}: {}\n", "host needed", bytes_format(r.host_needed),
                     bytes_format(in.host_mem), r.fits_host ? "fits" : "does NOT fit");
  if (!r.predicted.empty()) {
    out += "predicted, not yet validated against meta:";
    for (const std::string& p : r.predicted) out += " [" + p + "]";
    out += "\n";
  }
  for (const std::string& n : m.notes) out += "note: " + n + "\n";
  return out;
}

}  // namespace fp::plan
