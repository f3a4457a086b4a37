// Packed documents: where each token's document begins, and which targets cross a boundary.
// Legend: B sequences, T tokens per sequence (a whole window, before context parallelism cuts it).
//
// Note [Documents from EOS]: long-context corpora are documents of mixed lengths packed into windows,
// each ending with its EOS (scripts/make_token_file.py writes them so). With data.documents = "eos" a
// window is cut after every EOS (the EOS belongs to the document it ends):
//   - doc_start[b, t] is the position in the window after the last EOS before t (0 if none: a window
//     that starts inside a document starts that fragment at 0);
//   - attention sees only the earlier tokens of the same document (Note [Documents in attention] in
//     ops/attention.h), and RoPE positions restart at 0 at each document start (step/step.cpp);
//   - the target of an EOS position is the next document's first token: it is ignored (-100), so no loss
//     is taken across a boundary. The loss stays the mean over the targets that remain, over the whole
//     global batch (step/step.h).
// So a window of packed documents computes what each document run alone would: the same logits at each
// position, and the same loss terms (tests/model/test_documents.cpp; the twin runs each document's
// attention alone, tests/reference/qwen3_moe_twin.py per_document).
//
// Note [A document index]: documents need not end with an EOS token (a byte-level token file has none).
// scripts/make_token_file.py writes, beside OUT.bin, OUT.bin.docs: where each document starts in the
// token file. Layout, little-endian: the 8 bytes "FPDOCS01", int64 count D, then D int64 token offsets,
// strictly ascending, the first 0, each below the file's token count. With data.documents = "index" a
// window's documents are those of the index: doc_start as above, and no loss at a document's last token
// (its target is the next document's first token), the index's form of "no loss at EOS".
#pragma once

#include <cstdint>
#include <string>

#include "data/batch.h"

namespace fp {

// How a run's token file holds documents (data.documents).
enum class Documents {
  Documents_none,   // one stream: attention and positions run on across documents
  Documents_eos,    // documents end with data.eos_id (Note [Documents from EOS])
  Documents_index,  // the token file's document index, FILE.docs (Note [A document index])
};
// "none" / "eos" / "index"; throws fp::Error naming `key` otherwise.
Documents documents_parse(const std::string& text, const std::string& key = "data.documents");

// Marks the documents of a whole window batch (before context_slice): fills doc_start and ignores the
// targets of EOS positions (Note [Documents from EOS]). eos_id >= 0.
void batch_documents_from_eos(Batch& b, int32_t eos_id);

// A token file's document index (Note [A document index]).
struct DocumentIndex {
  std::vector<int64_t> starts;  // (D) token offsets, ascending, the first 0
};
// The suffix of a token file's index: FILE + ".docs".
inline std::string document_index_path(const std::string& token_file) { return token_file + ".docs"; }
// Reads and validates path against a token file of `tokens` tokens; fp::Error naming the file otherwise.
DocumentIndex document_index_read(const std::string& path, int64_t tokens);
// Writes the index atomically (scripts/make_token_file.py writes the same bytes).
void document_index_write(const std::string& path, const DocumentIndex& index);
// Marks the documents of a whole window batch from the index: each sequence's window starts at b.offsets
// (filled by the token-file loaders); fills doc_start and ignores the target of each document's last token.
void batch_documents_from_index(Batch& b, const DocumentIndex& index);

// How the windows of one token file get their documents: data.documents with its EOS id or the file's
// index, read once (the training file and eval.data each have their own).
struct DocumentMarker {
  Documents kind = Documents::Documents_none;
  int32_t eos_id = -1;  // Documents_eos
  DocumentIndex index;  // Documents_index
  // kind from data.documents; eos: eos_id >= 0 (documents_eos_id resolves it); index: token_file + ".docs",
  // validated against the file's `tokens`.
  static DocumentMarker make(const std::string& documents, int32_t eos_id, const std::string& token_file,
                             int64_t tokens);
  void mark(Batch& b) const;     // a whole window batch, before context_slice
  std::string describe() const;  // for the log: "documents end with EOS id 3", ...
};

}  // namespace fp
