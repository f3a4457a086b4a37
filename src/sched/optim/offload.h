// AdamW with its state in host memory (docs/design.md, OffloadStreamAdamW): the plain offload step and
// the streamed one. Both compute exactly the update of AdamW (adamw.h): the same global-norm
// clipping, the same kernel (ops/adamw.h) on the same operands, so they equal each other bit for bit
// and equal the device AdamW on the cpu backend, in the fp32 recipe and in the bf16 one.
//
// Dimensions: P parameters in all (every tensor of the ParamStore, in its order, seen as one flat
// range), B_max the largest bucket, S = optim.slots; w and g the bytes of one weight and of one
// gradient element (4 and 4 in the fp32 recipe, 2 and 2 in the bf16 one but for the parameters kept
// in f32, 4 and 4: Note [Parameters kept in f32] in model/params.h).
//
// State, per parameter, in the host arena (category optimizer; pinned memory on a GPU backend):
// the master weights, m (exp_avg) and v (exp_avg_sq), in the precision's master and moments dtypes
// (ParamStore::precision(); f32 in both recipes: 12 B per parameter). The host gradients of the
// serial variant are in each gradient's dtype, as is each segment in the host slots of the streamed
// one; the device slots are always f32. With the fp32 recipe the device weights are f32 too, so the
// master always equals them; it is kept so the schedule moves what a reduced-precision device copy
// would need (and what docs/design.md budgets). With the bf16 recipe the device weights are the master
// rounded (Note [Offload with bf16 weights]). Either way the master is taken from the device weights
// (widened, exact) at the first step after construction or set_steps_taken (a checkpoint load writes
// the device weights after the optimizer exists), unless the checkpoint brought the master itself
// (master_loaded).
//
//   OffloadSerialAdamW  all gradients to host (d2h, g B), CPU AdamW over everything while the device
//       waits, all weights back (h2d, w B). Host: + P x g B of gradients. Device: nothing but the
//       4-byte norm scalars (workspace). optim.update_on is not used: the update runs on the host.
//   OffloadStreamAdamW  the flat range is cut into buckets of at most optim.bucket_params; S staging
//       slots pipeline them (Note [OffloadStream pipeline]).
//       update_on = "device": per bucket, master, m, v go up into a device slot (12 B per parameter
//         over the link, f32 in both recipes), the bucket's gradients are gathered into the slot's
//         f32 row on the device (widened from bf16), the update runs on the device (the backend's
//         kernel), the weights are scattered into the parameters (bf16: rounded into them by the
//         kernel itself) and master, m, v come back (12 B). Device: S x B_max x 16 B (category
//         optimizer: grad, param, m, v rows), reserved at construction.
//       update_on = "host": per bucket, its gradients come down (g B) into a host slot, CPU AdamW
//         updates the host state, the new weights go up (w B): straight from the master in fp32,
//         from the slot's weight row in bf16. Device: nothing (the norm scalars); host: + S x B_max
//         x 4 B of slots (fp32: the gradient row; bf16: the gradient and the weight rows, 2 B each;
//         a bucket's rows are longer by 2 B per element of an f32 parameter among bf16 ones, and the
//         rows hold the longest bucket: offload_row_layout).
//
// Note [Offload with bf16 weights]: in the bf16 recipe (bf16 weights and gradients, f32 master and
// moments) the host keeps the f32 master and the device only its rounding, exactly as the device
// AdamW keeps its master beside the bf16 weights (Note [When AdamW keeps a master copy] in adamw.cpp).
// Every update is ops/adamw.h's kernel on the f32 master, m, v with the bf16 gradient, rounding the
// new master into a bf16 working copy (its param_copy); every element takes the device AdamW's
// operations, so the bits agree. What moves, per parameter and step (fp32 figures in brackets):
//   serial            down 2 B of gradient (4), up 2 B of weights (4). The new weights are the master
//                     rounded into the parameter's host gradient buffer once its update returned (the
//                     gradient is dead then), in a second host pass (reads 4 B, writes 2 B): the
//                     kernel's param_copy may not alias the gradient it reads (its operands are
//                     __restrict), and a buffer of its own would add P x 2 B to the host, which holds
//                     12 + 2 B per parameter as in the plan (tests/unit/test_plan.cpp).
//   stream, device    up and down 12 B of master, m, v (12, 12): the state stays f32 on the link. The
//                     gradient row is filled by the kernel table's converting copy (bf16 -> f32) on
//                     the compute stream, and the kernel rounds the new weights straight into the
//                     parameters (param_copy) instead of the f32 scatter copy. Device slots unchanged.
//   stream, host      down 2 B of gradient (4) into the slot's gradient row, up 2 B of weights (4)
//                     from the slot's weight row, which the kernel fills (param_copy); that row is
//                     rewritten only once the weights of the slot's previous bucket went up (the host
//                     waits on that event, Note [OffloadStream pipeline]).
// Each parameter moves in its own dtype: serial's host gradients are allocated per parameter, the
// device placement's converting copies read any dtype, and the host placement lays out each bucket
// segment of its slot rows in its parameter's dtype (offload_row_layout), so the one parameter kept
// in f32 among bf16 ones (DeepSeek-V3's routing bias, Note [Parameters kept in f32]) moves 4 B down
// and 4 B up, its master its exact copy, and every other parameter as above.
// The master sync (first step, set_steps_taken, weights_written) widens the bf16 weights into the
// master: serial through the host gradient buffers (between steps the gradients there are dead),
// 2 B down; stream on device on the device into a slot's param row, 4 B down; stream on host through
// the slots' weight rows, 2 B down. state_tensors() then also names the master ("<param>.master"),
// which checkpoints save and a resume loads (master_loaded). On a computing backend the precision
// must be one of these: f32 master and moments, weights f32 or bf16, gradients in the weights' dtype;
// any other mix is refused when the optimizer is made (the meta backend takes any and allocates by
// dtype as the cpu backend would).
//
// A step returns when the weights and the host state are final (the optimizer step is a sync point).
// On meta nothing is computed or copied, and the allocations are those of the cpu backend, in the
// same order.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/params.h"
#include "sched/optim/lr_schedule.h"
#include "sched/optim/optimizer.h"

namespace fp {

// One contiguous piece of one parameter inside a bucket.
struct OffloadSegment {
  int64_t param = 0;        // index into ParamStore::all()
  int64_t offset = 0;       // first element inside the parameter
  int64_t length = 0;       // elements
  int64_t slot_offset = 0;  // first element inside the bucket (and its staging slot)
};

struct OffloadBucket {
  int64_t first_segment = 0, segments = 0;  // a range of OffloadPlan::segments
  int64_t elements = 0;                     // sum of the segments' lengths, <= bucket_params
};

struct OffloadPlan {
  std::vector<OffloadSegment> segments;
  std::vector<OffloadBucket> buckets;
  int64_t largest = 0;  // B_max: elements of the largest bucket
};

// Cuts parameters of param_sizes elements (in order, as one flat range) into buckets of at most
// bucket_params elements. A bucket that splits a parameter ends at an offset inside it that is a
// multiple of kOffloadAlign elements (so a slot's rows and the parameter agree on SIMD alignment),
// and closes early rather than take a smaller unaligned piece; only a bucket_params below the
// alignment cuts unaligned pieces. Results never depend on the cut (Note [AdamW is element-wise]).
inline constexpr int64_t kOffloadAlign = 16;  // floats: one 64-byte line, two AVX2 vectors
OffloadPlan offload_plan_make(const std::vector<int64_t>& param_sizes, int64_t bucket_params);

// Where each segment of a plan lies in a host staging row that holds one bucket, each segment in its
// own parameter's dtype (Note [Offload with bf16 weights]): packed in bucket order, each offset
// rounded up to a multiple of its element's size. With one dtype of s bytes throughout, segment j is
// at s x slot_offset and bytes = s x B_max.
struct OffloadRowLayout {
  std::vector<uint64_t> offsets;  // (segments) bytes from the row's start, in the plan's segment order
  uint64_t bytes = 0;             // the longest bucket's row: what a host slot row must hold
};
// elem_bytes: (parameters) the bytes of one staged element of each parameter, in ParamStore order.
OffloadRowLayout offload_row_layout(const OffloadPlan& plan, const std::vector<uint64_t>& elem_bytes);

// Wall-clock seconds of the parts of the last step (on the issuing host thread), and the bytes it
// moved over the link (copies on the d2h and h2d streams; a master sync in the step included).
struct OffloadTimes {
  double norm_s = 0;        // the global gradient norm (device reductions, scalar reads)
  double down_s = 0;        // serial: all gradients to host
  double update_s = 0;      // time inside update kernels (serial: the CPU AdamW over all of P, and
                            // in bf16 the rounding of the master into the weights sent up)
  double up_s = 0;          // serial: all weights back
  double total_s = 0;       // the whole step
  uint64_t down_bytes = 0;  // device to host
  uint64_t up_bytes = 0;    // host to device
};

// What the host-offload variants share: the host state, the norm and clipping, the master sync.
class OffloadAdamW : public Optimizer {
 public:
  using StepStats = Optimizer::StepStats;

  // Step `step` (1-based) of total_steps: the norm and clipping exactly as AdamW::step, then
  // update_apply. Throws fp::Error before any write when the gradient norm is not finite.
  StepStats step(int64_t step, int64_t total_steps) final;

  // ("<param>.exp_avg", host m), ("<param>.exp_avg_sq", host v), and with weights stored in another
  // dtype than the master (bf16) ("<param>.master", host master), parameter by parameter (as AdamW).
  std::vector<std::pair<std::string, const Tensor*>> state_tensors() const final;
  // Copies the written weights into their host master, widened (a master not yet synced is copied
  // whole anyway). Leaves last_times() as the last step left it.
  void weights_written(const std::vector<Param*>& params) final;
  // A checkpoint's masters were read into state_tensors()'s: with bf16 weights they, not the rounded
  // weights, are what the next step starts from (the set_steps_taken that follows keeps them).
  void master_loaded() final {
    master_synced_ = rounded_;
    master_from_checkpoint_ = rounded_;
  }
  int64_t steps_taken() const final { return steps_taken_; }
  // Also marks the master stale (the next step takes it from the device weights again), unless
  // master_loaded came just before (a resume loads the master, then sets the step).
  void set_steps_taken(int64_t steps) final {
    steps_taken_ = steps;
    master_synced_ = master_from_checkpoint_;
    master_from_checkpoint_ = false;
  }

  // Host state in the order of params.all(), each shaped like its parameter's local_w() (FSDP shard).
  const std::vector<Tensor>& master() const { return master_; }
  const std::vector<Tensor>& m() const { return m_; }
  const std::vector<Tensor>& v() const { return v_; }
  const OffloadTimes& last_times() const { return times_; }

 protected:
  OffloadAdamW(ParamStore& params, Backend& be, const OptimConfig& cfg);

  // The update of every parameter, given the step's scalars.
  virtual void update_apply(const StepStats& st, int64_t step) = 0;
  // Bf16 weights only (rounded_): sets the host master of every parameter i with take[i] from its
  // device weights, widened (exact), through the variant's own staging (Note [Offload with bf16
  // weights]). Called with the device weights final (after grads_ready_ or a synchronize); returns
  // when the master is written.
  virtual void master_widen(const std::vector<bool>& take) = 0;

  // Note [Update scalars]: one AdamW update of `length` elements of parameter i on operands that
  // may live anywhere the kernel can reach: `host` selects the backend's host kernels (host state; they do
  // nothing on meta) or the backend's kernel table (device operands). master, m, v f32;
  // grad f32 or bf16; weights null, or where the kernel writes the new master rounded to its dtype.
  void update_range(bool host, int64_t i, float* master, CBuf grad, float* m, float* v, int64_t length,
                    const StepStats& st, int64_t step, Buf weights);
  // copy_async on the d2h (h2d) stream, counted in times_.down_bytes (up_bytes).
  void copy_down(void* dst, const void* src, uint64_t bytes);
  void copy_up(void* dst, const void* src, uint64_t bytes);

  ParamStore& params_;
  Backend& be_;
  const OptimConfig cfg_;
  std::vector<Tensor> master_;  // (numel of param i) each, host, category optimizer
  std::vector<Tensor> m_;       // (numel of param i) each, host, category optimizer
  std::vector<Tensor> v_;       // (numel of param i) each, host, category optimizer
  Event grads_ready_;           // recorded on compute after the norm: gradients final, weights free
  OffloadTimes times_;
  // The device weights are stored in another dtype than the master (the bf16 recipe): they are the
  // master rounded, and each update writes them from it (Note [Offload with bf16 weights]).
  bool rounded_ = false;

 private:
  void master_sync();

  Tensor sumsq_;  // (1) device, category workspace: reduce_sumsq's output
  int64_t steps_taken_ = 0;
  bool master_synced_ = false;
  bool master_from_checkpoint_ = false;  // master_loaded since the last set_steps_taken
};

class OffloadSerialAdamW final : public OffloadAdamW {
 public:
  // Allocates the host state and the host gradient copy (category grads on the host), in parameter
  // order. params and be must outlive the optimizer.
  OffloadSerialAdamW(ParamStore& params, Backend& be, const OptimConfig& cfg);

 private:
  void update_apply(const StepStats& st, int64_t step) override;
  void master_widen(const std::vector<bool>& take) override;

  // (numel of param i) each, host, category grads, in the grads dtype. With bf16 weights also the
  // staging of the weights: rounded from the master after the update (up) and at a master sync
  // (down), when no gradient is held there (Note [Offload with bf16 weights]).
  std::vector<Tensor> grad_host_;
};

// Note [OffloadStream pipeline]: bucket g uses slot g mod S. Issued from the host, in bucket order:
//   update_on = device
//     h2d:     wait slot_free[s]; master, m, v of g -> slot s;            record uploaded[g]
//     compute: wait uploaded[g]; gather grads; update; scatter weights; record updated[g]
//     d2h:     wait updated[g]; slot s -> master, m, v of g;               record slot_free[s]
//   update_on = host
//     d2h:     grads of g -> host slot s (after the update of g - S, by program order);
//                                                                          record downloaded[g]
//     host:    wait downloaded[g]; [bf16: wait weights_up[s]]; CPU AdamW on g; (slot s's gradient
//              row free again, by program order)
//     h2d:     weights of g (fp32: the master; bf16: slot s's weight row) -> the parameters;
//                                                               [bf16: record weights_up[s]]
// The first S uploads (downloads) are issued before the loop, and the one of bucket g + S right after
// bucket g is handed to the next stage, so with S = 2 bucket g + 1 moves in while g is updated and
// g - 1 moves out. Every read of a slot waits on the event of the write that filled it, and every
// refill waits on the event of the last read (a missing edge silently mixes two buckets; the
// delay-hook test catches it). Per bucket, the period is max(in, update, out, occupancy / S), where
// occupancy is the time a slot is held (in + update + out on the device, in + update on the host):
// the overlap model the benchmark checks.
class OffloadStreamAdamW final : public OffloadAdamW {
 public:
  // Plans the buckets and reserves the staging slots (device: S x B_max x 16 B, category optimizer;
  // host update: S x B_max x 4 B on the host, each segment in its parameter's dtypes, Note [Offload
  // with bf16 weights]). Throws fp::Error for optim.slots below 1.
  OffloadStreamAdamW(ParamStore& params, Backend& be, const OptimConfig& cfg);

  const OffloadPlan& plan() const { return plan_; }
  bool update_on_device() const { return on_device_; }

 private:
  void update_apply(const StepStats& st, int64_t step) override;
  void step_on_device(const StepStats& st, int64_t step);
  void step_on_host(const StepStats& st, int64_t step);
  void master_widen(const std::vector<bool>& take) override;
  // Segment j of the plan inside a host slot row laid out by `at`, as an operand of the given dtype.
  Buf host_row_at(const Tensor& row, const OffloadRowLayout& at, int64_t j, DType dtype) const;

  OffloadPlan plan_;
  bool on_device_ = true;
  std::vector<Tensor> slots_;  // device update: S x (4, B_max) f32 rows grad, param, m, v; category optimizer
  // Host update: S rows of gradients, each segment in its gradient's dtype (grad_at_); with bf16
  // weights S rows of weights, each segment in its parameter's dtype (weight_at_). Host, category
  // optimizer, allocated in the precision's grads (params) dtype: B_max elements when every parameter
  // has that dtype (Note [Offload with bf16 weights]).
  std::vector<Tensor> host_slots_;
  std::vector<Tensor> host_wslots_;
  OffloadRowLayout grad_at_, weight_at_;
};

}  // namespace fp
