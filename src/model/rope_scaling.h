// RoPE frequencies of a model, with Hugging Face's RoPE scaling (ops/rope.h applies them).
//
// Note [RoPE scaling as transformers computes it]: the formulas follow transformers 5.x
// (modeling_rope_utils.py), for a head of hd dimensions and base theta:
//   default  inv_freq[i] = theta^(-2i/hd)
//   linear   inv_freq[i] / factor
//   yarn     a ramp between extrapolation (inv_freq) and interpolation (inv_freq / factor) over the
//            dimensions whose wavelengths fall between beta_fast and beta_slow rotations of the
//            original context (original_max_position_embeddings, default max_position_embeddings;
//            the range rounded outwards to whole dimensions unless truncate = false); cos and sin
//            multiplied by attention_factor, default 0.1 ln(factor) + 1, or with mscale and
//            mscale_all_dim the ratio of those forms (DeepSeek's).
//   llama3   wavelengths above original / low_freq_factor divided by factor, below original /
//            high_freq_factor kept, a smooth blend in between.
// transformers 4.x (>= 4.45) differs in one case: when rope_scaling names
// original_max_position_embeddings, it takes factor = max_position_embeddings / original instead of
// the factor key. flatpeak follows 5.x; the twin (tests/reference/qwen3_moe_twin.py) implements the
// same formulas independently.
//   dynamic  (NTK-aware) the default formula with the base grown to
//            theta (factor L / M - (factor - 1))^(hd / (hd - 2)), L = max(seq_len, M), where seq_len is
//            the largest position of the step plus one and M = max_position_embeddings: the default
//            frequencies up to M. transformers caches the largest L it has seen and keeps using it for
//            shorter sequences above M; flatpeak computes every step from its own length, which equals
//            transformers' for a fresh model and whenever the length does not fall (training at one
//            seq_len). LongRoPE is refused (model/hf_config.cpp).
#pragma once

#include <vector>

#include "model/config.h"

namespace fp {

struct RopeTable {
  std::vector<double> inv_freq;  // (head_dim / 2)
  double attention_factor = 1.0;
};

// seq_len: the step's largest position plus one (read by dynamic only; 0: no step, M).
RopeTable rope_table(const ModelConfig& m, int64_t seq_len = 0);

}  // namespace fp
