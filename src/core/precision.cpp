#include "core/precision.h"

#include <fmt/format.h>

#include "core/error.h"

namespace fp {

namespace {
}  // namespace

Precision precision_recipe(std::string_view name) {
  Precision p;  // all f32
  if (name == "fp32" || name == "f32") {
    p.recipe = "fp32";
    return p;
  }
  if (name == "bf16") {
    p.params = p.grads = p.activations = DType::DType_BF16;
    p.recipe = "bf16";
    return p;
  }
  throw Error(fmt::format("precision.recipe = \"{}\" is not a recipe", name),
              "set precision.recipe = \"fp32\" or \"bf16\" (then override single fields, e.g. precision.logits = "
              "\"bf16\")");
}

DType precision_dtype_parse(std::string_view field, std::string_view value) {
  DType d = DType::DType_F32;
  try {
    d = dtype_parse(value);
  } catch (const Error&) {
    d = DType::DType_I64;  // reported below with the field's name
  }
  FP_CHECK(d == DType::DType_F32 || d == DType::DType_BF16 || d == DType::DType_F16,
           "use one of \"f32\", \"bf16\", \"f16\"", "precision.{} = \"{}\" is not a storage dtype", field, value);
  return d;
}

void precision_set(Precision& p, std::string_view key, std::string_view value) {
  DType* field = nullptr;
  precision_fields(p, [&](const char* name, DType& d) {
    if (key == name) field = &d;
  });
  FP_CHECK(field != nullptr,
           "the keys of [precision] are recipe, params, grads, activations, master, moments, logits, router",
           "unknown key precision.{}", key);
  *field = precision_dtype_parse(key, value);
}

void precision_key_set(Precision& p, std::string_view key, std::string_view value, std::string_view source) {
  try {
    if (key == "precision.recipe") {
      FP_CHECK(value == "fp32" || value == "bf16", "set precision.recipe = \"fp32\" or \"bf16\"",
               "precision.recipe = \"{}\" is not one of fp32|bf16", value);
      p = precision_recipe(value);
      return;
    }
    FP_CHECK(key.rfind("precision.", 0) == 0,
             "the keys of [precision] are recipe, params, grads, activations, "
             "master, moments, logits, router",
             "{} is not a [precision] key", key);
    precision_set(p, key.substr(10), value);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", source, e.what()), e.hint());
  }
}

bool precision_all_f32(const Precision& p) { return precision_non_f32(p).empty(); }

std::string precision_non_f32(const Precision& p) {
  std::string out;
  precision_fields(p, [&](const char* name, DType d) {
    if (d == DType::DType_F32) return;
    if (!out.empty()) out += ' ';
    out += fmt::format("{}={}", name, dtype_name(d));
  });
  return out;
}

std::string precision_describe(const Precision& p) {
  if (precision_all_f32(p)) return "fp32";
  std::string fields;
  precision_fields(p, [&](const char* name, DType d) {
    if (!fields.empty()) fields += ", ";
    fields += fmt::format("{} {}", name, dtype_name(d));
  });
  // A recipe whose fields were overridden is no longer the recipe alone.
  const Precision base = precision_recipe(p.recipe);
  const bool same = base.params == p.params && base.grads == p.grads && base.activations == p.activations &&
         base.master == p.master && base.moments == p.moments && base.logits == p.logits && base.router == p.router;
  return fmt::format("{}{} ({})", p.recipe, same ? "" : " with overrides", fields);
}

}  // namespace fp
