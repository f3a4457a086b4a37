// Human and JSON reports of a ledger's peaks.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memory/ledger.h"

namespace fp {

// A table: one line per category (peak, share of the total peak), then the total and the capacity,
// and which category binds (the largest peak).
std::string ledger_peaks_table(const Ledger& l);
// {"device_peak_bytes": .., "capacity_bytes": .., "peak_bytes": {"params": .., ...}, "binding": ".."}
nlohmann::json ledger_peaks_json(const Ledger& l);
// The category with the largest peak.
Category ledger_binding_category(const Ledger& l);

// Every tensor live at the moment the total first reached its peak, replayed from the timeline (the
// allocations that peak holds: alloc events without their free), largest first; tensors allocated
// before the timeline's first event are not in it (the caller sees their sum as total_peak() minus
// these). Empty when the timeline was not kept.
std::vector<LedgerEvent> ledger_live_at_peak(const Ledger& l);
// "  tensor  category  dtype  shape  bytes" lines of ledger_live_at_peak, identical tensors (tag,
// category, shape, dtype) grouped with a count, and a last line for what the timeline does not show.
std::string ledger_peak_breakdown(const Ledger& l);

}  // namespace fp
