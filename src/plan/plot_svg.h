// flatpeak plan --plot: the peak of every category and the step's peak against the context length,
// baseline and flatpeak side by side, as plain SVG text (no dependency).
// Axes: x log2 of the context T, y log10 of bytes per rank; a dashed line at the device memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace fp::plan {

// s with & < > " escaped: text and attribute values of SVG and HTML.
std::string xml_escape(const std::string& s);

struct PlotPanel {
  std::string title;              // e.g. "baseline"
  std::vector<int64_t> contexts;  // T of each point, ascending
  std::vector<Result> results;    // the plan at each T (same length)
};

// An SVG document (UTF-8 text). device_mem kUnlimitedBytes: no capacity line.
std::string peaks_plot_svg(const std::string& title, const std::vector<PlotPanel>& panels, uint64_t device_mem);

// Plans of `in` at T = 2^lo .. 2^hi (T below the context-parallel degree skipped) with the panel's
// schedules: one panel per schedule family set (baseline, flatpeak).
std::vector<PlotPanel> peaks_plot_panels(const Input& in, int lo_log2, int hi_log2);

// flatpeak plan --timeline: one step's device memory per category over the step (stacked areas, x the
// step's allocation events in order, y bytes, linear), one panel per schedule family on a shared
// scale, so the flattened categories are seen shrinking. events: one rank's device ledger.
struct TimelinePanel {
  std::string title;
  std::vector<LedgerEvent> events;
  uint64_t step_peak = 0;
  Category binding = Category::Category_params;
};
std::string timeline_svg(const std::string& title, const std::vector<TimelinePanel>& panels, uint64_t device_mem);

// A line chart (flatpeak report): y against x, one polyline per series, linear axes from 0 (or the
// data's minimum when it is far above 0). bytes: y ticks as byte sizes.
struct LineSeries {
  std::string name;
  std::string color;  // "" : the category palette in order
  std::vector<double> y;  // one per x (NaN: no point)
};
std::string line_chart_svg(const std::string& title, const std::string& x_label, const std::vector<double>& x,
                           const std::vector<LineSeries>& series, bool bytes);

}  // namespace fp::plan
