// Note [gpt-oss's experts in files] (fused_experts.h).
// Legend: E experts, H hidden, I expert width, G groups of 32 values of an MXFP4 row.
#include "train/fused_experts.h"

#include <cstdio>

#include "core/error.h"
#include "io/mxfp4.h"

namespace fp {

namespace {
std::string layer_prefix(int64_t l) { return fmt::format("model.layers.{}.mlp.experts.", l); }
}  // namespace

bool expert_param_parse(const std::string& name, ExpertParamName& out) {
  long long l = -1, e = -1;
  int used = 0;
  if (std::sscanf(name.c_str(), "model.layers.%lld.mlp.experts.%lld.%n", &l, &e, &used) != 2 || used == 0) return false;
  out.layer = l;
  out.expert = e;
  out.leaf = name.substr(static_cast<size_t>(used));
  return true;
}

const std::vector<float>& FusedExpertReader::slab(int64_t l, int64_t e, const std::string& kind) {
  const std::string name = layer_prefix(l) + kind;
  const std::string key = fmt::format("{}#{}", name, e);
  const int64_t E = cfg_.num_experts, H = cfg_.hidden_size, I = cfg_.moe_intermediate_size;
  const bool gate_up = kind.rfind("gate_up_proj", 0) == 0, bias = kind.ends_with("_bias");
  Slab& cache = bias ? biases_ : weights_;
  if (key == cache.key) return cache.values;
  std::vector<float>& slab = cache.values;
  const Shape full = bias ? Shape{E, gate_up ? 2 * I : H} : gate_up ? Shape{E, H, 2 * I} : Shape{E, I, H};
  slab.resize(static_cast<size_t>(full.numel() / E));
  if (bias || f_.has(name)) {
    FP_CHECK(f_.has(name), "a gpt-oss checkpoint holds each layer's fused experts (transformers' GptOssExperts)",
             "checkpoint '{}' has no tensor '{}'", f_.path(), name);
    f_.read_f32_rows(name, full, e, 1, slab.data());
  } else {
    // MXFP4 (io/mxfp4.h): blocks (E, R, G, 16) and scales (E, R, G) of the (E, R, C) transposed matrix,
    // C = G * 32, dequantized to (C, R): gate_up_proj's (H, 2I) from R = 2I, C = H; down_proj's (I, H).
    const int64_t R = gate_up ? 2 * I : H, C = gate_up ? H : I, G = C / kMxfp4GroupSize;
    FP_CHECK(f_.has(name + "_blocks") && f_.has(name + "_scales"),
             "a gpt-oss checkpoint holds each layer's experts fused (transformers' save_pretrained) or as MXFP4 "
             "blocks and scales (the published files)",
             "checkpoint '{}' has neither '{}' nor '{}_blocks' and '{}_scales'", f_.path(), name, name, name);
    FP_CHECK(C % kMxfp4GroupSize == 0, "MXFP4 packs rows of 32 values", "{}: {} values per row is not a multiple of 32",
             name, C);
    blocks_.resize(static_cast<size_t>(R * G * kMxfp4BlockBytes));
    scales_.resize(static_cast<size_t>(R * G));
    f_.read_u8_rows(name + "_blocks", {E, R, G, kMxfp4BlockBytes}, e, 1, blocks_.data());
    f_.read_u8_rows(name + "_scales", {E, R, G}, e, 1, scales_.data());
    mxfp4_dequantize_f32(blocks_.data(), scales_.data(), R, G, slab.data());
  }
  cache.key = key;
  return slab;
}

void FusedExpertReader::read(const ExpertParamName& p, float* host) {
  const int64_t H = cfg_.hidden_size, I = cfg_.moe_intermediate_size;
  const bool gate = p.leaf.rfind("gate_proj", 0) == 0, up = p.leaf.rfind("up_proj", 0) == 0;
  const bool bias = p.leaf.ends_with(".bias");
  if (gate || up) {
    const int64_t odd = up ? 1 : 0;
    const std::vector<float>& s = slab(p.layer, p.expert, bias ? "gate_up_proj_bias" : "gate_up_proj");
    if (bias) {
      for (int64_t i = 0; i < I; ++i) host[i] = s[2 * i + odd];
      return;
    }
    for (int64_t i = 0; i < I; ++i)  // (I, H) from the slab's (H, 2I)
      for (int64_t h = 0; h < H; ++h) host[i * H + h] = s[h * 2 * I + 2 * i + odd];
    return;
  }
  FP_ASSERT(p.leaf.rfind("down_proj", 0) == 0, "expert parameter {}", p.leaf);
  const std::vector<float>& s = slab(p.layer, p.expert, bias ? "down_proj_bias" : "down_proj");
  if (bias) {
    std::copy(s.begin(), s.begin() + H, host);
    return;
  }
  for (int64_t h = 0; h < H; ++h)  // (H, I) from the slab's (I, H)
    for (int64_t i = 0; i < I; ++i) host[h * I + i] = s[i * H + h];
}

std::vector<FusedTensor> fused_expert_tensors(const ModelConfig& cfg, int64_t layer) {
  const int64_t E = cfg.num_experts, H = cfg.hidden_size, I = cfg.moe_intermediate_size;
  const std::string pre = layer_prefix(layer);
  return {{pre + "gate_up_proj", "gate_up_proj", layer, {E, H, 2 * I}},
          {pre + "gate_up_proj_bias", "gate_up_proj_bias", layer, {E, 2 * I}},
          {pre + "down_proj", "down_proj", layer, {E, I, H}},
          {pre + "down_proj_bias", "down_proj_bias", layer, {E, H}}};
}

void fused_expert_fill(const ModelConfig& cfg, const FusedTensor& t, int64_t e, const float* gate_or_down,
                       const float* up, float* dst) {
  const int64_t H = cfg.hidden_size, I = cfg.moe_intermediate_size;
  if (t.kind == "gate_up_proj") {
    float* d = dst + e * H * 2 * I;  // (H, 2I)
    for (int64_t i = 0; i < I; ++i)
      for (int64_t h = 0; h < H; ++h) {
        d[h * 2 * I + 2 * i] = gate_or_down[i * H + h];
        d[h * 2 * I + 2 * i + 1] = up[i * H + h];
      }
  } else if (t.kind == "gate_up_proj_bias") {
    float* d = dst + e * 2 * I;
    for (int64_t i = 0; i < I; ++i) {
      d[2 * i] = gate_or_down[i];
      d[2 * i + 1] = up[i];
    }
  } else if (t.kind == "down_proj") {
    float* d = dst + e * I * H;  // (I, H)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < I; ++i) d[i * H + h] = gate_or_down[h * I + i];
  } else {
    std::copy(gate_or_down, gate_or_down + H, dst + e * H);
  }
}

}  // namespace fp
