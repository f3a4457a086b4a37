// Placeholder of the precision recipe (replaced by the precision branch's version on merge).
#pragma once

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
};

Precision precision_recipe(std::string_view name);

}  // namespace fp
