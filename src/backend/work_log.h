// What a meta run does, counted, and its time under a device profile (Note [Meta counts the work]).
//
// Note [Meta counts the work]
// The meta backend runs the engine's own step and computes nothing (Note [The engine is its own planner] in
// plan/plan.h); it sees every kernel call with its arguments (the kernel table, backend/kernels.h), every
// copy with its stream and bytes (Backend::copy_async), every message of the data channel with its group
// (backend/meta/meta_comm.cpp), and every record and wait of an event. So it counts, per rank:
//   kernels   per table entry: calls, FLOPs and bytes moved, from the shapes and dtypes of the call
//             (backend/kernel_work.h: each entry's formula);
//   copies    bytes per link: device memory (a copy on the compute stream) or the host link (h2d, d2h);
//   messages  bytes this rank sends, per collective, group size and link: within a node or across nodes;
//   the schedule: each kernel, copy and message is a task of its stream, and events order the streams.
// Counting costs nothing on a cpu run: only the meta table's entries count (a cpu kernel is the cpu
// table's function, no check on its path).
//
// Note [The step's critical path]
// With a device profile (backend/device_profile.h), each task gets a duration and the streams become a
// timeline (Timeline): a lane per stream (compute, h2d, d2h), one for the ring's transfers in flight (the
// link), and the host that issues the work. A task starts when its lane is free and the host has issued it
// (the host pays the launch overhead per kernel and runs ahead of a device's streams; a cpu's compute stream
// runs on the host itself, so there the host waits for every kernel); a wait moves its lane to the event's
// time; a synchronize moves the host. The step's time is when the last lane ends: the critical path through
// the tasks and their events, not their sum, so an offload's copies under the compute, PipelinedLLEP's
// chunks and the ring's hops overlap exactly as the engine orders them. The binding time is the resource
// that is busiest over the step: compute (kernels), communication (messages), the host link (offload
// copies) or launch (the host issuing kernels).
//
// A block run once and counted `times` over (Note [Repeats replayed once] in memory/ledger.h) is counted and
// timed `times` over (repeat_scale): its tasks' durations are multiplied, which is exact for the counts and
// for a block that starts and ends with its lanes joined (every repeated block of the engine does: a ring
// hop or a tile waits for its transfers before the next).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/device_profile.h"
#include "backend/kernels.h"

namespace fp {

// The work of one kernel call (backend/kernel_work.h).
struct KernelWork {
  enum class Kind { Kind_gemm, Kind_attention, Kind_other };
  Kind kind = Kind::Kind_other;
  double flops = 0;
  double bytes = 0;
  DType dtype = DType::DType_F32;  // the dtype its arithmetic's operands are stored in
  double M = 0, N = 0, K = 0;      // a GEMM's shape (the shape curve); 0 elsewhere
};

enum class Link { Link_device_memory, Link_host, Link_intra_node, Link_inter_node };
inline constexpr int kNumLinks = 4;
const char* link_name(Link l);

enum class TimeClass { TimeClass_compute, TimeClass_comm, TimeClass_host_link, TimeClass_launch };
inline constexpr int kNumTimeClasses = 4;
const char* time_class_name(TimeClass c);

// Lanes of a Timeline: a stream each, the transfers in flight, and the host.
enum class Lane { Lane_compute, Lane_h2d, Lane_d2h, Lane_transfer, Lane_host };
inline constexpr int kNumLanes = 5;

// Streams and events as clocks (Note [The step's critical path]); times in seconds from the start.
class Timeline {
 public:
  // A task of `seconds` on `lane`, issued by the host (which pays `launch` first): starts when both the lane
  // and the host are there; returns its end. host_inline: the host runs it (a cpu's compute stream).
  double run(Lane lane, double seconds, double launch = 0, bool host_inline = false);
  double at(Lane lane) const { return t_[static_cast<int>(lane)]; }
  // The lane does nothing before t (a wait on an event recorded at t).
  void wait_until(Lane lane, double t);
  // The host blocks until the lane has finished all its work so far.
  void host_sync(Lane lane) { wait_until(Lane::Lane_host, at(lane)); }
  // When the last lane ends: the step's time.
  double end() const;

 private:
  std::array<double, kNumLanes> t_{};
};

struct KernelCount {
  uint64_t calls = 0;
  double flops = 0, bytes = 0, seconds = 0;
};
struct LinkCount {
  uint64_t messages = 0;
  double bytes = 0, seconds = 0;
};
// The messages of one collective on one group size and link.
struct MessageCount {
  std::string op;
  int group = 0;
  Link link = Link::Link_intra_node;
  uint64_t calls = 0;
  double bytes = 0, seconds = 0;
};

// One rank's counts and, with a profile, its timeline (Note [Meta counts the work]).
class WorkLog {
 public:
  // profile may be null: counts only (seconds stay 0). world: the ranks of the run (a profile's shared cores).
  WorkLog(const DeviceProfile* profile, int world);

  void kernel(ops::KernelId id, Lane lane, const KernelWork& w);
  void copy(Lane lane, double bytes);
  // A collective of `bytes` sent by this rank over a group of `group` ranks, on the stream's lane; `steps`:
  // the latencies it pays (a ring's hops).
  void message(const char* op, int group, Lane lane, double bytes, int steps);
  // A transfer in flight (send_recv_start): returns its handle, whose end a wait joins.
  int64_t transfer_start(const char* op, int group, Lane lane, double bytes);
  void transfer_wait(int64_t handle, Lane lane);
  void host_sync(Lane lane) { tl_.host_sync(lane); }
  Timeline& timeline() { return tl_; }

  // Note [Meta counts the work]: a block counted `times` over.
  void repeat_push(double times) { scale_stack_.push_back(scale_ *= times); }
  void repeat_pop();

  // The link a group of this many ranks crosses (a group of consecutive ranks: across nodes when it has more
  // ranks than a node).
  Link group_link(int group) const;

  const std::array<KernelCount, ops::kKernelCount>& kernels() const { return kernels_; }
  const std::array<LinkCount, kNumLinks>& links() const { return links_; }
  const std::vector<MessageCount>& messages() const { return messages_; }
  const std::array<double, kNumTimeClasses>& busy() const { return busy_; }
  double flops() const;
  double step_seconds() const { return tl_.end(); }
  const DeviceProfile* profile() const { return profile_; }
  // The kernels' time under the profile (without launch); on the host lane at the host's memory bandwidth.
  double kernel_seconds(const KernelWork& w, Lane lane = Lane::Lane_compute) const;

 private:
  double message_seconds(Link l, double bytes, int steps) const;
  MessageCount& message_entry(const char* op, int group, Link l);

  const DeviceProfile* profile_;
  int world_;
  double slow_ = 1.0;  // shared cores: W ranks on fewer cores
  double scale_ = 1.0;
  std::vector<double> scale_stack_;
  Timeline tl_;
  std::array<KernelCount, ops::kKernelCount> kernels_{};
  std::array<LinkCount, kNumLinks> links_{};
  std::vector<MessageCount> messages_;
  std::array<double, kNumTimeClasses> busy_{};
  std::vector<double> transfers_;  // each transfer's end
};

}  // namespace fp
