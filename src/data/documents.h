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
// position, and the same loss terms (tests/model/test_documents.cpp, tests/reference/twin_documents.py).
#pragma once

#include <cstdint>
#include <string>

#include "data/batch.h"

namespace fp {

// How a run's token file holds documents (data.documents).
enum class Documents {
  Documents_none,  // one stream: attention and positions run on across documents
  Documents_eos,   // documents end with data.eos_id (Note [Documents from EOS])
};
// "none" / "eos"; throws fp::Error naming `key` otherwise.
Documents documents_parse(const std::string& text, const std::string& key = "data.documents");

// Marks the documents of a whole window batch (before context_slice): fills doc_start and ignores the
// targets of EOS positions (Note [Documents from EOS]). eos_id >= 0.
void batch_documents_from_eos(Batch& b, int32_t eos_id);

}  // namespace fp
