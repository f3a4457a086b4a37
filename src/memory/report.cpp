#include "memory/report.h"

#include <algorithm>

#include "core/units.h"

namespace fp {

Category ledger_binding_category(const Ledger& l) {
  Category best = Category::Category_params;
  for (Category c : kAllCategories)
    if (l.peak(c) > l.peak(best)) best = c;
  return best;
}

std::string ledger_peaks_table(const Ledger& l) {
  std::string s = fmt::format("  {:<12} {:>14} {:>8}\n", "category", "peak", "share");
  const double total = static_cast<double>(l.total_peak());
  for (Category c : kAllCategories) {
    const uint64_t p = l.peak(c);
    s += fmt::format("  {:<12} {:>14} {:>7.1f}%\n", category_name(c), bytes_format(p),
                     total > 0 ? 100.0 * static_cast<double>(p) / total : 0.0);
  }
  s += fmt::format("  {:<12} {:>14}   (capacity {}; largest category: {})\n", "step peak", bytes_format(l.total_peak()),
                   bytes_format(l.capacity()), category_name(ledger_binding_category(l)));
  return s;
}

nlohmann::json ledger_peaks_json(const Ledger& l) {
  nlohmann::json peaks = nlohmann::json::object();
  for (Category c : kAllCategories) peaks[std::string(category_name(c))] = l.peak(c);
  nlohmann::json j = {{"device_peak_bytes", l.total_peak()},
                      {"peak_bytes", peaks},
                      {"binding", std::string(category_name(ledger_binding_category(l)))}};
  if (l.capacity() != UINT64_MAX) j["capacity_bytes"] = l.capacity();
  return j;
}

std::vector<LedgerEvent> ledger_live_at_peak(const Ledger& l) {
  const std::vector<LedgerEvent>& ev = l.events();
  // The first event after which the total is the peak; replay up to it.
  size_t at = ev.size();
  for (size_t i = 0; i < ev.size(); ++i)
    if (ev[i].total_after == l.total_peak()) {
      at = i;
      break;
    }
  if (at == ev.size()) return {};
  std::vector<LedgerEvent> live;
  for (size_t i = 0; i <= at; ++i) {
    if (ev[i].alloc) {
      live.push_back(ev[i]);
      continue;
    }
    // A free gives back the most recent live allocation of the same tensor (tag, category, bytes).
    for (size_t j = live.size(); j-- > 0;)
      if (live[j].tag == ev[i].tag && live[j].category == ev[i].category && live[j].bytes == ev[i].bytes) {
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(j));
        break;
      }
  }
  std::stable_sort(live.begin(), live.end(), [](const LedgerEvent& a, const LedgerEvent& b) { return a.bytes > b.bytes; });
  return live;
}

std::string ledger_peak_breakdown(const Ledger& l) {
  const std::vector<LedgerEvent> live = ledger_live_at_peak(l);
  struct Row {
    const LedgerEvent* e;
    int count;
  };
  std::vector<Row> rows;
  uint64_t shown = 0;
  for (const LedgerEvent& e : live) {
    shown += e.bytes;
    bool merged = false;
    for (Row& r : rows)
      if (r.e->tag == e.tag && r.e->category == e.category && r.e->shape.str() == e.shape.str() && r.e->dtype == e.dtype) {
        ++r.count;
        merged = true;
        break;
      }
    if (!merged) rows.push_back({&e, 1});
  }
  std::string out = fmt::format("{:<34} {:<12} {:<5} {:<18} {:>12}\n", "tensor", "category", "dtype", "shape", "bytes");
  for (const Row& r : rows)
    out += fmt::format("{:<34} {:<12} {:<5} {:<18} {:>12}\n", r.count > 1 ? fmt::format("{} x{}", r.e->tag, r.count) : r.e->tag,
                       category_name(r.e->category), dtype_name(r.e->dtype), r.e->shape.str(),
                       bytes_format(r.e->bytes * static_cast<uint64_t>(r.count)));
  if (l.total_peak() > shown)
    out += fmt::format("{:<34} {:<12} {:<5} {:<18} {:>12}\n", "(allocated before the timeline)", "-", "-", "-",
                       bytes_format(l.total_peak() - shown));
  out += fmt::format("{:<34} {:<12} {:<5} {:<18} {:>12}\n", "total at the peak", "", "", "", bytes_format(l.total_peak()));
  return out;
}

}  // namespace fp
