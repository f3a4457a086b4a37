#include "data/documents.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace fp {

Documents documents_parse(const std::string& text, const std::string& key) {
  if (text == "none") return Documents::Documents_none;
  if (text == "eos") return Documents::Documents_eos;
  if (text == "index") return Documents::Documents_index;
  throw Error(fmt::format("{} = \"{}\" is none of \"none\", \"eos\", \"index\"", key, text),
              "write \"none\" (one stream), \"eos\" (documents end with data.eos_id) or \"index\" (the token file's "
              "FILE.docs, written by scripts/make_token_file.py); docs/data.md");
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

namespace {
constexpr char kIndexMagic[8] = {'F', 'P', 'D', 'O', 'C', 'S', '0', '1'};
}  // namespace

DocumentIndex document_index_read(const std::string& path, int64_t tokens) {
  const char* hint = "write it with scripts/make_token_file.py beside its token file (docs/data.md)";
  std::ifstream in(path, std::ios::binary);
  FP_CHECK(in.good(), hint, "cannot read the document index '{}' (data.documents = \"index\" reads FILE.docs)", path);
  char magic[8] = {};
  int64_t count = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&count), 8);
  FP_CHECK(in.good() && std::memcmp(magic, kIndexMagic, 8) == 0, hint,
           "'{}' is not a flatpeak document index (it must start with FPDOCS01)", path);
  FP_CHECK(count >= 1 && count <= tokens, hint, "'{}' holds {} documents for a token file of {} tokens", path, count,
           tokens);
  DocumentIndex idx;
  idx.starts.resize(static_cast<size_t>(count));
  in.read(reinterpret_cast<char*>(idx.starts.data()), count * 8);
  FP_CHECK(in.gcount() == count * 8, hint, "'{}' is truncated: {} of its {} offsets", path, in.gcount() / 8, count);
  in.peek();
  FP_CHECK(in.eof(), hint, "'{}' has bytes after its {} offsets", path, count);
  FP_CHECK(idx.starts[0] == 0, hint, "'{}': the first document starts at {}, not 0", path, idx.starts[0]);
  for (int64_t d = 1; d < count; ++d)
    FP_CHECK(idx.starts[d - 1] < idx.starts[d] && idx.starts[d] < tokens, hint,
             "'{}': document {} starts at {} (after {}; the token file has {} tokens): offsets must ascend within "
             "the file",
             path, d, idx.starts[d], idx.starts[d - 1], tokens);
  return idx;
}

void document_index_write(const std::string& path, const DocumentIndex& index) {
  std::string bytes(kIndexMagic, 8);
  const int64_t count = static_cast<int64_t>(index.starts.size());
  bytes.append(reinterpret_cast<const char*>(&count), 8);
  bytes.append(reinterpret_cast<const char*>(index.starts.data()), index.starts.size() * 8);
  file_write_atomic(path, bytes);
}

void batch_documents_from_index(Batch& b, const DocumentIndex& index) {
  FP_ASSERT(b.positions.empty(), "batch_documents_from_index: mark the whole window before context_slice");
  FP_ASSERT(static_cast<int64_t>(b.offsets.size()) == b.B, "batch_documents_from_index: {} offsets for {} sequences",
            b.offsets.size(), b.B);
  const std::vector<int64_t>& st = index.starts;
  b.doc_start.assign(static_cast<size_t>(b.B * b.T), 0);
  for (int64_t s = 0; s < b.B; ++s) {
    const int64_t off = b.offsets[s];
    // The last document starting at or before the window's first token.
    size_t d = static_cast<size_t>(std::upper_bound(st.begin(), st.end(), off) - st.begin()) - 1;
    for (int64_t t = 0; t < b.T; ++t) {
      while (d + 1 < st.size() && st[d + 1] <= off + t) ++d;
      b.doc_start[s * b.T + t] = static_cast<int32_t>(std::max<int64_t>(st[d], off) - off);
      // The next token begins the next document: no loss across the boundary.
      if (d + 1 < st.size() && st[d + 1] == off + t + 1) b.targets[s * b.T + t] = -100;
    }
  }
}

DocumentMarker DocumentMarker::make(const std::string& documents, int32_t eos_id, const std::string& token_file,
                                    int64_t tokens) {
  DocumentMarker m;
  m.kind = documents_parse(documents);
  if (m.kind == Documents::Documents_eos) {
    FP_ASSERT(eos_id >= 0, "documents = eos without an EOS id");
    m.eos_id = eos_id;
  } else if (m.kind == Documents::Documents_index) {
    m.index = document_index_read(document_index_path(token_file), tokens);
  }
  return m;
}

void DocumentMarker::mark(Batch& b) const {
  if (kind == Documents::Documents_eos) batch_documents_from_eos(b, eos_id);
  if (kind == Documents::Documents_index) batch_documents_from_index(b, index);
}

std::string DocumentMarker::describe() const {
  switch (kind) {
    case Documents::Documents_none:
      return "one stream (data.documents = \"none\")";
    case Documents::Documents_eos:
      return fmt::format("documents end with EOS id {} (no loss at EOS)", eos_id);
    case Documents::Documents_index:
      return fmt::format("{} documents from the file's index (no loss at a document's last token)",
                         index.starts.size());
  }
  return "";
}

}  // namespace fp
