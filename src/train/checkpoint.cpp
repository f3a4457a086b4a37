#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include "core/log.h"
#include "io/atomic_file.h"
#include "io/crc32c.h"
#include "io/safetensors.h"
#include "io/safetensors_set.h"
#include "model/hf_config.h"
#include "train/fused_experts.h"

namespace fp {

namespace fs = std::filesystem;

namespace {

constexpr int kFormatVersion = 1;

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Note [Checkpoint checksums] (checkpoint.h).
constexpr const char* kManifest = "manifest.json";
constexpr const char* kManifestFormat = "flatpeak-checkpoint-manifest";
constexpr int kManifestVersion = 1;

bool name_ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Whether checkpoint_load reads a file of this name: those must be in the manifest.
bool read_by_load(const std::string& n) {
  if (n == "config.json" || n == "trainer_state.json") return true;
  const bool stem = n.rfind("model", 0) == 0 || n.rfind("optimizer", 0) == 0;
  return stem && (name_ends_with(n, ".safetensors") || name_ends_with(n, ".safetensors.index.json"));
}

// "step-" and digits: a checkpoint directory of a run (not a ".tmp" one).
bool step_dir_name(const std::string& n) {
  return n.size() > 5 && n.rfind("step-", 0) == 0 &&
         std::all_of(n.begin() + 5, n.end(), [](char c) { return c >= '0' && c <= '9'; });
}

int64_t step_of(const std::string& n) { return std::stoll(n.substr(5)); }

// The run's checkpoint directories in run, newest first.
std::vector<std::string> step_dirs(const fs::path& run) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run, ec)) {
    const std::string n = entry.path().filename().string();
    if (step_dir_name(n) && entry.is_directory(ec)) found.push_back(n);
  }
  std::sort(found.begin(), found.end(),
            [](const std::string& a, const std::string& b) { return step_of(a) > step_of(b); });
  return found;
}

// Writes dir/manifest.json: every other regular file of dir with its size and CRC32C, read back from disk.
void manifest_write(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string n = entry.path().filename().string();
    if (entry.is_regular_file() && n != kManifest) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  for (const std::string& n : names) {
    const FileChecksum c = file_crc32c((dir / n).string());
    files[n] = {{"bytes", c.bytes}, {"crc32c", fmt::format("{:08x}", c.crc32c)}};
  }
  const nlohmann::ordered_json j = {
      {"format", kManifestFormat}, {"version", kManifestVersion}, {"checksum", "crc32c"}, {"files", files}};
  file_write_atomic((dir / kManifest).string(), j.dump(2) + "\n");
}

// What to do about a damaged checkpoint: the run's earlier ones, by name.
std::string damaged_hint(const fs::path& ck) {
  std::error_code ec;
  const fs::path real = fs::weakly_canonical(ck, ec);
  const fs::path at = ec ? ck : real;
  const std::string name = at.filename().string();
  std::vector<std::string> earlier;
  if (step_dir_name(name))
    for (const std::string& n : step_dirs(at.parent_path()))
      if (step_of(n) < step_of(name)) earlier.push_back((at.parent_path() / n).string());
  if (earlier.empty())
    return "its files differ from what was written, so it is not loaded (no earlier checkpoint lies beside it): "
           "restore the file from a copy, or write the checkpoint again";
  return fmt::format(
      "its files differ from what was written, so it is not loaded: load an earlier checkpoint of the run ({}; "
      "--resume with the run's folder falls back to the newest one that checks by itself), or restore the file "
      "from a copy",
      fmt::join(earlier, ", "));
}

}  // namespace

CheckpointCheck checkpoint_verify(const std::string& ck) {
  const fs::path root(ck);
  const fs::path manifest_path = root / kManifest;
  std::error_code ec;
  if (!fs::exists(manifest_path, ec))
    return fs::exists(root / "trainer_state.json", ec) ? CheckpointCheck::CheckpointCheck_unverified
                                                       : CheckpointCheck::CheckpointCheck_no_manifest;
  const fs::path real = fs::weakly_canonical(root, ec);  // DIR/checkpoint named as the step-N it links to
  const fs::path shown = ec ? root : real;
  auto damaged = [&](const std::string& file, const std::string& what) {
    return Error(fmt::format("checkpoint file '{}' is damaged: {}", (shown / file).string(), what), damaged_hint(root));
  };
  std::vector<std::pair<std::string, nlohmann::json>> files;
  try {
    const nlohmann::json j = nlohmann::json::parse(file_read(manifest_path.string()));
    if (j.value("format", std::string()) != kManifestFormat || j.value("version", 0) != kManifestVersion ||
        j.value("checksum", std::string()) != "crc32c" || !j.contains("files") || !j.at("files").is_object())
      throw damaged(kManifest, fmt::format("not a manifest of version {} with CRC32C checksums", kManifestVersion));
    for (const auto& [name, e] : j.at("files").items()) files.emplace_back(name, e);
  } catch (const nlohmann::json::exception& e) {
    throw damaged(kManifest, fmt::format("not readable JSON ({})", e.what()));
  }
  std::set<std::string> listed;
  for (const auto& [name, e] : files) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw damaged(kManifest, fmt::format("it names '{}', which is not a file of the checkpoint", name));
    uint64_t bytes = 0;
    uint32_t crc = 0;
    try {
      bytes = e.at("bytes").get<uint64_t>();
      const std::string hex = e.at("crc32c").get<std::string>();
      size_t used = 0;
      const unsigned long v = hex.size() == 8 ? std::stoul(hex, &used, 16) : 0;
      if (used != 8)
        throw damaged(kManifest, fmt::format("'{}' has the checksum '{}' (8 hex digits expected)", name, hex));
      crc = static_cast<uint32_t>(v);
    } catch (const nlohmann::json::exception& x) {
      throw damaged(kManifest, fmt::format("the entry of '{}' is malformed ({})", name, x.what()));
    } catch (const std::logic_error&) {
      throw damaged(kManifest, fmt::format("the entry of '{}' has a checksum that is not hexadecimal", name));
    }
    listed.insert(name);
    const fs::path path = root / name;
    if (!fs::is_regular_file(path, ec))
      throw damaged(name, fmt::format("it is missing ({} lists it, {} bytes)", kManifest, bytes));
    const uint64_t size = fs::file_size(path, ec);
    if (ec || size != bytes)
      throw damaged(name, fmt::format("{} bytes where {} says {}", ec ? 0 : size, kManifest, bytes));
    const FileChecksum got = file_crc32c(path.string());
    if (got.crc32c != crc)
      throw damaged(name, fmt::format("CRC32C {:08x} where {} says {:08x}", got.crc32c, kManifest, crc));
  }
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string n = entry.path().filename().string();
    FP_CHECK(!read_by_load(n) || listed.count(n) > 0,
             "the file came into the directory after the checkpoint was written: remove it, or resume from another "
             "checkpoint",
             "checkpoint '{}' holds '{}', which its {} does not list (a checkpoint's files are loaded only when "
             "checked)",
             ck, n, kManifest);
  }
  return CheckpointCheck::CheckpointCheck_verified;
}

ResumePoint checkpoint_resume_point(const std::string& dir) {
  const fs::path given(dir);
  std::error_code ec;
  // The run's folder, when dir names the run's newest checkpoint (DIR or DIR/checkpoint).
  fs::path run;
  if (given.filename() == "checkpoint" && fs::is_symlink(given, ec))
    run = given.parent_path();
  else if (!SafetensorsSet::present(dir, "model") && fs::is_symlink(given / "checkpoint", ec))
    run = given;
  const std::string newest = run.empty() ? std::string() : fs::read_symlink(run / "checkpoint", ec).filename().string();
  ResumePoint rp;
  if (run.empty() || ec || !step_dir_name(newest)) {  // one checkpoint named: that one or an error
    rp.dir = checkpoint_resolve(dir);
    rp.check = checkpoint_verify(rp.dir);
    return rp;
  }
  std::vector<std::string> candidates{newest};
  for (const std::string& n : step_dirs(run))
    if (step_of(n) < step_of(newest)) candidates.push_back(n);
  for (const std::string& n : candidates) {
    const fs::path ck = run / n;
    if (!SafetensorsSet::present(ck.string(), "model")) {
      rp.skipped.push_back(fmt::format("'{}' has no model.safetensors (missing or incomplete)", ck.string()));
      continue;
    }
    try {
      rp.check = checkpoint_verify(ck.string());
      rp.dir = ck.string();
      return rp;
    } catch (const Error& e) {
      rp.skipped.push_back(e.what());
    }
  }
  throw Error(
      fmt::format("no checkpoint of the run in '{}' can be trusted: {}", run.string(), fmt::join(rp.skipped, "; ")),
      "every checkpoint the run keeps is damaged: restore one from a copy, or start the run again with "
      "--overwrite");
}

namespace {

// One tensor of a checkpoint file: its name, the parameter whose layout it shares, and this rank's
// storage of it (the parameter's local_w, or an optimizer moment shaped like it; null when another
// rank holds the parameter).
// A gpt-oss file tensor that fuses a layer's experts (Note [gpt-oss's experts in files]) has no parameter of
// its own: fused names it, and the experts' parameters fill it.
struct Item {
  std::string name;
  const ParamInfo* param;
  const Tensor* local;
  std::optional<FusedTensor> fused = std::nullopt;
  const Shape& shape() const { return fused ? fused->shape : param->shape; }
};

std::vector<Item> weight_items(ParamStore& params) {
  std::vector<Item> out;
  for (const ParamInfo& p : params.layout())
    out.push_back({p.name, &p, p.local != nullptr ? &p.local->local_w() : nullptr});
  return out;
}

// The tensors of model.safetensors as transformers names them: the parameters, but gpt-oss's experts as
// each layer's four fused tensors (Note [gpt-oss's experts in files]).
std::vector<Item> file_weight_items(ParamStore& params, const ModelConfig& cfg) {
  if (!cfg.is_gpt_oss()) return weight_items(params);
  std::vector<Item> out;
  for (const ParamInfo& p : params.layout()) {
    ExpertParamName e;
    if (!expert_param_parse(p.name, e)) {
      out.push_back({p.name, &p, p.local != nullptr ? &p.local->local_w() : nullptr});
      continue;
    }
    if (e.expert == 0 && e.leaf == "gate_proj.weight")
      for (FusedTensor& t : fused_expert_tensors(cfg, e.layer)) out.push_back({t.name, nullptr, nullptr, t});
  }
  return out;
}

// Fused tensor t's full host copy (rank 0; others pass null), gathering every expert's parameters in
// expert order (collective, the same calls on every rank); by_name: params.layout() by name.
void fused_gather(ParamStore& params, const std::unordered_map<std::string, const ParamInfo*>& by_name,
                  const ModelConfig& cfg, const FusedTensor& t, float* host) {
  const bool gate_up = t.kind.rfind("gate_up", 0) == 0, bias = t.kind.ends_with("_bias");
  const char* leaf = bias ? ".bias" : ".weight";
  std::vector<float> a, b;
  for (int64_t e = 0; e < cfg.num_experts; ++e) {
    const std::string pre = fmt::format("model.layers.{}.mlp.experts.{}.", t.layer, e);
    auto gather = [&](const std::string& name, std::vector<float>& dst) {
      const ParamInfo& p = *by_name.at(name);
      dst.resize(static_cast<size_t>(p.shape.numel()));
      params.full_gather(p, p.local != nullptr ? &p.local->local_w() : nullptr, host != nullptr ? dst.data() : nullptr);
    };
    gather(pre + (gate_up ? "gate_proj" : "down_proj") + leaf, a);
    if (gate_up) gather(pre + "up_proj" + leaf, b);
    if (host != nullptr) fused_expert_fill(cfg, t, e, a.data(), b.data(), host);
  }
}

// "<param>.exp_avg", "<param>.exp_avg_sq" of every parameter of the model, in layout order; with
// master, "<param>.master" too: the f32 weights when model.safetensors holds them rounded (Note
// [Checkpoint dtype and shards]): the optimizer's own master where it keeps one (weights stored in
// bf16), else the weights themselves.
std::vector<Item> state_items(ParamStore& params, const Optimizer& optim, bool master) {
  std::unordered_map<std::string, const Tensor*> mine;
  for (const auto& [name, t] : optim.state_tensors()) mine[name] = t;
  std::vector<Item> out;
  for (const ParamInfo& p : params.layout()) {
    for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
      const std::string name = p.name + suffix;
      auto it = mine.find(name);
      FP_ASSERT((it != mine.end()) == (p.local != nullptr), "optimizer state '{}' and its parameter disagree", name);
      out.push_back({name, &p, it != mine.end() ? it->second : nullptr});
    }
    if (master) {
      auto it = mine.find(p.name + ".master");
      out.push_back({p.name + ".master", &p,
                     it != mine.end()     ? it->second
                     : p.local != nullptr ? &p.local->local_w()
                                          : nullptr});
    }
  }
  return out;
}

// Note [Tensors transformers keeps in f32]: DeepseekV3ForCausalLM keeps each MoE layer's router,
// mlp.gate.weight and mlp.gate.e_score_correction_bias, in float32 whatever dtype the rest of the model is
// made or loaded in (its _keep_in_fp32_modules_strict), so save_pretrained of a bf16 model writes those two
// F32 beside BF16 weights. flatpeak reads such a file as a bf16 model (the weights' dtype is that of the
// other tensors: TrainerState::weights_dtype) and writes those two in F32 whatever CheckpointFormat::weights
// says, as transformers does: a bf16 DeepSeek-V3 goes back as it came (every tensor in its dtype), and the
// routing bias, whose small differences between experts decide the choice, is never rounded to bf16.
bool kept_in_f32(const ModelConfig& cfg, const std::string& name) {
  if (!cfg.is_deepseek()) return false;
  for (const std::string_view end :
       {std::string_view(".mlp.gate.weight"), std::string_view(".mlp.gate.e_score_correction_bias")})
    if (name.size() >= end.size() && name.compare(name.size() - end.size(), end.size(), end) == 0) return true;
  return false;
}

// The first element of x that is not finite, or -1 (Note [No checkpoint holds a non-finite number]).
int64_t first_nonfinite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

// Note [No checkpoint holds a non-finite number]: a NaN or Inf in a weight or a moment poisons every
// step after it, silently. So saving refuses to write one (before any file exists: the previous
// checkpoint stays the latest) and loading refuses to use one, naming the tensor and the first bad
// element either way.
void finite_check(const std::string& tensor, const float* x, int64_t n, const std::string& where, bool saving) {
  const int64_t bad = first_nonfinite(x, n);
  if (bad < 0) return;
  if (saving)
    throw Error(fmt::format("not writing '{}': tensor '{}' holds {} at element {}", where, tensor, x[bad], bad),
                "the run diverged: lower optim.lr (a lower train.loss_spike_factor stops a run sooner) and resume "
                "from the last checkpoint, which stays the latest");
  throw Error(fmt::format("checkpoint '{}': tensor '{}' holds {} at element {}", where, tensor, x[bad], bad),
              "the file is damaged or came from a diverged run; use an earlier checkpoint");
}

// A tensor's place in a CheckpointImage's arena: a multiple of 64 bytes, so each starts aligned for any dtype.
uint64_t image_round(uint64_t bytes) { return (bytes + 63) / 64 * 64; }

// Note [Checkpoints over W ranks]: the files hold whole tensors under their Hugging Face names
// whatever W wrote them. Saving gathers each tensor to rank 0 (ParamStore::full_gather, collective,
// tensor by tensor in the same order on every rank), which alone writes; loading lets every rank read
// the file and keep its own rows (full_scatter). So any W loads a checkpoint of any other W.
// Writes items into dir as stem.safetensors in dtype, or, above shard_bytes, as shards with an index
// (Note [Checkpoint dtype and shards]); one shard's tensors are in host memory at a time. With model (the
// weights, not the optimizer state), its tensors transformers keeps in f32 are written in F32 (Note
// [Tensors transformers keeps in f32]).
// shown: how errors name the directory (the final checkpoint directory's, not the temporary one's).
// With image, rank 0 writes no file: the tensors go into image's arena and each file into image->files, to be
// written later by checkpoint_image_write (the same views, so the same bytes).
void tensors_write(const fs::path& dir, const std::string& stem, const std::string& shown,
                   const std::vector<Item>& items, ParamStore& params, DType dtype, uint64_t shard_bytes,
                   const ModelConfig* model = nullptr, CheckpointImage* image = nullptr) {
  const bool lead = params.rank() == 0;
  auto dtype_of = [&](const Item& it) {
    return model != nullptr && kept_in_f32(*model, it.name) ? DType::DType_F32 : dtype;
  };
  // Shards: consecutive items, a new one when the next tensor would take the current one past
  // shard_bytes (a tensor larger than that is a shard of its own).
  std::vector<size_t> starts{0};
  uint64_t in_shard = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t b = static_cast<uint64_t>(items[i].shape().numel()) * dtype_size(dtype_of(items[i]));
    if (in_shard > 0 && in_shard + b > shard_bytes) {
      starts.push_back(i);
      in_shard = 0;
    }
    in_shard += b;
  }
  const size_t n_shards = starts.size();
  starts.push_back(items.size());
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total = 0;
  std::vector<float> f32;  // (numel of the full shape) one tensor gathered
  std::unordered_map<std::string, const ParamInfo*> by_name;  // the layout by name, for fused tensors
  for (size_t s = 0; s < n_shards; ++s) {
    const std::string file = n_shards == 1 ? stem + ".safetensors"
                                           : fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, s + 1, n_shards);
    std::vector<std::vector<unsigned char>> host;  // rank 0 without image: each tensor in its dtype
    std::vector<SafetensorsView> views;
    for (size_t i = starts[s]; i < starts[s + 1]; ++i) {
      const Shape& shape = items[i].shape();
      const int64_t n = shape.numel();
      const DType dt = dtype_of(items[i]);
      const uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(dt);
      // Where rank 0 gathers the tensor in f32 and where its bytes go: into the image's arena (an f32 tensor
      // gathered there directly), or into a vector of its own.
      float* gathered = nullptr;
      unsigned char* dst = nullptr;
      if (lead && image != nullptr) {
        FP_ASSERT(image->used + image_round(bytes) <= image->capacity, "checkpoint image of {} bytes overflows at '{}'",
                  image->capacity, items[i].name);
        dst = image->arena + image->used;
        image->used += image_round(bytes);
        if (dt != DType::DType_F32) image->stage.resize(static_cast<size_t>(n));  // sized once, at the largest
        gathered = dt == DType::DType_F32 ? reinterpret_cast<float*>(dst) : image->stage.data();
      } else if (lead) {
        f32.resize(static_cast<size_t>(n));
        gathered = f32.data();
      }
      if (items[i].fused) {
        if (by_name.empty())
          for (const ParamInfo& p : params.layout()) by_name[p.name] = &p;
        fused_gather(params, by_name, *model, *items[i].fused, gathered);
      } else {
        params.full_gather(*items[i].param, items[i].local, gathered);
      }
      if (!lead) continue;
      finite_check(items[i].name, gathered, n, (fs::path(shown) / file).string(), true);
      if (image == nullptr) {
        host.emplace_back(static_cast<size_t>(bytes));
        dst = host.back().data();
      }
      if (dt == DType::DType_F32) {
        if (dst != reinterpret_cast<unsigned char*>(gathered)) std::memcpy(dst, gathered, static_cast<size_t>(bytes));
      } else {
        auto* h = reinterpret_cast<uint16_t*>(dst);
        for (int64_t k = 0; k < n; ++k)
          h[k] = dt == DType::DType_BF16 ? bf16_from_float(gathered[k]) : f16_from_float(gathered[k]);
      }
      views.push_back({items[i].name, dt, shape, dst});
      weight_map[items[i].name] = file;
      total += bytes;
    }
    if (!lead) continue;
    if (image != nullptr)
      image->files.push_back({file, true, std::move(views), {}});
    else
      safetensors_write((dir / file).string(), views, {{"format", "pt"}});
  }
  if (lead && n_shards > 1) {
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::string name = stem + ".safetensors.index.json";
    if (image != nullptr)
      image->files.push_back({name, false, {}, index.dump(2) + "\n"});
    else
      file_write_atomic((dir / name).string(), index.dump(2) + "\n");
  }
}

// The bytes tensors_write's items take in an image's arena (Note [Checkpoints off the critical path]).
uint64_t items_image_bytes(const std::vector<Item>& items, DType dtype, const ModelConfig* model) {
  uint64_t sum = 0;
  for (const Item& it : items) {
    const DType dt = model != nullptr && kept_in_f32(*model, it.name) ? DType::DType_F32 : dtype;
    sum += image_round(static_cast<uint64_t>(it.shape().numel()) * dtype_size(dt));
  }
  return sum;
}

// config.json of a checkpoint (Note [Checkpoint dtype and shards]).
std::string config_text(const ModelConfig& cfg, const CheckpointFormat& format) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(
      format.base_config.empty() ? model_config_hf_json(cfg) : format.base_config);
  j["use_cache"] = true;
  // The load-balancing weight the run trained with, where the file has the key (a run may choose its own:
  // model_function_differences in model/hf_config.h); DeepSeek-V3 has none.
  if (j.contains("router_aux_loss_coef") && !cfg.is_deepseek()) j["router_aux_loss_coef"] = cfg.router_aux_loss_coef;
  // The weights are written dequantized (Note [gpt-oss's experts in files]): a quantization_config read from
  // an MXFP4 checkpoint no longer describes them.
  j.erase("quantization_config");
  const char* name = format.weights == DType::DType_BF16 ? "bfloat16"
                     : format.weights == DType::DType_F16 ? "float16"
                                                          : "float32";
  j[j.contains("dtype") ? "dtype" : "torch_dtype"] = name;
  return j.dump(2) + "\n";
}

// What a tensor name tells about the feature behind it, for the errors below.
std::string tensor_hint(const std::string& name) {
  if (name.find(".bias") != std::string::npos)
    return "the file holds attention biases but config.json has attention_bias = false";
  if (name.find("mlp.experts.gate_up_proj") != std::string::npos || name.find("mlp.experts.down_proj") != std::string::npos)
    return "fused expert tensors (transformers 5's in-memory layout) are read for gpt_oss only: save this model with "
           "per-expert names (mlp.experts.<e>.gate_proj.weight, ...)";
  if (name.find("shared_expert") != std::string::npos)
    return "the file holds shared experts but config.json has none (n_shared_experts = 0, or a model_type without them)";
  if (name.find("e_score_correction_bias") != std::string::npos)
    return "the file holds DeepSeek-V3's routing bias but config.json's model_type has a softmax router";
  if (name.find("kv_a_proj_with_mqa") != std::string::npos || name.find("q_a_proj") != std::string::npos ||
      name.find("kv_b_proj") != std::string::npos)
    return "the file holds multi-head latent attention (model_type \"deepseek_v3\"); check config.json's model_type "
           "and q_lora_rank (null: q_proj)";
  if (name.find("mlp.gate_proj") != std::string::npos || name.find("mlp.up_proj") != std::string::npos ||
      name.find("mlp.down_proj") != std::string::npos)
    return "the file holds a dense MLP where config.json (mlp_only_layers, decoder_sparse_step) puts a MoE layer";
  if (name.find("mlp.gate.weight") != std::string::npos || name.find(".mlp.experts.") != std::string::npos)
    return "the file holds router or expert tensors config.json does not expect: check num_experts, and "
           "mlp_only_layers / decoder_sparse_step (a layer config.json makes dense)";
  if (name == "lm_head.weight") return "tie_word_embeddings = true shares the embedding, so lm_head.weight must equal it";
  return "check that config.json describes the model the weights were saved from (num_hidden_layers, num_experts, "
         "...); DeepSeek-V3's multi-token prediction layers (num_nextn_predict_layers, past num_hidden_layers) are "
         "not implemented: drop them from the files, as transformers does on load";
}

// Note [No weight is dropped silently]: every tensor of a checkpoint file must be read by the model.
// A tensor left over means a feature the model does not compute (a bias, a dense layer, a shared
// expert): the run would silently be another model, so loading stops and names the tensors.
void unread_check(const SafetensorsSet& f) {
  const std::vector<std::string> left = f.unread();
  if (left.empty()) return;
  const size_t shown = std::min<size_t>(left.size(), 8);
  throw Error(fmt::format("checkpoint '{}' holds {} tensor{} the model does not use: {}{}", f.path(), left.size(),
                          left.size() > 1 ? "s" : "",
                          fmt::join(std::vector<std::string>(left.begin(), left.begin() + shown), ", "),
                          left.size() > shown ? fmt::format(" (and {} more)", left.size() - shown) : ""),
              "flatpeak never drops a weight; " + tensor_hint(left.front()));
}

// Which config.json key makes the model need tensor `name` (for a missing tensor's error).
std::string implied_by(const std::string& name, const ModelConfig& cfg) {
  if (name == "lm_head.weight") return "tie_word_embeddings = false (a separate output matrix)";
  if (name.find(".bias") != std::string::npos) return "attention_bias = true";
  if (name.find("shared_experts") != std::string::npos)
    return fmt::format("n_shared_experts = {} (shared experts in every MoE layer)", cfg.n_shared_experts);
  if (name.find("e_score_correction_bias") != std::string::npos)
    return "model_type = \"deepseek_v3\" (the sigmoid router's bias, in every MoE layer)";
  if (name.find("q_a_") != std::string::npos || name.find("q_b_proj") != std::string::npos)
    return fmt::format("q_lora_rank = {} (a query latent)", cfg.q_lora_rank);
  if (name.find("kv_a_") != std::string::npos || name.find("kv_b_proj") != std::string::npos)
    return "model_type = \"deepseek_v3\" (multi-head latent attention)";
  if (name.find(".mlp.gate_proj") != std::string::npos || name.find(".mlp.up_proj") != std::string::npos ||
      name.find(".mlp.down_proj") != std::string::npos)
    return cfg.is_deepseek() ? fmt::format("first_k_dense_replace = {} (a dense layer)", cfg.first_k_dense_replace)
                             : fmt::format("mlp_only_layers = [{}] and decoder_sparse_step = {} (a dense layer)",
                                           fmt::join(cfg.mlp_only_layers, ", "), cfg.decoder_sparse_step);
  if (name.find(".mlp.experts.") != std::string::npos)
    return fmt::format("num_experts = {} (experts 0..{} in every layer)", cfg.num_experts, cfg.num_experts - 1);
  if (name.find("q_norm") != std::string::npos || name.find("k_norm") != std::string::npos)
    return "model_type = \"qwen3_moe\" (Qwen3 normalises q and k per head)";
  if (name.rfind("model.layers.", 0) == 0)
    return fmt::format("num_hidden_layers = {} (layers 0..{})", cfg.num_hidden_layers, cfg.num_hidden_layers - 1);
  return cfg.is_deepseek() ? "the DeepSeek-V3 architecture" : "the Qwen3-MoE architecture";
}

// Reads items; with check_unread, then refuses any tensor of f left unread (Note [No weight is dropped
// silently]).
// model_file: f is model.safetensors, whose gpt-oss experts are fused (Note [gpt-oss's experts in files]).
void tensors_read(SafetensorsSet& f, const std::vector<Item>& items, ParamStore& params, const ModelConfig& cfg,
                  bool check_unread, bool model_file) {
  std::vector<float> host;  // (numel of the full shape)
  FusedExpertReader fused(f, cfg);
  for (const Item& it : items) {
    ExpertParamName e;
    if (model_file && cfg.is_gpt_oss() && expert_param_parse(it.name, e)) {
      host.resize(static_cast<size_t>(it.param->shape.numel()));
      fused.read(e, host.data());
      finite_check(it.name, host.data(), it.param->shape.numel(), f.path(), false);
      params.full_scatter(*it.param, host.data(), const_cast<Tensor*>(it.local));
      continue;
    }
    FP_CHECK(f.has(it.name),
             "check that config.json describes the model the weights were saved from; " + tensor_hint(it.name),
             "checkpoint '{}' has no tensor '{}', which config.json's {} implies", f.path(), it.name,
             implied_by(it.name, cfg));
    host.resize(static_cast<size_t>(it.param->shape.numel()));
    f.read_f32(it.name, it.param->shape, host.data());
    finite_check(it.name, host.data(), it.param->shape.numel(), f.path(), false);
    params.full_scatter(*it.param, host.data(), const_cast<Tensor*>(it.local));
    // Note [Tied embeddings] (model/params.cpp): a file may still carry lm_head.weight (older
    // transformers wrote both); it is read, and taken only when it is the embedding bit for bit.
    if (cfg.tie_word_embeddings && it.name == "model.embed_tokens.weight" && f.has("lm_head.weight")) {
      std::vector<float> head(host.size());
      f.read_f32("lm_head.weight", it.param->shape, head.data());
      FP_CHECK(head == host, tensor_hint("lm_head.weight"),
               "checkpoint '{}': tie_word_embeddings = true but lm_head.weight differs from model.embed_tokens.weight",
               f.path());
    }
  }
  if (check_unread) unread_check(f);
}

// Renames tmp (complete, fsynced) to root/name, links "checkpoint" to it, keeps `keep` (Note [Atomic
// checkpoints]). Rank 0 only; no collective.
void checkpoint_commit(const fs::path& root, const std::string& name, int64_t step, int64_t keep) {
  const fs::path tmp = root / (name + ".tmp");
  const fs::path final_dir = root / name;
  std::error_code ec;
  // The checkpoint the link names now stays until the next one is complete and linked.
  const fs::path link = root / "checkpoint";
  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir);
  fsync_dir(root);
  // Point "checkpoint" at it: a new symlink renamed over the old one is atomic.
  const fs::path link_tmp = root / "checkpoint.tmp";
  fs::remove(link_tmp, ec);
  fs::create_directory_symlink(name, link_tmp);
  fs::rename(link_tmp, link);
  fsync_dir(root);

  // Keep the new checkpoint and the keep - 1 before it (train.keep_checkpoints; with keep >= 2 the one the
  // link named before stays, the fallback of Note [Resuming from the newest sound checkpoint]); drop this
  // run's older ones and stray temporaries. A step above the new one is never this run's to drop (a resume
  // from an earlier step keeps what came after until it is overwritten by name).
  int64_t kept = 0;
  for (const std::string& n : step_dirs(root)) {
    if (step_of(n) > step) continue;
    if (++kept > keep) fs::remove_all(root / n, ec);
  }
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string n = entry.path().filename().string();
    if (n.rfind("step-", 0) == 0 && name_ends_with(n, ".tmp")) fs::remove_all(entry.path(), ec);
  }
}

// trainer_state.json of a checkpoint.
std::string trainer_state_text(const TrainerState& state, bool has_optimizer) {
  nlohmann::json js = {{"format_version", kFormatVersion},
                       {"step", state.step},
                       {"data_position", state.data_position},
                       {"has_optimizer", has_optimizer},
                       {"schedule_steps", state.schedule_steps},
                       {"run_config", nlohmann::json::parse(state.run_config.empty() ? "{}" : state.run_config)}};
  return js.dump(2) + "\n";
}

// Whether optimizer.safetensors holds "<param>.master" (Note [Checkpoint dtype and shards]).
bool master_written(const CheckpointFormat& format, ParamStore& params) {
  return format.weights != DType::DType_F32 || params.precision().params != DType::DType_F32;
}

}  // namespace

std::string checkpoint_save(const std::string& dir, const ModelConfig& cfg, ParamStore& params, const Optimizer* optim,
                            const TrainerState& state, Backend& /*be: params' own backend moves the data*/,
                            const CheckpointFormat& format, int64_t keep) {
  FP_ASSERT(keep >= 1);
  const fs::path root(dir);
  const std::string name = fmt::format("step-{:08d}", state.step);
  const fs::path tmp = root / (name + ".tmp");
  const fs::path final_dir = root / name;
  std::error_code ec;
  // Every rank takes part in the gathers (Note [Checkpoints over W ranks]); rank 0 alone touches files.
  const bool lead = params.rank() == 0;
  if (lead) {
    fs::create_directories(root);
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp);
  }
  try {
    FP_ASSERT(format.weights == DType::DType_F32 || format.weights == DType::DType_BF16 ||
              format.weights == DType::DType_F16);
    tensors_write(tmp, "model", final_dir.string(), file_weight_items(params, cfg), params, format.weights,
                  format.shard_bytes, &cfg);
    if (optim != nullptr)
      tensors_write(tmp, "optimizer", final_dir.string(), state_items(params, *optim, master_written(format, params)),
                    params, DType::DType_F32, std::numeric_limits<uint64_t>::max());
    if (!lead) return final_dir.string();
    file_write_atomic((tmp / "config.json").string(), config_text(cfg, format));
    file_write_atomic((tmp / "trainer_state.json").string(), trainer_state_text(state, optim != nullptr));
    manifest_write(tmp);  // last: Note [Checkpoint checksums]
    fsync_dir(tmp);
  } catch (...) {
    if (lead) fs::remove_all(tmp, ec);  // a failed write leaves nothing behind; "checkpoint" is untouched
    throw;
  }

  checkpoint_commit(root, name, state.step, keep);
  return final_dir.string();
}

CheckpointImageBytes checkpoint_image_bytes(const ModelConfig& cfg, ParamStore& params, bool with_optimizer,
                                            const CheckpointFormat& format) {
  CheckpointImageBytes b;
  if (params.rank() != 0) return b;
  const std::vector<Item> weights = file_weight_items(params, cfg);
  b.arena = items_image_bytes(weights, format.weights, &cfg);
  if (format.weights != DType::DType_F32)
    for (const Item& it : weights)
      if (!kept_in_f32(cfg, it.name))
        b.stage = std::max<uint64_t>(b.stage, static_cast<uint64_t>(it.shape().numel()) * 4);
  if (with_optimizer)  // "<param>.exp_avg", ".exp_avg_sq" and, when written, ".master": f32, shaped like it
    for (const ParamInfo& p : params.layout())
      b.arena += (master_written(format, params) ? 3 : 2) * image_round(static_cast<uint64_t>(p.shape.numel()) * 4);
  return b;
}

void checkpoint_snapshot(CheckpointImage& image, const std::string& dir, const ModelConfig& cfg, ParamStore& params,
                         const Optimizer* optim, const TrainerState& state, const CheckpointFormat& format) {
  FP_ASSERT(format.weights == DType::DType_F32 || format.weights == DType::DType_BF16 ||
            format.weights == DType::DType_F16);
  image.used = 0;
  image.files.clear();
  image.step = state.step;
  const std::string shown = (fs::path(dir) / fmt::format("step-{:08d}", state.step)).string();  // for errors
  tensors_write({}, "model", shown, file_weight_items(params, cfg), params, format.weights, format.shard_bytes, &cfg,
                &image);
  if (optim != nullptr)
    tensors_write({}, "optimizer", shown, state_items(params, *optim, master_written(format, params)), params,
                  DType::DType_F32, std::numeric_limits<uint64_t>::max(), nullptr, &image);
  if (params.rank() != 0) return;
  image.files.push_back({"config.json", false, {}, config_text(cfg, format)});
  image.files.push_back({"trainer_state.json", false, {}, trainer_state_text(state, optim != nullptr)});
}

std::string checkpoint_image_write(const std::string& dir, const CheckpointImage& image, int64_t keep) {
  FP_ASSERT(keep >= 1);
  const fs::path root(dir);
  const std::string name = fmt::format("step-{:08d}", image.step);
  const fs::path tmp = root / (name + ".tmp");
  std::error_code ec;
  fs::create_directories(root);
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);
  try {
    for (const CheckpointImage::File& f : image.files) {
      if (f.safetensors)
        safetensors_write((tmp / f.name).string(), f.tensors, {{"format", "pt"}});
      else
        file_write_atomic((tmp / f.name).string(), f.text);
    }
    manifest_write(tmp);  // last: Note [Checkpoint checksums]
    fsync_dir(tmp);
  } catch (...) {
    fs::remove_all(tmp, ec);  // a failed write leaves nothing behind; "checkpoint" is untouched
    throw;
  }
  checkpoint_commit(root, name, image.step, keep);
  return (root / name).string();
}

void checkpoint_export(const std::string& out, const ModelConfig& cfg, ParamStore& params,
                       const CheckpointFormat& format) {
  const fs::path final_dir = fs::absolute(out).lexically_normal();
  const fs::path tmp = final_dir.string() + ".tmp";
  const bool lead = params.rank() == 0;
  std::error_code ec;
  FP_CHECK(!fs::exists(final_dir, ec), "pass a new directory to --out (nothing is overwritten)",
           "'{}' already exists", out);
  if (lead) {
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp);
  }
  try {
    tensors_write(tmp, "model", final_dir.string(), file_weight_items(params, cfg), params, format.weights,
                  format.shard_bytes, &cfg);
    if (!lead) return;
    file_write_atomic((tmp / "config.json").string(), config_text(cfg, format));
    manifest_write(tmp);  // Note [Checkpoint checksums]
    fsync_dir(tmp);
  } catch (...) {
    if (lead) fs::remove_all(tmp, ec);
    throw;
  }
  fs::rename(tmp, final_dir);
  fsync_dir(final_dir.parent_path());
}

std::string checkpoint_resolve(const std::string& dir) {
  const fs::path root(dir);
  if (SafetensorsSet::present(root.string(), "model")) return root.string();
  if (SafetensorsSet::present((root / "checkpoint").string(), "model")) return (root / "checkpoint").string();
  throw Error(fmt::format("no checkpoint in '{}' (neither {}/model.safetensors[.index.json] nor {}/checkpoint/)", dir,
                          dir, dir),
              "pass the --out directory of a flatpeak train run, or a directory holding config.json and "
              "model.safetensors (or a sharded model.safetensors.index.json)");
}

TrainerState checkpoint_load(const std::string& dir, const ModelConfig& cfg, ParamStore& params, Optimizer* optim,
                             Backend& /*be: params' own backend moves the data*/, bool verify) {
  const std::string ck = checkpoint_resolve(dir);
  const fs::path root(ck);
  // Note [Checkpoint checksums]: every file checked before a tensor is read.
  if (verify && checkpoint_verify(ck) == CheckpointCheck::CheckpointCheck_unverified && params.rank() == 0)
    log_info(
        "warning: checkpoint '{}' has no manifest.json (a flatpeak before checksums wrote it): its files are "
        "loaded unverified",
        ck);
  TrainerState state;
  // The architecture must match, key by key (model/hf_config.h reads the file strictly).
  {
    const HfConfig saved = hf_config_read(ck);
    state.config_json = saved.raw.dump(2);  // its keys in their order, written back on save
    const std::vector<std::string> diff = model_function_differences(saved.model, cfg);
    FP_CHECK(diff.empty(), "use the model config the checkpoint was written with",
             "checkpoint '{}' holds another model than the config: {} (checkpoint vs config)", ck,
             fmt::join(diff, "; "));
  }
  {
    SafetensorsSet f(ck, "model");
    // The weights' dtype is that of the tensors not kept in f32 (Note [Tensors transformers keeps in f32]):
    // those are read first, their dtypes taken, then the rest.
    std::vector<Item> items = weight_items(params);
    const auto kept = std::stable_partition(items.begin(), items.end(),
                                            [&](const Item& it) { return !kept_in_f32(cfg, it.name); });
    tensors_read(f, std::vector<Item>(items.begin(), kept), params, cfg, /*check_unread=*/false, /*model_file=*/true);
    const std::set<DType> dtypes = f.dtypes_read();
    tensors_read(f, std::vector<Item>(kept, items.end()), params, cfg, /*check_unread=*/true, /*model_file=*/true);
    state.weights_dtype = dtypes.size() == 1 ? *dtypes.begin() : DType::DType_F32;
    if (state.weights_dtype == DType::DType_F64) state.weights_dtype = DType::DType_F32;
  }
  const fs::path state_path = root / "trainer_state.json";
  if (fs::exists(state_path)) {
    nlohmann::json js;
    try {
      js = nlohmann::json::parse(file_read(state_path.string()));
      FP_CHECK(js.value("format_version", 0) == kFormatVersion, "this flatpeak reads checkpoint format 1",
               "checkpoint '{}' has format version {}", ck, js.value("format_version", 0));
      state.step = js.at("step").get<int64_t>();
      state.data_position = js.at("data_position").get<int64_t>();
      state.run_config = js.at("run_config").dump();
      state.schedule_steps = js.value("schedule_steps", int64_t{0});
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("trainer state '{}' is damaged: {}", state_path.string(), e.what()),
                  "use an earlier checkpoint");
    }
  }
  if (optim != nullptr) {
    FP_CHECK(SafetensorsSet::present(ck, "optimizer"),
             "resume needs a checkpoint written by flatpeak train (with optimizer state)",
             "checkpoint '{}' has no optimizer.safetensors", ck);
    SafetensorsSet f(ck, "optimizer");
    // The f32 master weights, when model.safetensors holds them rounded (Note [Checkpoint dtype and
    // shards]), replace what was read from it.
    const bool master = !params.layout().empty() && f.has(params.layout().front().name + ".master");
    tensors_read(f, state_items(params, *optim, master), params, cfg, /*check_unread=*/true, /*model_file=*/false);
    if (master) optim->master_loaded();
    optim->set_steps_taken(state.step);
  }
  return state;
}

}  // namespace fp
