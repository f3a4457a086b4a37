// mxfp4_dump: flatpeak's MXFP4 dequantization of a safetensors file, for scripts/interop_mxfp4.py to
// compare with transformers' convert_moe_packed_tensors (Note [MXFP4 in gpt-oss checkpoints] in
// src/io/mxfp4.h). Not a ctest and not part of the CLI.
//
//   mxfp4_dump IN.safetensors OUT.safetensors PREFIX...
//
// For each PREFIX, reads the U8 tensors PREFIX_blocks (E, R, G, 16) and PREFIX_scales (E, R, G) one
// expert at a time (read_u8_rows) and writes PREFIX, BF16 (E, G*32, R) from mxfp4_dequantize_bf16,
// and PREFIX.f32, F32 (E, G*32, R) from mxfp4_dequantize_f32.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/mxfp4.h"
#include "io/safetensors.h"

namespace {

struct Dequantized {
  std::string name;
  fp::Shape shape;  // (E, G*32, R)
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
};

Dequantized dequantize(const fp::SafetensorsFile& in, const std::string& prefix) {
  const std::string blocks_name = prefix + "_blocks", scales_name = prefix + "_scales";
  const fp::Shape bs = in.shape(blocks_name);  // (E, R, G, 16)
  FP_CHECK(bs.rank == 4 && bs[3] == fp::kMxfp4BlockBytes, "MXFP4 blocks are (E, R, G, 16)", "'{}' in '{}' has shape {}",
           blocks_name, in.path(), bs.str());
  const int64_t E = bs[0], R = bs[1], G = bs[2];
  const fp::Shape ss{E, R, G};
  Dequantized d{prefix, fp::Shape{E, G * fp::kMxfp4GroupSize, R}, {}, {}};
  const int64_t slab = G * fp::kMxfp4GroupSize * R;
  d.bf16.resize(static_cast<size_t>(E * slab));
  d.f32.resize(static_cast<size_t>(E * slab));
  std::vector<uint8_t> blocks(static_cast<size_t>(R * G * fp::kMxfp4BlockBytes));  // (R, G, 16)
  std::vector<uint8_t> scales(static_cast<size_t>(R * G));                         // (R, G)
  for (int64_t e = 0; e < E; ++e) {
    in.read_u8_rows(blocks_name, bs, e, 1, blocks.data());
    in.read_u8_rows(scales_name, ss, e, 1, scales.data());
    fp::mxfp4_dequantize_bf16(blocks.data(), scales.data(), R, G, d.bf16.data() + e * slab);
    fp::mxfp4_dequantize_f32(blocks.data(), scales.data(), R, G, d.f32.data() + e * slab);
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: mxfp4_dump IN.safetensors OUT.safetensors PREFIX...\n");
    return 2;
  }
  try {
    const fp::SafetensorsFile in(argv[1]);
    std::vector<Dequantized> out;
    for (int i = 3; i < argc; ++i) out.push_back(dequantize(in, argv[i]));
    std::vector<fp::SafetensorsView> views;
    for (const Dequantized& d : out) {
      views.push_back({d.name, fp::DType::DType_BF16, d.shape, d.bf16.data()});
      views.push_back({d.name + ".f32", fp::DType::DType_F32, d.shape, d.f32.data()});
    }
    fp::safetensors_write(argv[2], views, {});
  } catch (const fp::Error& e) {
    std::fprintf(stderr, "mxfp4_dump: %s\n  hint: %s\n", e.what(), e.hint().c_str());
    return 1;
  }
  return 0;
}
