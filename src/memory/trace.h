// Chrome trace export of a ledger timeline (memory_trace.json): one counter track per category and
// one for the total, in bytes, opening in Perfetto (ui.perfetto.dev) or chrome://tracing.
#pragma once

#include <string>

#include "memory/ledger.h"

namespace fp {

// Writes atomically (temp file + rename). Throws fp::Error when the file cannot be written.
void trace_write_chrome(const Ledger& ledger, const std::string& path);
// The same document as a string (tests).
std::string trace_chrome_json(const Ledger& ledger);

}  // namespace fp
