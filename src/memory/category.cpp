#include "memory/category.h"

#include "core/error.h"

namespace fp {

std::string_view category_name(Category c) {
  switch (c) {
    case Category::Category_params: return "params";
    case Category::Category_grads: return "grads";
    case Category::Category_optimizer: return "optimizer";
    case Category::Category_activations: return "activations";
    case Category::Category_checkpoints: return "checkpoints";
    case Category::Category_dispatch: return "dispatch";
    case Category::Category_vocab: return "vocab";
    case Category::Category_comm: return "comm";
    case Category::Category_workspace: return "workspace";
  }
  return "?";
}

Category category_parse(std::string_view s) {
  for (Category c : kAllCategories)
    if (category_name(c) == s) return c;
  throw Error(fmt::format("unknown memory category '{}'", s),
              "categories: params grads optimizer activations checkpoints dispatch vocab comm workspace");
}

std::string_view category_hint(Category c) {
  switch (c) {
    case Category::Category_dispatch:
      return "the rows this rank receives from other ranks' routes (they grow with routing skew) are "
             "flattened by PipelinedLLEP: set moe.dispatch = \"pipelined_llep\" "
             "(its buffer is bounded at launch by 2 * E_p * k * c_eff * H * bytes; lower pipelined.chunk_cap)";
    case Category::Category_vocab:
      return "the vocabulary projection is flattened by Ring-DTP: set vocab.schedule = \"ring\" "
             "(only block_tokens x V/P logit strips exist at a time; lower vocab.block_tokens)";
    case Category::Category_checkpoints:
      return "checkpoint boundaries are flattened by SCO: set ckpt.schedule = \"sco\" "
             "(boundaries go to host memory; at most two stay on the device)";
    case Category::Category_optimizer:
      return "optimizer state is flattened by OffloadStreamAdamW: set optim.schedule = \"offload_stream\" "
             "(state lives in host memory; the device holds slots x largest bucket x 16 B of staging)";
    case Category::Category_activations:
      return "activations (including the MoE block's own n * top-k routed copies) are recomputed per layer "
             "already; shorten the sequence, or split it over more ranks (context parallel: mpirun -np W)";
    case Category::Category_params:
    case Category::Category_grads:
      return "dense parameters and gradients are sharded over ranks: run on more ranks (mpirun -np W), "
             "or use a smaller model";
    case Category::Category_comm:
      return "communication buffers scale with the per-rank tokens: use more ranks or a shorter sequence";
    case Category::Category_workspace:
      return "workspace is per-op scratch: shorten the sequence or the block sizes";
  }
  return "";
}

}  // namespace fp
