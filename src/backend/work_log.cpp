// Counting and timing a meta run (Notes [Meta counts the work], [The step's critical path]).
#include "backend/work_log.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace fp {

const char* link_name(Link l) {
  switch (l) {
    case Link::Link_device_memory:
      return "device memory";
    case Link::Link_host:
      return "host link";
    case Link::Link_intra_node:
      return "intra-node";
    case Link::Link_inter_node:
      return "inter-node";
  }
  return "?";
}

const char* time_class_name(TimeClass c) {
  switch (c) {
    case TimeClass::TimeClass_compute:
      return "compute";
    case TimeClass::TimeClass_comm:
      return "communication";
    case TimeClass::TimeClass_host_link:
      return "host link";
    case TimeClass::TimeClass_launch:
      return "launch";
  }
  return "?";
}

double Timeline::run(Lane lane, double seconds, double launch, bool host_inline) {
  double& host = t_[static_cast<int>(Lane::Lane_host)];
  double& l = t_[static_cast<int>(lane)];
  host += launch;
  const double start = std::max(l, host);
  l = start + seconds;
  if (host_inline) host = l;
  return l;
}

void Timeline::wait_until(Lane lane, double t) {
  double& l = t_[static_cast<int>(lane)];
  l = std::max(l, t);
}

double Timeline::end() const { return *std::max_element(t_.begin(), t_.end()); }

WorkLog::WorkLog(const DeviceProfile* profile, int world) : profile_(profile), world_(std::max(world, 1)) {
  if (profile_ != nullptr && profile_->shared_cores > 0 && world_ > profile_->shared_cores)
    slow_ = static_cast<double>(world_) / profile_->shared_cores;
}

void WorkLog::repeat_pop() {
  FP_ASSERT(!scale_stack_.empty(), "repeat_pop without repeat_push");
  scale_stack_.pop_back();
  scale_ = scale_stack_.empty() ? 1.0 : scale_stack_.back();
}

double WorkLog::kernel_seconds(const KernelWork& w, Lane lane) const {
  if (profile_ == nullptr) return 0;
  const DeviceProfile& p = *profile_;
  const double mem =
      lane == Lane::Lane_host && p.host_mem_bytes_per_s > 0 ? p.host_mem_bytes_per_s : p.mem_bytes_per_s * p.mem_derate;
  const double t_mem = mem > 0 ? w.bytes / mem : 0;
  double t_flops = 0;
  switch (w.kind) {
    case KernelWork::Kind::Kind_gemm: {
      const double rate = device_profile_gemm_rate(p, w.dtype) * device_profile_gemm_fraction(p, w.M, w.N, w.K);
      t_flops = rate > 0 ? w.flops / rate : 0;
      break;
    }
    case KernelWork::Kind::Kind_attention: {
      const double rate = device_profile_gemm_rate(p, w.dtype) * p.attention_eff;
      t_flops = rate > 0 ? w.flops / rate : 0;
      break;
    }
    case KernelWork::Kind::Kind_other:
      t_flops = p.other_flops > 0 ? w.flops / p.other_flops : 0;
      break;
  }
  return std::max(t_mem, t_flops) * slow_;
}

void WorkLog::kernel(ops::KernelId id, Lane lane, const KernelWork& w) {
  KernelCount& k = kernels_[static_cast<int>(id)];
  k.calls += static_cast<uint64_t>(scale_);
  k.flops += w.flops * scale_;
  k.bytes += w.bytes * scale_;
  if (profile_ == nullptr) return;
  // Host kernels run on the host's own cores: no launch.
  const double s = kernel_seconds(w, lane) * scale_, launch = lane == Lane::Lane_host ? 0 : profile_->launch_s * scale_;
  k.seconds += s;
  busy_[static_cast<int>(TimeClass::TimeClass_compute)] += s;
  busy_[static_cast<int>(TimeClass::TimeClass_launch)] += launch;
  // A cpu runs its compute stream on the host (Note [The step's critical path]); host kernels too.
  const bool inline_host = profile_->shared_cores > 0 || lane == Lane::Lane_host;
  tl_.run(lane, s, launch, inline_host);
}

void WorkLog::copy(Lane lane, double bytes) {
  const Link l = lane == Lane::Lane_h2d || lane == Lane::Lane_d2h ? Link::Link_host : Link::Link_device_memory;
  LinkCount& c = links_[static_cast<int>(l)];
  c.messages += static_cast<uint64_t>(scale_);
  c.bytes += bytes * scale_;
  if (profile_ == nullptr) return;
  double s = 0;
  if (l == Link::Link_host) {
    s = (profile_->host_link.bytes_per_s > 0 ? bytes / profile_->host_link.bytes_per_s : 0) +
        profile_->host_link.latency_s;
    busy_[static_cast<int>(TimeClass::TimeClass_host_link)] += s * scale_;
  } else {
    // A device-to-device copy reads and writes its bytes.
    const double mem = profile_->mem_bytes_per_s * profile_->mem_derate;
    s = (mem > 0 ? 2 * bytes / mem : 0) * slow_;
    busy_[static_cast<int>(TimeClass::TimeClass_compute)] += s * scale_;
  }
  c.seconds += s * scale_;
  tl_.run(lane, s * scale_, 0, profile_->shared_cores > 0 && lane == Lane::Lane_compute);
}

Link WorkLog::group_link(int group) const {
  const int per_node = profile_ != nullptr ? profile_->ranks_per_node : 8;
  return group > per_node ? Link::Link_inter_node : Link::Link_intra_node;
}

double WorkLog::message_seconds(Link l, double bytes, int steps) const {
  if (profile_ == nullptr) return 0;
  const LinkProfile& lp = l == Link::Link_inter_node ? profile_->inter_node : profile_->intra_node;
  return (lp.bytes_per_s > 0 ? bytes / lp.bytes_per_s : 0) + steps * lp.latency_s;
}

MessageCount& WorkLog::message_entry(const char* op, int group, Link l) {
  for (MessageCount& m : messages_)
    if (m.group == group && m.link == l && std::strcmp(m.op.c_str(), op) == 0) return m;
  messages_.push_back({op, group, l, 0, 0, 0});
  return messages_.back();
}

void WorkLog::message(const char* op, int group, Lane lane, double bytes, int steps) {
  const Link l = group_link(group);
  const double s = message_seconds(l, bytes, steps) * scale_;
  MessageCount& m = message_entry(op, group, l);
  m.calls += static_cast<uint64_t>(scale_);
  m.bytes += bytes * scale_;
  m.seconds += s;
  LinkCount& c = links_[static_cast<int>(l)];
  c.messages += static_cast<uint64_t>(scale_);
  c.bytes += bytes * scale_;
  c.seconds += s;
  if (profile_ == nullptr) return;
  busy_[static_cast<int>(TimeClass::TimeClass_comm)] += s;
  // A collective is ordered with its stream; on a cpu the host moves the data itself (comm/data_comm.h).
  tl_.run(lane, s, 0, profile_->shared_cores > 0);
}

int64_t WorkLog::transfer_start(const char* op, int group, Lane lane, double bytes) {
  const Link l = group_link(group);
  const double s = message_seconds(l, bytes, 1) * scale_;
  MessageCount& m = message_entry(op, group, l);
  m.calls += static_cast<uint64_t>(scale_);
  m.bytes += bytes * scale_;
  m.seconds += s;
  LinkCount& c = links_[static_cast<int>(l)];
  c.messages += static_cast<uint64_t>(scale_);
  c.bytes += bytes * scale_;
  c.seconds += s;
  busy_[static_cast<int>(TimeClass::TimeClass_comm)] += s;
  // In flight beside the stream: starts once the stream has reached it, on the rank's transfer lane.
  tl_.wait_until(Lane::Lane_transfer, std::max(tl_.at(lane), tl_.at(Lane::Lane_host)));
  transfers_.push_back(tl_.run(Lane::Lane_transfer, s));
  return static_cast<int64_t>(transfers_.size()) - 1;
}

void WorkLog::transfer_wait(int64_t handle, Lane lane) {
  if (handle < 0 || handle >= static_cast<int64_t>(transfers_.size())) return;
  const double end = transfers_[static_cast<size_t>(handle)];
  tl_.wait_until(lane, end);
  if (profile_ != nullptr && profile_->shared_cores > 0) tl_.wait_until(Lane::Lane_host, end);
}

double WorkLog::flops() const {
  double f = 0;
  for (const KernelCount& k : kernels_) f += k.flops;
  return f;
}

}  // namespace fp
