// Human and JSON reports of a ledger's peaks.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "memory/ledger.h"

namespace fp {

// A table: one line per category (peak, share of the total peak), then the total and the capacity,
// and which category binds (the largest peak).
std::string ledger_peaks_table(const Ledger& l);
// {"device_peak_bytes": .., "capacity_bytes": .., "peak_bytes": {"params": .., ...}, "binding": ".."}
nlohmann::json ledger_peaks_json(const Ledger& l);
// The category with the largest peak.
Category ledger_binding_category(const Ledger& l);

}  // namespace fp
