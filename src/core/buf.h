// Kernel operands that carry their storage dtype (Note [Kernel operands carry their dtype]).
//
// Note [Kernel operands carry their dtype]: under a precision recipe (core/precision.h) the same
// kernel reads f32 tensors in one run and bf16 ones in another (activations, weights, gradients), so
// a kernel's floating-point operands are a Buf (written) or CBuf (read only): a pointer and its dtype,
// f32 or bf16. Kernels dispatch once per call on the dtypes (visit_float) to a template over the
// element type, and compute in f32 registers whatever the storage: load widens (exact), store rounds
// to nearest even (core/dtype.h). A float* converts implicitly to an f32 Buf, so f32 callers and the
// scalar references keep passing plain pointers; a Tensor gives its own (Tensor::buf). Statistics,
// accumulators and ids stay float*/double*/int32_t* in the signatures: they have one dtype whatever
// the recipe (Note [Which dtype each allocation gets] in core/precision.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace fp {

// One bf16 element (the upper half of a float), a distinct type so that templates over the element
// type never mistake it for an integer or an f16.
struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2);

inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) { return bf16_to_float(x.bits); }
template <class T>
T from_f32(float x);
template <>
inline float from_f32<float>(float x) {
  return x;
}
template <>
inline bf16 from_f32<bf16>(float x) {
  return {bf16_from_float(x)};
}

// The DType of an element type (f32 or bf16).
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::DType_F32;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::DType_BF16;
}

// The errors of the operand checks below, out of line so that this header needs no formatting library
// (it is included by the cuda backend's .cu files, which nvcc compiles; core/buf.cpp).
[[noreturn]] void buf_dtype_mismatch(DType stored, DType read);
[[noreturn]] void buf_dtype_refused(const char* kernel, DType t);

// A written operand: data (null on the meta backend) and its dtype, f32 or bf16.
struct Buf {
  void* p = nullptr;
  DType dtype = DType::DType_F32;

  Buf() = default;
  Buf(std::nullptr_t) {}
  Buf(float* f) : p(f) {}  // NOLINT(google-explicit-constructor): f32 callers pass plain pointers
  Buf(bf16* h) : p(h), dtype(DType::DType_BF16) {}  // NOLINT(google-explicit-constructor)
  Buf(void* q, DType t) : p(q), dtype(t) {}

  bool null() const { return p == nullptr; }
  // The operand `off` elements further on (null stays null: meta).
  Buf at(int64_t off) const {
    return p == nullptr ? Buf(nullptr, dtype)
                        : Buf(static_cast<char*>(p) + off * static_cast<int64_t>(dtype_size(dtype)), dtype);
  }
  // The typed pointer; asserts that the operand is stored as T.
  template <class T>
  T* as() const {
    if (dtype != dtype_of<T>()) buf_dtype_mismatch(dtype, dtype_of<T>());
    return static_cast<T*>(p);
  }
  float* f32() const { return as<float>(); }
};

// A read-only operand.
struct CBuf {
  const void* p = nullptr;
  DType dtype = DType::DType_F32;

  CBuf() = default;
  CBuf(std::nullptr_t) {}
  CBuf(const float* f) : p(f) {}                           // NOLINT(google-explicit-constructor)
  CBuf(const bf16* h) : p(h), dtype(DType::DType_BF16) {}  // NOLINT(google-explicit-constructor)
  CBuf(Buf b) : p(b.p), dtype(b.dtype) {}                  // NOLINT(google-explicit-constructor)
  CBuf(const void* q, DType t) : p(q), dtype(t) {}

  bool null() const { return p == nullptr; }
  CBuf at(int64_t off) const {
    return p == nullptr ? CBuf(nullptr, dtype)
                        : CBuf(static_cast<const char*>(p) + off * static_cast<int64_t>(dtype_size(dtype)), dtype);
  }
  template <class T>
  const T* as() const {
    if (dtype != dtype_of<T>()) buf_dtype_mismatch(dtype, dtype_of<T>());
    return static_cast<const T*>(p);
  }
  const float* f32() const { return as<float>(); }
};

// Calls f.template operator()<T>() with T the element type of `t` (float or bf16); any other dtype
// is an error naming the kernel. The one dispatch per kernel call of Note [Kernel operands carry
// their dtype]: f is a template lambda, []<class T>() { ... }.
template <class F>
decltype(auto) visit_float(DType t, const char* kernel, F&& f) {
  switch (t) {
    case DType::DType_F32:
      return f.template operator()<float>();
    case DType::DType_BF16:
      return f.template operator()<bf16>();
    default:
      break;
  }
  buf_dtype_refused(kernel, t);
}

}  // namespace fp
