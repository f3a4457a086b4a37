// What the dispatch-level MPI cases share (ep_case.cpp: standard expert parallelism; llep_case.cpp:
// LLEP and PipelinedLLEP): a small MoE layer with odd sizes, deterministic inputs, host copies of
// device tensors, and the two error measures their checks use. Header-only, test code only.
//
// Legend: n_b tokens of block b (rank b's tokens), H hidden, E experts.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../common/norm_rel.h"
#include "backend/backend.h"
#include "comm/comm.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/params.h"

namespace fp::dist_test {

inline constexpr double kTol = 1e-6;

// Odd sizes (no multiple of a SIMD width); 8 experts so that W = 1, 2, 4 all divide them.
inline ModelConfig config_make(int64_t E = 8, int64_t H = 27) {
  ModelConfig m;
  m.hidden_size = H, m.num_hidden_layers = 1, m.num_attention_heads = 3, m.num_key_value_heads = 1;
  m.head_dim = 9, m.num_experts = E, m.num_experts_per_tok = 2, m.moe_intermediate_size = 19;
  m.vocab_size = 16, m.norm_topk_prob = true, m.router_aux_loss_coef = 0.02, m.rope_theta = 10000;
  m.rms_norm_eps = 1e-6, m.seed = 5;
  return m;
}

// n_b: unequal, so sends, receives and chunks differ from rank to rank.
inline int64_t block_tokens(int b) { return 29 + 7 * b; }

inline std::vector<float> random_vec(int64_t count, uint64_t seed, double scale) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = static_cast<float>(scale * rng.normal());
  return v;
}

inline std::vector<float> host_of(Backend& be, const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  be.copy_to_host(h.data(), t.data(), t.bytes());
  return h;
}

inline Tensor device_of(Backend& be, Category c, const Shape& shape, const std::vector<float>& h,
                        const std::string& name) {
  Tensor t = be.alloc_f32(c, shape, name);
  if (be.computes()) be.copy_from_host(t.data(), h.data(), t.bytes());
  return t;
}

// max |got - ref| / max |ref|; infinite when the sizes differ or anything is not finite.
inline double max_rel(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double diff = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(ref[i])));
  }
  return mag > 0 ? diff / mag : diff;
}

// Expert weights 10x the initial scale: the experts' part of x2 then is of the order of x1, so that
// comparing x2 - x1 is not dominated by the rounding of the residual sum.
inline void experts_scale(Backend& be, const LayerParams& lp, int64_t E) {
  for (int64_t e = 0; e < E; ++e)
    for (Param* p : {lp.gate_proj[e], lp.up_proj[e], lp.down_proj[e]})
      be.kernels().scale_inplace(p->w.f32(), 10.0f, p->w.numel());
}

// Every gradient the MoE block writes, in a fixed order: name and host copy.
inline std::vector<std::pair<std::string, std::vector<float>>> moe_grads(Backend& be, const LayerParams& lp,
                                                                         int64_t E) {
  std::vector<std::pair<std::string, std::vector<float>>> g;
  g.push_back({lp.gate->name, host_of(be, lp.gate->g)});
  g.push_back({lp.post_attention_layernorm->name, host_of(be, lp.post_attention_layernorm->g)});
  for (int64_t e = 0; e < E; ++e)
    for (const Param* p : {lp.gate_proj[e], lp.up_proj[e], lp.down_proj[e]}) g.push_back({p->name, host_of(be, p->g)});
  return g;
}

// The reference every rank checks against: the single-rank computation of the W blocks (the local
// dispatch, every expert here) with the weights every rank starts from, and the gradients it leaves.
// run_block(be, comm, lp, b) runs block b and returns its result.
template <class RunBlock>
auto reference_blocks(const ModelConfig& cfg, int W, const RunBlock& run_block) {
  auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  ParamStore ps(cfg, *be);
  ps.init(cfg.seed);
  experts_scale(*be, ps.layers[0], cfg.num_experts);
  std::unique_ptr<Comm> single = comm_single();
  std::vector<decltype(run_block(*be, *single, ps.layers[0], 0))> blocks;
  for (int b = 0; b < W; ++b) blocks.push_back(run_block(*be, *single, ps.layers[0], b));
  return std::make_pair(std::move(blocks), moe_grads(*be, ps.layers[0], cfg.num_experts));
}

}  // namespace fp::dist_test
