#include "data/documents.h"

#include "core/error.h"

namespace fp {

Documents documents_parse(const std::string& text, const std::string& key) {
  if (text == "none") return Documents::Documents_none;
  if (text == "eos") return Documents::Documents_eos;
  throw Error(fmt::format("{} = \"{}\" is neither \"none\" nor \"eos\"", key, text),
              "write \"none\" (one stream) or \"eos\" (documents end with data.eos_id; docs/data.md)");
}

void batch_documents_from_eos(Batch& b, int32_t eos_id) {
  FP_ASSERT(eos_id >= 0, "batch_documents_from_eos: eos_id {} < 0", eos_id);
  FP_ASSERT(b.positions.empty(), "batch_documents_from_eos: mark the whole window before context_slice");
  const int64_t n = b.B * b.T;
  b.doc_start.assign(static_cast<size_t>(n), 0);
  for (int64_t s = 0; s < b.B; ++s) {
    int32_t start = 0;
    for (int64_t t = 0; t < b.T; ++t) {
      const int64_t i = s * b.T + t;
      b.doc_start[i] = start;
      if (b.tokens[i] == eos_id) {
        b.targets[i] = -100;  // the next document's first token
        start = static_cast<int32_t>(t + 1);
      }
    }
  }
}

}  // namespace fp
