// Precision: the element type of each kind of tensor a training step allocates (docs/design.md,
// "Precision is a recipe chosen at launch"). Chosen once per run ([precision] in the run config) and
// honoured at every allocation: the model, the schedules and the optimizers read their dtype from it.
//
// Note [Which dtype each allocation gets]
//   params       weights: ParamStore's storage, FSDP's gathered units, LLEP's guest experts and the
//                Ring-DTP shards in flight
//   grads        weight gradients: ParamStore's, the gathered units' unsharded ones, LLEP's guest
//                gradients; the host copy of offload_serial
//   activations  everything a block produces (projections, FFN intermediates, outputs), the layer
//                boundaries (checkpoints, SCO's host copies), the dispatch buffers, the ring-attention
//                K/V blocks, the activation gradients, the batches Ring-DTP moves
//   master       the fp32 copy of the weights the optimizer updates; on the device (AdamW) only when
//                params != master, on the host (offload optimizers) always
//   moments      AdamW's m and v
//   logits       vocabulary tensors: logits, log-softmax, their gradient, Ring-DTP strips
//   router       router logits, probabilities, top-k weights and their gradients
// Always f32 (or wider) whatever the recipe: statistics (RMSNorm rstd, attention lse, the online-LSE
// state m, z, y), accumulators that travel (ring-attention dK/dV, Ring-DTP dW and dX partial sums),
// workspace scalars, the offload staging slots; ids are i32.
#pragma once

#include <string>
#include <string_view>

#include "core/dtype.h"

namespace fp {

struct Precision {
  DType params = DType::DType_F32;
  DType grads = DType::DType_F32;
  DType activations = DType::DType_F32;
  DType master = DType::DType_F32;
  DType moments = DType::DType_F32;
  DType logits = DType::DType_F32;
  DType router = DType::DType_F32;
  std::string recipe = "fp32";  // the recipe it started from (names it in logs); "custom" never
};

// The named recipes:
//   "fp32"  everything f32 (the default; what the cpu backend computes)
//   "bf16"  the paper's: bf16 params, grads and activations; f32 master, moments, logits and router
// Throws fp::Error naming the recipe otherwise.
Precision precision_recipe(std::string_view name);

// A storage dtype of a [precision] field: f32, bf16 or f16 (fp::Error naming the field otherwise).
DType precision_dtype_parse(std::string_view field, std::string_view value);

// Sets one field by its [precision] key (params, grads, activations, master, moments, logits,
// router). Throws fp::Error naming the key when it is unknown, or the value when it is no dtype.
void precision_set(Precision& p, std::string_view key, std::string_view value);
// Sets one run-config key of [precision] by its dotted name, "precision.recipe" (fp32 | bf16: every field
// anew) or "precision.<field>", from its text. Throws fp::Error "<source>: ..." naming the key or value.
void precision_key_set(Precision& p, std::string_view key, std::string_view value, std::string_view source);
// Each field under its [precision] name, in that order: f(name, dtype) (P: Precision or const Precision).
template <class P, class F>
void precision_fields(P& p, F&& f) {
  f("params", p.params);
  f("grads", p.grads);
  f("activations", p.activations);
  f("master", p.master);
  f("moments", p.moments);
  f("logits", p.logits);
  f("router", p.router);
}

// True when every field is f32.
bool precision_all_f32(const Precision& p);
// The fields that are not f32, e.g. "params=bf16 grads=bf16 activations=bf16" (empty when all f32).
std::string precision_non_f32(const Precision& p);
// One line for logs: "fp32" when everything is f32, else the recipe and every field, e.g.
// "bf16 (params bf16, grads bf16, activations bf16, master f32, moments f32, logits f32, router f32)";
// fields overridden after the recipe show in the list.
std::string precision_describe(const Precision& p);

}  // namespace fp
