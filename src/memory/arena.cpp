#include "memory/arena.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/units.h"

namespace fp {

void* Arena::allocate(Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype) {
  ledger_.on_alloc(c, bytes, tag, shape, dtype);  // throws when over capacity
  if (!allocator_.materializes() || bytes == 0) return nullptr;
  void* p = allocator_.allocate(bytes);
  if (p == nullptr) {
    ledger_.on_free(c, bytes, tag, shape, dtype);
    throw Error(fmt::format("the {} allocator refused {} for tensor '{}' {} in category '{}' ({})", allocator_.name(),
                            bytes_format(bytes), tag, shape.str(), category_name(c), ledger_.space()),
                "set --device-mem below this machine's free memory so the ledger refuses first, with a category");
  }
  return p;
}

void Arena::release(void* p, Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype) {
  if (p != nullptr) allocator_.deallocate(p, bytes);
  ledger_.on_free(c, bytes, tag, shape, dtype);
}

namespace {

class HostAlignedAllocator final : public Allocator {
 public:
  void* allocate(uint64_t bytes) override { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
  void deallocate(void* p, uint64_t) override { std::free(p); }
  std::string_view name() const override { return "host"; }
};

class NullAllocator final : public Allocator {
 public:
  void* allocate(uint64_t) override { return nullptr; }
  void deallocate(void*, uint64_t) override {}
  bool materializes() const override { return false; }
  std::string_view name() const override { return "null"; }
};

}  // namespace

Allocator& allocator_host_aligned() {
  static HostAlignedAllocator a;
  return a;
}

Allocator& allocator_null() {
  static NullAllocator a;
  return a;
}

Tensor::Tensor(Arena& arena, Category c, const Shape& shape, DType dtype, std::string name)
    : shape_(shape), dtype_(dtype), category_(c), name_(std::move(name)) {
  FP_ASSERT(shape.numel() >= 0, "negative shape {} for '{}'", shape.str(), name_);
  bytes_ = static_cast<uint64_t>(shape.numel()) * dtype_size(dtype);
  data_ = arena.allocate(c, bytes_, name_, shape_, dtype_);
  arena_ = &arena;
}

Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    reset();
    arena_ = o.arena_;
    data_ = o.data_;
    shape_ = o.shape_;
    dtype_ = o.dtype_;
    category_ = o.category_;
    bytes_ = o.bytes_;
    name_ = std::move(o.name_);
    view_ = o.view_;
    o.arena_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Tensor Tensor::view(const Tensor& base, int64_t offset, const Shape& shape, std::string name) {
  FP_ASSERT(base.defined() && offset >= 0 && offset + shape.numel() <= base.numel(),
            "view {} at {} outside tensor '{}' {}", shape.str(), offset, base.name_, base.shape_.str());
  Tensor t;
  t.arena_ = base.arena_;
  const uint64_t skip = static_cast<uint64_t>(offset) * dtype_size(base.dtype_);
  t.data_ = base.data_ == nullptr ? nullptr : static_cast<char*>(base.data_) + skip;
  t.shape_ = shape;
  t.dtype_ = base.dtype_;
  t.category_ = base.category_;
  t.bytes_ = static_cast<uint64_t>(shape.numel()) * dtype_size(base.dtype_);
  t.name_ = std::move(name);
  t.view_ = true;
  return t;
}

void Tensor::reset() {
  if (arena_ != nullptr) {
    if (!view_) arena_->release(data_, category_, bytes_, name_, shape_, dtype_);
    arena_ = nullptr;
    data_ = nullptr;
    view_ = false;
  }
}

float* Tensor::f32() const {
  if (data_ == nullptr) return nullptr;  // meta: no memory, any dtype
  FP_ASSERT(dtype_ == DType::DType_F32, "tensor '{}' is {}, not f32", name_, dtype_name(dtype_));
  return static_cast<float*>(data_);
}
int32_t* Tensor::i32() const {
  if (data_ == nullptr) return nullptr;  // meta: no memory, any dtype
  FP_ASSERT(dtype_ == DType::DType_I32, "tensor '{}' is {}, not i32", name_, dtype_name(dtype_));
  return static_cast<int32_t*>(data_);
}
double* Tensor::f64() const {
  if (data_ == nullptr) return nullptr;  // meta: no memory, any dtype
  FP_ASSERT(dtype_ == DType::DType_F64, "tensor '{}' is {}, not f64", name_, dtype_name(dtype_));
  return static_cast<double*>(data_);
}

}  // namespace fp
