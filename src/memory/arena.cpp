#include "memory/arena.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include <sys/mman.h>

#include "core/units.h"

namespace fp {

Arena::~Arena() { pending_collect(/*wait=*/true); }

void* Arena::allocate(Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype) {
  ledger_.on_alloc(c, bytes, tag, shape, dtype);  // throws when over capacity
  if (!allocator_.materializes() || bytes == 0) return nullptr;
  if (!pending_.empty()) pending_collect();
  void* p = allocator_.allocate(bytes);
  if (p == nullptr && !pending_.empty()) {  // blocks still in flight may be what the request needs
    pending_collect(/*wait=*/true);
    p = allocator_.allocate(bytes);
  }
  if (p == nullptr) {
    ledger_.on_free(c, bytes, tag, shape, dtype);
    throw Error(fmt::format("the {} allocator refused {} for tensor '{}' {} in category '{}' ({})", allocator_.name(),
                            bytes_format(bytes), tag, shape.str(), category_name(c), ledger_.space()),
                "set --device-mem below this machine's free memory so the ledger refuses first, with a category");
  }
  return p;
}

void Arena::release(void* p, Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype,
                    const StreamUses& uses) {
  if (p != nullptr) {
    if (uses.n == 0) {
      allocator_.deallocate(p, bytes);
    } else {
      Pending pend{p, bytes, {}};
      for (int i = 0; i < uses.n; ++i) uses.streams[i]->record(pend.done[i]);
      pending_.push_back(std::move(pend));
      pending_bytes_ += bytes;
      pending_peak_bytes_ = std::max(pending_peak_bytes_, pending_bytes_);
    }
  }
  ledger_.on_free(c, bytes, tag, shape, dtype);
}

void Arena::pending_collect(bool wait) {
  size_t kept = 0;
  for (Pending& pend : pending_) {
    bool done = true;
    for (const Event& e : pend.done) {
      if (wait) e.synchronize();
      done = done && e.query();
    }
    if (done) {
      allocator_.deallocate(pend.p, pend.bytes);
      pending_bytes_ -= pend.bytes;
    } else {
      pending_[kept++] = std::move(pend);
    }
  }
  pending_.resize(kept);
}

namespace {

// Note [Large host blocks are mapped]: a block of kMapFrom bytes or more is its own anonymous mapping
// (mmap), given back to the system when freed (munmap); smaller ones come from malloc. glibc would map
// large blocks too, but its threshold rises to the size of every mapped block freed (up to 32 MiB), so
// after the first steps a training step's tensors came from its heap, where a freed block in the middle
// keeps its pages: the resident set then grew with every new mix of sizes though the bytes in use did
// not (Note [Caching allocator] in memory/caching_allocator.h). Mapped, the resident set follows the
// blocks held (tensors and the cache).
class HostAlignedAllocator final : public Allocator {
 public:
  static constexpr uint64_t kMapFrom = uint64_t{256} << 10;
  void* allocate(uint64_t bytes) override {
    const uint64_t size = rounded(bytes);
    if (size < kMapFrom) return std::aligned_alloc(64, size);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void deallocate(void* p, uint64_t bytes) override {
    const uint64_t size = rounded(bytes);
    if (size < kMapFrom) {
      std::free(p);
    } else {
      FP_ASSERT(munmap(p, size) == 0, "munmap of a {}-byte host block failed", size);
    }
  }
  std::string_view name() const override { return "host"; }

 private:
  static uint64_t rounded(uint64_t bytes) { return (bytes + 63) / 64 * 64; }
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
    uses_ = o.uses_;
    o.uses_ = {};
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
    if (!view_) arena_->release(data_, category_, bytes_, name_, shape_, dtype_, uses_);
    arena_ = nullptr;
    data_ = nullptr;
    view_ = false;
    uses_ = {};
  }
}

void Tensor::record_stream(Stream& s) {
  FP_ASSERT(defined() && !view_, "record_stream on '{}': {}", name_, view_ ? "a view (record its base)" : "undefined");
  for (int i = 0; i < uses_.n; ++i) {
    if (uses_.streams[i] == &s) return;
  }
  FP_ASSERT(uses_.n < kMaxStreamUses, "tensor '{}' used on more than {} other streams", name_,
            kMaxStreamUses);
  uses_.streams[uses_.n++] = &s;
}

float* Tensor::f32() const {
  if (data_ == nullptr) return nullptr;  // meta: no memory, any dtype
  FP_ASSERT(dtype_ == DType::DType_F32, "tensor '{}' is {}, not f32", name_, dtype_name(dtype_));
  return static_cast<float*>(data_);
}
Buf Tensor::buf() const {
  // meta: no memory and no kernel reads it, so any dtype the planner accounts (f16 included) passes.
  FP_ASSERT(data_ == nullptr || dtype_ == DType::DType_F32 || dtype_ == DType::DType_BF16,
            "tensor '{}' is {}: kernels take f32 or bf16", name_, dtype_name(dtype_));
  return {data_, dtype_};
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
