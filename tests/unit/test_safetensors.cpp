// safetensors reader/writer: roundtrips, the byte layout, every kind of damaged file, and a
// cross-check against an independent hand-written Python parser (when /usr/bin/python3 has torch).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "../common/temp_dir.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace fp {
namespace {

namespace fs = std::filesystem;

using test_files::expect_error;
// A fresh directory under /tmp, removed with everything in it at the end of the test.
struct TempDir : test_files::TempDir {
  TempDir() : test_files::TempDir("fp_safetensors") {}
};

// A file made by hand: 8-byte length (header.size() unless given), header text, data bytes.
void raw_write(const std::string& path, const std::string& header, const std::string& data,
               int64_t length_field = -1) {
  const uint64_t n = length_field < 0 ? header.size() : static_cast<uint64_t>(length_field);
  std::string buf(8, '\0');
  std::memcpy(buf.data(), &n, 8);
  buf += header;
  buf += data;
  file_write_atomic(path, buf);
}

template <class T>
std::vector<T> values_random(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<T>(rng.normal() * 100.0);
  return v;
}

uint16_t bf16_from_float(float f) {  // truncation; the test only round-trips bits
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

TEST(Safetensors, RoundtripDtypesAndShapes) {
  TempDir tmp;
  const std::string path = tmp.file("a.safetensors");
  auto f32 = values_random<float>(2 * 3, 1);
  auto f64 = values_random<double>(5, 2);
  auto i32 = values_random<int32_t>(4, 3);
  auto i64 = values_random<int64_t>(1, 4);
  std::vector<uint16_t> bf16(2 * 1 * 3 * 2), f16(3);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = static_cast<uint16_t>(0x3f00 + 37 * i);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = static_cast<uint16_t>(0x3c00 + 11 * i);
  std::vector<SafetensorsView> views = {
      {"w.f32", DType::DType_F32, {2, 3}, f32.data()},
      {"b.bf16", DType::DType_BF16, {2, 1, 3, 2}, bf16.data()},  // rank 4
      {"c.f64", DType::DType_F64, {5}, f64.data()},
      {"a.f16", DType::DType_F16, {3}, f16.data()},             // 6 bytes: pushes the next offset off 8
      {"z.i32", DType::DType_I32, {2, 2}, i32.data()},
      {"scalar.i64", DType::DType_I64, {}, i64.data()},          // rank 0
      {"empty.f32", DType::DType_F32, {0, 3}, nullptr},          // no elements
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"config", "{\"a\": [1, 2]}"}};
  safetensors_write(path, views, meta);

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(), meta);
  std::vector<std::string> want_names;
  for (const auto& v : views) want_names.push_back(v.name);
  std::sort(want_names.begin(), want_names.end());
  EXPECT_EQ(f.names(), want_names);
  for (const auto& v : views) {
    ASSERT_TRUE(f.has(v.name)) << v.name;
    EXPECT_EQ(f.dtype(v.name), v.dtype) << v.name;
    EXPECT_EQ(f.shape(v.name), v.shape) << v.name << " " << f.shape(v.name).str();
    const size_t bytes = static_cast<size_t>(v.shape.numel()) * dtype_size(v.dtype);
    if (bytes > 0) {
      EXPECT_EQ(std::memcmp(f.data(v.name), v.data, bytes), 0) << v.name;
    }
    // Every tensor starts aligned to its element size, so data() may be cast.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.data(v.name)) % dtype_size(v.dtype), 0u) << v.name;
  }
  EXPECT_EQ(f.shape("scalar.i64").rank, 0);
  EXPECT_FALSE(f.has("missing"));

  // Copy-out helpers.
  std::vector<float> got(6);
  f.read_f32("w.f32", {2, 3}, got.data());
  EXPECT_EQ(std::memcmp(got.data(), f32.data(), 24), 0);
  std::vector<float> from64(5);
  f.read_f32("c.f64", {5}, from64.data());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(from64[i], static_cast<float>(f64[i]));
  std::vector<int32_t> ints(4);
  f.read_i32("z.i32", {2, 2}, ints.data());
  EXPECT_EQ(ints, i32);
  int32_t one = 0;
  f.read_i32("scalar.i64", {}, &one);
  EXPECT_EQ(one, static_cast<int32_t>(i64[0]));
  f.read_f32("empty.f32", {0, 3}, nullptr);
}

TEST(Safetensors, EmptyMetadataAndNoTensors) {
  TempDir tmp;
  const std::string path = tmp.file("e.safetensors");
  safetensors_write(path, {}, {});
  SafetensorsFile f(path);
  EXPECT_TRUE(f.names().empty());
  EXPECT_TRUE(f.metadata().empty());
  const std::string raw = file_read(path);
  EXPECT_EQ(raw.size() % 8, 0u);
  EXPECT_EQ(raw.find("__metadata__"), std::string::npos);  // empty metadata writes no entry

  float x = 2.5f;
  safetensors_write(path, {{"x", DType::DType_F32, {1}, &x}}, {});
  SafetensorsFile g(path);
  EXPECT_TRUE(g.metadata().empty());
  float y = 0;
  g.read_f32("x", {1}, &y);
  EXPECT_EQ(y, 2.5f);
}

TEST(Safetensors, HeaderLayout) {
  TempDir tmp;
  const std::string path = tmp.file("l.safetensors");
  auto a = values_random<float>(7, 5);
  auto b = values_random<float>(3, 6);
  auto c = values_random<float>(1, 7);
  safetensors_write(path, {{"m", DType::DType_F32, {7}, a.data()}, {"b", DType::DType_F32, {3}, b.data()},
                           {"z", DType::DType_F32, {1}, c.data()}},
                    {{"k", "v"}});
  const std::string raw = file_read(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string text = raw.substr(8, n);
  const size_t close = text.find_last_of('}');
  ASSERT_NE(close, std::string::npos);
  EXPECT_EQ(text.substr(close + 1), std::string(n - close - 1, ' '));  // padding is spaces only
  // Header order: names sorted; offsets contiguous in that order (one dtype), ending at the file end.
  auto h = nlohmann::ordered_json::parse(text);
  std::vector<std::string> order;
  uint64_t next = 0;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") continue;
    order.push_back(name);
    EXPECT_EQ(v["data_offsets"][0].get<uint64_t>(), next) << name;
    next = v["data_offsets"][1].get<uint64_t>();
  }
  EXPECT_EQ(order, (std::vector<std::string>{"b", "m", "z"}));
  EXPECT_EQ(8 + n + next, raw.size());
  EXPECT_EQ(h["__metadata__"]["k"], "v");
  EXPECT_EQ(std::memcmp(raw.data() + 8 + n, b.data(), 12), 0);
}

TEST(Safetensors, ConvertsHalfTypesToFloat) {
  TempDir tmp;
  const std::string path = tmp.file("h.safetensors");
  const float want[5] = {1.0f, -2.5f, 0.375f, 65504.0f, 5.9604645e-08f};  // last: smallest f16 subnormal
  const uint16_t f16[5] = {0x3c00, 0xc100, 0x3600, 0x7bff, 0x0001};
  uint16_t bf16[5];
  for (int i = 0; i < 5; ++i) bf16[i] = bf16_from_float(want[i]);
  safetensors_write(path, {{"h", DType::DType_F16, {5}, f16}, {"b", DType::DType_BF16, {5}, bf16}}, {});
  SafetensorsFile f(path);
  float got[5];
  f.read_f32("h", {5}, got);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i], want[i]) << i;
  f.read_f32("b", {5}, got);
  for (int i = 0; i < 5; ++i) {  // bf16 is the top half of the float's bits
    const uint32_t bits = static_cast<uint32_t>(bf16[i]) << 16;
    float exact;
    std::memcpy(&exact, &bits, 4);
    EXPECT_EQ(got[i], exact) << i;
    if (i < 3) {
      EXPECT_EQ(got[i], want[i]) << i;  // these three are exact in bf16
    }
  }
}

TEST(Safetensors, ReadMismatchesNameTheTensor) {
  TempDir tmp;
  const std::string path = tmp.file("m.safetensors");
  auto a = values_random<float>(6, 8);
  int32_t ids[2] = {1, 2};
  int64_t big = int64_t{1} << 40;
  safetensors_write(path, {{"layer.w", DType::DType_F32, {2, 3}, a.data()}, {"ids", DType::DType_I32, {2}, ids},
                           {"big", DType::DType_I64, {}, &big}},
                    {});
  SafetensorsFile f(path);
  std::vector<float> dst(6);
  std::vector<int32_t> idst(6);
  expect_error([&] { f.read_f32("layer.w", {3, 2}, dst.data()); }, {path, "layer.w", "(2, 3)", "(3, 2)"});
  expect_error([&] { f.read_f32("layer.w", {6}, dst.data()); }, {"layer.w", "(2, 3)", "(6)"});
  expect_error([&] { f.read_f32("ids", {2}, dst.data()); }, {path, "'ids'", "I32"});
  expect_error([&] { f.read_i32("layer.w", {2, 3}, idst.data()); }, {"layer.w", "F32"});
  expect_error([&] { f.read_i32("big", {}, idst.data()); }, {"big", "int32"});
  expect_error([&] { f.read_f32("nope", {1}, dst.data()); }, {path, "'nope'"});
  expect_error([&] { (void)f.shape("nope"); }, {"'nope'"});
}

TEST(Safetensors, WriteErrors) {
  TempDir tmp;
  float x = 1;
  const std::string missing_dir = tmp.file("no/such/dir/x.safetensors");
  expect_error([&] { safetensors_write(missing_dir, {{"x", DType::DType_F32, {1}, &x}}, {}); }, {missing_dir});
  EXPECT_FALSE(fs::exists(missing_dir));
  const std::string path = tmp.file("w.safetensors");
  expect_error([&] { safetensors_write(path, {{"x", DType::DType_F32, {1}, &x}, {"x", DType::DType_F32, {1}, &x}}, {}); },
               {"'x'", "twice"});
  expect_error([&] { safetensors_write(path, {{"", DType::DType_F32, {1}, &x}}, {}); }, {"name"});
  expect_error([&] { safetensors_write(path, {{"__metadata__", DType::DType_F32, {1}, &x}}, {}); }, {"__metadata__"});
  expect_error([&] { safetensors_write(path, {{"x", DType::DType_F32, {2, -1}, &x}}, {}); }, {"'x'", "(2, -1)"});
  expect_error([&] { safetensors_write(path, {{"x", DType::DType_F32, {2}, nullptr}}, {}); }, {"'x'", "no data"});
  EXPECT_FALSE(fs::exists(path));
}

TEST(Safetensors, WriteReplacesAtomically) {
  TempDir tmp;
  const std::string path = tmp.file("r.safetensors");
  float a = 1, b = 2;
  safetensors_write(path, {{"a", DType::DType_F32, {1}, &a}}, {});
  safetensors_write(path, {{"b", DType::DType_F32, {1}, &b}}, {});
  SafetensorsFile f(path);
  EXPECT_EQ(f.names(), std::vector<std::string>{"b"});
  int entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.dir)) entries += (e.path().string() != "");
  EXPECT_EQ(entries, 1);  // no temp file left behind
}

TEST(Safetensors, DamagedFiles) {
  TempDir tmp;
  const std::string good = tmp.file("good.safetensors");
  auto a = values_random<float>(6, 9);
  auto b = values_random<float>(4, 10);
  safetensors_write(good, {{"a", DType::DType_F32, {2, 3}, a.data()}, {"b", DType::DType_F32, {4}, b.data()}},
                    {{"k", "v"}});
  const std::string raw = file_read(good);
  ASSERT_NO_THROW(SafetensorsFile{good});
  const std::string p = tmp.file("bad.safetensors");
  auto open = [&] { SafetensorsFile f(p); };

  // Missing file and a directory.
  expect_error([&] { SafetensorsFile f(tmp.file("absent.safetensors")); }, {"absent.safetensors"});
  expect_error([&] { SafetensorsFile f(tmp.dir.string()); }, {tmp.dir.string(), "directory"});

  // Shorter than the length field, and empty.
  file_write_atomic(p, raw.substr(0, 5));
  expect_error(open, {p, "5 bytes", "too short"});
  file_write_atomic(p, std::string());
  expect_error(open, {p, "0 bytes"});

  // Truncated in the header, and in the data section.
  file_write_atomic(p, raw.substr(0, 20));
  expect_error(open, {p, "header length", "truncated"});
  file_write_atomic(p, raw.substr(0, raw.size() - 3));
  expect_error(open, {p, "outside", "truncated"});

  // A header length larger than the file, and an absurd one.
  raw_write(p, "{}", "", 1000);
  expect_error(open, {p, "1000 bytes", "2 bytes follow"});
  raw_write(p, "{}", "", int64_t{1} << 62);
  expect_error(open, {p, "header length"});
  // Header length that cuts the JSON short.
  raw_write(p, "{\"a\": {}}", "", 4);
  expect_error(open, {p, "not valid JSON"});

  // Not JSON, JSON that is not an object.
  raw_write(p, "{\"a\": {\"dtype\": \"F32\",", "");
  expect_error(open, {p, "not valid JSON"});
  raw_write(p, "[1, 2]", "");
  expect_error(open, {p, "not an object"});

  const std::string data(16, 'x');
  // Unknown and malformed dtypes.
  raw_write(p, R"({"t": {"dtype": "F99", "shape": [4], "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'", "F99"});
  raw_write(p, R"({"t": {"dtype": "I8", "shape": [16], "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'", "I8"});
  raw_write(p, R"({"t": {"shape": [4], "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'", "dtype"});
  // Shapes: missing, negative, fractional, rank 5.
  raw_write(p, R"({"t": {"dtype": "F32", "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'", "shape"});
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'", "[-4]"});
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'", "shape"});
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [1,1,1,1,4], "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'", "rank 5"});
  // Offsets: missing, not a pair, negative, reversed, past the end, inconsistent with the shape.
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [4]}})", data);
  expect_error(open, {p, "'t'", "data_offsets"});
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [16]}})", data);
  expect_error(open, {p, "'t'", "data_offsets"});
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [-4, 12]}})", data);
  expect_error(open, {p, "'t'", "data_offsets"});
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", data);
  expect_error(open, {p, "'t'", "[8, 4]"});
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", data);
  expect_error(open, {p, "'t'", "[8, 24]", "16-byte data section"});
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'", "(3)", "12 bytes", "16 bytes"});
  raw_write(p, R"({"t": {"dtype": "F64", "shape": [4], "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'", "32 bytes"});
  raw_write(p, R"({"t": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 16]}})", data);
  expect_error(open, {p, "'t'"});
  // Overlap.
  raw_write(p,
            R"({"s": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
                "t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
            data);
  expect_error(open, {p, "'s'", "'t'", "overlap"});
  // An entry that is not an object; metadata that is not strings.
  raw_write(p, R"({"t": 3})", data);
  expect_error(open, {p, "'t'"});
  raw_write(p, R"({"__metadata__": {"k": 1}})", data);
  expect_error(open, {p, "metadata", "\"k\""});
  raw_write(p, R"({"__metadata__": [1]})", data);
  expect_error(open, {p, "__metadata__"});

  // The same file made by hand reads fine, with unpadded header and an empty tensor sharing an offset.
  raw_write(p,
            R"({"s": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]},
                "e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [4, 4]},
                "t": {"dtype": "F16", "shape": [4], "data_offsets": [8, 16]}})",
            data);
  SafetensorsFile f(p);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"e", "s", "t"}));
  EXPECT_EQ(f.shape("e"), (Shape{0, 5}));
}

// Runs a shell command; returns its exit status (-1 when it did not exit normally).
int run(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Independent check of the byte format: Python parses what C++ wrote (struct + json +
// torch.frombuffer, no safetensors package), and writes a file by hand (unpadded header, mixed
// alignment) that C++ must read.
TEST(Safetensors, CrossCheckWithPython) {
  if (run("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch";
  TempDir tmp;
  const std::string from_cpp = tmp.file("cpp.safetensors");
  const std::string from_py = tmp.file("py.safetensors");
  const std::string script = tmp.file("check.py");
  const float f32[6] = {1.5f, -2.25f, 3.0e-3f, 1e30f, -0.0f, 7.0f};
  const double f64 = -1.0 / 3.0;
  const int32_t i32[4] = {-7, 0, 2147483647, 12};
  const int64_t i64[2] = {-(int64_t{1} << 40), 5};
  const uint16_t bf16[3] = {bf16_from_float(1.5f), bf16_from_float(-0.375f), bf16_from_float(96.0f)};
  const uint16_t f16[2] = {0x3c00, 0xc100};  // 1.0, -2.5
  safetensors_write(from_cpp,
                    {{"w.f32", DType::DType_F32, {2, 3}, f32},
                     {"s.f64", DType::DType_F64, {}, &f64},
                     {"i.i32", DType::DType_I32, {1, 2, 2}, i32},
                     {"j.i64", DType::DType_I64, {2}, i64},
                     {"b.bf16", DType::DType_BF16, {3}, bf16},
                     {"h.f16", DType::DType_F16, {1, 1, 1, 2}, f16}},
                    {{"config", "{\"x\": 1}"}});
  std::ofstream(script) << R"PY(
import json, struct, sys, torch
src, dst = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert n % 8 == 0, n
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
assert header.pop("__metadata__") == {"config": '{"x": 1}'}
dt = {"F32": torch.float32, "F64": torch.float64, "I32": torch.int32, "I64": torch.int64,
      "BF16": torch.bfloat16, "F16": torch.float16}
got, end = {}, 0
for name, e in header.items():
    b, f = e["data_offsets"]
    t = torch.frombuffer(bytearray(data[b:f]), dtype=dt[e["dtype"]]).reshape(e["shape"])
    assert b % t.element_size() == 0, (name, b)
    got[name] = t
    end = max(end, f)
assert end == len(data), (end, len(data))
assert list(header) == sorted(header), list(header)
want = {
    "w.f32": torch.tensor([[1.5, -2.25, 3.0e-3], [1e30, -0.0, 7.0]], dtype=torch.float32),
    "s.f64": torch.tensor(-1.0 / 3.0, dtype=torch.float64),
    "i.i32": torch.tensor([[[-7, 0], [2147483647, 12]]], dtype=torch.int32),
    "j.i64": torch.tensor([-(1 << 40), 5], dtype=torch.int64),
    "b.bf16": torch.tensor([1.5, -0.375, 96.0], dtype=torch.bfloat16),
    "h.f16": torch.tensor([[[[1.0, -2.5]]]], dtype=torch.float16),
}
assert sorted(got) == sorted(want), sorted(got)
for k in want:
    assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, (k, got[k])
    assert torch.equal(got[k], want[k]), (k, got[k], want[k])
assert torch.signbit(got["w.f32"][1, 1])
# Now a file written by hand: unpadded header, an F16 before an F32 (offset 6, not 4-aligned).
ts = [("z", torch.tensor([0.5, -1.0, 2.0], dtype=torch.float16)),
      ("a", torch.arange(5, dtype=torch.float32) * 0.25 - 1.0),
      ("n", torch.tensor([3, -4], dtype=torch.int64))]
hdr, blob = {"__metadata__": {"who": "python"}}, b""
for name, t in ts:
    bts = t.numpy().tobytes()
    hdr[name] = {"dtype": {torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}[t.dtype],
                 "shape": list(t.shape), "data_offsets": [len(blob), len(blob) + len(bts)]}
    blob += bts
h = json.dumps(hdr).encode()
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + blob)
print("python cross-check OK")
)PY";
  ASSERT_EQ(run("/usr/bin/python3 " + script + " " + from_cpp + " " + from_py), 0) << "the Python parser disagrees";
  SafetensorsFile f(from_py);
  EXPECT_EQ(f.metadata().at("who"), "python");
  float z[3], a[5];
  f.read_f32("z", {3}, z);
  f.read_f32("a", {5}, a);  // misaligned in the file: read_f32 must still work
  EXPECT_EQ(z[0], 0.5f);
  EXPECT_EQ(z[1], -1.0f);
  EXPECT_EQ(z[2], 2.0f);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a[i], i * 0.25f - 1.0f) << i;
  int32_t n[2];
  f.read_i32("n", {2}, n);
  EXPECT_EQ(n[0], 3);
  EXPECT_EQ(n[1], -4);
}

}  // namespace
}  // namespace fp
