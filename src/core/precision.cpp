#include "core/precision.h"

#include "core/error.h"

namespace fp {

Precision precision_recipe(std::string_view name) {
  Precision p;
  if (name == "fp32") return p;
  FP_CHECK(name == "bf16", "precision.recipe is \"fp32\" or \"bf16\"", "unknown precision recipe '{}'", name);
  p.params = p.grads = p.activations = DType::DType_BF16;
  return p;
}

}  // namespace fp
