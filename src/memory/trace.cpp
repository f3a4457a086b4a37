#include "memory/trace.h"

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"

namespace fp {

std::string trace_chrome_json(const Ledger& ledger) {
  // Counter events ("ph":"C"): each carries the values of its track at that time. We emit the
  // changed category's track and the total at every event.
  nlohmann::json events = nlohmann::json::array();
  std::array<uint64_t, kNumCategories> cur{};
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", ledger.space() + " memory"}}}});
  for (const LedgerEvent& e : ledger.events()) {
    const int i = static_cast<int>(e.category);
    cur[i] = e.alloc ? cur[i] + e.bytes : cur[i] - e.bytes;
    events.push_back({{"name", std::string(category_name(e.category))},
                      {"ph", "C"},
                      {"ts", e.time_us},
                      {"pid", 1},
                      {"args", {{"bytes", cur[i]}}}});
    events.push_back({{"name", "total"}, {"ph", "C"}, {"ts", e.time_us}, {"pid", 1}, {"args", {{"bytes", e.total_after}}}});
  }
  nlohmann::json doc = {{"traceEvents", events},
                        {"displayTimeUnit", "ms"},
                        {"otherData",
                         {{"space", ledger.space()},
                          {"capacity_bytes", ledger.capacity()},
                          {"peak_bytes", ledger.total_peak()},
                          {"dropped_events", ledger.dropped_events()}}}};
  return doc.dump();
}

void trace_write_chrome(const Ledger& ledger, const std::string& path) {
  file_write_atomic(path, trace_chrome_json(ledger));
}

}  // namespace fp
