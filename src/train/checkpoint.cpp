#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/safetensors.h"

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

// Copies device tensors to host buffers and writes them as one safetensors file.
void tensors_write(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                   Backend& be) {
  std::vector<std::vector<float>> host(tensors.size());
  std::vector<SafetensorsView> views;
  views.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = *tensors[i].second;
    host[i].resize(static_cast<size_t>(t.numel()));
    be.copy_to_host(host[i].data(), t.data(), t.bytes());
    views.push_back({tensors[i].first, DType::DType_F32, t.shape(), host[i].data()});
  }
  safetensors_write(path, views, {{"format", "pt"}});
}

void tensors_read(const SafetensorsFile& f, const std::string& path,
                  const std::vector<std::pair<std::string, Tensor*>>& tensors, Backend& be) {
  std::vector<float> host;
  for (const auto& [name, t] : tensors) {
    FP_CHECK(f.has(name), "the checkpoint was written for another model; check --config",
             "checkpoint '{}' has no tensor '{}'", path, name);
    host.resize(static_cast<size_t>(t->numel()));
    f.read_f32(name, t->shape(), host.data());
    be.copy_from_host(t->data(), host.data(), t->bytes());
  }
}

}  // namespace

std::string checkpoint_save(const std::string& dir, const ModelConfig& cfg, ParamStore& params, const Optimizer* optim,
                            const TrainerState& state, Backend& be) {
  const fs::path root(dir);
  fs::create_directories(root);
  const std::string name = fmt::format("step-{:08d}", state.step);
  const fs::path tmp = root / (name + ".tmp");
  const fs::path final_dir = root / name;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp);

  std::vector<std::pair<std::string, const Tensor*>> weights;
  for (const Param& p : params.all()) weights.emplace_back(p.name, &p.w);
  tensors_write((tmp / "model.safetensors").string(), weights, be);
  file_write_atomic((tmp / "config.json").string(), model_config_hf_json(cfg) + "\n");
  if (optim != nullptr) tensors_write((tmp / "optimizer.safetensors").string(), optim->state_tensors(), be);
  nlohmann::json js = {{"format_version", kFormatVersion},
                       {"step", state.step},
                       {"data_position", state.data_position},
                       {"has_optimizer", optim != nullptr},
                       {"run_config", nlohmann::json::parse(state.run_config.empty() ? "{}" : state.run_config)}};
  file_write_atomic((tmp / "trainer_state.json").string(), js.dump(2) + "\n");
  fsync_dir(tmp);

  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir);
  fsync_dir(root);
  // Point "checkpoint" at it: a new symlink renamed over the old one is atomic.
  const fs::path link = root / "checkpoint";
  const fs::path link_tmp = root / "checkpoint.tmp";
  fs::remove(link_tmp, ec);
  fs::create_directory_symlink(name, link_tmp);
  fs::rename(link_tmp, link);
  fsync_dir(root);

  // Keep the new checkpoint and the one before it; drop older ones and stray temporaries.
  std::vector<std::string> steps;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string n = entry.path().filename().string();
    if (n.rfind("step-", 0) != 0) continue;
    if (n.size() > 4 && n.substr(n.size() - 4) == ".tmp") {
      fs::remove_all(entry.path(), ec);
      continue;
    }
    steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + 2 < steps.size(); ++i) fs::remove_all(root / steps[i], ec);
  return final_dir.string();
}

std::string checkpoint_resolve(const std::string& dir) {
  const fs::path root(dir);
  if (fs::exists(root / "model.safetensors")) return root.string();
  if (fs::exists(root / "checkpoint" / "model.safetensors")) return (root / "checkpoint").string();
  throw Error(fmt::format("no checkpoint in '{}' (neither {}/model.safetensors nor {}/checkpoint/)", dir, dir, dir),
              "pass the --out directory of a flatpeak train run, or a directory holding model.safetensors");
}

TrainerState checkpoint_load(const std::string& dir, const ModelConfig& cfg, ParamStore& params, Optimizer* optim,
                             Backend& be) {
  const std::string ck = checkpoint_resolve(dir);
  const fs::path root(ck);
  TrainerState state;
  // The architecture must match: compare the Hugging Face config it was written with.
  {
    const std::string path = (root / "config.json").string();
    nlohmann::json saved;
    try {
      saved = nlohmann::json::parse(file_read(path));
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("checkpoint config '{}' is not valid JSON: {}", path, e.what()),
                  "the checkpoint is damaged; use an earlier one");
    }
    const nlohmann::json want = nlohmann::json::parse(model_config_hf_json(cfg));
    for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                            "num_experts", "num_experts_per_tok", "moe_intermediate_size", "vocab_size"}) {
      FP_CHECK(saved.contains(key) && saved[key] == want[key], "use the config the checkpoint was trained with",
               "checkpoint '{}' has {} = {}, the config says {}", ck, key,
               saved.contains(key) ? saved[key].dump() : "nothing", want[key].dump());
    }
  }
  {
    const std::string path = (root / "model.safetensors").string();
    SafetensorsFile f(path);
    std::vector<std::pair<std::string, Tensor*>> weights;
    for (Param& p : params.all()) weights.emplace_back(p.name, &p.w);
    tensors_read(f, path, weights, be);
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
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("trainer state '{}' is damaged: {}", state_path.string(), e.what()),
                  "use an earlier checkpoint");
    }
  }
  if (optim != nullptr) {
    const std::string path = (root / "optimizer.safetensors").string();
    FP_CHECK(fs::exists(path), "resume needs a checkpoint written by flatpeak train (with optimizer state)",
             "checkpoint '{}' has no optimizer.safetensors", ck);
    SafetensorsFile f(path);
    std::vector<std::pair<std::string, Tensor*>> st;
    for (const auto& [name, t] : optim->state_tensors()) st.emplace_back(name, const_cast<Tensor*>(t));
    tensors_read(f, path, st, be);
    optim->set_steps_taken(state.step);
  }
  return state;
}

}  // namespace fp
