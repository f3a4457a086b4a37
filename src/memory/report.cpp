#include "memory/report.h"

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

}  // namespace fp
