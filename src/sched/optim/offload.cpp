// Host-offloaded AdamW: the serial step and the streamed one (offload.h). Dimensions: P parameters,
// B_max the largest bucket, S slots.
#include "sched/optim/offload.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/timing.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"

namespace fp {

namespace {

// Rows of a device staging slot (4, B_max).
enum SlotRow : int64_t { SlotRow_grad = 0, SlotRow_param = 1, SlotRow_m = 2, SlotRow_v = 3 };

}  // namespace

// ---------------------------------------------------------------------------------------------
// Buckets

OffloadPlan offload_plan_make(const std::vector<int64_t>& param_sizes, int64_t bucket_params) {
  FP_CHECK(bucket_params >= 1, "set optim.bucket_params to a positive count (default 1048576)",
           "optim.bucket_params = {} must be >= 1", bucket_params);
  OffloadPlan plan;
  OffloadBucket cur;
  auto close = [&] {
    if (cur.elements == 0) return;
    plan.largest = std::max(plan.largest, cur.elements);
    plan.buckets.push_back(cur);
    cur = OffloadBucket{};
    cur.first_segment = static_cast<int64_t>(plan.segments.size());
  };
  for (size_t i = 0; i < param_sizes.size(); ++i) {
    const int64_t n = param_sizes[i];
    int64_t off = 0;
    while (off < n) {
      int64_t take = std::min(n - off, bucket_params - cur.elements);
      if (take < n - off) {
        // The parameter continues in the next bucket: end this piece on an aligned offset.
        const int64_t aligned = (off + take) / kOffloadAlign * kOffloadAlign - off;
        if (aligned > 0) {
          take = aligned;
        } else if (cur.elements > 0) {
          close();  // no aligned piece fits: the parameter starts the next bucket
          continue;
        }  // else: an empty bucket smaller than the alignment takes the unaligned piece
      }
      plan.segments.push_back({static_cast<int64_t>(i), off, take, cur.elements});
      ++cur.segments;
      cur.elements += take;
      off += take;
      if (cur.elements == bucket_params) close();
    }
  }
  close();
  return plan;
}

OffloadRowLayout offload_row_layout(const OffloadPlan& plan, const std::vector<uint64_t>& elem_bytes) {
  OffloadRowLayout at;
  at.offsets.reserve(plan.segments.size());
  for (const OffloadBucket& b : plan.buckets) {
    uint64_t end = 0;  // bytes of the bucket's row so far
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = plan.segments[static_cast<size_t>(j)];
      FP_ASSERT(static_cast<size_t>(j) == at.offsets.size(), "buckets hold the segments in order");
      const uint64_t size = elem_bytes[static_cast<size_t>(sg.param)];
      end = (end + size - 1) / size * size;  // each element at its own alignment
      at.offsets.push_back(end);
      end += static_cast<uint64_t>(sg.length) * size;
    }
    at.bytes = std::max(at.bytes, end);
  }
  return at;
}

// ---------------------------------------------------------------------------------------------
// Shared: host state, norm, clipping, master sync

OffloadAdamW::OffloadAdamW(ParamStore& params, Backend& be, const OptimConfig& cfg)
    : params_(params), be_(be), cfg_(cfg) {
  const size_t n = params_.all().size();
  master_.reserve(n);
  m_.reserve(n);
  v_.reserve(n);
  const Precision& pr = params_.precision();
  // Note [Offload with bf16 weights]: the host update runs on f32 master, m, v (the cpu kernel's
  // float* operands) and writes the weights in their dtype from it; the staging of the weights
  // shares the gradients' buffers, so both have one dtype. meta computes nothing: any precision.
  const DType f = DType::DType_F32, h = DType::DType_BF16;
  FP_CHECK(!be_.computes() ||
               (pr.master == f && pr.moments == f && (pr.params == f || pr.params == h) && pr.grads == pr.params),
           "set precision.recipe = \"fp32\" or \"bf16\" without per-field overrides, or optim.schedule = \"device\"",
           "{} on the {} backend takes f32 master weights and moments, and weights and gradients both f32 or both "
           "bf16 (precision {})",
           fmt::format("optim.schedule = \"{}\"", schedule_name(cfg_.sched.kind)), be_.name(), precision_describe(pr));
  rounded_ = pr.params != pr.master;
  for (const Param& p : params_.all()) {
    const Shape& shape = p.local_w().shape();  // the FSDP shard on W ranks
    master_.emplace_back(be_.alloc_host(Category::Category_optimizer, shape, pr.master, p.name + ".master"));
    Tensor& m = m_.emplace_back(be_.alloc_host(Category::Category_optimizer, shape, pr.moments, p.name + ".exp_avg"));
    Tensor& v =
        v_.emplace_back(be_.alloc_host(Category::Category_optimizer, shape, pr.moments, p.name + ".exp_avg_sq"));
    // Host memory: written directly (null on meta, where nothing exists to zero).
    if (m.data() != nullptr) std::memset(m.data(), 0, m.bytes());
    if (v.data() != nullptr) std::memset(v.data(), 0, v.bytes());
  }
  sumsq_ = grad_sumsq_alloc(params_, be_);
}

void OffloadAdamW::master_sync() {
  // The device weights are the truth before the first step (init or checkpoint load).
  be_.d2h_stream().wait(grads_ready_);
  if (rounded_) {
    master_widen(std::vector<bool>(params_.all().size(), true));
  } else {
    size_t i = 0;
    for (const Param& p : params_.all()) {
      copy_down(master_[i].data(), p.local_w().data(), p.local_w().bytes());
      ++i;
    }
    Event done;
    be_.d2h_stream().record(done);
    done.synchronize();
  }
  master_synced_ = true;
}

void OffloadAdamW::weights_written(const std::vector<Param*>& written) {
  if (!master_synced_ || written.empty()) return;
  be_.synchronize();
  std::vector<bool> take;
  for (const Param& p : params_.all())
    take.push_back(std::find(written.begin(), written.end(), &p) != written.end());
  if (rounded_) {
    const OffloadTimes last = times_;  // last_times() describes the last step, not this copy
    master_widen(take);
    times_ = last;
    return;
  }
  size_t i = 0;
  for (const Param& p : params_.all()) {
    if (take[i]) be_.copy_to_host(master_[i].data(), p.local_w().data(), p.local_w().bytes());
    ++i;
  }
}

void OffloadAdamW::copy_down(void* dst, const void* src, uint64_t bytes) {
  be_.copy_async(be_.d2h_stream(), dst, src, bytes);
  times_.down_bytes += bytes;
}

void OffloadAdamW::copy_up(void* dst, const void* src, uint64_t bytes) {
  be_.copy_async(be_.h2d_stream(), dst, src, bytes);
  times_.up_bytes += bytes;
}

OffloadAdamW::StepStats OffloadAdamW::step(int64_t step, int64_t total_steps) {
  FP_ASSERT(step == steps_taken_ + 1, "OffloadAdamW::step({}) after step {}: steps must follow each other (resume "
            "sets set_steps_taken)", step, steps_taken_);
  const auto t0 = Clock::now();
  times_ = OffloadTimes{};
  // The norm and clipping of AdamW::step, the same code (step_stats_begin in optimizer.h). Global over every
  // gradient, so it must finish before any bucket is updated.
  StepStats st = step_stats_begin(cfg_, params_, be_, sumsq_, step, total_steps);
  if (!be_.computes()) {
    // Meta: the update moves and computes only, into buffers reserved at launch (the host state, the
    // slots): it allocates nothing, so there is nothing to replay. At 64 ranks of paper-39L its
    // 11K buckets of stream events per rank were half a plan point (tests/model/test_model_ledger.cpp
    // holds cpu and meta to the same allocation sequence, the optimizer step included).
    steps_taken_ = step;
    return st;
  }
  // The copy streams read the gradients and overwrite the weights: both only after everything the
  // compute stream issued so far (the backward that wrote them, the norm that read them).
  be_.compute_stream().record(grads_ready_);
  times_.norm_s = seconds_since(t0);
  if (!master_synced_) master_sync();
  update_apply(st, step);
  steps_taken_ = step;
  times_.total_s = seconds_since(t0);
  return st;
}

void OffloadAdamW::update_range(bool host, int64_t i, float* master, CBuf grad, float* m, float* v, int64_t length,
                                const StepStats& st, int64_t step, Buf weights) {
  const ops::AdamWHyper h = adamw_hyper(cfg_, st, params_.all()[static_cast<size_t>(i)], step);
  const auto t0 = Clock::now();
  if (host) {
    // Host operands: the backend's host kernels (Note [Host kernels] in backend/backend.h), not its
    // device table (a device kernel cannot read host memory).
    be_.host_kernels().adamw_update(master, grad, m, v, length, h, weights);
  } else {
    be_.kernels().adamw_update(master, grad, m, v, length, h, weights);
  }
  times_.update_s += seconds_since(t0);
}

std::vector<std::pair<std::string, const Tensor*>> OffloadAdamW::state_tensors() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  out.reserve(3 * m_.size());
  size_t i = 0;
  for (const Param& p : params_.all()) {
    out.emplace_back(p.name + ".exp_avg", &m_[i]);
    out.emplace_back(p.name + ".exp_avg_sq", &v_[i]);
    if (rounded_) out.emplace_back(p.name + ".master", &master_[i]);
    ++i;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Serial

OffloadSerialAdamW::OffloadSerialAdamW(ParamStore& params, Backend& be, const OptimConfig& cfg)
    : OffloadAdamW(params, be, cfg) {
  grad_host_.reserve(params_.all().size());
  for (const Param& p : params_.all())
    grad_host_.emplace_back(
        be_.alloc_host(Category::Category_grads, p.local_g().shape(), p.local_g().dtype(), p.name + ".grad_host"));
}

void OffloadSerialAdamW::update_apply(const StepStats& st, int64_t step) {
  Stream& d2h = be_.d2h_stream();
  Stream& h2d = be_.h2d_stream();
  auto t0 = Clock::now();
  // 1. Every gradient to the host.
  d2h.wait(grads_ready_);
  size_t i = 0;
  for (const Param& p : params_.all()) {
    copy_down(grad_host_[i].data(), p.local_g().data(), p.local_g().bytes());
    ++i;
  }
  Event down;
  d2h.record(down);
  down.synchronize();
  times_.down_s = seconds_since(t0);
  // 2. CPU AdamW over everything, parameter by parameter, while the device waits. With bf16 weights
  // the new master is then rounded into the gradient's buffer, dead once its update returned (Note
  // [Offload with bf16 weights]: the kernel's param_copy may not alias its gradient).
  for (i = 0; i < master_.size(); ++i) {
    const int64_t n = master_[i].numel();
    update_range(/*host=*/true, static_cast<int64_t>(i), master_[i].f32(), grad_host_[i].cbuf(), m_[i].f32(),
                 v_[i].f32(), n, st, step, nullptr);
    if (rounded_) {
      const auto tr = Clock::now();
      be_.host_kernels().copy(grad_host_[i].buf(), master_[i].f32(), n);
      times_.update_s += seconds_since(tr);
    }
  }
  // 3. Every weight back: the master itself (fp32), or its rounding (bf16).
  t0 = Clock::now();
  h2d.wait(grads_ready_);
  i = 0;
  for (Param& p : params_.all()) {
    copy_up(p.local_w().data(), rounded_ ? grad_host_[i].data() : master_[i].data(), p.local_w().bytes());
    ++i;
  }
  Event up;
  h2d.record(up);
  be_.compute_stream().wait(up);  // the next forward reads the new weights
  up.synchronize();
  times_.up_s = seconds_since(t0);
}

void OffloadSerialAdamW::master_widen(const std::vector<bool>& take) {
  // Between steps no gradient is held in grad_host_ (each step downloads them anew): the bf16
  // weights come down into it and are widened into the master on the host.
  size_t i = 0;
  for (const Param& p : params_.all()) {
    FP_ASSERT(grad_host_[i].dtype() == p.local_w().dtype(), "{}: host gradient {} stages {} weights", p.name,
              dtype_name(grad_host_[i].dtype()), dtype_name(p.local_w().dtype()));
    if (take[i]) copy_down(grad_host_[i].data(), p.local_w().data(), p.local_w().bytes());
    ++i;
  }
  Event done;
  be_.d2h_stream().record(done);
  done.synchronize();
  for (i = 0; i < master_.size(); ++i)
    if (take[i]) be_.host_kernels().copy(master_[i].f32(), grad_host_[i].cbuf(), master_[i].numel());
}

// ---------------------------------------------------------------------------------------------
// Streamed

OffloadStreamAdamW::OffloadStreamAdamW(ParamStore& params, Backend& be, const OptimConfig& cfg)
    : OffloadAdamW(params, be, cfg) {
  FP_CHECK(cfg_.sched.slots >= 1, "set optim.slots to 1 or more (default 2)", "optim.slots = {} must be >= 1",
           cfg_.sched.slots);
  on_device_ = !cfg_.sched.update_on_host;
  std::vector<int64_t> sizes;
  for (const Param& p : params_.all()) sizes.push_back(p.local_w().numel());
  plan_ = offload_plan_make(sizes, cfg_.sched.bucket_params);
  // Host placement: each segment staged in its parameter's own dtypes (Note [Offload with bf16
  // weights]), a row as long as its largest bucket's bytes, in elements of the precision's dtype (for
  // one dtype throughout, B_max of them). From the parameters' dtypes alone, so meta allocates what cpu
  // does.
  const Precision& pr = params_.precision();
  if (!on_device_) {
    std::vector<uint64_t> g_size, w_size;
    for (const Param& p : params_.all()) {
      g_size.push_back(dtype_size(p.local_g().dtype()));
      w_size.push_back(dtype_size(p.local_w().dtype()));
    }
    grad_at_ = offload_row_layout(plan_, g_size);
    if (rounded_) weight_at_ = offload_row_layout(plan_, w_size);
  }
  auto elements = [](uint64_t bytes, DType t) {
    return static_cast<int64_t>((bytes + dtype_size(t) - 1) / dtype_size(t));
  };
  // The fixed working set, reserved at launch (Plan before allocating, STYLE.md).
  for (int64_t s = 0; s < cfg_.sched.slots && plan_.largest > 0; ++s) {
    if (on_device_) {
      slots_.push_back(be_.alloc_f32(Category::Category_optimizer, {4, plan_.largest}, fmt::format("optim.slot{}", s)));
    } else {
      // The gradient row; with bf16 weights the weight row too.
      host_slots_.push_back(be_.alloc_host(Category::Category_optimizer, {elements(grad_at_.bytes, pr.grads)}, pr.grads,
                                           fmt::format("optim.host_slot{}", s)));
      if (rounded_)
        host_wslots_.push_back(be_.alloc_host(Category::Category_optimizer, {elements(weight_at_.bytes, pr.params)},
                                              pr.params, fmt::format("optim.host_wslot{}", s)));
    }
  }
}

Buf OffloadStreamAdamW::host_row_at(const Tensor& row, const OffloadRowLayout& at, int64_t j, DType dtype) const {
  const size_t k = static_cast<size_t>(j);
  FP_ASSERT(at.offsets[k] + static_cast<uint64_t>(plan_.segments[k].length) * dtype_size(dtype) <= row.bytes(),
            "segment {} ({} B at {}) ends past its host slot row of {} B", j,
            plan_.segments[k].length * dtype_size(dtype), at.offsets[k], row.bytes());
  char* base = static_cast<char*>(row.data());
  return Buf(base == nullptr ? nullptr : base + at.offsets[k], dtype);
}

void OffloadStreamAdamW::update_apply(const StepStats& st, int64_t step) {
  if (on_device_) {
    step_on_device(st, step);
  } else {
    step_on_host(st, step);
  }
}

void OffloadStreamAdamW::step_on_device(const StepStats& st, int64_t step) {
  Stream& h2d = be_.h2d_stream();
  Stream& d2h = be_.d2h_stream();
  Stream& compute = be_.compute_stream();
  const auto& segs = plan_.segments;
  const int64_t n_buckets = static_cast<int64_t>(plan_.buckets.size());
  const int64_t S = static_cast<int64_t>(slots_.size());
  const int64_t row = plan_.largest;  // elements per slot row
  std::vector<Event> uploaded(static_cast<size_t>(n_buckets)), updated(static_cast<size_t>(n_buckets));
  std::vector<Event> slot_free(static_cast<size_t>(S));

  // master, m, v of bucket g -> slot g mod S, once the slot's previous bucket is written back.
  auto upload = [&](int64_t g) {
    const OffloadBucket& b = plan_.buckets[static_cast<size_t>(g)];
    float* slot = slots_[static_cast<size_t>(g % S)].f32();  // (4, B_max)
    h2d.wait(slot_free[static_cast<size_t>(g % S)]);
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      const size_t i = static_cast<size_t>(sg.param);
      const uint64_t bytes = static_cast<uint64_t>(sg.length) * sizeof(float);
      copy_up(slot + SlotRow_param * row + sg.slot_offset, master_[i].f32() + sg.offset, bytes);
      copy_up(slot + SlotRow_m * row + sg.slot_offset, m_[i].f32() + sg.offset, bytes);
      copy_up(slot + SlotRow_v * row + sg.slot_offset, v_[i].f32() + sg.offset, bytes);
    }
    h2d.record(uploaded[static_cast<size_t>(g)]);
  };

  for (int64_t g = 0; g < std::min(S, n_buckets); ++g) upload(g);
  for (int64_t g = 0; g < n_buckets; ++g) {
    const OffloadBucket& b = plan_.buckets[static_cast<size_t>(g)];
    const size_t s = static_cast<size_t>(g % S);
    float* slot = slots_[s].f32();  // (4, B_max)
    // Update on the device: gather the gradients (bf16: widened by the converting copy), update the
    // slot, scatter the weights (bf16: rounded into them by the update itself).
    compute.wait(uploaded[static_cast<size_t>(g)]);
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      const Param& p = params_.all()[static_cast<size_t>(sg.param)];
      float* grad_row = slot + SlotRow_grad * row + sg.slot_offset;
      if (rounded_) {
        be_.kernels().copy(grad_row, p.local_g().cbuf().at(sg.offset), sg.length);
      } else {
        be_.copy_async(compute, grad_row, p.local_g().f32() + sg.offset, static_cast<uint64_t>(sg.length) * sizeof(float));
      }
    }
    // Per segment: weight decay differs between parameters (matrices vs norm weights).
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      Param& p = params_.all()[static_cast<size_t>(sg.param)];
      const int64_t o = sg.slot_offset;
      update_range(/*host=*/false, sg.param, slot + SlotRow_param * row + o, slot + SlotRow_grad * row + o,
                   slot + SlotRow_m * row + o, slot + SlotRow_v * row + o, sg.length, st, step,
                   rounded_ ? p.local_w().buf().at(sg.offset) : Buf{});
    }
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments && !rounded_; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      Param& p = params_.all()[static_cast<size_t>(sg.param)];
      be_.copy_async(compute, p.local_w().f32() + sg.offset, slot + SlotRow_param * row + sg.slot_offset,
                     static_cast<uint64_t>(sg.length) * sizeof(float));
    }
    compute.record(updated[static_cast<size_t>(g)]);
    // master, m, v back to the host; then the slot takes bucket g + S.
    d2h.wait(updated[static_cast<size_t>(g)]);
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      const size_t i = static_cast<size_t>(sg.param);
      const uint64_t bytes = static_cast<uint64_t>(sg.length) * sizeof(float);
      copy_down(master_[i].f32() + sg.offset, slot + SlotRow_param * row + sg.slot_offset, bytes);
      copy_down(m_[i].f32() + sg.offset, slot + SlotRow_m * row + sg.slot_offset, bytes);
      copy_down(v_[i].f32() + sg.offset, slot + SlotRow_v * row + sg.slot_offset, bytes);
    }
    d2h.record(slot_free[s]);
    if (g + S < n_buckets) upload(g + S);
  }
  // The host state is final once the last write-back landed.
  Event done;
  d2h.record(done);
  done.synchronize();
}

void OffloadStreamAdamW::step_on_host(const StepStats& st, int64_t step) {
  Stream& h2d = be_.h2d_stream();
  Stream& d2h = be_.d2h_stream();
  const auto& segs = plan_.segments;
  const int64_t n_buckets = static_cast<int64_t>(plan_.buckets.size());
  const int64_t S = static_cast<int64_t>(host_slots_.size());
  std::vector<Event> downloaded(static_cast<size_t>(n_buckets));
  std::vector<Event> weights_up(static_cast<size_t>(S));  // bf16: slot s's weight row went up

  // Gradients of bucket g -> host slot g mod S, each segment in its gradient's dtype. Issued only
  // after the previous bucket of that slot was updated (program order on the host), so no event
  // guards the refill.
  auto download = [&](int64_t g) {
    const OffloadBucket& b = plan_.buckets[static_cast<size_t>(g)];
    const Tensor& slot = host_slots_[static_cast<size_t>(g % S)];  // the bucket's gradients
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      const Tensor& grad = params_.all()[static_cast<size_t>(sg.param)].local_g();
      copy_down(host_row_at(slot, grad_at_, j, grad.dtype()).p, grad.buf().at(sg.offset).p,
                static_cast<uint64_t>(sg.length) * dtype_size(grad.dtype()));
    }
    d2h.record(downloaded[static_cast<size_t>(g)]);
  };

  d2h.wait(grads_ready_);
  h2d.wait(grads_ready_);  // the weights are overwritten only after the backward read them
  for (int64_t g = 0; g < std::min(S, n_buckets); ++g) download(g);
  for (int64_t g = 0; g < n_buckets; ++g) {
    const OffloadBucket& b = plan_.buckets[static_cast<size_t>(g)];
    const size_t s = static_cast<size_t>(g % S);
    downloaded[static_cast<size_t>(g)].synchronize();
    // bf16: the weight row the update rounds into, once its previous bucket's copy went up.
    if (rounded_) weights_up[s].synchronize();
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      const size_t i = static_cast<size_t>(sg.param);
      const Param& p = params_.all()[i];
      update_range(/*host=*/true, sg.param, master_[i].f32() + sg.offset,
                   host_row_at(host_slots_[s], grad_at_, j, p.local_g().dtype()), m_[i].f32() + sg.offset,
                   v_[i].f32() + sg.offset, sg.length, st, step,
                   rounded_ ? host_row_at(host_wslots_[s], weight_at_, j, p.local_w().dtype()) : Buf{});
    }
    // The new weights go up in their dtype: fp32 straight from the master (final for this step:
    // nothing writes it again), bf16 from the weight row the update wrote (an f32 parameter's too).
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      Tensor& w = params_.all()[static_cast<size_t>(sg.param)].local_w();
      const uint64_t bytes = static_cast<uint64_t>(sg.length) * dtype_size(w.dtype());
      if (rounded_) {
        copy_up(w.buf().at(sg.offset).p, host_row_at(host_wslots_[s], weight_at_, j, w.dtype()).p, bytes);
      } else {
        copy_up(w.f32() + sg.offset, master_[static_cast<size_t>(sg.param)].f32() + sg.offset, bytes);
      }
    }
    if (rounded_) h2d.record(weights_up[s]);
    if (g + S < n_buckets) download(g + S);
  }
  Event up;
  h2d.record(up);
  be_.compute_stream().wait(up);  // the next forward reads the new weights
  up.synchronize();
}

void OffloadStreamAdamW::master_widen(const std::vector<bool>& take) {
  Stream& d2h = be_.d2h_stream();
  const auto& segs = plan_.segments;
  if (on_device_) {
    // Widened on the device into a slot's param row (the converting copy on the compute stream),
    // then 4 B per parameter down, through the S slots in turn.
    Stream& compute = be_.compute_stream();
    const int64_t S = static_cast<int64_t>(slots_.size());
    const int64_t row = plan_.largest;
    std::vector<Event> slot_free(static_cast<size_t>(S));
    for (size_t g = 0; g < plan_.buckets.size(); ++g) {
      const OffloadBucket& b = plan_.buckets[g];
      const size_t s = g % static_cast<size_t>(S);
      float* param_row = slots_[s].f32() + SlotRow_param * row;  // (B_max)
      compute.wait(slot_free[s]);
      for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
        const OffloadSegment& sg = segs[static_cast<size_t>(j)];
        const Param& p = params_.all()[static_cast<size_t>(sg.param)];
        if (take[static_cast<size_t>(sg.param)])
          be_.kernels().copy(param_row + sg.slot_offset, p.local_w().cbuf().at(sg.offset), sg.length);
      }
      Event widened;
      compute.record(widened);
      d2h.wait(widened);
      for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
        const OffloadSegment& sg = segs[static_cast<size_t>(j)];
        const size_t i = static_cast<size_t>(sg.param);
        if (take[i])
          copy_down(master_[i].f32() + sg.offset, param_row + sg.slot_offset,
                    static_cast<uint64_t>(sg.length) * sizeof(float));
      }
      d2h.record(slot_free[s]);
    }
    Event done;
    d2h.record(done);
    done.synchronize();
    return;
  }
  // Host placement: the weights come down in their dtype into a slot's weight row, bucket by bucket,
  // and are widened on the host (a first step's cost: one bucket in flight is enough).
  const Tensor& stage = host_wslots_.front();  // a bucket's weights
  for (const OffloadBucket& b : plan_.buckets) {
    bool any = false;
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      const Tensor& w = params_.all()[static_cast<size_t>(sg.param)].local_w();
      if (!take[static_cast<size_t>(sg.param)]) continue;
      copy_down(host_row_at(stage, weight_at_, j, w.dtype()).p, w.buf().at(sg.offset).p,
                static_cast<uint64_t>(sg.length) * dtype_size(w.dtype()));
      any = true;
    }
    if (!any) continue;
    Event down;
    d2h.record(down);
    down.synchronize();
    for (int64_t j = b.first_segment; j < b.first_segment + b.segments; ++j) {
      const OffloadSegment& sg = segs[static_cast<size_t>(j)];
      const size_t i = static_cast<size_t>(sg.param);
      const DType t = params_.all()[i].local_w().dtype();
      if (take[i])
        be_.host_kernels().copy(master_[i].f32() + sg.offset, host_row_at(stage, weight_at_, j, t), sg.length);
    }
  }
}

}  // namespace fp
