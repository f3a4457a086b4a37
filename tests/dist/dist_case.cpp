// One forward+backward of a small model on W ranks (run under mpirun, or alone for W = 1): every rank
// takes its zig-zag piece of the same global batch; the dense parameters are sharded FSDP-style
// (model/params.h), so every gradient is gathered whole to rank 0, which writes the loss and every
// parameter gradient to a safetensors file, for dist_check.py to compare across W, with each rank's
// ledger figures: out.ledger (W, 4) i64 = current params bytes after the step, peak params, peak
// grads, current grads.
//
//   dist_case OUT.safetensors [plain|hf_layers|hf_layers_flat|deepseek|deepseek_flat]
// hf_layers turns on every switch of the Hugging Face layer: attention biases, a sliding window shorter
// than the sequence (so some ring hops carry blocks outside every query's window), tied embeddings (one
// parameter in two FSDP units), and a dense layer. hf_layers_flat runs that model with the flattened
// schedules: Ring-DTP (the tied head reads the embedding's own shard), SCO and PipelinedLLEP. deepseek is
// DeepSeek-V3's layer (multi-head latent attention on the ring, the sigmoid router with a nonzero routing
// bias choosing within 2 of 4 groups, a shared expert, a dense first layer); deepseek_flat runs it with
// the flattened schedules. The suffix _llep takes the LLEP dispatch, _chunked runs the MoE block's token
// side in chunks of 37 of a rank's tokens (Note [The MoE token side in chunks]). _bf16 runs the bf16
// recipe (gradients written widened to F32) with the balanced routing profile: with the router
// choosing, a bf16 rounding that differs between W flips a token's top-k and moves whole rows between
// experts, which no tolerance covers. _docs packs documents into the batch: EOS tokens at fixed positions
// cut each sequence (Note [Documents from EOS], data/documents.h), so attention, RoPE and the loss follow
// the boundaries on every rank of the ring. _balanced deals the window to the ranks by attention work
// (Note [Balanced rings], data/context_split.h) instead of zig-zag. _dp2 runs 2 data-parallel replicas of W/2
// context-parallel ranks (Note [A device mesh] in train/trainer.cpp), each replica one sequence of the batch.
// gptoss is gpt-oss's layer (sinks, alternating sliding and full attention, biases everywhere, the clamped
// SwiGLU); gptoss_flat runs it with the flattened schedules.
// _tiled (last) runs every layer in tiles of 25 of a rank's tokens (Note [Sequence-tiled layers] in
// model/layer_tiles.cpp): each tile's queries run their own ring.
#include <cstdio>

#include "../common/gathered_grads.h"
#include "backend/backend.h"
#include "comm/comm.h"
#include "core/units.h"
#include "data/context_split.h"
#include "data/documents.h"
#include "data/recall_task.h"
#include "io/safetensors.h"
#include "step/step.h"

using namespace fp;

int main(int argc, char** argv) {
  std::string variant = argc == 3 ? argv[2] : "plain";
  // Suffixes: _llep (the LLEP dispatch), _chunked (the MoE token side in chunks of 37 tokens).
  auto suffix = [&](const std::string& x) {
    const bool has = variant.size() > x.size() && variant.ends_with(x);
    if (has) variant.resize(variant.size() - x.size());
    return has;
  };
  const bool tiled = suffix("_tiled");
  const bool dp2 = suffix("_dp2");
  const bool balanced = suffix("_balanced");
  const bool docs = suffix("_docs");
  const bool bf16 = suffix("_bf16");
  const bool chunked = suffix("_chunked"), llep = suffix("_llep");
  const bool deepseek = variant == "deepseek" || variant == "deepseek_flat";
  const bool gpt_oss = variant == "gptoss" || variant == "gptoss_flat";
  if ((argc != 2 && argc != 3) ||
      (variant != "plain" && variant != "hf_layers" && variant != "hf_layers_flat" && !deepseek && !gpt_oss)) {
    std::fprintf(stderr,
                 "usage: dist_case OUT.safetensors "
                 "[plain|hf_layers|hf_layers_flat|deepseek|deepseek_flat|gptoss|gptoss_flat]"
                 "[_llep][_chunked][_bf16][_docs][_balanced][_dp2][_tiled]\n");
    return 2;
  }
  Comm& comm = comm_world();
  try {
    ModelConfig m;
    m.hidden_size = 32, m.num_hidden_layers = 2, m.num_attention_heads = 4, m.num_key_value_heads = 2;
    m.head_dim = 8, m.num_experts = 8, m.num_experts_per_tok = 2, m.moe_intermediate_size = 24;
    // V = 66: not a multiple of 4, so the last ranks hold padding rows of embed_tokens and lm_head.
    m.vocab_size = 66, m.norm_topk_prob = true, m.router_aux_loss_coef = 0.02, m.rope_theta = 10000;
    m.rms_norm_eps = 1e-6, m.seed = 3;
    Schedules sched;
    if (variant == "hf_layers_flat" || variant == "deepseek_flat" || variant == "gptoss_flat") {
      sched.vocab.kind = VocabSchedule::Kind::Kind_ring;
      sched.vocab.block_tokens = 64;
      sched.ckpt.kind = CkptSchedule::Kind::Kind_sco;
      sched.dispatch.kind = DispatchSchedule::Kind::Kind_pipelined_llep;
      sched.dispatch.lambda = 1.0;  // plan on every layer
      sched.dispatch.min_tokens_per_gemm = 8;
      sched.dispatch.chunk_cap = 32;
    }
    if (llep) {
      sched.dispatch.kind = DispatchSchedule::Kind::Kind_llep;
      sched.dispatch.lambda = 1.0;
      sched.dispatch.min_tokens_per_gemm = 8;
    }
    if (chunked) sched.dispatch.token_chunk = 37;
    // Tiles of 25 tokens: pieces of each rank's 200 / W tokens per sequence (8, 4 and 2 tiles per sequence).
    if (tiled) sched.ckpt.layer_tile = 25;
    if (deepseek) {
      m.model_type = ModelType::ModelType_deepseek_v3;
      m.num_hidden_layers = 3, m.num_key_value_heads = 4, m.q_lora_rank = 16, m.kv_lora_rank = 12;
      m.qk_nope_head_dim = 8, m.qk_rope_head_dim = 8, m.v_head_dim = 6, m.head_dim = 8, m.rope_interleave = true;
      m.first_k_dense_replace = 1, m.intermediate_size = 20, m.n_shared_experts = 1;
      m.n_group = 4, m.topk_group = 2, m.routed_scaling_factor = 2.5, m.router_aux_loss_coef = 0;
    } else if (gpt_oss) {
      // gpt-oss's layer: sinks (on every rank's queries of the ring, their gradient summed by the FSDP
      // reduce), a sliding layer between full ones, biases on q/k/v/o, the router and every expert (moving
      // with LLEP's weights), the clamped SwiGLU with a limit the activations cross.
      m.model_type = ModelType::ModelType_gpt_oss;
      m.num_hidden_layers = 3, m.attention_bias = true, m.sliding_window = 45, m.rms_norm_eps = 1e-5;
      m.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
      m.swiglu_alpha = 1.702, m.swiglu_limit = 0.02;
    } else if (variant != "plain") {
      m.num_hidden_layers = 3, m.mlp_only_layers = {1}, m.intermediate_size = 20;
      m.attention_bias = true, m.tie_word_embeddings = true, m.sliding_window = 45;
    }
    RecallTaskConfig rc;
    rc.vocab_size = m.vocab_size, rc.seq_len = 200, rc.pairs = 2, rc.seed = 4, rc.loss_on = LossOn::LossOn_all;
    auto be = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
    Model model(m, *be, RoutingProfile{}, sched, precision_recipe(bf16 ? "bf16" : "fp32"), &comm);
    model.init_weights(m.seed);
    // Larger q/k weights: attention far from uniform, so the ring's merge is really exercised.
    // (Each rank scales its own rows: the same weights for any W.)
    // Biases start at zero: give them small values (a v bias much larger than W_v x makes every value
    // alike, and the q/k gradients then fall to 1e-7, where W changes their rounding at 1e-4) (the same for any W: each rank fills its rows by index).
    for (Param& p : model.params().all()) {
      if (p.name.find("q_proj.weight") != std::string::npos || p.name.find("k_proj.weight") != std::string::npos)
        be->kernels().scale_inplace(p.local_w().buf(), 10.0f, p.local_w().numel());
      if (p.name.ends_with(".bias") || p.name.ends_with("e_score_correction_bias")) {
        std::vector<float> b(static_cast<size_t>(p.local_w().numel()));
        for (size_t i = 0; i < b.size(); ++i)
          b[i] = 0.02f * static_cast<float>(((p.block.row0 + static_cast<int64_t>(i)) * 37 % 11) - 5);
        if (p.local_w().dtype() == DType::DType_BF16) {
          std::vector<uint16_t> h(b.size());
          for (size_t i = 0; i < b.size(); ++i) h[i] = bf16_from_float(b[i]);
          be->copy_from_host(p.local_w().data(), h.data(), p.local_w().bytes());
        } else {
          be->copy_from_host(p.local_w().data(), b.data(), p.local_w().bytes());
        }
      }
    }
    Batch global = recall_batch(rc, 0, 2, nullptr);
    if (docs) {
      // Documents end at 30, 31 (a one-token document), 95 and 150 in the first sequence, 120 in the
      // second: boundaries inside zig-zag chunks and on their edges (C = 25 at W = 4).
      const int32_t eos = static_cast<int32_t>(m.vocab_size - 1);
      for (const auto& [b, t] : {std::pair{0, 30}, {0, 31}, {0, 95}, {0, 150}, {1, 120}}) {
        global.tokens[b * global.T + t] = eos;
        global.targets[b * global.T + t - 1] = eos;
      }
      batch_documents_from_eos(global, eos);
    }
    // Note [A device mesh]: dp replicas of cp ranks, each replica its rows of the global batch.
    const int dp = dp2 ? 2 : 1, cp = comm.size() / dp;
    model.set_context_parallel(cp);
    const int64_t rows = global.B / dp;
    Batch local = context_slice(batch_rows(global, (comm.rank() / cp) * rows, rows), comm.rank() % cp, cp,
                                balanced ? ContextSplit::ContextSplit_balanced : ContextSplit::ContextSplit_zigzag,
                                m.sliding_window);
    be->device_ledger().peaks_reset();
    StepOutputs out = step_forward_backward(model, local);
    const Ledger& led = be->device_ledger();
    int64_t mine[4] = {static_cast<int64_t>(led.current(Category::Category_params)),
                       static_cast<int64_t>(led.peak(Category::Category_params)),
                       static_cast<int64_t>(led.peak(Category::Category_grads)),
                       static_cast<int64_t>(led.current(Category::Category_grads))};
    std::vector<int64_t> ledger(static_cast<size_t>(4 * comm.size()));
    comm.all_gather(mine, ledger.data(), 4, DType::DType_I64);
    std::vector<std::vector<float>> host = grads_gathered(model.params(), comm.rank());  // collective
    std::vector<SafetensorsView> views;
    for (size_t i = 0; i < host.size(); ++i) {
      const ParamInfo& p = model.params().layout()[i];
      views.push_back({"grad." + p.name, DType::DType_F32, p.shape, host[i].data()});
    }
    if (comm.rank() == 0) {
      double losses[3] = {out.loss, out.ce_loss, out.aux_loss};
      views.push_back({"out.losses", DType::DType_F64, {3}, losses});
      views.push_back({"out.ledger", DType::DType_I64, {comm.size(), 4}, ledger.data()});
      safetensors_write(argv[1], views,
                        {{"ranks", std::to_string(comm.size())}, {"tied", m.tie_word_embeddings ? "1" : "0"}});
      std::printf("W=%d loss %.9f (ce %.9f, aux %.9f)\n", comm.size(), out.loss, out.ce_loss, out.aux_loss);
    }
    comm.barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error [rank %d]: %s\n", comm.rank(), e.what());
    comm.abort(1);
  }
}
