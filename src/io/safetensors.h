// safetensors files: the Hugging Face tensor container, read and written without the Rust library.
//
// Layout (https://huggingface.co/docs/safetensors):
//   [8 bytes]  N, little-endian uint64: length of the header
//   [N bytes]  JSON header: {"__metadata__": {"k": "v", ...},
//                            "<name>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
//   [rest]     data section; begin/end are byte offsets into it, end exclusive
// Tensors are row-major, little-endian. flatpeak reads and writes the dtypes F32 F64 BF16 F16 I32 I64
// and shapes of rank 0 (a scalar) to 4, and U8 as raw bytes (MXFP4 blocks and scales of gpt-oss
// checkpoints, Note [MXFP4 in gpt-oss checkpoints] in io/mxfp4.h; U8 is no DType, compute never sees it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace fp {

// One tensor to write. data points to shape.numel() elements of dtype (row-major, host memory); it
// may be null only when numel() == 0. The view does not own the data.
struct SafetensorsView {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;
};

// Writes tensors and string metadata to path atomically (io/atomic_file.h: a crash leaves the old
// file or the new one). The header lists the tensors sorted by name and is padded with spaces to a
// multiple of 8 bytes. The data is contiguous (no gaps) and ordered by element size, widest first,
// then by name, as the Python safetensors library does: every tensor then starts at a multiple of
// its element size (for files of one dtype this is plain name order).
// An empty metadata map writes no "__metadata__" entry. Throws fp::Error on a duplicate or empty
// name, the reserved name "__metadata__", a negative dimension, null data for a non-empty tensor, or
// when the file cannot be written (e.g. the directory does not exist).
void safetensors_write(const std::string& path, const std::vector<SafetensorsView>& tensors,
                       const std::map<std::string, std::string>& metadata);

// One U8 tensor to write: shape.numel() raw bytes at data (host memory, not owned), which may be null
// only when numel() == 0.
struct SafetensorsU8View {
  std::string name;
  Shape shape;
  const uint8_t* data;
};

// As above, with U8 tensors besides (element size 1: their data comes after every wider tensor's).
// Names must be unique across both lists.
void safetensors_write(const std::string& path, const std::vector<SafetensorsView>& tensors,
                       const std::vector<SafetensorsU8View>& u8_tensors,
                       const std::map<std::string, std::string>& metadata);

// A whole safetensors file read into host memory and validated on construction: size >= 8, a header
// length within the file, a JSON object header, every entry with a known dtype (one of the six DTypes
// or U8), a shape of rank <= 4 and data_offsets inside the data section that match shape * dtype size,
// no two tensors overlapping, metadata values all strings. Any problem throws fp::Error naming the
// file and what is wrong. The data section is stored 8-byte aligned and files written by
// safetensors_write (or the Python library) keep every tensor at a multiple of its element size, so
// data() may be cast to the tensor's type; the read_ functions work for any alignment.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  std::vector<std::string> names() const;  // sorted
  // These throw fp::Error naming the file and the tensor when there is no tensor of that name; dtype
  // also throws for a U8 tensor (no DType; ask is_u8 first where a file may hold them).
  DType dtype(const std::string& name) const;
  bool is_u8(const std::string& name) const;
  Shape shape(const std::string& name) const;
  const void* data(const std::string& name) const;  // shape(name).numel() elements of dtype(name), or bytes
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Copies tensor `name` into dst (expect.numel() floats), converting F64/BF16/F16 to float (F64
  // rounds to nearest). Throws fp::Error naming the tensor and the file when it is missing, has an
  // integer dtype, or its shape differs from expect (the message gives both shapes).
  void read_f32(const std::string& name, const Shape& expect, float* dst) const;
  // Copies tensor `name` into dst (expect.numel() int32s). I32 is copied; I64 is narrowed and throws
  // when a value does not fit. Throws like read_f32 for a missing tensor, another dtype or shape.
  void read_i32(const std::string& name, const Shape& expect, int32_t* dst) const;
  // Copies U8 tensor `name` into dst (expect.numel() bytes). Throws like read_f32 when it is missing,
  // has another dtype (the message gives both) or another shape.
  void read_u8(const std::string& name, const Shape& expect, uint8_t* dst) const;

  // Rows [row0, row0 + rows) along dim 0 of tensor `name`, whose whole shape must be `full` (rank >= 1):
  // rows * (full.numel() / full[0]) elements into dst, e.g. expert e of an (E, R, C) tensor with
  // row0 = e, rows = 1, without copying the others. read_f32_rows converts as read_f32 does and
  // read_u8_rows copies as read_u8 does; both throw as those do for a missing tensor, another dtype or
  // a shape other than full. A range outside [0, full[0]) is the caller's bug (fp::InternalError).
  void read_f32_rows(const std::string& name, const Shape& full, int64_t row0, int64_t rows, float* dst) const;
  void read_u8_rows(const std::string& name, const Shape& full, int64_t row0, int64_t rows, uint8_t* dst) const;

 private:
  struct Entry {
    DType dtype = DType::DType_F32;
    bool u8 = false;  // a U8 tensor (raw bytes): dtype is not its dtype
    Shape shape;
    uint64_t begin = 0;  // byte offsets into the data section
    uint64_t end = 0;
  };
  const Entry& entry(const std::string& name) const;
  // The shape check, then the byte range of rows [row0, row0 + rows) of e and their element count.
  const unsigned char* rows_bytes(const std::string& name, const Entry& e, const Shape& full, int64_t row0,
                                  int64_t rows, int64_t* n) const;
  const unsigned char* bytes(const Entry& e) const {
    return reinterpret_cast<const unsigned char*>(data_.data()) + e.begin;
  }

  std::string path_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
  std::vector<uint64_t> data_;  // the data section; uint64_t elements keep every tensor aligned
};

// The safetensors dtype string ("F32", "BF16", ...) of t.
const char* safetensors_dtype_name(DType t);

}  // namespace fp
