// Plain SVG of per-category peaks against the context length (plot_svg.h).
#include "plan/plot_svg.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"

namespace fp::plan {

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

namespace {

// One colour per category (kAllCategories order), then the step peak in black.
constexpr const char* kColors[kNumCategories] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};


std::string si_bytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  while (b >= 1000.0 && u < 6) {
    b /= 1000.0;
    ++u;
  }
  return fmt::format("{:g} {}", std::round(b), units[u]);
}

// The document's opening: size, white background, the title centred at height title_y.
std::string svg_open(double width, double height, const std::string& title, int title_y) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" viewBox=\"0 0 {0:.0f} {1:.0f}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2:.0f}\" y=\"{4}\" font-size=\"16\" text-anchor=\"middle\">{3}</text>\n",
      width, height, width / 2, xml_escape(title), title_y);
}

struct Frame {
  double x0, y0, w, h;       // plot area in pixels (y0 top)
  double lx0, lx1, ly0, ly1; // log2 T range, log10 bytes range
  double px(double t) const { return x0 + (std::log2(t) - lx0) / (lx1 - lx0) * w; }
  double py(double bytes) const {
    const double l = std::clamp(std::log10(bytes), ly0, ly1);
    return y0 + h - (l - ly0) / (ly1 - ly0) * h;
  }
};

// A series as polylines, broken where the value is 0 (no point on a log axis).
std::string series_svg(const Frame& f, const std::vector<int64_t>& t, const std::vector<uint64_t>& v,
                       const std::string& color, double width, const std::string& dash) {
  std::string out, pts;
  auto flush = [&] {
    if (!pts.empty())
      out += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"{} points=\"{}\"/>\n", color, width,
                         dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"", pts);
    pts.clear();
  };
  for (size_t i = 0; i < t.size(); ++i) {
    if (v[i] == 0) {
      flush();
      continue;
    }
    pts += fmt::format("{:.1f},{:.1f} ", f.px(static_cast<double>(t[i])), f.py(static_cast<double>(v[i])));
  }
  flush();
  return out;
}

}  // namespace

std::string peaks_plot_svg(const std::string& title, const std::vector<PlotPanel>& panels, uint64_t device_mem) {
  FP_ASSERT(!panels.empty());
  const double pw = 460, ph = 340, left = 80, top = 60, gap = 110;
  const double width = left + panels.size() * pw + (panels.size() - 1) * gap + 40, height = top + ph + 150;
  // Shared axes over every panel.
  int64_t tmin = INT64_MAX, tmax = 0;
  double bmin = 1e300, bmax = 1;
  for (const PlotPanel& p : panels)
    for (size_t i = 0; i < p.contexts.size(); ++i) {
      tmin = std::min(tmin, p.contexts[i]);
      tmax = std::max(tmax, p.contexts[i]);
      const Result& r = p.results[i];
      bmax = std::max(bmax, static_cast<double>(r.step_peak));
      for (uint64_t b : r.peak)
        if (b > 0) bmin = std::min(bmin, static_cast<double>(b));
    }
  if (tmax == 0) tmin = tmax = 1;
  if (device_mem != kUnlimitedBytes) bmax = std::max(bmax, static_cast<double>(device_mem));
  bmin = std::max(bmin, bmax / 1e8);  // eight decades at most: tiny workspaces sit on the floor
  Frame f{0, top, pw, ph, std::log2(static_cast<double>(tmin)), std::log2(static_cast<double>(tmax)),
          std::floor(std::log10(bmin)), std::ceil(std::log10(bmax))};
  if (f.lx1 <= f.lx0) f.lx1 = f.lx0 + 1;
  if (f.ly1 <= f.ly0) f.ly1 = f.ly0 + 1;

  std::string s = svg_open(width, height, title, 24);
  for (size_t p = 0; p < panels.size(); ++p) {
    const PlotPanel& panel = panels[p];
    f.x0 = left + p * (pw + gap);
    s += fmt::format("<g>\n<text x=\"{:.0f}\" y=\"{:.0f}\" font-size=\"14\" text-anchor=\"middle\">{}</text>\n",
                     f.x0 + pw / 2, top - 10, xml_escape(panel.title));
    s += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" stroke=\"#333\"/>\n",
                     f.x0, f.y0, pw, ph);
    for (double l = f.ly0; l <= f.ly1 + 1e-9; l += 1) {  // decades
      const double y = f.py(std::pow(10.0, l));
      s += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", f.x0, y,
                       f.x0 + pw, y);
      s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", f.x0 - 6, y + 4,
                       si_bytes(std::pow(10.0, l)));
    }
    for (double l = std::ceil(f.lx0); l <= f.lx1 + 1e-9; l += 1) {  // powers of two of T
      const double x = f.px(std::pow(2.0, l));
      s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.0f}\" x2=\"{:.1f}\" y2=\"{:.0f}\" stroke=\"#eee\"/>\n", x, f.y0, x,
                       f.y0 + ph);
      if (static_cast<int64_t>(l) % 2 == 0 || f.lx1 - f.lx0 <= 8)
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.0f}\" text-anchor=\"middle\">{}</text>\n", x, f.y0 + ph + 16,
                         context_format(static_cast<int64_t>(std::llround(std::pow(2.0, l)))));
    }
    s += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" text-anchor=\"middle\">context length T (tokens)</text>\n",
                     f.x0 + pw / 2, f.y0 + ph + 36);
    if (p == 0)
      s += fmt::format("<text transform=\"translate({:.0f},{:.0f}) rotate(-90)\" text-anchor=\"middle\">peak per rank "
                       "(bytes, log)</text>\n",
                       f.x0 - 62, f.y0 + ph / 2);
    if (device_mem != kUnlimitedBytes) {
      const double y = f.py(static_cast<double>(device_mem));
      s += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.1f}\" x2=\"{:.0f}\" y2=\"{:.1f}\" stroke=\"red\" "
                       "stroke-dasharray=\"6,4\"/>\n",
                       f.x0, y, f.x0 + pw, y);
    }
    for (Category cat : kAllCategories) {
      std::vector<uint64_t> v;
      for (const Result& r : panel.results) v.push_back(r.peak[static_cast<int>(cat)]);
      s += series_svg(f, panel.contexts, v, kColors[static_cast<int>(cat)], 1.6, "");
    }
    std::vector<uint64_t> total;
    for (const Result& r : panel.results) total.push_back(r.step_peak);
    s += series_svg(f, panel.contexts, total, "black", 3, "");
    s += "</g>\n";
  }
  // Legend under the panels.
  double lx = left, ly = top + ph + 70;
  auto entry = [&](const std::string& label, const std::string& color, double w, const std::string& dash) {
    s += fmt::format("<line x1=\"{:.0f}\" y1=\"{:.0f}\" x2=\"{:.0f}\" y2=\"{:.0f}\" stroke=\"{}\" stroke-width=\"{}\"{}/>\n",
                     lx, ly, lx + 22, ly, color, w, dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"");
    s += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n", lx + 27, ly + 4, xml_escape(label));
    lx += 130;
    if (lx + 130 > width) {
      lx = left;
      ly += 20;
    }
  };
  for (Category cat : kAllCategories) entry(std::string(category_name(cat)), kColors[static_cast<int>(cat)], 1.6, "");
  entry("step peak", "black", 3, "");
  if (device_mem != kUnlimitedBytes) entry("device memory " + si_bytes(static_cast<double>(device_mem)), "red", 1, "6,4");
  s += "</svg>\n";
  return s;
}

std::vector<PlotPanel> peaks_plot_panels(const Input& in, int lo_log2, int hi_log2) {
  std::vector<PlotPanel> panels(2);
  panels[0].title = "baseline";
  panels[1].title = "flatpeak (PipelinedLLEP + Ring-DTP + SCO + OffloadStreamAdamW)";
  for (size_t p = 0; p < panels.size(); ++p) {
    Input x = in;
    if (p == 0)
      settings_set_baseline(x.settings);
    else
      settings_set_flatpeak(x.settings);
    const int64_t cp = x.settings.layout.context_ranks();
    for (int l = lo_log2; l <= hi_log2; ++l) {
      x.context = int64_t{1} << l;
      if (cp > 1 && x.context % (2 * cp) != 0) continue;  // the engine's zig-zag split needs 2cp | T
      panels[p].contexts.push_back(x.context);
      panels[p].results.push_back(plan_step(x));
    }
  }
  return panels;
}

std::string timeline_svg(const std::string& title, const std::vector<TimelinePanel>& panels, uint64_t device_mem) {
  FP_ASSERT(!panels.empty());
  constexpr size_t kBins = 600;  // points per panel: each bin keeps its highest moment (peaks survive)
  const double pw = 460, ph = 300, left = 90, top = 60, gap = 90;
  const double width = left + panels.size() * pw + (panels.size() - 1) * gap + 30, height = top + ph + 130;
  // Per panel: the per-category bytes at the sampled moments.
  std::vector<std::vector<std::array<uint64_t, kNumCategories>>> samples(panels.size());
  uint64_t ymax = 1;
  for (size_t p = 0; p < panels.size(); ++p) {
    const std::vector<LedgerEvent>& ev = panels[p].events;
    std::array<uint64_t, kNumCategories> cur{};
    const size_t n = ev.size(), bins = std::min(kBins, std::max<size_t>(n, 1));
    std::array<uint64_t, kNumCategories> best{};
    uint64_t best_total = 0;
    size_t bin = 0;
    for (size_t i = 0; i < n; ++i) {
      const int c = static_cast<int>(ev[i].category);
      cur[c] = ev[i].alloc ? cur[c] + ev[i].bytes : cur[c] - std::min(cur[c], ev[i].bytes);
      uint64_t total = 0;
      for (uint64_t b : cur) total += b;
      if (total >= best_total) best_total = total, best = cur;
      const size_t b_of = (i + 1) * bins / n;  // the bin after event i
      if (b_of > bin || i + 1 == n) {
        samples[p].push_back(best);
        ymax = std::max(ymax, best_total);
        best_total = 0;
        bin = b_of;
      }
    }
  }
  if (device_mem != kUnlimitedBytes) ymax = std::max<uint64_t>(ymax, std::min<uint64_t>(device_mem, ymax * 2));
  const double ytop = static_cast<double>(ymax) * 1.08;
  std::string out = svg_open(width, height, title, 28);
  for (size_t p = 0; p < panels.size(); ++p) {
    const double x0 = left + p * (pw + gap), y0 = top;
    auto py = [&](double b) { return y0 + ph - b / ytop * ph; };
    out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" "
                       "stroke=\"#999\"/>\n",
                       x0, y0, pw, ph);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"13\">{} (peak {}, "
                       "binding: {})</text>\n",
                       x0 + pw / 2, y0 - 10, xml_escape(panels[p].title), si_bytes(static_cast<double>(panels[p].step_peak)),
                       category_name(panels[p].binding));
    for (int t = 0; t <= 4; ++t) {  // y ticks
      const double b = ytop * t / 4;
      out += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/>"
                         "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
                         x0, x0 + pw, py(b), py(b), x0 - 6, py(b) + 4, si_bytes(b));
    }
    const auto& sm = samples[p];
    const size_t m = sm.size();
    auto px = [&](size_t i) { return x0 + (m <= 1 ? 0.0 : static_cast<double>(i) / static_cast<double>(m - 1) * pw); };
    std::vector<double> base(m, 0.0);
    for (int c = 0; c < kNumCategories; ++c) {
      bool any = false;
      for (size_t i = 0; i < m; ++i) any |= sm[i][c] > 0;
      if (!any) continue;
      std::string pts;
      for (size_t i = 0; i < m; ++i) pts += fmt::format("{:.1f},{:.1f} ", px(i), py(base[i] + static_cast<double>(sm[i][c])));
      for (size_t i = m; i-- > 0;) pts += fmt::format("{:.1f},{:.1f} ", px(i), py(base[i]));
      out += fmt::format("<polygon fill=\"{}\" fill-opacity=\"0.85\" stroke=\"none\" points=\"{}\"/>\n", kColors[c], pts);
      for (size_t i = 0; i < m; ++i) base[i] += static_cast<double>(sm[i][c]);
    }
    if (device_mem != kUnlimitedBytes && static_cast<double>(device_mem) <= ytop)
      out += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"black\" "
                         "stroke-dasharray=\"6,4\"/><text x=\"{:.1f}\" y=\"{:.1f}\">device {}</text>\n",
                         x0, x0 + pw, py(static_cast<double>(device_mem)), py(static_cast<double>(device_mem)), x0 + 4,
                         py(static_cast<double>(device_mem)) - 4, si_bytes(static_cast<double>(device_mem)));
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">one training step (allocation "
                       "events in order: forward, backward, optimizer)</text>\n",
                       x0 + pw / 2, y0 + ph + 20);
  }
  // Legend.
  double lx = left, ly = top + ph + 55;
  for (int c = 0; c < kNumCategories; ++c) {
    out += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.0f}\" "
                       "y=\"{:.0f}\">{}</text>\n",
                       lx, ly, kColors[c], lx + 16, ly + 11, category_name(kAllCategories[c]));
    lx += 110;
    if (lx > width - 110) lx = left, ly += 20;
  }
  out += "</svg>\n";
  return out;
}

std::string line_chart_svg(const std::string& title, const std::string& x_label, const std::vector<double>& x,
                           const std::vector<LineSeries>& series, bool bytes) {
  const double pw = 560, ph = 220, left = 80, top = 40, width = left + pw + 170, height = top + ph + 50;
  double xmin = x.empty() ? 0 : x.front(), xmax = x.empty() ? 1 : x.back(), ymin = 1e300, ymax = -1e300;
  for (const LineSeries& sr : series)
    for (double v : sr.y)
      if (std::isfinite(v)) ymin = std::min(ymin, v), ymax = std::max(ymax, v);
  if (ymin > ymax) ymin = 0, ymax = 1;
  if (ymin >= 0 && ymin < 0.5 * ymax) ymin = 0;  // from 0 unless the data sit far above it
  if (ymax <= ymin) ymax = ymin + 1;
  if (xmax <= xmin) xmax = xmin + 1;
  const double pad = 0.05 * (ymax - ymin);
  const double y0 = ymin == 0 ? 0 : ymin - pad, y1 = ymax + pad;
  auto px = [&](double v) { return left + (v - xmin) / (xmax - xmin) * pw; };
  auto py = [&](double v) { return top + ph - (v - y0) / (y1 - y0) * ph; };
  std::string out = svg_open(width, height, title, 22);
  out += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"none\" stroke=\"#999\"/>\n",
                     left, top, pw, ph);
  for (int t = 0; t <= 4; ++t) {
    const double v = y0 + (y1 - y0) * t / 4;
    out += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/><text x=\"{:.1f}\" "
                       "y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n",
                       left, left + pw, py(v), py(v), left - 6, py(v) + 4, bytes ? si_bytes(v) : fmt::format("{:.4g}", v));
  }
  double last_tick = -1e300;  // x ticks: whole numbers (steps), each once
  for (int t = 0; t <= 4; ++t) {
    const double xv = std::round(xmin + (xmax - xmin) * t / 4);
    if (xv <= last_tick) continue;
    last_tick = xv;
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.0f}</text>\n", px(xv), top + ph + 16, xv);
  }
  out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", left + pw / 2, top + ph + 36,
                     xml_escape(x_label));
  for (size_t i = 0; i < series.size(); ++i) {
    const LineSeries& sr = series[i];
    const std::string color = sr.color.empty() ? kColors[i % kNumCategories] : sr.color;
    std::string pts;
    for (size_t j = 0; j < sr.y.size() && j < x.size(); ++j)
      if (std::isfinite(sr.y[j])) pts += fmt::format("{:.1f},{:.1f} ", px(x[j]), py(sr.y[j]));
    out += fmt::format("<polyline class=\"series\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n", color, pts);
    out += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"12\" height=\"3\" fill=\"{}\"/><text x=\"{:.0f}\" y=\"{:.0f}\">{}</text>\n",
                       left + pw + 15, top + 10 + 18 * i, color, left + pw + 32, top + 15 + 18 * i, xml_escape(sr.name));
  }
  out += "</svg>\n";
  return out;
}

}  // namespace fp::plan
