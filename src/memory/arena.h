// Arenas and tensors.
//
// An Arena is one memory space (the device, or host memory) with a Ledger, over an Allocator
// (memory/allocator.h) that the backend injects. When the allocator materializes, allocations are
// real; when it does not (the meta backend), they are accounted in the ledger identically but no
// memory exists and data pointers are null.
//
// A Tensor is a move-only owning handle: it names its category, shape and dtype, and gives its bytes
// back to its arena when destroyed or reset(). Every device allocation in flatpeak is a Tensor.
// A view (Tensor::view) is a non-owning Tensor over part of another one: the same interface, no
// allocation, nothing given back; it must not outlive its base (FSDP: a parameter's full-shaped
// weight inside the gathered unit of its layer, model/params.h).
//
// Note [Stream-ordered frees]: a tensor is allocated for the compute stream (the stream kernels run
// on; on cpu it runs inline, so the host thread's order is its order). When another stream (a copy
// stream) reads or writes it, Tensor::record_stream(s) says so, and freeing the tensor no longer has
// to wait for that stream: the arena records an event on each such stream at the free and hands the
// block back to its allocator only once every event completed (checked at each later allocation, and
// waited for when the arena goes). PyTorch's Tensor.record_stream is the model. The ledger counts the
// bytes free at the free, on every backend alike (a plan is the same whatever the timing); the bytes
// still waiting are pending_bytes() (peak: pending_peak_bytes()), which is what the device held
// beyond the ledger in the meantime. So a schedule whose promise is a bound (SCO's two boundaries)
// waits for its copies instead: a stream-ordered free is for buffers whose copies may pile up without
// breaking a promise (none of the four schedules uses it today).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/buf.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "memory/category.h"
#include "memory/ledger.h"

namespace fp {

// The streams other than the compute stream that used a block (Note [Stream-ordered frees]).
inline constexpr int kMaxStreamUses = 2;
struct StreamUses {
  std::array<Stream*, kMaxStreamUses> streams{};
  int n = 0;
};

class Arena {
 public:
  // allocator must outlive the arena.
  Arena(std::string space, uint64_t capacity, Allocator& allocator)
      : ledger_(std::move(space), capacity), allocator_(allocator) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  // Waits for the pending frees' events and gives their blocks back.
  ~Arena();

  // Throws OutOfMemoryError when over capacity. Returns null when not materializing.
  void* allocate(Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype);
  void release(void* p, Category c, uint64_t bytes, const std::string& tag, const Shape& shape, DType dtype,
               const StreamUses& uses = {});
  // Gives back every pending block whose streams are done (wait: after waiting for them).
  void pending_collect(bool wait = false);
  uint64_t pending_bytes() const { return pending_bytes_; }
  uint64_t pending_peak_bytes() const { return pending_peak_bytes_; }

  Ledger& ledger() { return ledger_; }
  const Ledger& ledger() const { return ledger_; }
  bool materializes() const { return allocator_.materializes(); }
  Allocator& allocator() const { return allocator_; }

 private:
  struct Pending {
    void* p;
    uint64_t bytes;
    std::array<Event, kMaxStreamUses> done;
  };
  Ledger ledger_;
  Allocator& allocator_;
  std::vector<Pending> pending_;
  uint64_t pending_bytes_ = 0;
  uint64_t pending_peak_bytes_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(Arena& arena, Category c, const Shape& shape, DType dtype, std::string name);
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& o) noexcept { *this = std::move(o); }
  Tensor& operator=(Tensor&& o) noexcept;
  ~Tensor() { reset(); }

  // A non-owning view of `shape` starting `offset` elements into base (same dtype, category and
  // arena; null data when base has none, as on meta). Asserts that it lies inside base.
  static Tensor view(const Tensor& base, int64_t offset, const Shape& shape, std::string name);

  // Gives the bytes back (a view gives nothing back); the tensor becomes undefined.
  void reset();
  // Note [Stream-ordered frees]: stream s (not the compute stream) uses this tensor; its bytes go back
  // to the allocator only after the work enqueued on s before the free. Not on views (record the base).
  void record_stream(Stream& s);
  bool is_view() const { return view_; }

  bool defined() const { return arena_ != nullptr; }
  // Data pointers: null on the meta backend (kernels there do nothing).
  void* data() const { return data_; }
  float* f32() const;
  // The tensor as a kernel operand (f32 or bf16; Note [Kernel operands carry their dtype] in core/buf.h).
  Buf buf() const;
  CBuf cbuf() const { return buf(); }
  int32_t* i32() const;
  double* f64() const;

  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  int64_t dim(int i) const { return shape_[i]; }
  DType dtype() const { return dtype_; }
  Category category() const { return category_; }
  uint64_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }

 private:
  Arena* arena_ = nullptr;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::DType_F32;
  Category category_ = Category::Category_workspace;
  uint64_t bytes_ = 0;
  std::string name_;
  bool view_ = false;  // a view owns nothing (Tensor::view)
  StreamUses uses_;
};

}  // namespace fp
