// The key registry (Note [One key registry] in train/config_keys.h).
#include "train/config_keys.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "core/units.h"
#include "data/context_split.h"
#include "data/documents.h"
#include "model/hf_config.h"
#include "model/routing.h"
#include "train/toml_json.h"

namespace fp {

namespace {

constexpr const char* kConfigHint = "see configs/tiny.toml for a complete, commented example, or `flatpeak keys`";
constexpr uint32_t kTrainPlan = kKeyTrain | kKeyPlan;
constexpr int kConfigFormat = 2;  // config_json's: every key of the registry (1: an older flatpeak's subset)

using json = nlohmann::json;

// One line of doc for each [model] key (Hugging Face's names; model/config.h has the details).
const char* model_key_doc(std::string_view key) {
  static const std::pair<const char*, const char*> kDocs[] = {
      {"model_type", "\"qwen3_moe\" (default) or \"deepseek_v3\" (Note [Two architectures, one layer])"},
      {"hidden_size", "H, the width of the residual stream"},
      {"num_hidden_layers", "L, decoder layers"},
      {"num_attention_heads", "query heads"},
      {"num_key_value_heads", "key/value heads (grouped-query attention); MLA: equal to the query heads"},
      {"head_dim", "query/key/value head width; MLA: the RoPE width, may be left out"},
      {"num_experts", "E, routed experts per MoE layer"},
      {"num_experts_per_tok", "k, experts each token is routed to"},
      {"moe_intermediate_size", "I, each expert's SwiGLU width"},
      {"vocab_size", "V, the vocabulary"},
      {"rope_theta", "RoPE base"},
      {"rms_norm_eps", "epsilon of every RMSNorm"},
      {"norm_topk_prob", "renormalise the k routing weights to sum to 1"},
      {"router_aux_loss_coef", "the load-balancing loss's weight (qwen3_moe; 0 for deepseek_v3)"},
      {"attention_bias", "biases on q/k/v/o projections"},
      {"tie_word_embeddings", "lm_head is the embedding matrix"},
      {"sliding_window", "attention window in tokens (0: full causal)"},
      {"decoder_sparse_step", "every this many layers is a MoE layer (qwen3_moe)"},
      {"intermediate_size", "the dense layers' SwiGLU width"},
      {"q_lora_rank", "MLA: the query latent (0: none)"},
      {"kv_lora_rank", "MLA: the key/value latent"},
      {"qk_nope_head_dim", "MLA: the per-head query/key part without RoPE"},
      {"qk_rope_head_dim", "MLA: the RoPE part, one key shared by the heads"},
      {"v_head_dim", "MLA: value head width"},
      {"rope_interleave", "RoPE rotates adjacent pairs (2i, 2i+1)"},
      {"n_shared_experts", "deepseek_v3: shared experts on every token"},
      {"n_group", "deepseek_v3: expert groups of the group-limited top-k"},
      {"topk_group", "deepseek_v3: groups a token may pick its experts from"},
      {"routed_scaling_factor", "deepseek_v3: the routed experts' weights are multiplied by it"},
      {"first_k_dense_replace", "deepseek_v3: the first this many layers are dense"},
      {"mlp_only_layers", "qwen3_moe: dense layers by index, e.g. [0, 1]"},
      {"layer_types", "gpt_oss: each layer's attention, \"sliding_attention\" or \"full_attention\""},
      {"swiglu_alpha", "gpt_oss: the clamped SwiGLU's sigmoid gain (1.702)"},
      {"swiglu_limit", "gpt_oss: the clamped SwiGLU's limit on gate and up (7.0)"},
      {"rope_scaling", "Hugging Face's rope_scaling as an inline table, e.g. { rope_type = \"yarn\", factor = 4.0 }"},
      {"seed", "seeds the fresh weights"},
  };
  for (const auto& [k, d] : kDocs)
    if (key == k) return d;
  return "";
}

// Whether model key `key` belongs to the other architecture of m (then it stays at its default and is
// neither written nor compared).
bool model_key_foreign(const ModelConfig& m, std::string_view key) {
  const bool gpt_oss_key = model_key_gpt_oss_only(key) || key == "layer_types";
  if (m.is_deepseek())
    return key == "mlp_only_layers" || key == "decoder_sparse_step" || key == "sliding_window" || gpt_oss_key;
  if (m.is_gpt_oss())
    return key == "mlp_only_layers" || key == "decoder_sparse_step" || key == "intermediate_size" ||
           model_key_deepseek_only(key);
  return model_key_deepseek_only(key) || gpt_oss_key;
}

// The text a schedule setting takes (schedules_set parses it): strings raw, numbers and booleans as TOML.
std::string schedule_text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

ConfigKey schedule_key(const char* name, KeyType type, KeyEffect effect, uint32_t commands, const char* doc,
                       const char* alias, std::function<json(const Schedules&)> get) {
  ConfigKey k;
  k.name = name;
  k.type = type;
  k.effect = effect;
  k.commands = commands;
  k.doc = doc;
  if (*alias != '\0') k.aliases.push_back(alias);
  k.set = [name = std::string(name)](RunConfig& c, const json& v, const std::string& source) {
    schedules_set(c.schedules, name, schedule_text(v), source);
  };
  k.get = [get = std::move(get)](const RunConfig& c) { return get(c.schedules); };
  return k;
}

// A [precision] key: arithmetic, for train and plan, set through precision_key_set.
ConfigKey precision_key(const char* name, const char* doc, std::function<json(const Precision&)> get) {
  ConfigKey k;
  k.name = name;
  k.type = KeyType::KeyType_string;
  k.effect = KeyEffect::KeyEffect_arithmetic;
  k.commands = kTrainPlan;
  k.doc = doc;
  k.set = [name = std::string(name)](RunConfig& c, const json& v, const std::string& source) {
    precision_key_set(c.precision, name, v.get<std::string>(), source);
  };
  k.get = [get = std::move(get)](const RunConfig& c) { return get(c.precision); };
  return k;
}

template <class T>
ConfigKey plain_key(const char* name, KeyType type, KeyEffect effect, const char* doc, T RunConfig::*table, auto member,
                    std::function<void(const RunConfig&, const std::string&)> check = nullptr) {
  ConfigKey k;
  k.name = name;
  k.type = type;
  k.effect = effect;
  k.doc = doc;
  k.set = [table, member](RunConfig& c, const json& v, const std::string&) {
    auto& field = c.*table.*member;
    field = v.get<std::remove_reference_t<decltype(field)>>();
  };
  k.get = [table, member](const RunConfig& c) { return json(c.*table.*member); };
  k.check = std::move(check);
  return k;
}

std::vector<ConfigKey> registry_build() {
  using K = KeyType;
  constexpr KeyEffect kArith = KeyEffect::KeyEffect_arithmetic;
  constexpr KeyEffect kSched = KeyEffect::KeyEffect_schedule;
  constexpr KeyEffect kRun = KeyEffect::KeyEffect_run;
  std::vector<ConfigKey> keys;

  // [model]: Hugging Face's names. model_type first (the architecture decides which keys it reads).
  {
    ConfigKey k;
    k.name = "model.model_type";
    k.type = K::KeyType_string;
    k.doc = model_key_doc("model_type");
    k.set = [](RunConfig& c, const json& v, const std::string& source) {
      c.model.model_type = model_type_parse(v.get<std::string>(), fmt::format("{}: model.model_type", source));
    };
    k.get = [](const RunConfig& c) { return json(model_type_name(c.model.model_type)); };
    keys.push_back(std::move(k));
  }
  ModelConfig probe;
  model_keys_visit(probe, [&](const char* key, auto& member) {
    using T = std::remove_reference_t<decltype(member)>;
    ConfigKey k;
    k.name = std::string("model.") + key;
    k.type = std::is_same_v<T, int64_t>  ? K::KeyType_int
             : std::is_same_v<T, double> ? K::KeyType_float
                                         : K::KeyType_bool;
    // head_dim: required but under MLA, where it is the RoPE width (config_parse checks it).
    k.required = !model_key_optional(key) && std::string_view(key) != "head_dim";
    k.doc = model_key_doc(key);
    const std::string name = key;
    k.set = [name](RunConfig& c, const json& v, const std::string&) {
      model_keys_visit(c.model, [&](const char* kk, auto& m) {
        if (name == kk) m = v.get<std::remove_reference_t<decltype(m)>>();
      });
    };
    k.get = [name](const RunConfig& c) {
      json out;
      if (model_key_foreign(c.model, name)) return out;
      model_keys_visit(c.model, [&](const char* kk, const auto& m) {
        if (name == kk) out = m;
      });
      return out;
    };
    keys.push_back(std::move(k));
  });
  {
    ConfigKey k;
    k.name = "model.mlp_only_layers";
    k.type = K::KeyType_int_list;
    k.doc = model_key_doc("mlp_only_layers");
    k.set = [](RunConfig& c, const json& v, const std::string&) {
      c.model.mlp_only_layers = v.get<std::vector<int64_t>>();
    };
    k.get = [](const RunConfig& c) {
      return model_key_foreign(c.model, "mlp_only_layers") ? json() : json(c.model.mlp_only_layers);
    };
    keys.push_back(std::move(k));
  }
  {
    ConfigKey k;
    k.name = "model.layer_types";
    k.type = K::KeyType_string_list;
    k.doc = model_key_doc("layer_types");
    k.set = [](RunConfig& c, const json& v, const std::string&) {
      c.model.layer_types = v.get<std::vector<std::string>>();
    };
    k.get = [](const RunConfig& c) {
      return model_key_foreign(c.model, "layer_types") ? json() : json(c.model.layer_types);
    };
    keys.push_back(std::move(k));
  }
  {
    ConfigKey k;
    k.name = "model.rope_scaling";
    k.type = K::KeyType_table;
    k.doc = model_key_doc("rope_scaling");
    k.set = [](RunConfig& c, const json& v, const std::string&) {
      c.model.rope_scaling = rope_scaling_parse(v, "model.rope_scaling");
    };
    k.get = [](const RunConfig& c) { return rope_scaling_json(c.model.rope_scaling); };  // null: default RoPE
    keys.push_back(std::move(k));
  }
  {
    ConfigKey k;
    k.name = "model.seed";
    k.type = K::KeyType_int;
    k.required = true;
    k.effect = kRun;  // a resume takes the weights from the checkpoint: the seed made the first ones
    k.doc = model_key_doc("seed");
    k.set = [](RunConfig& c, const json& v, const std::string&) {
      c.model.seed = static_cast<uint64_t>(v.get<int64_t>());
    };
    k.get = [](const RunConfig& c) { return json(static_cast<int64_t>(c.model.seed)); };
    keys.push_back(std::move(k));
  }

  // [train]
  auto at_least = [](const char* name, int64_t lo) {
    return [name, lo](const RunConfig& c, const std::string& source) {
      const int64_t v = config_key_find(name)->get(c).get<int64_t>();
      if (lo == 0)
        FP_CHECK(v >= 0, kConfigHint, "{}: {} = {} must be >= 0", source, name, v);
      else
        FP_CHECK(v >= lo, kConfigHint, "{}: {} = {} must be at least {}", source, name, v, lo);
    };
  };
  keys.push_back(plain_key("train.batch_size", K::KeyType_int, kArith,
                           "sequences per micro-batch (over every rank); a step is train.grad_accum of them",
                           &RunConfig::train, &TrainConfig::batch_size, at_least("train.batch_size", 1)));
  keys.push_back(plain_key("train.seq_len", K::KeyType_int, kArith, "T, tokens per sequence", &RunConfig::train,
                           &TrainConfig::seq_len, at_least("train.seq_len", 2)));
  keys.back().required = true;
  keys.push_back(plain_key("train.steps", K::KeyType_int, kArith,
                           "the run's length and its learning-rate schedule's (--steps overrides it)",
                           &RunConfig::train, &TrainConfig::steps, at_least("train.steps", 1)));
  keys.push_back(plain_key("train.grad_accum", K::KeyType_int, kRun,
                           "micro-batches of batch_size sequences per optimizer step: a global batch of grad_accum x "
                           "batch_size sequences",
                           &RunConfig::train, &TrainConfig::grad_accum, at_least("train.grad_accum", 1)));
  keys.push_back(plain_key("train.checkpoint_every", K::KeyType_int, kRun,
                           "steps between checkpoints (0: only at the end)", &RunConfig::train,
                           &TrainConfig::checkpoint_every, at_least("train.checkpoint_every", 0)));
  keys.push_back(plain_key("train.keep_checkpoints", K::KeyType_int, kRun,
                           "the run's checkpoints kept on disk, newest first (>= 1; with 2 or more a damaged newest "
                           "one leaves an earlier one to resume from)",
                           &RunConfig::train, &TrainConfig::keep_checkpoints, at_least("train.keep_checkpoints", 1)));
  keys.push_back(plain_key("train.checkpoint_async", K::KeyType_bool, kRun,
                           "write checkpoints in the background from a host copy (rank 0 holds the checkpoint's "
                           "bytes) while the next steps run",
                           &RunConfig::train, &TrainConfig::checkpoint_async));
  keys.back().commands = kTrainPlan;  // the plan counts the host copy
  keys.back().aliases = {"checkpoint_async"};
  keys.push_back(plain_key(
      "train.loss_spike_factor", K::KeyType_float, kRun,
      "stop before the update when the loss exceeds this multiple of the recent median (0: off)", &RunConfig::train,
      &TrainConfig::loss_spike_factor, [](const RunConfig& c, const std::string& source) {
        FP_CHECK(c.train.loss_spike_factor == 0 || c.train.loss_spike_factor > 1, kConfigHint,
                 "{}: train.loss_spike_factor = {} must be 0 (off) or above 1", source, c.train.loss_spike_factor);
      }));
  keys.push_back(plain_key(
      "train.step_timeout", K::KeyType_float, kRun,
      "seconds a step (with its checkpoint) may take; past them the process ends with an error naming the step and "
      "the collective it waits in, exit 124 (0: off; flatpeak launch sets it)",
      &RunConfig::train, &TrainConfig::step_timeout, [](const RunConfig& c, const std::string& source) {
        FP_CHECK(c.train.step_timeout >= 0, kConfigHint,
                 "{}: train.step_timeout = {} must be 0 (off) or a number of seconds", source, c.train.step_timeout);
      }));

  // [optim]: AdamW's hyperparameters, then its schedule (OffloadStreamAdamW).
  auto optim_check = [](const char* name, auto ok, const char* rule) {
    return [name, ok, rule](const RunConfig& c, const std::string& source) {
      const double v = config_key_find(name)->get(c).template get<double>();
      FP_CHECK(ok(v), kConfigHint, "{}: {} = {} must {}", source, name, v, rule);
    };
  };
  keys.push_back(plain_key("optim.lr", K::KeyType_float, kArith, "peak learning rate", &RunConfig::optim,
                           &OptimConfig::lr,
                           optim_check(
                               "optim.lr", [](double v) { return std::isfinite(v) && v > 0; }, "be > 0")));
  keys.push_back(plain_key("optim.beta1", K::KeyType_float, kArith, "AdamW's first-moment decay", &RunConfig::optim,
                           &OptimConfig::beta1,
                           optim_check(
                               "optim.beta1", [](double v) { return v >= 0 && v < 1; }, "lie in [0, 1)")));
  keys.push_back(plain_key("optim.beta2", K::KeyType_float, kArith, "AdamW's second-moment decay", &RunConfig::optim,
                           &OptimConfig::beta2,
                           optim_check(
                               "optim.beta2", [](double v) { return v >= 0 && v < 1; }, "lie in [0, 1)")));
  keys.push_back(plain_key("optim.eps", K::KeyType_float, kArith, "AdamW's epsilon", &RunConfig::optim,
                           &OptimConfig::eps,
                           optim_check(
                               "optim.eps", [](double v) { return v > 0; }, "be > 0")));
  keys.push_back(plain_key("optim.weight_decay", K::KeyType_float, kArith, "decoupled weight decay", &RunConfig::optim,
                           &OptimConfig::weight_decay,
                           optim_check(
                               "optim.weight_decay", [](double v) { return v >= 0; }, "be >= 0")));
  keys.push_back(plain_key("optim.grad_clip", K::KeyType_float, kArith, "global gradient-norm clip (0: off)",
                           &RunConfig::optim, &OptimConfig::grad_clip,
                           optim_check(
                               "optim.grad_clip", [](double v) { return v >= 0; }, "be >= 0 (0: off)")));
  keys.push_back(plain_key("optim.warmup_steps", K::KeyType_int, kArith, "linear warmup steps before the cosine decay",
                           &RunConfig::optim, &OptimConfig::warmup_steps, at_least("optim.warmup_steps", 0)));
  keys.push_back(plain_key("optim.min_lr_ratio", K::KeyType_float, kArith,
                           "the cosine decay's floor, as a fraction of lr", &RunConfig::optim,
                           &OptimConfig::min_lr_ratio,
                           optim_check(
                               "optim.min_lr_ratio", [](double v) { return v >= 0 && v <= 1; }, "lie in [0, 1]")));
  keys.push_back(schedule_key("optim.schedule", K::KeyType_string, kSched, kTrainPlan,
                              "where AdamW's state lives: device | offload_serial | offload_stream (plan: also auto)",
                              "optim", [](const Schedules& s) { return json(schedule_name(s.optim.kind)); }));
  keys.push_back(schedule_key("optim.bucket_params", K::KeyType_int, kSched, kTrainPlan,
                              "offload_stream: parameters per bucket", "bucket_params",
                              [](const Schedules& s) { return json(s.optim.bucket_params); }));
  keys.push_back(schedule_key("optim.slots", K::KeyType_int, kSched, kTrainPlan, "offload_stream: staging slots",
                              "slots", [](const Schedules& s) { return json(s.optim.slots); }));
  keys.push_back(schedule_key("optim.update_on", K::KeyType_string, kSched, kTrainPlan,
                              "offload_stream: the update runs on the device or the host", "update_on",
                              [](const Schedules& s) { return json(update_on_name(s.optim)); }));

  // [data]
  {
    keys.push_back(plain_key("data.source", K::KeyType_string, kArith,
                             "\"recall\" (the built-in long-context task) or a token file's path", &RunConfig::data,
                             &DataConfig::source, [](const RunConfig& c, const std::string& source) {
                               FP_CHECK(!c.data.source.empty(), "write \"recall\" or the path of a token file",
                                        "{}: data.source is empty", source);
                             }));
    keys.push_back(
        plain_key("data.task", K::KeyType_string, kArith,
                  "recall: \"recall\" ([KEY, k, v] triples) or \"recall_packed\" (docs/data.md)", &RunConfig::data,
                  &DataConfig::task, [](const RunConfig& c, const std::string& source) {
                    FP_CHECK(c.data.task == "recall" || c.data.task == "recall_packed",
                             "write \"recall\" ([KEY, k, v] triples) or \"recall_packed\" (one pair token per plant); "
                             "docs/data.md",
                             "{}: data.task = \"{}\" is neither \"recall\" nor \"recall_packed\"", source, c.data.task);
                  }));
    keys.push_back(plain_key("data.pairs", K::KeyType_int, kArith,
                             "recall: key->value pairs per sequence (0: seq_len / 64)", &RunConfig::data,
                             &DataConfig::pairs, at_least("data.pairs", 0)));
    keys.push_back(
        plain_key("data.loss_on", K::KeyType_string, kArith, "recall: the loss on \"all\" positions or \"answers\"",
                  &RunConfig::data, &DataConfig::loss_on, [](const RunConfig& c, const std::string& source) {
                    FP_CHECK(c.data.loss_on == "all" || c.data.loss_on == "answers", "write \"all\" or \"answers\"",
                             "{}: data.loss_on = \"{}\" is neither \"all\" nor \"answers\"", source, c.data.loss_on);
                  }));
    ConfigKey docs = plain_key(
        "data.documents", K::KeyType_string, kArith,
        "token file: \"none\" (one stream), \"eos\" (documents end with data.eos_id) or \"index\" (FILE.docs of "
        "scripts/make_token_file.py); docs/data.md",
        &RunConfig::data, &DataConfig::documents, [](const RunConfig& c, const std::string& source) {
          documents_parse(c.data.documents, source + ": data.documents");
        });
    docs.commands |= kKeyEval;
    keys.push_back(std::move(docs));
    ConfigKey eos = plain_key("data.eos_id", K::KeyType_int, kArith,
                              "documents = \"eos\": the EOS token id (-1: --init-from's config.json eos_token_id)",
                              &RunConfig::data, &DataConfig::eos_id, [](const RunConfig& c, const std::string& source) {
                                FP_CHECK(c.data.eos_id >= -1 && c.data.eos_id < c.model.vocab_size, kConfigHint,
                                         "{}: data.eos_id = {} is not a token id below model.vocab_size = {} (or -1)",
                                         source, c.data.eos_id, c.model.vocab_size);
                              });
    eos.commands |= kKeyEval;
    keys.push_back(std::move(eos));
    keys.push_back(plain_key(
        "data.context_split", K::KeyType_string, kSched,
        "a window's tokens dealt to the ranks: \"zigzag\" (one causal sequence) or \"balanced\" (by attention work: "
        "packed documents; docs/data.md)",
        &RunConfig::data, &DataConfig::context_split, [](const RunConfig& c, const std::string& source) {
          context_split_parse(c.data.context_split, source + ": data.context_split");
        }));
    ConfigKey k;
    k.name = "data.seed";
    k.type = K::KeyType_int;
    k.doc = "seeds the data (the recall task's draws)";
    k.set = [](RunConfig& c, const json& v, const std::string&) {
      c.data.seed = static_cast<uint64_t>(v.get<int64_t>());
    };
    k.get = [](const RunConfig& c) { return json(static_cast<int64_t>(c.data.seed)); };
    keys.push_back(std::move(k));
  }

  // [parallel]
  keys.push_back(plain_key("parallel.dp", K::KeyType_int, kRun,
                           "data-parallel replicas, each reading its own train.batch_size sequences (W = dp x cp)",
                           &RunConfig::parallel, &ParallelConfig::dp, at_least("parallel.dp", 1)));
  keys.push_back(plain_key("parallel.cp", K::KeyType_int, kRun,
                           "context-parallel ranks per replica, sharing each sequence by ring attention (0: W / dp)",
                           &RunConfig::parallel, &ParallelConfig::cp, at_least("parallel.cp", 0)));
  keys.push_back(
      plain_key("parallel.ep", K::KeyType_int, kRun,
                "ranks per expert group, each group a replica of every expert (divides W and the experts; 0: W)",
                &RunConfig::parallel, &ParallelConfig::ep, at_least("parallel.ep", 0)));
  keys.push_back(plain_key("parallel.fsdp", K::KeyType_int, kRun,
                           "ranks per dense-shard group, replicated across groups (HSDP; divides W; 0: W, plain FSDP)",
                           &RunConfig::parallel, &ParallelConfig::fsdp, at_least("parallel.fsdp", 0)));

  // [eval]
  keys.push_back(plain_key("eval.data", K::KeyType_string, kRun,
                           "held-out token file evaluated while training (\"\": none; read as data.documents says)",
                           &RunConfig::eval, &EvalConfig::data));
  keys.push_back(plain_key("eval.every", K::KeyType_int, kRun,
                           "steps between held-out evaluations (0: only after the last step)", &RunConfig::eval,
                           &EvalConfig::every, at_least("eval.every", 0)));
  keys.push_back(plain_key("eval.batches", K::KeyType_int, kRun,
                           "batches of train.batch_size x train.seq_len per evaluation (0: the whole file once)",
                           &RunConfig::eval, &EvalConfig::batches, at_least("eval.batches", 0)));

  // [moe]
  {
    ConfigKey k;
    k.name = "moe.routing_profile";
    k.type = K::KeyType_string;
    k.commands = kTrainPlan;
    k.aliases = {"routing"};
    k.doc = "\"router\", or \"balanced\" / \"hot:R:H\" overriding the router (exact peaks on meta; model/routing.h)";
    k.set = [](RunConfig& c, const json& v, const std::string&) {
      c.moe.routing_profile = routing_profile_parse(v.get<std::string>());
    };
    k.get = [](const RunConfig& c) { return json(c.moe.routing_profile.str()); };
    keys.push_back(std::move(k));
  }
  keys.push_back(schedule_key("moe.dispatch", K::KeyType_string, kSched, kTrainPlan,
                              "expert dispatch with W > 1: standard | llep | pipelined_llep", "dispatch",
                              [](const Schedules& s) { return json(schedule_name(s.dispatch.kind)); }));
  {
    ConfigKey k;
    k.name = "moe.bias_update_rate";
    k.type = K::KeyType_float;
    k.doc = "deepseek_v3: the step of e_score_correction_bias per training step (0 freezes it)";
    k.set = [](RunConfig& c, const json& v, const std::string&) { c.moe.bias_update_rate = v.get<double>(); };
    // Only DeepSeek's sigmoid router has the bias: under another router the key is refused (config_parse).
    k.get = [](const RunConfig& c) { return c.model.router_sigmoid() ? json(c.moe.bias_update_rate) : json(); };
    k.check = [](const RunConfig& c, const std::string& source) {
      FP_CHECK(std::isfinite(c.moe.bias_update_rate) && c.moe.bias_update_rate >= 0,
               "the step of e_score_correction_bias per training step (Note [Sigmoid routing]); 0 freezes it",
               "{}: moe.bias_update_rate = {} must be >= 0", source, c.moe.bias_update_rate);
    };
    keys.push_back(std::move(k));
  }
  keys.push_back(schedule_key("moe.token_chunk", K::KeyType_int, kSched, kTrainPlan,
                              "the MoE block's token side in chunks of this many of a rank's tokens (0: whole)",
                              "token_chunk", [](const Schedules& s) { return json(s.dispatch.token_chunk); }));
  keys.back().flag = "--token-chunk";

  // [llep], [pipelined]: PipelinedLLEP.
  keys.push_back(schedule_key("llep.lambda", K::KeyType_float, kSched, kTrainPlan,
                              "plan only when the busiest rank's load is this multiple of the mean", "lambda",
                              [](const Schedules& s) { return json(s.dispatch.lambda); }));
  keys.back().flag = "--lambda";
  keys.push_back(schedule_key("llep.alpha", K::KeyType_float, kSched, kTrainPlan, "per-rank cap = alpha x mean load",
                              "alpha", [](const Schedules& s) { return json(s.dispatch.alpha); }));
  keys.back().flag = "--alpha";
  keys.push_back(schedule_key("llep.min_tokens_per_gemm", K::KeyType_int, kSched, kTrainPlan,
                              "the smallest spilled piece worth a GEMM", "min_tokens_per_gemm",
                              [](const Schedules& s) { return json(s.dispatch.min_tokens_per_gemm); }));
  keys.back().flag = "--min-tokens-per-gemm";
  keys.push_back(schedule_key("pipelined.chunk_cap", K::KeyType_int, kSched, kTrainPlan,
                              "c, tokens per source rank per chunk", "chunk_cap",
                              [](const Schedules& s) { return json(s.dispatch.chunk_cap); }));
  keys.back().flag = "--chunk-cap";
  keys.back().aliases.push_back("chunk_tokens");
  keys.push_back(schedule_key("pipelined.max_chunks", K::KeyType_int, kSched, kTrainPlan, "K_max, chunks at most",
                              "max_chunks", [](const Schedules& s) { return json(s.dispatch.max_chunks); }));
  keys.back().flag = "--max-chunks";
  keys.push_back(schedule_key("pipelined.membership", K::KeyType_string, kSched, kTrainPlan,
                              "which tokens share a chunk: strided | contiguous", "membership",
                              [](const Schedules& s) { return json(s.dispatch.strided ? "strided" : "contiguous"); }));

  // [vocab]: Ring-DTP.
  keys.push_back(schedule_key("vocab.schedule", K::KeyType_string, kSched, kTrainPlan,
                              "the loss: full ((n, V) logits) | ring (Ring-DTP, strips)", "vocab",
                              [](const Schedules& s) { return json(schedule_name(s.vocab.kind)); }));
  keys.push_back(schedule_key("vocab.block_tokens", K::KeyType_int, kSched, kTrainPlan, "ring: tokens per strip",
                              "block_tokens", [](const Schedules& s) { return json(s.vocab.block_tokens); }));
  keys.back().flag = "--block-tokens";
  keys.push_back(schedule_key("vocab.ring_mode", K::KeyType_string, kSched, kTrainPlan,
                              "ring, W > 1: what travels: weights | activations | auto", "ring_mode",
                              [](const Schedules& s) { return json(s.vocab.ring_mode); }));
  keys.push_back(schedule_key("vocab.keep_strips", K::KeyType_bool, kSched, kTrainPlan,
                              "ring, W > 1: keep the strips for backward (memory for time)", "keep_strips",
                              [](const Schedules& s) { return json(s.vocab.keep_strips); }));

  // [ckpt]: SCO and the activation plan.
  keys.push_back(schedule_key("ckpt.schedule", K::KeyType_string, kSched, kTrainPlan,
                              "checkpoint boundaries: device | sco (host, one layer ahead)", "ckpt",
                              [](const Schedules& s) { return json(schedule_name(s.ckpt.kind)); }));
  keys.push_back(schedule_key("ckpt.host_budget", K::KeyType_string, kSched, kTrainPlan,
                              "sco: host bytes for boundaries (\"unlimited\", 8GiB, ...)", "ckpt_host_budget",
                              [](const Schedules& s) {
                                return json(s.ckpt.host_budget == kUnlimitedBytes ? std::string("unlimited")
                                                                                  : std::to_string(s.ckpt.host_budget));
                              }));
  keys.push_back(schedule_key("ckpt.recompute", K::KeyType_bool, kSched, kTrainPlan,
                              "the backward recomputes each layer (false: keep every layer's activations)", "recompute",
                              [](const Schedules& s) { return json(s.ckpt.recompute); }));
  keys.push_back(
      schedule_key("ckpt.layer_tile", K::KeyType_int, kSched, kTrainPlan,
                   "each layer's token-wise work in tiles of at most this many of a rank's tokens, and MLA's "
                   "expanded keys in chunks of as many (0: whole)",
                   "layer_tile", [](const Schedules& s) { return json(s.ckpt.layer_tile); }));
  keys.push_back(schedule_key("ckpt.every", K::KeyType_int, kSched, kTrainPlan,
                              "a boundary every k layers, the other k - 1 of a group recomputed in the backward",
                              "every", [](const Schedules& s) { return json(s.ckpt.every); }));

  // [precision]: the recipe, then the fields (applied after it).
  keys.push_back(precision_key("precision.recipe", "fp32 | bf16 (core/precision.h); the fields below override it",
                               [](const Precision& p) { return json(p.recipe); }));
  const Precision f32;
  precision_fields(f32, [&](const char* field, DType) {
    keys.push_back(precision_key((std::string("precision.") + field).c_str(),
                                 "f32 | bf16 | f16: the dtype of this kind of tensor",
                                 [field = std::string(field)](const Precision& p) {
                                   json out;
                                   precision_fields(p, [&](const char* name, DType d) {
                                     if (field == name) out = std::string(dtype_name(d));
                                   });
                                   return out;
                                 }));
    keys.back().aliases = {std::string("dtype.") + (std::string_view(field) == "params" ? "weights" : field)};
  });
  for (ConfigKey& k : keys)
    if (!k.flag.empty()) k.commands |= kKeyBench;
  return keys;
}

// A JSON value as TOML text (for config_toml).
std::string toml_text(const json& v) {
  if (v.is_string()) {  // a TOML basic string
    std::string s = "\"";
    for (const char ch : v.get<std::string>()) {
      if (ch == '"' || ch == '\\') s += '\\';
      if (static_cast<unsigned char>(ch) < 0x20) {
        s += fmt::format("\\u{:04x}", static_cast<unsigned>(ch));
        continue;
      }
      s += ch;
    }
    return s + "\"";
  }
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_float()) {
    std::string s = fmt::format("{}", v.get<double>());  // the shortest text that reads back exactly
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  }
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + toml_text(v[i]);
    return s + "]";
  }
  if (v.is_object()) {
    std::string s = "{ ";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      s += (first ? "" : ", ") + it.key() + " = " + toml_text(it.value());
      first = false;
    }
    return s + " }";
  }
  return "\"\"";
}

}  // namespace

const char* key_type_text(KeyType t) {
  switch (t) {
    case KeyType::KeyType_int:
      return "an integer";
    case KeyType::KeyType_float:
      return "a number";
    case KeyType::KeyType_bool:
      return "true or false";
    case KeyType::KeyType_string:
      return "a string";
    case KeyType::KeyType_table:
      return "an inline table { key = value, ... }";
    case KeyType::KeyType_int_list:
      return "a list of integers, e.g. [0, 1]";
    case KeyType::KeyType_string_list:
      return "a list of strings, e.g. [\"a\", \"b\"]";
  }
  return "?";
}

const char* key_effect_name(KeyEffect e) {
  switch (e) {
    case KeyEffect::KeyEffect_arithmetic:
      return "arithmetic";
    case KeyEffect::KeyEffect_schedule:
      return "schedule";
    case KeyEffect::KeyEffect_run:
      return "run";
  }
  return "?";
}

std::string key_commands_text(uint32_t commands) {
  std::string s;
  for (const auto& [bit, name] :
       {std::pair{kKeyTrain, "train"}, {kKeyPlan, "plan"}, {kKeyBench, "bench"}, {kKeyEval, "eval"}})
    if (commands & bit) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = registry_build();
  return keys;
}

const ConfigKey* config_key_find(std::string_view name, bool aliases) {
  for (const ConfigKey& k : config_keys())
    if (k.name == name || (aliases && std::find(k.aliases.begin(), k.aliases.end(), name) != k.aliases.end()))
      return &k;
  return nullptr;
}

std::vector<std::string> config_tables() {
  std::vector<std::string> out;
  for (const ConfigKey& k : config_keys())
    if (std::find(out.begin(), out.end(), k.table()) == out.end()) out.push_back(k.table());
  return out;
}

namespace {

// Whether v has type t (an integer counts as a number).
bool key_value_fits(KeyType t, const json& v) {
  switch (t) {
    case KeyType::KeyType_int:
      return v.is_number_integer();
    case KeyType::KeyType_float:
      return v.is_number();
    case KeyType::KeyType_bool:
      return v.is_boolean();
    case KeyType::KeyType_string:
      return v.is_string();
    case KeyType::KeyType_table:
      return v.is_object();
    case KeyType::KeyType_int_list: {
      if (!v.is_array()) return false;
      for (const json& e : v)
        if (!e.is_number_integer()) return false;
      return true;
    }
    case KeyType::KeyType_string_list: {
      if (!v.is_array()) return false;
      for (const json& e : v)
        if (!e.is_string()) return false;
      return true;
    }
  }
  return false;
}

}  // namespace

void config_key_set_text(RunConfig& c, const ConfigKey& k, std::string_view text, const std::string& source) {
  json v;
  try {
    toml::table t = toml::parse("v = " + std::string(text));
    v = toml_node_json(*t["v"].node());
  } catch (const toml::parse_error&) {
    v = std::string(text);  // a bare string
  }
  if (k.type == KeyType::KeyType_string && !v.is_string()) v = std::string(text);  // "--schedule ckpt=1GiB" and alike
  config_key_store(c, k, v, source);
}

void config_key_store(RunConfig& c, const ConfigKey& k, const json& v, const std::string& source, const char* hint) {
  FP_CHECK(key_value_fits(k.type, v), hint != nullptr ? hint : kConfigHint, "{}: {} must be {}", source, k.name,
           key_type_text(k.type));
  k.set(c, v, source);
}

void config_validate(const RunConfig& c, const std::string& source) {
  for (const ConfigKey& k : config_keys())
    if (k.check) k.check(c, source);
  model_config_validate(c.model, source);
  schedules_validate(c.schedules, source);
  routing_profile_check(c.moe.routing_profile, c.model.num_experts_per_tok, c.model.num_experts,
                        source + ": moe.routing_profile");
}

json config_json(const RunConfig& c) {
  json j = json::object();
  j["config_format"] = kConfigFormat;  // every key of the registry (config_resume_check)
  for (const ConfigKey& k : config_keys()) {
    json v = k.get(c);
    if (v.is_null()) continue;
    j[k.table()][k.key()] = std::move(v);
  }
  return j;
}

std::string config_toml(const RunConfig& c) {
  const json j = config_json(c);
  std::string out;
  for (const std::string& t : config_tables()) {
    if (!j.contains(t)) continue;
    out += "[" + t + "]\n";
    for (const ConfigKey& k : config_keys()) {
      if (k.table() != t || !j[t].contains(k.key())) continue;
      out += k.key() + " = " + toml_text(j[t][k.key()]) + "\n";
    }
    out += "\n";
  }
  return out;
}

ResumeCheck config_resume_check(const json& then, const RunConfig& now, bool extend) {
  ResumeCheck r;
  // An older flatpeak recorded [model] as the Hugging Face config.json (its spellings differ); the
  // architecture is compared with the checkpoint's config.json anyway (Note [A model from a checkpoint]).
  const bool hf_model = then.contains("model") && then["model"].is_object() && then["model"].contains("architectures");
  // config_json writes every key that is set, so there a key left out was not set (null); an older
  // flatpeak's subset says nothing of what it left out.
  const bool complete = then.is_object() && then.value("config_format", 0) >= kConfigFormat;
  const json null_value;
  const RunConfig defaults;
  for (const ConfigKey& k : config_keys()) {
    if (hf_model && k.table() == "model") continue;
    const json v_now = k.get(now);
    const json* v_then = complete ? &null_value : nullptr;
    if (then.contains(k.table()) && then[k.table()].is_object() && then[k.table()].contains(k.key()))
      v_then = &then[k.table()][k.key()];
    if (v_then == nullptr) {
      // An older flatpeak recorded a subset (and precision as one string, checked below). A key it left
      // out at its default now is what that run ran; another value cannot be checked, so it is named.
      if (!v_now.is_null() && k.effect == KeyEffect::KeyEffect_arithmetic && k.table() != "precision" &&
          k.get(defaults) != v_now && k.table() != "model")
        r.not_recorded.push_back(k.name);
      continue;
    }
    if (*v_then == v_now) continue;
    // A key added since the checkpoint was written is absent from its complete record: at its default,
    // what that run ran.
    if (v_then == &null_value && v_now == k.get(defaults)) continue;
    if (extend && k.name == "train.steps") continue;
    const std::string line = fmt::format("{}: checkpoint {}, now {}", k.name, v_then->dump(), v_now.dump());
    // Note [A device mesh] (train/trainer.cpp): batch_size is per data-parallel replica; a layout that keeps
    // dp x batch_size, the global micro-batch, reads the same sequences.
    if (k.name == "train.batch_size" && v_then->is_number_integer()) {
      const json dp_then =
          then.contains("parallel") && then["parallel"].contains("dp") ? then["parallel"]["dp"] : json(1);
      if (dp_then.is_number_integer() &&
          dp_then.get<int64_t>() * v_then->get<int64_t>() == now.parallel.dp * now.train.batch_size) {
        r.changed.push_back(line + fmt::format(" (the same {} sequences per micro-batch over parallel.dp = {})",
                                               now.parallel.dp * now.train.batch_size, now.parallel.dp));
        continue;
      }
    }
    (k.effect == KeyEffect::KeyEffect_arithmetic ? r.refused : r.changed).push_back(line);
  }
  // An older flatpeak's "precision": one description string, written when not fp32.
  if (then.contains("precision") && then["precision"].is_string() &&
      then["precision"].get<std::string>() != precision_describe(now.precision))
    r.refused.push_back(fmt::format("precision: checkpoint \"{}\", now \"{}\"", then["precision"].get<std::string>(),
                                    precision_describe(now.precision)));
  // A setting the checkpoint's run had that this flatpeak does not know (a newer one wrote it): never
  // dropped silently.
  if (then.is_object())
    for (auto t = then.begin(); t != then.end(); ++t) {
      if (t.key() == "config_format" || (t.key() == "model" && hf_model) || !t.value().is_object()) continue;
      for (auto it = t.value().begin(); it != t.value().end(); ++it)
        if (config_key_find(t.key() + "." + it.key()) == nullptr)
          r.refused.push_back(
              fmt::format("{}.{}: checkpoint {}, not a key of this flatpeak", t.key(), it.key(), it.value().dump()));
    }
  return r;
}

KeyFlag config_key_flag(std::string_view name) {
  const ConfigKey* k = config_key_find(name);
  FP_ASSERT(k != nullptr && !k->flag.empty(), "config_key_flag: {} has no flag", name);
  return {k->flag, fmt::format("{} ({})", k->doc, k->name)};
}

std::string config_keys_describe(bool markdown) {
  std::string out;
  RunConfig defaults, deepseek;  // a key DeepSeek-V3 alone reads has its default there
  deepseek.model.model_type = ModelType::ModelType_deepseek_v3;
  if (markdown) out += "| key | type | default | on resume | read by | what it sets |\n|---|---|---|---|---|---|\n";
  for (const ConfigKey& k : config_keys()) {
    json d = k.get(defaults);
    if (d.is_null()) d = k.get(deepseek);
    const std::string def = k.required ? "required" : d.is_null() ? "-" : toml_text(d);
    if (markdown) {
      std::string name = "`" + k.name + "`";
      if (!k.aliases.empty()) name += fmt::format("<br>plan: `{}`", fmt::join(k.aliases, "`, `"));
      if (!k.flag.empty()) name += fmt::format("<br>bench: `{}`", k.flag);
      std::string doc = k.doc;
      for (size_t p = doc.find('|'); p != std::string::npos; p = doc.find('|', p + 2)) doc.replace(p, 1, "\\|");
      out += fmt::format("| {} | {} | {} | {} | {} | {} |\n", name, key_type_text(k.type),
                         k.required ? def : "`" + def + "`", key_effect_name(k.effect), key_commands_text(k.commands),
                         doc);
    } else {
      std::string names = k.name;
      if (!k.aliases.empty()) names += fmt::format(" (plan: {})", fmt::join(k.aliases, ", "));
      if (!k.flag.empty()) names += fmt::format(" (bench: {})", k.flag);
      out += fmt::format("{}\n    {}; {}; default {}; on resume: {}; read by {}\n", names, k.doc, key_type_text(k.type),
                         def, key_effect_name(k.effect), key_commands_text(k.commands));
    }
  }
  return out;
}

}  // namespace fp
