// flatpeak report RUN_DIR: one self-contained HTML page of a training run (no network, no script):
// a summary, the loss, recall accuracy and speed per step, every category's device peak per step,
// and, when the folder has it (scripts/demo writes it), one step's memory per category under the
// plain schedules and flatpeak's (memory_story.svg, from `flatpeak plan --timeline`).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/units.h"
#include "io/atomic_file.h"
#include "memory/category.h"
#include "plan/plot_svg.h"

namespace fp::cli {

namespace {

struct ReportOptions {
  std::string run;
  std::string out;  // default RUN/report.html
};

// An SVG file's text without its XML declaration, for inlining.
std::string svg_inline(const std::string& text) {
  const size_t at = text.find("<svg");
  return at == std::string::npos ? std::string() : text.substr(at);
}

int report_run(const ReportOptions& o) {
  namespace fs = std::filesystem;
  const fs::path dir(o.run), metrics_path = dir / "metrics.jsonl";
  FP_CHECK(fs::exists(metrics_path), "pass the --out folder of a `flatpeak train` run",
           "'{}' holds no metrics.jsonl: not a run folder", o.run);
  std::ifstream in(metrics_path);
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      rows.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {
      break;  // a torn last line of a killed run
    }
  }
  FP_CHECK(!rows.empty(), "train at least one step first", "'{}' has no complete step", metrics_path.string());

  auto num = [](const nlohmann::json& j, const char* key) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::nan("");
  };
  std::vector<double> steps, loss, ce, recall, tps, eval;
  std::vector<plan::LineSeries> peaks;
  for (Category c : kAllCategories) peaks.push_back({std::string(category_name(c)), "", {}});
  bool has_recall = false;
  for (const nlohmann::json& r : rows) {
    steps.push_back(num(r, "step"));
    loss.push_back(num(r, "loss"));
    ce.push_back(num(r, "ce_loss"));
    recall.push_back(num(r, "recall_accuracy"));
    eval.push_back(num(r, "eval_loss"));  // Note [Held-out evaluation] (train/trainer.cpp): some steps only
    has_recall |= std::isfinite(recall.back());
    tps.push_back(num(r, "tokens_per_s"));
    for (size_t c = 0; c < peaks.size(); ++c)
      peaks[c].y.push_back(r.contains("peak_bytes") ? num(r["peak_bytes"], peaks[c].name.c_str()) : std::nan(""));
  }
  // Categories that stayed at 0 bytes add nothing to the chart.
  std::vector<plan::LineSeries> shown;
  for (size_t c = 0; c < peaks.size(); ++c) {
    bool any = false;
    for (double v : peaks[c].y) any |= std::isfinite(v) && v > 0;
    if (any) shown.push_back(peaks[c]);
  }
  const nlohmann::json& last = rows.back();
  double best = loss.front();
  int64_t best_step = static_cast<int64_t>(steps.front());
  for (size_t i = 0; i < loss.size(); ++i)
    if (loss[i] < best) best = loss[i], best_step = static_cast<int64_t>(steps[i]);
  std::vector<double> sorted_tps = tps;
  std::sort(sorted_tps.begin(), sorted_tps.end());
  const double peak = num(last, "device_peak_bytes");

  std::string html = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><title>flatpeak run {0}</title>\n"
      "<style>body{{font-family:sans-serif;max-width:860px;margin:2em auto;color:#222}} "
      "table{{border-collapse:collapse}} td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}} "
      "svg{{max-width:100%;height:auto}}</style></head><body>\n<h1>flatpeak run {0}</h1>\n",
      plan::xml_escape(o.run));
  html += "<table>\n";
  auto row = [&](const std::string& k, const std::string& v) {
    html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", plan::xml_escape(k), plan::xml_escape(v));
  };
  row("steps", fmt::format("{} to {} ({} recorded)", steps.front(), steps.back(), rows.size()));
  row("loss", fmt::format("{:.4f} -> {:.4f} (best {:.4f} at step {})", loss.front(), loss.back(), best, best_step));
  for (size_t i = eval.size(); i-- > 0;)
    if (std::isfinite(eval[i])) {
      row("held-out loss (last evaluation)", fmt::format("{:.4f} at step {}", eval[i], steps[i]));
      break;
    }
  if (has_recall) row("recall accuracy (last step)", fmt::format("{:.3f}", recall.back()));
  row("tokens/s (median)", fmt::format("{:.0f}", sorted_tps[sorted_tps.size() / 2]));
  if (std::isfinite(peak))
    row("device peak (last step)", fmt::format("{} (binding: {})", bytes_format(static_cast<uint64_t>(peak)),
                                               last.value("binding", std::string("?"))));
  html += "</table>\n";
  std::vector<plan::LineSeries> losses = {{"loss (with aux)", "#1f77b4", loss}, {"cross-entropy", "#ff7f0e", ce}};
  if (std::any_of(eval.begin(), eval.end(), [](double v) { return std::isfinite(v); }))
    losses.push_back({"held-out cross-entropy", "#d62728", eval});
  html += "<h2>Loss</h2>\n" + plan::line_chart_svg("loss per step", "step", steps, losses, false);
  if (has_recall)
    html += "<h2>Recall accuracy</h2>\n" +
            plan::line_chart_svg("share of answers predicted exactly", "step", steps, {{"recall", "#2ca02c", recall}}, false);
  html += "<h2>Speed</h2>\n" + plan::line_chart_svg("tokens per second", "step", steps, {{"tokens/s", "#9467bd", tps}}, false);
  html += "<h2>Device memory: each category's peak per step</h2>\n" +
          plan::line_chart_svg("peak bytes per category (from the device ledger)", "step", steps, shown, true);
  const fs::path story = dir / "memory_story.svg";
  html += "<h2>One step's memory: plain schedules vs flatpeak</h2>\n";
  if (fs::exists(story))
    html += svg_inline(file_read(story.string()));
  else
    html += "<p>Not in this folder: <code>flatpeak plan --model CONFIG --context T --timeline "
            "memory_story.svg</code> draws it (scripts/demo does).</p>\n";
  html += "<p>Timeline of every allocation: memory_trace.json in the run folder (open it in ui.perfetto.dev).</p>\n";
  html += "</body></html>\n";
  const std::string out = o.out.empty() ? (dir / "report.html").string() : o.out;
  file_write_atomic(out, html);
  fmt::print("wrote {} ({} steps)\n", out, rows.size());
  return 0;
}

}  // namespace

void report_register(CLI::App& app, Runner& run) {
  auto opts = std::make_shared<ReportOptions>();
  ReportOptions& o = *opts;
  CLI::App* sub = app.add_subcommand("report", "one self-contained HTML page of a training run (no network needed)");
  sub->callback([&run, opts] { run = [opts] { return report_run(*opts); }; });
  sub->add_option("run", o.run, "the --out folder of a `flatpeak train` run")->required();
  sub->add_option("--out", o.out, "where to write the page (default RUN/report.html)");
}

}  // namespace fp::cli
