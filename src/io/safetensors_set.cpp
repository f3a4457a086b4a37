// One or several safetensors files as one set of tensors (Note [Sharded checkpoints]).
#include "io/safetensors_set.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"

namespace fp {

namespace fs = std::filesystem;

namespace {
constexpr const char* kIndexHint =
    "an index is {\"weight_map\": {\"<tensor>\": \"<file>.safetensors\", ...}} beside its shard files, as "
    "transformers' save_pretrained writes it";
}  // namespace

bool SafetensorsSet::present(const std::string& dir, const std::string& stem) {
  const fs::path d(dir);
  return fs::exists(d / (stem + ".safetensors")) || fs::exists(d / (stem + ".safetensors.index.json"));
}

SafetensorsSet::SafetensorsSet(const std::string& dir, const std::string& stem) : dir_(dir) {
  const fs::path d(dir);
  const fs::path single = d / (stem + ".safetensors");
  const fs::path index = d / (stem + ".safetensors.index.json");
  if (fs::exists(single)) {
    path_ = single.string();
    open_name_ = single.filename().string();
    open_ = std::make_unique<SafetensorsFile>(path_);
    for (const std::string& n : open_->names()) file_of_[n] = open_name_;
    return;
  }
  FP_CHECK(fs::exists(index), "a checkpoint directory holds model.safetensors or model.safetensors.index.json",
           "'{}' has neither {} nor {}", dir, single.filename().string(), index.filename().string());
  path_ = index.string();
  sharded_ = true;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(file_read(path_));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("index '{}' is not JSON: {}", path_, e.what()), kIndexHint);
  }
  FP_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), kIndexHint,
           "index '{}' has no \"weight_map\" object", path_);
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    FP_CHECK(it.value().is_string(), kIndexHint, "index '{}': the file of '{}' is {}, not a file name", path_,
             it.key(), it.value().dump());
    const std::string file = it.value().get<std::string>();
    FP_CHECK(!file.empty() && fs::path(file).filename() == file, kIndexHint,
             "index '{}': '{}' maps to '{}', not a file name in the same directory", path_, it.key(), file);
    FP_CHECK(fs::exists(d / file), "copy every shard the index names into the checkpoint directory",
             "index '{}' maps '{}' to '{}', which is missing", path_, it.key(), file);
    file_of_[it.key()] = file;
  }
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : file_of_) out.push_back(n);
  return out;
}

const SafetensorsFile& SafetensorsSet::shard(const std::string& file) {
  if (open_ != nullptr && open_name_ == file) return *open_;
  open_.reset();  // one shard in memory at a time
  open_ = std::make_unique<SafetensorsFile>((fs::path(dir_) / file).string());
  open_name_ = file;
  // The shard must hold what the index says it holds, and nothing the index maps elsewhere.
  for (const std::string& n : open_->names()) {
    auto it = file_of_.find(n);
    FP_CHECK(it != file_of_.end() && it->second == file, kIndexHint,
             "shard '{}' holds tensor '{}', which index '{}' {}", open_->path(), n, path_,
             it == file_of_.end() ? std::string("does not list") : "maps to '" + it->second + "'");
  }
  return *open_;
}

const SafetensorsFile& SafetensorsSet::holder(const std::string& name) {
  auto it = file_of_.find(name);
  FP_CHECK(it != file_of_.end(), "the checkpoint was written for another model", "checkpoint '{}' has no tensor '{}'",
           path_, name);
  const SafetensorsFile& f = shard(it->second);
  FP_CHECK(f.has(name), kIndexHint, "index '{}' maps '{}' to '{}', which does not hold it", path_, name, it->second);
  return f;
}

void SafetensorsSet::read_f32(const std::string& name, const Shape& expect, float* dst) {
  const SafetensorsFile& f = holder(name);
  f.read_f32(name, expect, dst);
  read_.insert(name);
  dtypes_.insert(f.dtype(name));
}

void SafetensorsSet::read_u8(const std::string& name, const Shape& expect, uint8_t* dst) {
  holder(name).read_u8(name, expect, dst);
  read_.insert(name);
}

void SafetensorsSet::read_f32_rows(const std::string& name, const Shape& full, int64_t row0, int64_t rows, float* dst) {
  const SafetensorsFile& f = holder(name);
  f.read_f32_rows(name, full, row0, rows, dst);
  read_.insert(name);
  dtypes_.insert(f.dtype(name));
}

void SafetensorsSet::read_u8_rows(const std::string& name, const Shape& full, int64_t row0, int64_t rows,
                                  uint8_t* dst) {
  holder(name).read_u8_rows(name, full, row0, rows, dst);
  read_.insert(name);
}

std::vector<std::string> SafetensorsSet::unread() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : file_of_)
    if (!read_.count(n)) out.push_back(n);
  return out;
}

}  // namespace fp
