// Writes a model test case for the PyTorch twin (check_case.py): the weights, a batch, and what
// flatpeak computes for it (logits, losses, every parameter gradient), as one safetensors file.
//
//   dump_case OUT.safetensors CASE [bf16]   CASE: "gqa_norm" | "mha_nonorm" | "hf_layers" | "yarn" | "mla" | "mla_yarn"
//                                           | "gptoss" | "gptoss_yarn"
//
// bf16: the model in precision_recipe("bf16") (bf16 weights, activations and gradients). The weights are
// the fp32 case's, each rounded once to bf16 (built from an fp32 model's init: a bf16 model's own init is
// rounded already), and the file holds the rounded values (as F32, like every float tensor here: the
// gradients widened), so the twin computes on exactly the weights flatpeak used. DeepSeek-V3's routing
// bias stays f32 (Note [Parameters kept in f32] in model/params.h), and its router weights are 1.5 times
// the fp32 case's (Note [A bf16 DeepSeek case away from ties]).
// The metadata "precision" says which recipe ran ("fp32" or "bf16"); check_case.py reads it.
//
// Every case uses sequences that span several attention tiles, top-k > 1, and arranges that the last
// expert of every MoE layer receives no token (Note [An expert with no tokens]). hf_layers has every
// switch of the Hugging Face layer on: attention biases, a sliding window that is not a multiple of the
// attention tile, tied embeddings, dense layers from both mlp_only_layers and decoder_sparse_step, and
// dynamic NTK RoPE active at its sequence length. yarn is gqa_norm with YaRN RoPE past its original
// context, DeepSeek's mscale pair making the attention factor (the cos/sin scale) differ from 1.
// mla is DeepSeek-V3's layer (model_type deepseek_v3): multi-head latent attention with a query latent and
// interleaved RoPE, the sigmoid router with a nonzero e_score_correction_bias choosing within 2 of 4 expert
// groups, routed_scaling_factor, a shared expert and a dense first layer. mla_yarn: no query latent,
// rotate-half RoPE, one group, no renormalisation, YaRN with mscale_all_dim (the softmax scale's mscale^2).
// gptoss is GptOssForCausalLM (model_type gpt_oss): attention sinks, layer_types mixing a sliding window
// with full attention, biases everywhere, the router's bias and the clamped SwiGLU with its clamps
// reached; gptoss_yarn adds gpt-oss's YaRN (truncate = false).
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "bench/bench_common.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/units.h"
#include "data/documents.h"
#include "data/random_batch.h"
#include "io/safetensors.h"
#include "step/step.h"

using namespace fp;

namespace {

struct Case {
  ModelConfig m;
  int64_t B, T;
  bool docs = false;  // packed documents (Note [Documents from EOS]): EOS at fixed positions cuts the batch
};

Case case_make(std::string name) {
  Case c;
  // <case>_docs: the case with packed documents; gqa_window: gqa_norm with a sliding window of 20.
  if (name.ends_with("_docs")) {
    c.docs = true;
    name.resize(name.size() - 5);
  }
  ModelConfig& m = c.m;
  m.rope_theta = 10000;
  m.rms_norm_eps = 1e-6;
  m.seed = 11;
  if (name == "gqa_norm" || name == "gqa_window") {
    m.hidden_size = 32, m.num_hidden_layers = 2, m.num_attention_heads = 4, m.num_key_value_heads = 2;
    m.head_dim = 8, m.num_experts = 6, m.num_experts_per_tok = 2, m.moe_intermediate_size = 24;
    m.vocab_size = 40, m.norm_topk_prob = true, m.router_aux_loss_coef = 0.05;
    if (name == "gqa_window") m.sliding_window = 20, m.attention_bias = true;
    c.B = 2, c.T = 150;
  } else if (name == "mha_nonorm") {
    m.hidden_size = 24, m.num_hidden_layers = 3, m.num_attention_heads = 3, m.num_key_value_heads = 3;
    m.head_dim = 6, m.num_experts = 5, m.num_experts_per_tok = 3, m.moe_intermediate_size = 10;
    m.vocab_size = 33, m.norm_topk_prob = false, m.router_aux_loss_coef = 0.1, m.rope_theta = 500;
    c.B = 1, c.T = 131;
  } else if (name == "yarn") {
    m.hidden_size = 32, m.num_hidden_layers = 2, m.num_attention_heads = 4, m.num_key_value_heads = 2;
    m.head_dim = 8, m.num_experts = 6, m.num_experts_per_tok = 2, m.moe_intermediate_size = 24;
    m.vocab_size = 40, m.norm_topk_prob = true, m.router_aux_loss_coef = 0.05;
    m.rope_scaling.kind = RopeScaling::Kind::Kind_yarn;
    m.rope_scaling.factor = 4.0, m.rope_scaling.original_max_position_embeddings = 64;
    m.rope_scaling.mscale = 1.0, m.rope_scaling.mscale_all_dim = 0.5;
    c.B = 2, c.T = 150;
  } else if (name == "hf_layers") {
    m.hidden_size = 32, m.num_hidden_layers = 4, m.num_attention_heads = 4, m.num_key_value_heads = 2;
    m.head_dim = 8, m.num_experts = 6, m.num_experts_per_tok = 2, m.moe_intermediate_size = 24;
    m.vocab_size = 40, m.norm_topk_prob = true, m.router_aux_loss_coef = 0.05;
    m.attention_bias = true, m.tie_word_embeddings = true, m.sliding_window = 70;
    m.mlp_only_layers = {0}, m.decoder_sparse_step = 2, m.intermediate_size = 20;  // layers 0, 2 dense
    // dynamic NTK RoPE past 100 positions: the base grows for T = 150
    m.rope_scaling.kind = RopeScaling::Kind::Kind_dynamic;
    m.rope_scaling.factor = 2.0, m.rope_scaling.original_max_position_embeddings = 100;
    c.B = 2, c.T = 150;
  } else if (name == "mla" || name == "mla_yarn") {
    m.model_type = ModelType::ModelType_deepseek_v3;
    m.hidden_size = 32, m.num_hidden_layers = 3, m.num_attention_heads = 4, m.num_key_value_heads = 4;
    m.kv_lora_rank = 12, m.qk_nope_head_dim = 6, m.qk_rope_head_dim = 4, m.v_head_dim = 5;
    m.head_dim = m.qk_rope_head_dim;
    m.num_experts = 8, m.num_experts_per_tok = 2, m.moe_intermediate_size = 12, m.vocab_size = 40;
    m.router_aux_loss_coef = 0;
    if (name == "mla") {
      m.q_lora_rank = 10, m.rope_interleave = true, m.n_group = 4, m.topk_group = 2, m.norm_topk_prob = true;
      m.routed_scaling_factor = 2.5, m.n_shared_experts = 1, m.first_k_dense_replace = 1, m.intermediate_size = 20;
    } else {
      m.q_lora_rank = 0, m.rope_interleave = false, m.norm_topk_prob = false, m.routed_scaling_factor = 1.5;
      m.n_shared_experts = 2;
      m.rope_scaling.kind = RopeScaling::Kind::Kind_yarn;
      m.rope_scaling.factor = 4.0, m.rope_scaling.original_max_position_embeddings = 64;
      m.rope_scaling.mscale = 1.0, m.rope_scaling.mscale_all_dim = 1.0;
    }
    c.B = 2, c.T = 150;
  } else if (name == "gptoss" || name == "gptoss_yarn") {
    // GptOssForCausalLM: sinks, a sliding layer between full ones (window 20 < T, not a multiple of the
    // attention tile), q/k/v/o biases, the router's bias, expert biases and the clamped SwiGLU with a
    // limit the case's activations cross (gate and up both clamped on a share of the rows).
    m.model_type = ModelType::ModelType_gpt_oss;
    m.hidden_size = 32, m.num_hidden_layers = 3, m.num_attention_heads = 4, m.num_key_value_heads = 2;
    m.head_dim = 8, m.num_experts = 6, m.num_experts_per_tok = 2, m.moe_intermediate_size = 24;
    m.vocab_size = 40, m.norm_topk_prob = true, m.router_aux_loss_coef = 0.05, m.rms_norm_eps = 1e-5;
    m.attention_bias = true, m.sliding_window = 20;
    m.layer_types = {"full_attention", "sliding_attention", "full_attention"};
    m.swiglu_alpha = 1.702, m.swiglu_limit = 0.15;
    if (name == "gptoss_yarn") {  // gpt-oss's own RoPE: YaRN without truncation, past its original context
      m.rope_scaling.kind = RopeScaling::Kind::Kind_yarn;
      m.rope_scaling.factor = 4.0, m.rope_scaling.original_max_position_embeddings = 64;
      m.rope_scaling.beta_fast = 32, m.rope_scaling.beta_slow = 1, m.rope_scaling.truncate = false;
      m.rope_theta = 150000;
      // The last layer full: a sliding layer's key bias moves its scores only through the rotations of
      // RoPE across the window's 20 keys (softmax is shift-invariant), so its gradient is a cancelling sum,
      // ~1e-6 of the others at the YaRN frequencies, whose float error no relative bound of 1e-5 holds. The
      // gptoss case keeps a sliding middle layer at default RoPE.
      m.layer_types = {"sliding_attention", "full_attention", "full_attention"};
    }
    c.B = 2, c.T = 150;
  } else {
    throw Error("unknown case '" + name + "'",
                "cases: gqa_norm, gqa_window, mha_nonorm, hf_layers, yarn, mla, mla_yarn, gptoss, gptoss_yarn, each "
                "with _docs");
  }
  return c;
}

// t (f32 or bf16) widened to f32 on the host.
std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  bench::device_read_f32(be, t.cbuf(), t.numel(), v.data());
  return v;
}

// t (f32 or bf16) = v, each value rounded to nearest even for a bf16 t.
void from_host(Backend& be, Tensor& t, const std::vector<float>& v) {
  if (t.dtype() != DType::DType_BF16) {
    be.copy_from_host(t.data(), v.data(), t.bytes());
    return;
  }
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = bf16_from_float(v[i]);
  be.copy_from_host(t.data(), h.data(), t.bytes());
}

}  // namespace

int main(int argc, char** argv) {
  const bool bf16 = argc == 4 && std::string(argv[3]) == "bf16";
  if (argc != 3 && !bf16) {
    std::fprintf(stderr, "usage: dump_case OUT.safetensors CASE[_docs] [bf16]\n");
    return 2;
  }
  try {
    Case c = case_make(argv[2]);
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(c.m, *be, RoutingProfile{}, Schedules{}, precision_recipe(bf16 ? "bf16" : "fp32"));
    model.init_weights(c.m.seed);
    ParamStore& ps = model.params();
    std::unique_ptr<Model> init_f32;  // bf16: the fp32 model's init, the values the bf16 weights round
    if (bf16) {
      init_f32 = std::make_unique<Model>(c.m, *be, RoutingProfile{});
      init_f32->init_weights(c.m.seed);
    }
    // Norm weights away from 1 so a missing multiplication cannot hide; larger router weights so the
    // top-k choice is far from ties; embeddings ~ N(0, 1) and q/k projections ~ N(0, 0.2) so that
    // attention is far from uniform (at the 0.02 initialisation every score is nearly equal and the
    // q/k gradients are tiny differences of large terms, which tests fp32 cancellation, not the model).
    // Note [An expert with no tokens]: every embedding gets +3 in dimension 0, which therefore stays
    // positive through the residual stream, and the last expert's router row gets -8 there: its
    // logit is always the lowest, so it is never among the top k < E.
    Rng rng(99);
    for (size_t i = 0; i < ps.all().size(); ++i) {
      Param& p = ps.all()[i];
      std::vector<float> w = to_host(*be, init_f32 ? init_f32->params().all()[i].w : p.w);
      const bool bias = p.name.ends_with(".bias");  // ~ N(0, 0.3): a constant q/k offset would make
                                                    // every query alike (the q/k gradients cancel)
      // DeepSeek's routing bias ~ N(0, 0.1): it moves the choice (the sigmoid scores lie in (0, 1)).
      const bool route_bias = p.name.ends_with("e_score_correction_bias");
      const bool sinks = p.name.ends_with(".sinks");  // gpt_oss: ~ N(0, 1.5), some rows' sink dominates
      const bool norm = p.w.shape().rank == 1 && !bias && !route_bias && !sinks;
      const bool router =
          p.name.find("mlp.gate.weight") != std::string::npos || p.name.find("mlp.router.weight") != std::string::npos;
      const bool qk = p.name.find("q_proj") != std::string::npos || p.name.find("k_proj") != std::string::npos ||
                      p.name.find("q_b_proj") != std::string::npos || p.name.find("kv_b_proj") != std::string::npos ||
                      p.name.find("kv_a_proj") != std::string::npos;
      const bool embed = p.name == "model.embed_tokens.weight";
      // Note [A bf16 DeepSeek case away from ties]: flatpeak and the bf16 twin route on the same rounded
      // h2, so their choices differ only where a top-k margin is within the f32 noise of the router's
      // GEMM (~1e-7 of a score). With the fp32 case's router the mla case's smallest margin of the choice
      // scores was 3.1e-6 (layer 2; check_case.py flags it as near a tie), some 30x that noise, against 2e-3 and
      // 3.4e-4 for the fp32 mla and mla_yarn cases; the bf16 variants take the router weights 1.5 times
      // larger, which puts the smallest margins at 5.7e-4 (mla) and 1.1e-4 (mla_yarn). The fp32 cases
      // are unchanged.
      const float router_scale = bf16 && c.m.is_deepseek() ? 1.5f : 1.0f;
      for (float& x : w) {
        if (norm) x = static_cast<float>(1.0 + 0.2 * rng.normal());
        if (bias) x = static_cast<float>(0.3 * rng.normal());
        if (router) x = static_cast<float>(0.5 * rng.normal()) * router_scale;
        if (route_bias) x = static_cast<float>(0.1 * rng.normal());
        if (sinks) x = static_cast<float>(1.5 * rng.normal());
        if (qk) x *= 10.0f;
        if (embed) x *= 50.0f;
      }
      if (p.name == "model.embed_tokens.weight")
        for (int64_t r = 0; r < c.m.vocab_size; ++r) w[r * c.m.hidden_size] += 3.0f;
      if (router) w[(c.m.num_experts - 1) * c.m.hidden_size] = -8.0f;
      if (route_bias) w[c.m.num_experts - 1] = -1.0f;  // the last expert's sigmoid score ~0 stays last
      if (p.name.ends_with("mlp.router.bias")) w[c.m.num_experts - 1] = -2.0f;  // gpt_oss: the last stays last
      if (p.name.ends_with("o_proj.bias")) w[0] = 0.5f;  // adds to dimension 0 of the residual: keeps it positive
      from_host(*be, p.w, w);
    }
    init_f32.reset();
    Batch batch = batch_random(c.B, c.T, c.m.vocab_size, 5);
    for (int64_t i = 0; i < c.B * c.T; i += 7) batch.targets[i] = -100;  // some ignored positions
    if (c.docs) {
      // Documents end at 20, 21 (one token), 63 and 100 of the first sequence, 64 and 127 of the others.
      const int32_t eos = static_cast<int32_t>(c.m.vocab_size - 1);
      for (int64_t b = 0; b < c.B; ++b)
        for (const int64_t t : b == 0 ? std::vector<int64_t>{20, 21, 63, 100} : std::vector<int64_t>{64, 127}) {
          batch.tokens[b * c.T + t] = eos;
          if (batch.targets[b * c.T + t - 1] != -100) batch.targets[b * c.T + t - 1] = eos;
        }
      batch_documents_from_eos(batch, eos);
    }
    std::vector<float> logits;
    StepOutputs out = step_forward_backward(model, batch, &logits);

    std::vector<std::vector<float>> keep;  // host copies backing the views
    std::vector<SafetensorsView> views;
    for (Param& p : ps.all()) {
      keep.push_back(to_host(*be, p.w));
      views.push_back({p.name, DType::DType_F32, p.w.shape(), keep.back().data()});
      keep.push_back(to_host(*be, p.g));
      views.push_back({"grad." + p.name, DType::DType_F32, p.g.shape(), keep.back().data()});
    }
    views.push_back({"input_ids", DType::DType_I32, {c.B, c.T}, batch.tokens.data()});
    views.push_back({"targets", DType::DType_I32, {c.B, c.T}, batch.targets.data()});
    if (c.docs) views.push_back({"doc_start", DType::DType_I32, {c.B, c.T}, batch.doc_start.data()});
    views.push_back({"out.logits", DType::DType_F32, {c.B, c.T, c.m.vocab_size}, logits.data()});
    float losses[3] = {static_cast<float>(out.loss), static_cast<float>(out.ce_loss),
                       static_cast<float>(out.aux_loss)};
    views.push_back({"out.loss", DType::DType_F32, {1}, &losses[0]});
    views.push_back({"out.ce_loss", DType::DType_F32, {1}, &losses[1]});
    views.push_back({"out.aux_loss", DType::DType_F32, {1}, &losses[2]});
    const std::string hf = model_config_hf_json(c.m);
    safetensors_write(argv[1], views, {{"config", hf}, {"precision", bf16 ? "bf16" : "fp32"}});
    int64_t empty = 0;  // over the MoE layers (a dense layer's counts are all zero)
    for (int64_t l = 0; l < c.m.num_hidden_layers; ++l)
      for (int64_t e = 0; e < c.m.num_experts && c.m.layer_is_sparse(l); ++e)
        empty += (out.expert_counts[l * c.m.num_experts + e] == 0);
    std::printf("wrote %s: loss %.6f (ce %.6f, aux %.6f), %lld empty (layer, expert) pairs\n", argv[1], out.loss,
                out.ce_loss, out.aux_loss, static_cast<long long>(empty));
    return empty > 0 ? 0 : 3;  // the case must contain an expert with no tokens
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
