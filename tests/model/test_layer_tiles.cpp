// Note [Sequence-tiled layers] (model/layer_tiles.cpp): ckpt.layer_tile < n runs each layer's token-wise work
// in tiles. Against the whole layers on the same weights and batch: the loss and the logits within 1e-6 (to
// float rounding of the GEMMs' rows), every gradient within max(1e-6, 2 gamma(n heads)) norm-relative (the
// weight gradients and dK/dV accumulate tile by tile: grad_tolerance), for tiles that cut sequences into pieces and
// tiles of whole sequences; with a sliding window shorter than a tile, attention biases and a dense MLP layer;
// gpt-oss's layer (sinks, sliding and full layers, no q/k norms, biases, the clamped SwiGLU); deepseek_v3's MLA with
// and without the query latent (Note [MLA in tiles]: its keys expanded from the latent in chunks of the tile); with
// the MoE token side in chunks inside the tiles; with packed documents; with shorter last tiles. A tile of n or more
// is the whole step bit for bit; the activations peak falls with the tile; meta allocates as cpu event for event;
// kept layers in tiles are refused by name. Ring attention over W ranks with tiles: tests/dist (dist_check.py
// grads_tiled).
#include <gtest/gtest.h>

#include <cmath>

#include "../common/deepseek_config.h"
#include "../common/error_bound.h"
#include "../common/norm_rel.h"
#include "../common/qwen_config.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/units.h"
#include "data/documents.h"
#include "data/random_batch.h"
#include "step/step.h"

namespace fp {

namespace {
ModelConfig qwen_config() {
  ModelConfig m = qwen_small_config(2);
  m.router_aux_loss_coef = 0.05;
  return m;
}

// Every switch of the Hugging Face layer that touches the tiled attention: a sliding window shorter than a
// tile, q/k/v/o biases, and a dense MLP layer between two MoE layers.
ModelConfig switched_config() {
  ModelConfig m = qwen_config();
  m.num_hidden_layers = 3, m.mlp_only_layers = {1}, m.intermediate_size = 28;
  m.attention_bias = true, m.sliding_window = 11;
  return m;
}

// gpt-oss's layer (Note [Attention sinks]): sinks, a sliding layer (window 11) between full ones, biases on
// q/k/v/o, the router and the experts, no q/k norms, the clamped SwiGLU with a limit the activations cross.
ModelConfig gpt_oss_config() {
  ModelConfig m = qwen_config();
  m.model_type = ModelType::ModelType_gpt_oss;
  m.num_hidden_layers = 3, m.attention_bias = true, m.sliding_window = 11, m.rms_norm_eps = 1e-5;
  m.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
  m.swiglu_alpha = 1.702, m.swiglu_limit = 0.05;
  return m;
}

// deepseek_v3's MLA (Note [MLA in tiles]): with the query latent and a dense first layer, or without either.
ModelConfig deepseek_config(bool q_latent) {
  return q_latent ? deepseek_small_config(3, 6, 1) : deepseek_small_config(2, 0, 0);
}

const char* name_of(const ModelConfig& m) {
  return m.is_gpt_oss()     ? "gpt_oss"
         : m.is_deepseek()  ? (m.q_lora_rank > 0 ? "deepseek_q_latent" : "deepseek")
         : m.attention_bias ? "switched"
                            : "qwen";
}

struct Options {
  int64_t layer_tile = 0;
  int64_t token_chunk = 0;
  std::string device = "cpu";
  RoutingProfile profile;
  Precision precision;
};

struct StepRun {
  StepOutputs out;
  std::vector<float> logits;
  std::vector<std::vector<float>> grads;
  uint64_t act_peak = 0;
  std::vector<LedgerEvent> events;
};

StepRun run(const ModelConfig& m, const Batch& batch, const Options& o) {
  auto be = backend_create(o.device, kUnlimitedBytes, kUnlimitedBytes);
  Schedules sched;
  sched.ckpt.layer_tile = o.layer_tile;
  sched.dispatch.token_chunk = o.token_chunk;
  Model model(m, *be, o.profile, sched, o.precision);
  model.init_weights(m.seed);
  // Larger q/k weights: attention far from uniform, so a tile that saw the wrong keys would show.
  for (Param& p : model.params().all()) {
    if (p.name.find("q_proj.weight") != std::string::npos || p.name.find("k_proj.weight") != std::string::npos ||
        p.name.find("q_b_proj.weight") != std::string::npos || p.name.find("kv_b_proj.weight") != std::string::npos)
      be->kernels().scale_inplace(p.w.buf(), 6.0f, p.w.numel());
    // gpt-oss: biases (transformers starts them at zero) and sinks away from zero, by index.
    if (m.is_gpt_oss() && be->computes() && (p.name.ends_with(".bias") || p.name.ends_with(".sinks"))) {
      std::vector<float> b(static_cast<size_t>(p.w.numel()));
      for (size_t i = 0; i < b.size(); ++i) b[i] = 0.05f * static_cast<float>(static_cast<int64_t>(i * 37 % 11) - 5);
      if (p.w.dtype() == DType::DType_BF16) {
        std::vector<uint16_t> h(b.size());
        for (size_t i = 0; i < b.size(); ++i) h[i] = bf16_from_float(b[i]);
        be->copy_from_host(p.w.data(), h.data(), p.w.bytes());
      } else {
        be->copy_from_host(p.w.data(), b.data(), p.w.bytes());
      }
    }
  }
  StepRun r;
  const bool cpu = o.device == "cpu";
  r.out = step_forward_backward(model, batch, cpu ? &r.logits : nullptr);
  if (cpu)
    for (Param& q : model.params().all()) {
      std::vector<float> g(static_cast<size_t>(q.g.numel()));
      if (q.g.dtype() == DType::DType_BF16) {
        std::vector<uint16_t> h(g.size());
        be->copy_to_host(h.data(), q.g.data(), q.g.bytes());
        for (size_t i = 0; i < g.size(); ++i) g[i] = bf16_to_float(h[i]);
      } else {
        be->copy_to_host(g.data(), q.g.data(), q.g.bytes());
      }
      r.grads.push_back(std::move(g));
    }
  r.act_peak = be->device_ledger().peak(Category::Category_activations);
  r.events = be->device_ledger().events();
  return r;
}

Options tiled(int64_t tile, int64_t chunk = 0) {
  Options o;
  o.layer_tile = tile;
  o.token_chunk = chunk;
  return o;
}

double worst_grad(const StepRun& a, const StepRun& b) {
  EXPECT_EQ(a.grads.size(), b.grads.size());
  double worst = 0;
  for (size_t i = 0; i < a.grads.size() && i < b.grads.size(); ++i)
    worst = std::max(worst, norm_rel(a.grads[i], b.grads[i]));
  return worst;
}

// The gradients' tolerance (Note [Tolerances from an error model] in tests/common/error_bound.h): tiles
// reorder sums of up to n x heads terms (the norms' and biases' weight gradients, over every token and
// head), and small gradients of such sums cancel; 1e-6 norm-relative held on this data (worst 1.1e-6 on
// one 16-element bias), so the bound is the larger of 1e-6 and twice gamma(n x heads).
double grad_tolerance(const ModelConfig& m, const Batch& b) {
  return std::max(1e-6, 2 * test_bound::gamma(static_cast<double>(b.B * b.T * m.num_attention_heads)));
}

void expect_same_function(const StepRun& t, const StepRun& whole, double tol, double grad_tol) {
  EXPECT_NEAR(t.out.loss, whole.out.loss, tol * std::fabs(whole.out.loss));
  EXPECT_NEAR(t.out.aux_loss, whole.out.aux_loss, tol * std::fabs(whole.out.aux_loss) + 1e-12);
  EXPECT_EQ(t.out.expert_counts, whole.out.expert_counts);
  EXPECT_LE(norm_rel(t.logits, whole.logits), tol);
  EXPECT_LE(worst_grad(t, whole), grad_tol);
}

}  // namespace

TEST(LayerTiles, TiledStepMatchesWholeLayers) {
  // 2 sequences of 48: tiles of 8 and 16 tokens cut each sequence into pieces (20 takes 16, the longest
  // divisor of 48 not above it), 48 is one sequence a tile, 96 the whole step.
  const Batch batch = batch_random(2, 48, 50, 8);
  for (const ModelConfig& m :
       {qwen_config(), switched_config(), gpt_oss_config(), deepseek_config(true), deepseek_config(false)}) {
    SCOPED_TRACE(name_of(m));
    const StepRun whole = run(m, batch, {});
    for (int64_t tile : {8, 16, 20, 48}) {
      SCOPED_TRACE(tile);
      const StepRun t = run(m, batch, tiled(tile));
      expect_same_function(t, whole, 1e-6, grad_tolerance(m, batch));
      EXPECT_LT(t.act_peak, whole.act_peak) << "a layer's token-wise tensors are bounded by the tile";
    }
    // The MoE token side in chunks of 7 inside tiles of 16.
    expect_same_function(run(m, batch, tiled(16, 7)), whole, 1e-6, grad_tolerance(m, batch));
    const StepRun one = run(m, batch, tiled(96));
    EXPECT_EQ(one.out.loss, whole.out.loss);
    EXPECT_EQ(one.logits, whole.logits);
    EXPECT_EQ(one.grads, whole.grads);
  }
}

TEST(LayerTiles, ShorterLastTiles) {
  // 3 sequences of 47: pieces of 10 end with one of 7; groups of 2 sequences end with one of 1.
  const Batch batch = batch_random(3, 47, 50, 4);
  for (const ModelConfig& m : {switched_config(), deepseek_config(true)}) {
    SCOPED_TRACE(name_of(m));
    const StepRun whole = run(m, batch, {});
    for (int64_t tile : {10, 94}) {
      SCOPED_TRACE(tile);
      expect_same_function(run(m, batch, tiled(tile, 6)), whole, 1e-6, grad_tolerance(m, batch));
    }
  }
}

TEST(LayerTiles, PackedDocumentsInTiles) {
  // Documents end inside tiles and on their edges: a tile's queries see only their document's keys, which
  // may lie in earlier tiles.
  Batch batch = batch_random(2, 48, 50, 9);
  constexpr int32_t kEos = 3;
  for (int32_t& t : batch.tokens)
    if (t == kEos) t = kEos + 1;
  for (const auto& [b, t] : {std::pair{0, 5}, {0, 15}, {0, 16}, {0, 40}, {1, 23}}) {
    batch.tokens[b * batch.T + t] = kEos;
    batch.targets[b * batch.T + t - 1] = kEos;
  }
  batch_documents_from_eos(batch, kEos);
  for (ModelConfig m : {qwen_config(), deepseek_config(true)}) {
    SCOPED_TRACE(name_of(m));
    m.router_aux_loss_coef = 0;
    const StepRun whole = run(m, batch, {});
    for (int64_t tile : {8, 16})
      expect_same_function(run(m, batch, tiled(tile)), whole, 1e-6, grad_tolerance(m, batch));
  }
}

TEST(LayerTiles, Bf16TilesMatchWholeLayers) {
  // bf16: the forward's arithmetic is the whole layer's, op for op (the GEMMs on a tile's rows), so the loss
  // agrees to f32 rounding; the bf16 gradients of the weights accumulate per tile (one bf16 rounding per
  // tile instead of one): within 4 x tiles x 2^-8 norm-relative.
  const Batch batch = batch_random(2, 48, 50, 8);
  Options o;
  o.precision = precision_recipe("bf16");
  for (const ModelConfig& m : {qwen_config(), gpt_oss_config(), deepseek_config(true)}) {
    SCOPED_TRACE(name_of(m));
    o.layer_tile = 0;
    const StepRun whole = run(m, batch, o);
    o.layer_tile = 16;
    const StepRun t = run(m, batch, o);
    EXPECT_NEAR(t.out.loss, whole.out.loss, 1e-5 * std::fabs(whole.out.loss));
    EXPECT_LE(worst_grad(t, whole), 4.0 * 6 / 256);
    EXPECT_LE(norm_rel(t.logits, whole.logits), 1e-5);
  }
}

TEST(LayerTiles, MetaAllocatesAsCpu) {
  // Under a profile each tile is routed as the step's tokens; a shorter last tile (47 = 4 x 10 + 7) afresh
  // (StepContext::profile_n), on meta in closed form.
  const Batch batch = batch_random(2, 47, 50, 8);
  for (const auto& [prof, m] : {std::pair{"balanced", switched_config()},
                                {"hot:0.9:2", switched_config()},
                                {"balanced", gpt_oss_config()},
                                {"balanced", deepseek_config(true)}}) {
    SCOPED_TRACE(::testing::Message() << prof << " " << model_type_name(m.model_type));
    Options o = tiled(10, 6);
    o.profile = routing_profile_parse(prof);
    const StepRun cpu = run(m, batch, o);
    o.device = "meta";
    const StepRun meta = run(m, batch, o);
    ASSERT_EQ(cpu.events.size(), meta.events.size());
    for (size_t j = 0; j < cpu.events.size(); ++j) {
      ASSERT_EQ(cpu.events[j].tag, meta.events[j].tag) << "event " << j;
      ASSERT_EQ(cpu.events[j].bytes, meta.events[j].bytes) << "event " << j << " " << cpu.events[j].tag;
    }
    EXPECT_EQ(cpu.out.expert_counts, meta.out.expert_counts);
  }
}

TEST(LayerTiles, KeptLayersInTilesAreRefusedByName) {
  auto refused = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // Kept layers are whole.
  Schedules s;
  s.ckpt.layer_tile = 8;
  s.ckpt.recompute = false;
  refused([&] { schedules_validate(s, "test"); }, "ckpt.layer_tile = 8 needs ckpt.recompute = true");
}

}  // namespace fp
