// flatpeak plan: per-category peaks of one training step at full scale, the binding category, the
// host memory needed, and the largest context that fits for the baseline and for flatpeak
// (src/plan/plan.h). A plan is a run of the engine on meta over W threads: exact, and seconds at the
// paper's scale.
//
//   flatpeak plan --model FILE --context T [--ranks W] [--device-mem SIZE] [--host-mem SIZE]
//                 [--schedule baseline|flatpeak|key=value ...] [--set precision.KEY=VALUE ...]
//   flatpeak plan --config RUN.toml [--context T] [--set table.key=value ...] [...]
//                 (the run config `train` takes: its model, batch, seq_len, schedules and precision)
//                 [--json FILE] [--plot FILE] [--compare] [--timeline FILE] [--strict]
#include "plan/plan.h"

#include <algorithm>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/units.h"
#include "io/atomic_file.h"
#include "plan/choose.h"
#include "plan/model_file.h"
#include "plan/plan_json.h"
#include "plan/plot_svg.h"
#include "plan/ring_balance.h"
#include "train/run_config.h"

namespace fp::cli {

namespace {

struct PlanOptions {
  std::string model;
  std::string config;
  std::string context;
  int64_t ranks = 0;  // 0: the preset's, else 1
  std::string device_mem = "unlimited";
  std::string host_mem = "unlimited";
  std::vector<std::string> schedule;
  std::vector<std::string> set;
  std::string json;
  std::string plot;
  bool compare = false;
  std::string timeline;
  bool strict = false;
  bool no_reach = false;
  std::string mesh;        // "dp=D,cp=C[,ep=E]" (Note [A device mesh])
  int64_t grad_accum = 1;  // micro-batches per optimizer step: tokens per step, no memory
  std::string docs;  // a document-length mix: the ring's balance (plan/ring_balance.h)
  int64_t docs_windows = 8;
  std::string profile = "h100-sxm";  // Note [Time in the planner]; "none": no time
  bool choose = false;               // Note [Choosing the fastest plan that fits]
  bool choose_every = false;  // ckpt.every's trade at this context, and the k chosen (Note [Boundaries every k layers])
};

// ckpt.every = k trades recompute for boundary memory (Note [Boundaries every k layers] in step/step.cpp):
// the step at this context with the given schedules for several k, each plan's device peak and host need,
// and the smallest k whose step fits both (the least recompute that fits).
void every_choose(const plan::Model& m, const plan::Input& in) {
  const int64_t L = m.cfg.num_hidden_layers;
  fmt::print("\nckpt.every at {} tokens on {} rank(s): boundaries kept every k layers, the rest recomputed\n",
             plan::context_format(in.context), in.settings.layout.ranks);
  fmt::print("  {:>3} {:>10} {:>15} {:>14} {:>14} {:>14}  {}\n", "k", "kept", "extra forwards", "step cost",
             "device peak", "host needed", "fits");
  int64_t chosen = 0;
  for (int64_t k : {1, 2, 3, 4, 6, 8, 12, 16}) {
    if (k > L && k != 1) break;
    plan::Input x = in;
    x.settings.sched.ckpt.every = k;
    const plan::Result r = plan::plan_step(x);
    const int64_t kept = (L + k - 1) / k, extra = L - kept;
    const bool fits = r.fits_device && r.fits_host;
    if (fits && chosen == 0) chosen = k;
    // A layer's step: its forward, its recompute and its backward (about two forwards): 4 forwards.
    fmt::print("  {:>3} {:>10} {:>15} {:>13.1f}% {:>14} {:>14}  {}\n", k, kept, extra,
               100.0 * static_cast<double>(extra) / static_cast<double>(4 * L), bytes_format(r.step_peak),
               bytes_format(r.host_needed),
               fits             ? "yes"
               : !r.fits_device ? "no (device)"
                                : "no (host)");
  }
  if (chosen > 0)
    fmt::print(
        "chosen: ckpt.every = {} (the smallest k that fits; step cost: extra layer forwards over a step's "
        "4 L, a backward counted as two forwards)\n",
        chosen);
  else
    fmt::print("no k fits: the boundaries are not what binds (see the plan above)\n");
}

// The memory story of one step at this context: baseline and flatpeak side by side, per category
// (--compare), and one rank's device memory over the step for both (--timeline SVG).
void compare_run(const PlanOptions& o, const plan::Model& m, const plan::Input& in) {
  std::vector<plan::TimelinePanel> panels;
  std::vector<plan::Result> results;
  for (int family = 0; family < 2; ++family) {
    plan::Input x = in;
    if (family == 0)
      plan::settings_set_baseline(x.settings);
    else
      plan::settings_set_flatpeak(x.settings);
    std::vector<plan::RankPlan> ranks;
    plan::PlanOptions opt;
    opt.events = !o.timeline.empty();
    opt.ranks = &ranks;
    results.push_back(plan::plan_step(x, opt));
    size_t worst = 0;
    for (size_t r = 1; r < ranks.size(); ++r)
      if (ranks[r].step_peak > ranks[worst].step_peak) worst = r;
    plan::TimelinePanel panel;
    panel.title = family == 0 ? "baseline" : "flatpeak";
    if (!ranks.empty()) panel.events = std::move(ranks[worst].events);
    panel.step_peak = results.back().step_peak;
    panel.binding = results.back().binding;
    panels.push_back(std::move(panel));
  }
  const plan::Result &b = results[0], &f = results[1];
  fmt::print("\n{} at {} tokens on {} rank(s), per rank: baseline vs flatpeak (the engine on meta)\n", m.name,
             plan::context_format(in.context), in.settings.layout.ranks);
  fmt::print("  {:<12} {:>14} {:>14} {:>9}\n", "category", "baseline", "flatpeak", "ratio");
  auto ratio = [](uint64_t a, uint64_t z) {
    return z == 0 ? (a == 0 ? std::string("-") : std::string("inf")) : fmt::format("{:.1f}x", static_cast<double>(a) / static_cast<double>(z));
  };
  for (int c = 0; c < kNumCategories; ++c)
    fmt::print("  {:<12} {:>14} {:>14} {:>9}\n", category_name(kAllCategories[c]), bytes_format(b.peak[c]),
               bytes_format(f.peak[c]), ratio(b.peak[c], f.peak[c]));
  fmt::print("  {:<12} {:>14} {:>14} {:>9}   binding: {} -> {}\n", "step peak", bytes_format(b.step_peak),
             bytes_format(f.step_peak), ratio(b.step_peak, f.step_peak), category_name(b.binding),
             category_name(f.binding));
  fmt::print("  {:<12} {:>14} {:>14}\n", "host needed", bytes_format(b.host_needed), bytes_format(f.host_needed));
  if (!o.timeline.empty()) {
    const std::string title = fmt::format("{}: device memory over one step at {} tokens, {} rank(s) (rank with the "
                                          "largest peak)",
                                          m.name, plan::context_format(in.context), in.settings.layout.ranks);
    file_write_atomic(o.timeline, plan::timeline_svg(title, panels, in.device_mem));
    fmt::print("wrote {}\n", o.timeline);
  }
}

// plan --choose (Note [Choosing the fastest plan that fits] in plan/choose.cpp): every plan tried, the fastest
// that fits and the runner-up, each time labelled a prediction.
void choose_print(const plan::Input& in) {
  const plan::Choice c = plan::plan_choose(in);
  fmt::print(
      "\nchoose: the fastest plan that fits, predicted on {} (predictions; coordinate search over the mesh and "
      "the schedules' knobs, {} plans in {:.1f} s)\n",
      in.profile->name, c.tried.size(), c.seconds);
  fmt::print("  {:>11} {:>12} {:>13} {:>7} {:>14} {:>5}  {}\n", "step s", "tokens/s/dev", "binding time", "MFU",
             "device peak", "fits", "change from the plan asked for");
  for (size_t i = 0; i < c.tried.size(); ++i) {
    const plan::Result& r = c.tried[i].result;
    const char* mark = static_cast<int>(i) == c.best        ? " <- chosen"
                       : static_cast<int>(i) == c.runner_up ? " <- runner-up"
                                                            : "";
    fmt::print("  {:>11.4g} {:>12.4g} {:>13} {:>6.1f}% {:>14} {:>5}  {}{}\n", r.time.seconds, r.time.tokens_per_s,
               time_class_name(r.time.binding), 100 * r.time.mfu, bytes_format(r.step_peak), r.fits() ? "yes" : "no",
               c.tried[i].describe, mark);
  }
  if (c.best < 0) {
    fmt::print("chosen: none (no plan tried fits)\n");
    return;
  }
  auto line = [&](const char* what, int i) {
    const plan::Candidate& x = c.tried[static_cast<size_t>(i)];
    fmt::print("{}: {} -> predicted {:.4g} s per step, {:.4g} tokens/s per device, binding time {}, device peak {}\n",
               what, x.describe, x.result.time.seconds, x.result.time.tokens_per_s,
               time_class_name(x.result.time.binding), bytes_format(x.result.step_peak));
  };
  line("chosen", c.best);
  if (c.runner_up >= 0) line("runner-up", c.runner_up);
}

// A run config (--config): the model as model_load reads it (notes, what is approximated), with the
// dimensions, schedules, precision, batch and context of the run config as `train` parses it (--set
// applying to every key); routing = "router" is data dependent, so the planner keeps its balanced profile.
plan::Model config_apply(const PlanOptions& o, plan::Input& in) {
  const RunConfig c = config_load(o.config, o.set);
  plan::Model m = plan::model_load(o.config);
  m.cfg = c.model;
  in.settings.sched = c.schedules;
  in.settings.precision = c.precision;
  in.settings.layout.batch = c.train.batch_size;
  in.settings.checkpoint_async = c.train.checkpoint_async;  // the checkpoint's host copy, counted on rank 0
  if (c.moe.routing_profile.kind != RoutingProfile::Kind::Kind_router) in.settings.routing = c.moe.routing_profile;
  in.context = o.context.empty() ? c.train.seq_len : plan::context_parse(o.context);
  return m;
}

// --mesh dp=D,cp=C[,ep=E][,fsdp=F] (Note [A device mesh] in train/trainer.cpp): D x C ranks, experts in groups
// of E of them and dense shards in groups of F (Note [Experts in groups] in model/params.h; default all).
void mesh_apply(const PlanOptions& o, plan::Layout& lay) {
  const char* hint = "write --mesh dp=D,cp=C (D x C ranks), e.g. --mesh dp=8,cp=8";
  int64_t dp = 1, cp = 0, ep = 0, fsdp = 0;
  size_t at = 0;
  while (at < o.mesh.size()) {
    const size_t end = std::min(o.mesh.find(',', at), o.mesh.size()), eq = o.mesh.find('=', at);
    FP_CHECK(eq != std::string::npos && eq < end, hint, "--mesh {}: '{}' is not key=value", o.mesh,
             o.mesh.substr(at, end - at));
    const std::string key = o.mesh.substr(at, eq - at), value = o.mesh.substr(eq + 1, end - eq - 1);
    int64_t v = 0;
    try {
      v = std::stoll(value);
    } catch (const std::exception&) {
      throw Error(fmt::format("--mesh {}: {} = '{}' is not an integer", o.mesh, key, value), hint);
    }
    FP_CHECK(v >= 1, hint, "--mesh {}: {} = {} must be at least 1", o.mesh, key, v);
    if (key == "dp")
      dp = v;
    else if (key == "cp")
      cp = v;
    else if (key == "ep")
      ep = v;
    else if (key == "fsdp")
      fsdp = v;
    else
      throw Error(fmt::format("--mesh {}: unknown axis '{}' (dp, cp, ep, fsdp)", o.mesh, key), hint);
    at = end + 1;
  }
  if (cp == 0) cp = o.ranks > 0 ? o.ranks / dp : 1;
  FP_CHECK(o.ranks == 0 || o.ranks == dp * cp, hint, "--mesh {} makes {} ranks, --ranks says {}", o.mesh, dp * cp,
           o.ranks);
  FP_CHECK(ep == 0 || (dp * cp) % ep == 0, "choose ep dividing dp x cp (or leave it out: every rank)",
           "--mesh {}: ep = {} does not divide the {} ranks", o.mesh, ep, dp * cp);
  FP_CHECK(fsdp == 0 || (dp * cp) % fsdp == 0, "choose fsdp dividing dp x cp (or leave it out: every rank)",
           "--mesh {}: fsdp = {} does not divide the {} ranks", o.mesh, fsdp, dp * cp);
  lay.ranks = dp * cp;
  lay.cp = cp;
  lay.ep = ep;
  lay.fsdp = fsdp;
}

int plan_run(const PlanOptions& o) {
  FP_CHECK(o.model.empty() != o.config.empty(),
           "plan --model FILE (a preset, run config or config.json: its [model] only) or plan --config RUN.toml "
           "(the run config's model, batch, seq_len, schedules and precision)",
           "plan takes one of --model and --config");
  plan::Input in;
  const plan::Model m = o.config.empty() ? plan::model_load(o.model) : config_apply(o, in);
  FP_CHECK(!o.context.empty() || !o.config.empty(), "give --context T, e.g. --context 1M",
           "plan --model needs --context (a run config gives train.seq_len)");
  in.model = m.cfg;
  if (o.config.empty()) in.context = plan::context_parse(o.context);
  in.settings.layout.ranks = o.ranks > 0 ? o.ranks : (m.default_ranks > 0 ? m.default_ranks : 1);
  if (!o.mesh.empty()) mesh_apply(o, in.settings.layout);
  in.device_mem = bytes_parse(o.device_mem);
  in.host_mem = bytes_parse(o.host_mem);
  in.approximate = m.approximate;
  for (const std::string& item : o.schedule) plan::settings_apply(in.settings, item);
  for (const std::string& item : o.config.empty() ? o.set : std::vector<std::string>{}) {
    FP_CHECK(item.rfind("precision.", 0) == 0,
             "plan's --set takes the run config's [precision] keys: precision.recipe=fp32|bf16, precision.params=bf16, ...",
             "--set {}: plan --model takes a model file, not a run config; only precision.* keys apply (plan "
             "--config RUN.toml takes every key)",
             item);
    std::string v = item;
    v.erase(std::remove(v.begin(), v.end(), '"'), v.end());  // precision.recipe="bf16" as in TOML
    plan::settings_apply(in.settings, v);
  }

  if (o.profile != "none") in.profile = std::make_shared<const DeviceProfile>(device_profile_load(o.profile));

  const plan::Result r = plan::plan_step(in);
  fmt::print("{}", plan::plan_table(m, in, r));
  const plan::Layout& lay = in.settings.layout;
  // Tokens per optimizer step of a context: every replica's sequences of every micro-batch.
  auto step_tokens = [&](int64_t T) { return lay.replicas() * o.grad_accum * lay.batch * T; };
  if (!o.mesh.empty() || o.grad_accum > 1)
    fmt::print(
        "mesh: {} replicas x {} context-parallel ranks = {} ranks, experts in {} group(s) of {}, dense shards in {} "
        "group(s) of {}; {} micro-batch(es) of {} sequence(s) per replica: {} tokens per optimizer step at {}\n",
        lay.replicas(), lay.context_ranks(), lay.ranks, lay.ranks / lay.expert_ranks(), lay.expert_ranks(),
        lay.ranks / lay.shard_ranks(), lay.shard_ranks(), o.grad_accum, lay.batch, step_tokens(in.context),
        plan::context_format(in.context));

  // Reach: the same sizes, layout and dtypes with the baseline's and flatpeak's schedule families.
  nlohmann::ordered_json reach = nullptr;
  if (in.device_mem != kUnlimitedBytes && !o.no_reach) {
    plan::Input base = in, flat = in;
    plan::settings_set_baseline(base.settings);
    plan::settings_set_flatpeak(flat.settings);
    // A point at the paper's scale takes seconds: say what the searches are doing (stderr).
    auto progress = [](const char* which) {
      return [which](int64_t T, bool fits, double s) {
        log_info("reach ({}): {} tokens {} ({:.1f} s)", which, T, fits ? "fit" : "do not fit", s);
      };
    };
    const plan::Reach rb = plan::plan_reach(base, int64_t{1} << 31, progress("baseline"));
    const plan::Reach rf = plan::plan_reach(flat, int64_t{1} << 31, progress("flatpeak"));
    auto line = [&](const plan::Reach& x) {
      if (x.max_context == 0) return std::string("nothing fits");
      return fmt::format("{} tokens ({}{}; binding there: {}; {} plans in {:.1f} s{})", x.max_context,
                         plan::context_format(x.max_pow2), x.capped ? ", capped" : " as a power of two",
                         category_name(x.at_max.binding), x.points, x.seconds,
                         lay.replicas() > 1 || o.grad_accum > 1
                             ? fmt::format("; {} tokens per optimizer step", step_tokens(x.max_context))
                             : std::string());
    };
    fmt::print("reach at {} per rank, host {}: baseline {}; flatpeak {}\n", bytes_format(in.device_mem),
               bytes_format(in.host_mem), line(rb), line(rf));
    reach = {{"baseline", plan::reach_json(rb)}, {"flatpeak", plan::reach_json(rf)}};
  } else {
    fmt::print("reach: {}\n", o.no_reach ? "not searched (--no-reach)"
                                         : "give --device-mem to search the largest context that fits");
  }

  if (!o.json.empty()) {
    nlohmann::ordered_json j = plan::plan_json(m, in, r);
    j["reach"] = reach;
    file_write_atomic(o.json, j.dump(2) + "\n");
    fmt::print("wrote {}\n", o.json);
  }
  if (!o.plot.empty()) {
    // From 4K (or one token per rank) to twice the requested context, at least 1M.
    int hi = 20;
    while ((int64_t{1} << hi) < 2 * in.context && hi < 34) ++hi;
    const std::vector<plan::PlotPanel> panels = plan::peaks_plot_panels(in, 12, hi);
    std::string title = fmt::format("{}: peak per rank vs context, {} rank(s)", m.name, in.settings.layout.ranks);
    if (r.time.predicted)  // Note [Time in the planner]: labelled a prediction
      title += fmt::format("; predicted on {} at {}: {:.3g} s/step, {:.3g} tokens/s/device, MFU {:.1f}%, {}-bound",
                           r.time.profile, plan::context_format(in.context), r.time.seconds, r.time.tokens_per_s,
                           100 * r.time.mfu, time_class_name(r.time.binding));
    file_write_atomic(o.plot, plan::peaks_plot_svg(title, panels, in.device_mem));
    fmt::print("wrote {}\n", o.plot);
  }
  if (o.compare || !o.timeline.empty()) compare_run(o, m, in);
  if (o.choose_every) every_choose(m, in);
  if (o.choose) choose_print(in);
  if (!o.docs.empty()) {
    // Note [Balanced rings] (data/context_split.h): zig-zag against the balanced split on this mix.
    const plan::DocMix mix = plan::doc_mix_parse(o.docs);
    const int W = static_cast<int>(in.settings.layout.ranks);
    fmt::print("\n{}", plan::ring_balance_table(
                           mix, plan::ring_balance(mix, in.context, W, o.docs_windows, in.model.sliding_window)));
  }
  if (o.strict && !r.exact()) {
    fmt::print(stderr, "error: --strict: the plan is approximate ({})\n", r.approximate.front());
    return 3;
  }
  return 0;
}

}  // namespace

void plan_register(CLI::App& parent, Runner& run) {
  auto opts = std::make_shared<PlanOptions>();
  PlanOptions& o = *opts;
  CLI::App* sub = parent.add_subcommand(
      "plan", "per-category peaks at full scale (the engine on meta), the binding category and each schedule's reach");
  sub->callback([&run, opts] { run = [opts] { return plan_run(*opts); }; });
  sub->add_option("--model", o.model,
                  "model: a preset (configs/models/*.toml), a run config's [model], or a Hugging Face config.json "
                  "(schedules from --schedule only)");
  sub->add_option("--config", o.config,
                  "a run config (the TOML `train` takes): its model, train.batch_size, train.seq_len (the context "
                  "unless --context), every schedule setting and [precision]; --set overrides any key, "
                  "--schedule applies after it");
  sub->add_option("--context", o.context, "context length T: 1048576, 1M, 128K (required with --model)");
  sub->add_option("--ranks", o.ranks, "ranks W (default: the preset's, else 1)")->check(at_least(1));
  sub->add_option("--device-mem", o.device_mem, "device memory per rank: 80GB, 141GB, 96GiB (default unlimited)");
  sub->add_option("--host-mem", o.host_mem, "host memory per rank for offloads (default unlimited)");
  sub->add_option("--schedule", o.schedule,
                  "baseline (default) | flatpeak | key=value with the run config's names (moe.dispatch="
                  "standard|llep|pipelined_llep vocab.schedule= ckpt.schedule= optim.schedule= "
                  "pipelined.chunk_cap= ckpt.host_budget= precision.recipe= ...) or batch= rank= routing=; "
                  "the older short names (dispatch= vocab= ckpt= optim= chunk_tokens= ckpt_host_budget= ..., the "
                  "key without its table) are kept as aliases; repeatable, applied in order; a wrong key lists "
                  "them all");
  sub->add_option("--set", o.set,
                  "with --model: precision.recipe=fp32|bf16 (default bf16: the paper's recipe), precision.params=...; "
                  "with --config: any run-config key, as `train --set`");
  sub->add_flag("--no-reach", o.no_reach, "skip the two reach searches (one plan only)");
  sub->add_flag("--strict", o.strict, "exit 3 when the plan is approximate (a model the engine does not run exactly)");
  sub->add_option("--json", o.json, "write the plan, its statuses and the reach as JSON");
  sub->add_option("--plot", o.plot, "write an SVG of the peak per category against the context length");
  sub->add_option("--mesh", o.mesh,
                  "the layout dp=D,cp=C[,ep=E][,fsdp=F]: D data-parallel replicas of C context-parallel ranks (D x C "
                  "ranks; experts in groups of E ranks and dense shards in groups of F, default all of them)");
  sub->add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step (tokens per step; no memory)")
      ->check(at_least(1));
  sub->add_option(
      "--docs", o.docs,
      "packed documents of this length mix, e.g. mean=16K,tail=1.5 (log-normal): how evenly ring attention's "
      "work falls on the ranks under the zigzag and the balanced data.context_split");
  sub->add_option("--docs-windows", o.docs_windows, "windows drawn for --docs (default 8)")->check(at_least(1));
  sub->add_option("--profile", o.profile,
                  "device profile the step is timed under (predictions): h100-sxm (default), h200-sxm, local (`bench "
                  "calibrate`'s), a profile file, or none");
  sub->add_flag("--choose", o.choose,
                "search the mesh and the schedules' knobs for the fastest plan that fits (predicted under --profile); "
                "prints every plan tried, the chosen one and the runner-up");
  sub->add_flag("--choose-every", o.choose_every,
                "plan ckpt.every = 1, 2, 3, 4, ... at this context: device peak, host need and recompute of each, and "
                "the smallest k that fits");
  sub->add_flag("--compare", o.compare, "also print baseline and flatpeak side by side, per category, at this context");
  sub->add_option("--timeline", o.timeline,
                  "write an SVG of the device memory per category over one step, baseline and flatpeak (implies "
                  "--compare)");
}

}  // namespace fp::cli
