// safetensors reader and writer (format in safetensors.h).
#include "io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"

namespace fp {

// The format is little-endian and tensors are copied as raw bytes.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// A header longer than this is certainly a damaged length field (the Python library has the same cap).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kDamagedHint =
    "the file is damaged or is not a safetensors file; write it again (flatpeak writes atomically, so a "
    "partial file comes from an interrupted copy or another program)";

bool dtype_from_safetensors(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> table[] = {
      {"F32", DType::DType_F32},   {"F64", DType::DType_F64}, {"BF16", DType::DType_BF16},
      {"F16", DType::DType_F16},   {"I32", DType::DType_I32}, {"I64", DType::DType_I64},
  };
  for (const auto& [name, t] : table)
    if (s == name) {
      *out = t;
      return true;
    }
  return false;
}

// Bytes of a tensor of elements of elem_size bytes, or false when the product overflows 64 bits.
bool tensor_bytes(const Shape& shape, uint64_t elem_size, uint64_t* out) {
  uint64_t n = elem_size;
  for (int i = 0; i < shape.rank; ++i) {
    const uint64_t d = static_cast<uint64_t>(shape[i]);
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / d) return false;
    n *= d;
  }
  *out = n;
  return true;
}

template <class T>
T load(const unsigned char* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));  // any alignment
  return v;
}

// A tensor to write, either kind of view: dtype is its safetensors string, elem its element size.
struct TensorOut {
  const std::string* name;
  const char* dtype;
  uint64_t elem;
  Shape shape;
  const void* data;
};

void safetensors_write_all(const std::string& path, const std::vector<TensorOut>& tensors,
                           const std::map<std::string, std::string>& metadata);

}  // namespace

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::DType_F32: return "F32";
    case DType::DType_F64: return "F64";
    case DType::DType_BF16: return "BF16";
    case DType::DType_F16: return "F16";
    case DType::DType_I32: return "I32";
    case DType::DType_I64: return "I64";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------------
// Writing

void safetensors_write(const std::string& path, const std::vector<SafetensorsView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  safetensors_write(path, tensors, {}, metadata);
}

void safetensors_write(const std::string& path, const std::vector<SafetensorsView>& tensors,
                       const std::vector<SafetensorsU8View>& u8_tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorOut> all;
  all.reserve(tensors.size() + u8_tensors.size());
  for (const SafetensorsView& v : tensors)
    all.push_back({&v.name, safetensors_dtype_name(v.dtype), dtype_size(v.dtype), v.shape, v.data});
  for (const SafetensorsU8View& v : u8_tensors) all.push_back({&v.name, "U8", 1, v.shape, v.data});
  safetensors_write_all(path, all, metadata);
}

namespace {

void safetensors_write_all(const std::string& path, const std::vector<TensorOut>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  const char* hint = "this is a bug in the caller; tensor names must be unique and shapes valid";
  std::vector<size_t> by_name(tensors.size());
  std::iota(by_name.begin(), by_name.end(), size_t{0});
  std::sort(by_name.begin(), by_name.end(), [&](size_t a, size_t b) { return *tensors[a].name < *tensors[b].name; });
  std::vector<uint64_t> bytes(tensors.size());
  for (size_t k = 0; k < by_name.size(); ++k) {
    const TensorOut& v = tensors[by_name[k]];
    const std::string& name = *v.name;
    FP_CHECK(!name.empty() && name != "__metadata__", hint, "cannot write '{}': invalid tensor name '{}'", path, name);
    FP_CHECK(k == 0 || *tensors[by_name[k - 1]].name != name, hint, "cannot write '{}': tensor '{}' appears twice",
             path, name);
    FP_CHECK(v.shape.rank >= 0 && v.shape.rank <= Shape::kMaxRank, hint, "cannot write '{}': tensor '{}' has rank {}",
             path, name, v.shape.rank);
    for (int i = 0; i < v.shape.rank; ++i)
      FP_CHECK(v.shape[i] >= 0, hint, "cannot write '{}': tensor '{}' has shape {}", path, name, v.shape.str());
    FP_CHECK(tensor_bytes(v.shape, v.elem, &bytes[by_name[k]]), hint,
             "cannot write '{}': tensor '{}' of shape {} is too large", path, name, v.shape.str());
    FP_CHECK(v.data != nullptr || bytes[by_name[k]] == 0, hint, "cannot write '{}': tensor '{}' has no data", path,
             name);
  }

  // Data order: widest element first, then name, so each tensor starts at a multiple of its element
  // size (the header and its padding end on a multiple of 8).
  std::vector<size_t> by_layout = by_name;
  std::stable_sort(by_layout.begin(), by_layout.end(),
                   [&](size_t a, size_t b) { return tensors[a].elem > tensors[b].elem; });
  std::vector<uint64_t> begin(tensors.size());
  uint64_t total = 0;
  for (size_t i : by_layout) {
    begin[i] = total;
    total += bytes[i];
  }

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  for (size_t i : by_name) {
    const TensorOut& v = tensors[i];
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int d = 0; d < v.shape.rank; ++d) shape.push_back(v.shape[d]);
    header[*v.name] = {
        {"dtype", v.dtype}, {"shape", std::move(shape)}, {"data_offsets", {begin[i], begin[i] + bytes[i]}}};
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("cannot write '{}': a tensor name or metadata string is not valid UTF-8 ({})", path,
                            e.what()),
                "use UTF-8 names and metadata");
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  std::string buf(8 + text.size() + total, '\0');
  const uint64_t n = text.size();
  std::memcpy(buf.data(), &n, 8);
  std::memcpy(buf.data() + 8, text.data(), text.size());
  char* data = buf.data() + 8 + text.size();
  for (size_t i = 0; i < tensors.size(); ++i)
    if (bytes[i] > 0) std::memcpy(data + begin[i], tensors[i].data, bytes[i]);
  file_write_atomic(path, buf.data(), buf.size());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Reading

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto damaged = [&](const std::string& what) {
    return Error(fmt::format("safetensors file '{}': {}", path, what), kDamagedHint);
  };

  std::error_code ec;
  FP_CHECK(!std::filesystem::is_directory(path, ec), "pass the path of a .safetensors file",
           "cannot read safetensors file '{}': it is a directory", path);
  std::ifstream in(path, std::ios::binary);
  FP_CHECK(in.good(), "check the path", "cannot read safetensors file '{}': {}", path, std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0, std::ios::beg);
  FP_CHECK(end >= 0, "check the path", "cannot read safetensors file '{}': cannot find its size", path);
  const uint64_t size = static_cast<uint64_t>(end);
  if (size < 8) throw damaged(fmt::format("the file is {} bytes, too short for the 8-byte header length", size));

  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > size - 8)
    throw damaged(fmt::format("the header length field says {} bytes but only {} bytes follow it (truncated file?)",
                              n, size - 8));
  if (n > kMaxHeaderBytes)
    throw damaged(fmt::format("the header length field says {} bytes, more than the {} byte limit", n,
                              kMaxHeaderBytes));
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  const uint64_t data_bytes = size - 8 - n;
  data_.assign((data_bytes + 7) / 8, 0);
  in.read(reinterpret_cast<char*>(data_.data()), static_cast<std::streamsize>(data_bytes));
  FP_CHECK(in.good(), "check that the file is not being written", "cannot read safetensors file '{}': {}", path,
           std::strerror(errno));

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw damaged(fmt::format("the header is not valid JSON ({})", e.what()));
  }
  if (!header.is_object()) throw damaged(fmt::format("the header is JSON {}, not an object", header.type_name()));

  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw damaged("\"__metadata__\" is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) throw damaged(fmt::format("metadata \"{}\" is {}, not a string", k, s.dump()));
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", name);
    if (!v.is_object()) throw damaged(fmt::format("{} is {}, not an object", where, v.dump()));
    Entry e;
    const auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) throw damaged(where + " has no \"dtype\" string");
    e.u8 = dt->get<std::string>() == "U8";
    if (!e.u8 && !dtype_from_safetensors(dt->get<std::string>(), &e.dtype))
      throw Error(fmt::format("safetensors file '{}': {} has dtype \"{}\", which flatpeak does not read", path, where,
                              dt->get<std::string>()),
                  "flatpeak reads F32, F64, BF16, F16, I32, I64 and U8; convert the file (e.g. with torch) first");
    const auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) throw damaged(where + " has no \"shape\" array");
    if (sh->size() > static_cast<size_t>(Shape::kMaxRank))
      throw Error(fmt::format("safetensors file '{}': {} has rank {} (shape {}); flatpeak handles rank <= {}", path,
                              where, sh->size(), sh->dump(), Shape::kMaxRank),
                  "flatpeak reads tensors of at most 4 dimensions");
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        throw damaged(fmt::format("{} has shape {}, whose dimensions are not all integers >= 0", where, sh->dump()));
      e.shape.dims[e.shape.rank++] = d.get<int64_t>();
    }
    const auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      throw damaged(where + " has no \"data_offsets\" pair of integers >= 0");
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end || e.end > data_bytes)
      throw damaged(fmt::format("{} has data_offsets [{}, {}] outside the {}-byte data section{}", where, e.begin,
                                e.end, data_bytes, e.end > data_bytes ? " (truncated file?)" : ""));
    uint64_t want = 0;
    if (!tensor_bytes(e.shape, e.u8 ? 1 : dtype_size(e.dtype), &want))
      throw damaged(fmt::format("{} has shape {}, too large to address", where, e.shape.str()));
    if (want != e.end - e.begin)
      throw damaged(fmt::format("{} has shape {} of {} ({} bytes) but data_offsets [{}, {}] span {} bytes", where,
                                e.shape.str(), dt->get<std::string>(), want, e.begin, e.end, e.end - e.begin));
    entries_.emplace(name, e);
  }

  // No two tensors may share bytes: sort by start and compare neighbours (empty tensors share nothing).
  std::vector<std::pair<const std::string*, const Entry*>> spans;
  for (const auto& [name, e] : entries_)
    if (e.end > e.begin) spans.emplace_back(&name, &e);
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].second->begin < spans[i - 1].second->end)
      throw damaged(fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", *spans[i - 1].first,
                                spans[i - 1].second->begin, spans[i - 1].second->end, *spans[i].first,
                                spans[i].second->begin, spans[i].second->end));
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string some;
    int shown = 0;
    for (const auto& [n, e] : entries_) {
      if (shown++ == 5) {
        some += ", ...";
        break;
      }
      some += (shown > 1 ? ", " : "") + n;
    }
    throw Error(fmt::format("safetensors file '{}' has no tensor '{}' (it holds {} tensors: {})", path_, name,
                            entries_.size(), some),
                "the file was written for another model or configuration");
  }
  return it->second;
}

DType SafetensorsFile::dtype(const std::string& name) const {
  const Entry& e = entry(name);
  FP_CHECK(!e.u8, "a U8 tensor holds raw bytes (e.g. MXFP4 blocks or scales); read it with read_u8",
           "safetensors file '{}': tensor '{}' has dtype U8, which is no DType", path_, name);
  return e.dtype;
}
bool SafetensorsFile::is_u8(const std::string& name) const { return entry(name).u8; }
Shape SafetensorsFile::shape(const std::string& name) const { return entry(name).shape; }
const void* SafetensorsFile::data(const std::string& name) const { return bytes(entry(name)); }

namespace {

void shape_check(const std::string& path, const std::string& name, const Shape& found, const Shape& expect) {
  FP_CHECK(found == expect, "the file was written for another model or configuration",
           "safetensors file '{}': tensor '{}' has shape {}, expected {}", path, name, found.str(), expect.str());
}

// The n elements at p of tensor `name`, stored as dtype (or U8), into dst as floats (F64/BF16/F16
// converted); throws for an integer or U8 tensor.
void f32_convert(const std::string& path, const std::string& name, bool u8, DType dtype, const unsigned char* p,
                 int64_t n, float* dst) {
  if (!u8) {
    switch (dtype) {
      case DType::DType_F32:
        if (n > 0) std::memcpy(dst, p, static_cast<size_t>(n) * 4);
        return;
      case DType::DType_F64:
        for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load<double>(p, i));
        return;
      case DType::DType_BF16:
        for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(load<uint16_t>(p, i));
        return;
      case DType::DType_F16:
        for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(load<uint16_t>(p, i));
        return;
      case DType::DType_I32:
      case DType::DType_I64:
        break;
    }
  }
  throw Error(fmt::format("safetensors file '{}': tensor '{}' has dtype {}, expected a floating-point dtype", path,
                          name, u8 ? "U8" : safetensors_dtype_name(dtype)),
              "the file was written for another purpose; check which file is passed");
}

void u8_check(const std::string& path, const std::string& name, bool u8, DType dtype) {
  FP_CHECK(u8, "the file was written for another purpose; check which file is passed",
           "safetensors file '{}': tensor '{}' has dtype {}, expected U8", path, name, safetensors_dtype_name(dtype));
}

}  // namespace

void SafetensorsFile::read_f32(const std::string& name, const Shape& expect, float* dst) const {
  const Entry& e = entry(name);
  shape_check(path_, name, e.shape, expect);
  f32_convert(path_, name, e.u8, e.dtype, bytes(e), e.shape.numel(), dst);
}

void SafetensorsFile::read_i32(const std::string& name, const Shape& expect, int32_t* dst) const {
  const Entry& e = entry(name);
  shape_check(path_, name, e.shape, expect);
  const unsigned char* p = bytes(e);
  const int64_t n = e.shape.numel();
  if (!e.u8 && e.dtype == DType::DType_I32) {
    if (n > 0) std::memcpy(dst, p, static_cast<size_t>(n) * 4);
    return;
  }
  if (!e.u8 && e.dtype == DType::DType_I64) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = load<int64_t>(p, i);
      FP_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
               "the values must fit in 32 bits", "safetensors file '{}': tensor '{}' element {} = {} does not fit int32",
               path_, name, i, v);
      dst[i] = static_cast<int32_t>(v);
    }
    return;
  }
  throw Error(fmt::format("safetensors file '{}': tensor '{}' has dtype {}, expected I32 or I64", path_, name,
                          e.u8 ? "U8" : safetensors_dtype_name(e.dtype)),
              "the file was written for another purpose; check which file is passed");
}

void SafetensorsFile::read_u8(const std::string& name, const Shape& expect, uint8_t* dst) const {
  const Entry& e = entry(name);
  shape_check(path_, name, e.shape, expect);
  u8_check(path_, name, e.u8, e.dtype);
  const int64_t n = e.shape.numel();
  if (n > 0) std::memcpy(dst, bytes(e), static_cast<size_t>(n));
}

const unsigned char* SafetensorsFile::rows_bytes(const std::string& name, const Entry& e, const Shape& full,
                                                 int64_t row0, int64_t rows, int64_t* n) const {
  shape_check(path_, name, e.shape, full);
  FP_ASSERT(full.rank >= 1 && row0 >= 0 && rows >= 0 && row0 + rows <= full[0], "rows [{}, {}) of '{}' of shape {}",
            row0, row0 + rows, name, full.str());
  const int64_t per_row = full[0] > 0 ? full.numel() / full[0] : 0;
  *n = rows * per_row;
  return bytes(e) + row0 * per_row * static_cast<int64_t>(e.u8 ? 1 : dtype_size(e.dtype));
}

void SafetensorsFile::read_f32_rows(const std::string& name, const Shape& full, int64_t row0, int64_t rows,
                                    float* dst) const {
  const Entry& e = entry(name);
  int64_t n = 0;
  const unsigned char* p = rows_bytes(name, e, full, row0, rows, &n);
  f32_convert(path_, name, e.u8, e.dtype, p, n, dst);
}

void SafetensorsFile::read_u8_rows(const std::string& name, const Shape& full, int64_t row0, int64_t rows,
                                   uint8_t* dst) const {
  const Entry& e = entry(name);
  int64_t n = 0;
  const unsigned char* p = rows_bytes(name, e, full, row0, rows, &n);
  u8_check(path_, name, e.u8, e.dtype);
  if (n > 0) std::memcpy(dst, p, static_cast<size_t>(n));
}

}  // namespace fp
