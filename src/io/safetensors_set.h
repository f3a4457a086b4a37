// The tensors of a checkpoint directory, in one safetensors file or sharded over several.
//
// Note [Sharded checkpoints]: transformers writes a model above its max_shard_size as
// "<stem>-00001-of-0000N.safetensors" files plus "<stem>.safetensors.index.json", whose "weight_map"
// names the file of every tensor ({"metadata": {...}, "weight_map": {"<tensor>": "<file>", ...}}).
// SafetensorsSet reads either layout. One shard is in memory at a time (opened on first use); a
// shard holding a tensor that the index maps elsewhere, or an index naming a file that is missing, is
// an error. Every read is recorded, so that the caller can refuse the tensors nobody read
// (Note [No weight is dropped silently] in train/checkpoint.cpp).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace fp {

class SafetensorsSet {
 public:
  // dir holds <stem>.safetensors or <stem>.safetensors.index.json (the single file wins when both
  // exist, as in transformers). Throws fp::Error when neither does, or the index is malformed.
  SafetensorsSet(const std::string& dir, const std::string& stem);
  // Whether dir holds either layout for stem.
  static bool present(const std::string& dir, const std::string& stem);

  // The single file or the index: how errors name the set.
  const std::string& path() const { return path_; }
  bool sharded() const { return sharded_; }
  bool has(const std::string& name) const { return file_of_.count(name) != 0; }
  std::vector<std::string> names() const;  // sorted

  // As SafetensorsFile::read_f32 (F32, F64, BF16 and F16 converted to float); records the read and
  // the tensor's stored dtype.
  void read_f32(const std::string& name, const Shape& expect, float* dst);
  // As SafetensorsFile::read_u8 (raw bytes: MXFP4 blocks and scales); records the read (U8 is no DType,
  // so dtypes_read() does not list it).
  void read_u8(const std::string& name, const Shape& expect, uint8_t* dst);
  // As SafetensorsFile::read_f32_rows / read_u8_rows: rows [row0, row0 + rows) along dim 0 of a tensor
  // of shape full (expert e of an (E, ...) tensor), recorded as read_f32 / read_u8 record theirs. Any
  // range counts as reading the tensor: a caller going expert by expert reads every one.
  void read_f32_rows(const std::string& name, const Shape& full, int64_t row0, int64_t rows, float* dst);
  void read_u8_rows(const std::string& name, const Shape& full, int64_t row0, int64_t rows, uint8_t* dst);

  // Tensors never read, sorted.
  std::vector<std::string> unread() const;
  // The stored dtypes of the tensors read so far (e.g. {BF16}).
  const std::set<DType>& dtypes_read() const { return dtypes_; }

 private:
  const SafetensorsFile& shard(const std::string& file);
  // The shard holding tensor `name` (opened if need be); throws when the set has no such tensor.
  const SafetensorsFile& holder(const std::string& name);

  std::string dir_, path_;
  bool sharded_ = false;
  std::map<std::string, std::string> file_of_;  // tensor -> file name within dir_
  std::string open_name_;
  std::unique_ptr<SafetensorsFile> open_;
  std::set<std::string> read_;
  std::set<DType> dtypes_;
};

}  // namespace fp
