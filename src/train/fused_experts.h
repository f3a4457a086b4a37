// gpt-oss's experts as files hold them: one fused tensor per layer and kind, against flatpeak's per-expert
// parameters (model/params.h).
//
// Note [gpt-oss's experts in files]: transformers' GptOssExperts keeps all E experts of a layer in four
// tensors, in (in, out) order and with gate and up interleaved column by column:
//   mlp.experts.gate_up_proj       (E, H, 2I)   gate = columns 0, 2, 4, ...; up = columns 1, 3, 5, ...
//   mlp.experts.gate_up_proj_bias  (E, 2I)      interleaved the same way
//   mlp.experts.down_proj          (E, I, H)
//   mlp.experts.down_proj_bias     (E, H)
// flatpeak stores each expert as nn.Linear weights (gate_proj (I, H), up_proj (I, H), down_proj (H, I)) and
// biases, so that every expert FFN, dispatch and LLEP transfer serves gpt-oss as it serves Qwen3-MoE; the
// files are translated here, expert by expert, on load and on save (gate_proj.weight[e][i][h] =
// gate_up_proj[e][h][2i], down_proj.weight[e][h][i] = down_proj[e][i][h]). The published checkpoints store
// gate_up_proj and down_proj as MXFP4 instead (quantization_config.quant_method "mxfp4": "<name>_blocks"
// and "<name>_scales", io/mxfp4.h), dequantized to bf16 on load exactly as transformers'
// convert_moe_packed_tensors does; flatpeak writes bf16 (or f32) fused tensors, which transformers loads
// unquantized. Loading reads one expert's slab of a fused tensor at a time (never the whole (E, ...)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/safetensors_set.h"
#include "model/config.h"
#include "model/params.h"

namespace fp {

// One parameter of an expert: which layer, expert and leaf ("gate_proj.weight", ..., "down_proj.bias").
struct ExpertParamName {
  int64_t layer = -1, expert = -1;
  std::string leaf;
};
// Whether `name` is a per-expert parameter of gpt_oss (model.layers.L.mlp.experts.E.<leaf>), and which.
bool expert_param_parse(const std::string& name, ExpertParamName& out);

// Reads per-expert parameters from the fused tensors of a checkpoint, caching the last expert slab read.
class FusedExpertReader {
 public:
  FusedExpertReader(SafetensorsSet& f, const ModelConfig& cfg) : f_(f), cfg_(cfg) {}
  // The full tensor of parameter p (its shape) into host. Throws fp::Error naming what the file lacks.
  void read(const ExpertParamName& p, float* host);

 private:
  // Expert e's slab of layer l's fused tensor `kind` ("gate_up_proj" (H, 2I), "down_proj" (I, H), or their
  // biases (2I), (H)), dequantized when the file holds MXFP4.
  const std::vector<float>& slab(int64_t l, int64_t e, const std::string& kind);

  // The last slab read of each kind, weights and biases apart: an expert's items alternate between them
  // (gate_proj.weight, gate_proj.bias, up_proj.weight, ...), and the weight slab serves both gate and up.
  struct Slab {
    std::string key;  // tensor name and expert
    std::vector<float> values;
  };
  SafetensorsSet& f_;
  const ModelConfig& cfg_;
  Slab weights_, biases_;
  std::vector<uint8_t> blocks_, scales_;
};

// The fused tensors of layer l: name ("model.layers.L.mlp.experts.<kind>") and shape, in transformers'
// order.
struct FusedTensor {
  std::string name, kind;
  int64_t layer = 0;
  Shape shape;
};
std::vector<FusedTensor> fused_expert_tensors(const ModelConfig& cfg, int64_t layer);

// Expert e's share of fused tensor t, from the expert's full parameters (each as read by
// ParamStore::full_gather): gate, up (I, H) weights or (I) biases for gate_up_proj(_bias), down (H, I) or
// (H) for down_proj(_bias), written into t's host buffer dst (numel of t.shape).
void fused_expert_fill(const ModelConfig& cfg, const FusedTensor& t, int64_t e, const float* gate_or_down,
                       const float* up, float* dst);

}  // namespace fp
