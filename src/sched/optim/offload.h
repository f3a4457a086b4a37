// AdamW with its state in host memory (DESIGN.md, OffloadStreamAdamW): the plain offload step and
// the streamed one. Both compute exactly the update of AdamW (adamw.h): the same global-norm
// clipping, the same kernel (ops/adamw.h) on the same operands, so they equal each other bit for bit
// and equal the device AdamW on the cpu backend.
//
// Dimensions: P parameters in all (every tensor of the ParamStore, in its order, seen as one flat
// range), B_max the largest bucket, S = optim.slots.
//
// State, per parameter, in the host arena (category optimizer; pinned memory on a GPU backend):
// the master weights, m (exp_avg) and v (exp_avg_sq), in the precision's master and moments dtypes
// (ParamStore::precision(); 12 B per parameter in fp32 and in the bf16 recipe). The host gradients of
// the serial variant are in the grads dtype; the staging slots are always fp32. With the fp32 recipe
// the device weights are fp32 too, so the master always equals them; it is kept so the schedule moves what a
// reduced-precision device copy would need (and what DESIGN.md budgets), and it is taken from the
// device weights at the first step after construction or set_steps_taken (a checkpoint load writes
// the device weights after the optimizer exists).
//
//   OffloadSerialAdamW  all gradients to host (d2h), CPU AdamW over everything while the device
//       waits, all weights back (h2d). Host: + P x 4 B of gradients. Device: nothing but the 4-byte
//       norm scalar (workspace). optim.update_on is not used: the update runs on the host.
//   OffloadStreamAdamW  the flat range is cut into buckets of at most optim.bucket_params; S staging
//       slots pipeline them (Note [OffloadStream pipeline]).
//       update_on = "device": per bucket, master, m, v go up into a device slot (12 B per parameter
//         over the link), the bucket's gradients are gathered into the slot on the device, the
//         update runs on the device (the backend's kernel), the weights are scattered into the
//         parameters and master, m, v come back (12 B). Device: S x B_max x 16 B (category
//         optimizer: grad, param, m, v rows), reserved at construction.
//       update_on = "host": per bucket, its gradients come down (4 B) into a host slot, CPU AdamW
//         updates the host state, the new weights go up (4 B) straight from the master. Device:
//         nothing (the norm scalar); host: + S x B_max x 4 B of gradient slots.
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

// Wall-clock seconds of the parts of the last step (on the issuing host thread).
struct OffloadTimes {
  double norm_s = 0;    // the global gradient norm (device reductions, scalar reads)
  double down_s = 0;    // serial: all gradients to host
  double update_s = 0;  // time inside update kernels (serial: the CPU AdamW over all of P)
  double up_s = 0;      // serial: all weights back
  double total_s = 0;   // the whole step
};

// What the host-offload variants share: the host state, the norm and clipping, the master sync.
class OffloadAdamW : public Optimizer {
 public:
  using StepStats = Optimizer::StepStats;

  // Step `step` (1-based) of total_steps: the norm and clipping exactly as AdamW::step, then
  // update_apply. Throws fp::Error before any write when the gradient norm is not finite.
  StepStats step(int64_t step, int64_t total_steps) final;

  // ("<param>.exp_avg", host m), ("<param>.exp_avg_sq", host v), parameter by parameter (as AdamW).
  std::vector<std::pair<std::string, const Tensor*>> state_tensors() const final;
  // Copies the written weights into their host master (a master not yet synced is copied whole anyway).
  void weights_written(const std::vector<Param*>& params) final;
  int64_t steps_taken() const final { return steps_taken_; }
  // Also marks the master stale: the next step copies it from the device weights again.
  void set_steps_taken(int64_t steps) final {
    steps_taken_ = steps;
    master_synced_ = false;
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

  // Note [Update scalars]: one AdamW update of `length` elements of parameter i on operands that
  // may live anywhere the kernel can reach: `host` selects ops::cpu::adamw_update (host state; only
  // when the backend computes) or the backend's kernel table (device operands).
  void update_range(bool host, int64_t i, float* param, const float* grad, float* m, float* v, int64_t length,
                    const StepStats& st, int64_t step);

  ParamStore& params_;
  Backend& be_;
  const OptimConfig cfg_;
  std::vector<Tensor> master_;  // (numel of param i) each, host, category optimizer
  std::vector<Tensor> m_;       // (numel of param i) each, host, category optimizer
  std::vector<Tensor> v_;       // (numel of param i) each, host, category optimizer
  Event grads_ready_;           // recorded on compute after the norm: gradients final, weights free
  OffloadTimes times_;

 private:
  double grad_norm_compute();
  void master_sync();

  Tensor sumsq_;  // (1) device, category workspace: reduce_sumsq's output
  int64_t steps_taken_ = 0;
  bool master_synced_ = false;
};

class OffloadSerialAdamW final : public OffloadAdamW {
 public:
  // Allocates the host state and the host gradient copy (category grads on the host), in parameter
  // order. params and be must outlive the optimizer.
  OffloadSerialAdamW(ParamStore& params, Backend& be, const OptimConfig& cfg);

 private:
  void update_apply(const StepStats& st, int64_t step) override;

  std::vector<Tensor> grad_host_;  // (numel of param i) each, host, category grads
};

// Note [OffloadStream pipeline]: bucket g uses slot g mod S. Issued from the host, in bucket order:
//   update_on = device
//     h2d:     wait slot_free[s]; master, m, v of g -> slot s;            record uploaded[g]
//     compute: wait uploaded[g]; gather grads; update; scatter weights; record updated[g]
//     d2h:     wait updated[g]; slot s -> master, m, v of g;               record slot_free[s]
//   update_on = host
//     d2h:     wait slot_free[s]; grads of g -> host slot s;               record downloaded[g]
//     host:    wait downloaded[g]; CPU AdamW on g; (slot s free again, by program order)
//     h2d:     master of g -> the parameters' weights
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
  // host update: S x B_max x 4 B on the host). Throws fp::Error for an update_on other than
  // "device" | "host".
  OffloadStreamAdamW(ParamStore& params, Backend& be, const OptimConfig& cfg);

  const OffloadPlan& plan() const { return plan_; }
  bool update_on_device() const { return on_device_; }

 private:
  void update_apply(const StepStats& st, int64_t step) override;
  void step_on_device(const StepStats& st, int64_t step);
  void step_on_host(const StepStats& st, int64_t step);

  OffloadPlan plan_;
  bool on_device_ = true;
  std::vector<Tensor> slots_;       // device update: S x (4, B_max) rows grad, param, m, v; category optimizer
  std::vector<Tensor> host_slots_;  // host update: S x (B_max) gradients, host, category optimizer
};

}  // namespace fp
