// The nine categories every device allocation names (docs/design.md, "Architecture"), and for each the
// schedule that flattens it: the hint an out-of-memory error gives.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace fp {

enum class Category : uint8_t {
  Category_params,
  Category_grads,
  Category_optimizer,
  // Per-layer intermediates, including the MoE block's token side: this rank's own m = n k routed
  // copies (moe.rows, moe.slot_pos, moe.xs, moe.ys (which takes the output gradients in backward),
  // moe.dxs), sized by the config alone.
  Category_activations,
  Category_checkpoints,
  // Expert dispatch: the buffers sized by the routes this rank receives from other ranks (received
  // rows, their grouping and outputs, the send/return buffers of LLEP and PipelinedLLEP): they grow
  // with routing skew under the standard dispatch, and PipelinedLLEP bounds them at launch. Empty
  // on one rank (the local dispatch receives nothing).
  Category_dispatch,
  Category_vocab,
  Category_comm,
  Category_workspace,
};
// The categories under the short names the allocation sites use (be.alloc(kAct, ...)).
inline constexpr Category kParams = Category::Category_params;
inline constexpr Category kGrads = Category::Category_grads;
inline constexpr Category kOpt = Category::Category_optimizer;
inline constexpr Category kAct = Category::Category_activations;
inline constexpr Category kCkpt = Category::Category_checkpoints;
inline constexpr Category kDispatch = Category::Category_dispatch;
inline constexpr Category kVocab = Category::Category_vocab;
inline constexpr Category kComm = Category::Category_comm;
inline constexpr Category kWs = Category::Category_workspace;
inline constexpr int kNumCategories = 9;

inline constexpr std::array<Category, kNumCategories> kAllCategories = {
    Category::Category_params,      Category::Category_grads,       Category::Category_optimizer,
    Category::Category_activations, Category::Category_checkpoints, Category::Category_dispatch,
    Category::Category_vocab,       Category::Category_comm,        Category::Category_workspace};

std::string_view category_name(Category c);
// Throws fp::Error naming the valid categories.
Category category_parse(std::string_view s);
// What to change when this category runs out of memory (the schedule that flattens it).
std::string_view category_hint(Category c);

}  // namespace fp
