// The planner: the per-rank device-memory peaks of one training step (forward, backward and optimizer
// step) for any model, context length and rank count, the binding category, the host memory the
// schedules need, and the largest context that fits.
//
// Note [The engine is its own planner]
// A plan is a run of the engine: W ranks as threads of one process (comm/thread_comm.h), each with a
// meta backend that performs the engine's own allocations and computes nothing, joined by a comm
// that really exchanges the host data behind data-dependent sizes (EP's counts, LLEP's loads,
// Ring-DTP's token counts), running the step the trainer runs (zero grads, step_forward_backward, the
// optimizer step) in the settings' precision recipe. Its ledgers are the plan. No second copy of the
// allocation sequence exists, so nothing can drift from the engine (ggml plans allocation from the
// graph it will run, for the same reason). The plan describes the rank with the largest step peak,
// or layout.rank. Every category is exact in that sense; a plan is approximate only where the model
// itself is an approximation of the file it came from (Model::notes: an architecture the engine does
// not run, such as MLA planned as GQA), and says why.
//
// Legend: T context (tokens per sequence), B sequences, W ranks (the engine's layout: the sequence is
// split over every rank, every dense parameter sharded by rows over W, E / W experts per rank, the
// vocabulary ring over W), N = B T / W tokens per rank, E experts, k top-k.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/device_profile.h"
#include "backend/work_log.h"
#include "comm/thread_comm.h"
#include "core/dtype.h"
#include "core/precision.h"
#include "core/units.h"
#include "memory/category.h"
#include "memory/ledger.h"
#include "model/config.h"
#include "model/schedules.h"

namespace fp::plan {

using CategoryBytes = std::array<uint64_t, kNumCategories>;

// The flatpeak preset's moe.token_chunk: at paper-7L's former reach on 16 ranks (4.74M tokens) it takes the
// step peak from 131.3 to 77.2 GiB (docs/benchmarks.md); smaller chunks gain little more.
inline constexpr int64_t kFlatpeakTokenChunk = 16384;
// The flatpeak preset's ckpt.layer_tile (Note [Sequence-tiled layers] in model/layer_tiles.cpp): tiles of
// 8192 tokens bound a layer's token-wise tensors at that many tokens; smaller ones move the reach little
// (docs/benchmarks.md, "Sequence-tiled layers").
inline constexpr int64_t kFlatpeakLayerTile = 8192;

struct Layout {
  int64_t ranks = 1;  // W
  int64_t batch = 1;  // B, sequences per step of each replica (each split over its cp ranks)
  // Note [A device mesh] (train/trainer.cpp): dp = W / cp replicas of cp context-parallel ranks (0: cp = W,
  // one replica). The experts are split over groups of ep ranks and the dense shards (with the
  // vocabulary ring) over groups of fsdp ranks (Notes [Experts in groups], [Dense shards in groups] in
  // model/params.h; 0: one group of all W).
  int64_t cp = 0;
  int64_t ep = 0;
  int64_t fsdp = 0;
  int64_t context_ranks() const { return cp > 0 ? cp : ranks; }    // cp
  int64_t replicas() const { return ranks / context_ranks(); }     // dp
  int64_t expert_ranks() const { return ep > 0 ? ep : ranks; }     // ep
  int64_t shard_ranks() const { return fsdp > 0 ? fsdp : ranks; }  // fsdp
  int64_t rank = -1;  // the rank to describe; -1: the one with the largest step peak (ranks differ by
                      // the rows their experts receive and their vocabulary shard)
};

// Every schedule setting is the engine's own struct (model/schedules.h), under the run config's names;
// the planner differs in two defaults: optim.schedule = "auto" (the baseline's rule, resolved by
// plan_step) and precision.recipe = "bf16" (Settings::precision: the paper's recipe, a real run's dtypes).
Schedules planner_schedules();

struct Settings {
  Schedules sched = planner_schedules();
  Precision precision = precision_recipe("bf16");  // [precision] (core/precision.h)
  Layout layout;
  RoutingProfile routing = routing_profile_parse("balanced");
  // The flatpeak preset's layer tile and Ring-DTP strip are the planner's to shrink where they bind (Note [The
  // planner shrinks what binds] in plan/plan.cpp); a key given by name (ckpt.layer_tile=, vocab.block_tokens=)
  // is kept as given.
  bool shrink = false;
  // train.checkpoint_async: rank 0 holds a host copy of the checkpoint (Note [Checkpoints off the critical
  // path] in train/checkpoint_writer.h), counted in its host memory.
  bool checkpoint_async = false;
};

// The schedule families of the baseline (FSDP2-like: standard EP, full logits, boundaries on the
// device, optimizer on the device or offloaded serially, whichever fits) and of flatpeak (all four
// flattened: pipelined_llep, ring, sco, offload_stream). Only the families change; sizes, layout,
// dtypes and routing are kept.
void settings_set_baseline(Settings& s);
void settings_set_flatpeak(Settings& s);

// Applies one --schedule item: "baseline", "flatpeak", or key=value where key is a schedule setting's
// run-config name (schedules_set in model/schedules.h: vocab.schedule=ring, pipelined.chunk_cap=512,
// optim.schedule=auto|device|offload_serial|offload_stream, ckpt.host_budget=1GiB, precision.recipe=bf16,
// ...) or one of the layout's batch= rank= routing=balanced|hot:R:H. Older short spellings are aliases
// of those names: vocab= ckpt= optim= dispatch= block_tokens= ring_mode= keep_strips= chunk_tokens=
// chunk_cap= max_chunks= membership= lambda= alpha= min_tokens_per_gemm= token_chunk= bucket_params=
// slots= update_on= ckpt_host_budget= dtype.weights= dtype.<field>=, and dtype=D sets every field.
// The result is validated (schedules_validate). Throws fp::Error naming the item.
void settings_apply(Settings& s, std::string_view item);

// A model to plan: the engine's architecture (Qwen3-MoE) with the dimensions of a preset or a
// Hugging Face config.json; notes say what was approximated.
struct Model {
  std::string name;
  std::string source;                    // file it came from
  ModelConfig cfg;                       // dimensions (rope/eps are not used)
  int64_t default_ranks = 0;             // preset's rank count (paper models), 0: none
  std::vector<std::string> notes;        // what the preset assumes (dimensions not given by its source)
  std::vector<std::string> approximate;  // architecture the engine does not run, modelled as Qwen3-MoE
};

struct Input {
  ModelConfig model;
  int64_t context = 0;  // T
  Settings settings;
  uint64_t device_mem = kUnlimitedBytes;  // per rank
  uint64_t host_mem = kUnlimitedBytes;    // per rank (pinned host memory for offloads)
  std::vector<std::string> approximate;   // why the model is approximate (Model::approximate); empty: exact
  // Note [Time in the planner]: the device profile the step is timed under; null: no time is predicted.
  std::shared_ptr<const DeviceProfile> profile;
};

// Note [Time in the planner]
// The meta run counts its work (Note [Meta counts the work] in backend/work_log.h); under a device profile
// (backend/device_profile.h) each rank's kernels, copies and messages become a timeline over its streams, and
// the step's predicted time is the longest rank's critical path (ranks are timed each on its own: a rank that
// waits for a slower one at a collective is covered by taking the slowest). Every figure here is a prediction
// under the profile's rates and deratings, printed as one. Assumed: the routing profile's loads (balanced by
// default), a group of ranks within a node when it has at most ranks_per_node ranks, the usual ring
// algorithms' bytes per collective, and no interference between streams beyond their order (a copy under a
// GEMM does not slow it).
struct StepTime {
  bool predicted = false;   // a profile was given
  std::string profile;      // its name
  double seconds = 0;       // the step, predicted: the slowest rank's critical path
  double tokens_per_s = 0;  // per device: the rank's tokens over the step's time
  double mfu = 0;           // model FLOPs (6 x active parameters per token + attention) / (seconds x peak)
  double peak_flops = 0;    // the profile's dense GEMM peak in the activations' dtype (underated)
  double model_flops = 0;   // per rank, the classic estimate (no recompute)
  double flops = 0;         // per rank, counted: every kernel, recompute included
  double gemm_flops = 0, attention_flops = 0;
  std::array<double, kNumTimeClasses> busy{};  // seconds each resource is busy (Note [The step's critical path])
  TimeClass binding = TimeClass::TimeClass_compute;
  std::array<double, kNumLinks> link_bytes{};  // per rank: bytes over each link
  uint64_t kernel_calls = 0;
};

// The layout of a plan, as the engine ran it.
struct Sizes {
  int64_t ranks = 1;
  int64_t tokens = 0;                // N, tokens per rank
  int64_t routes_sent = 0;           // m = N k
  int64_t rank = 0;                  // the rank described (W > 1: the largest step peak, or layout.rank)
  int64_t vocab_ring = 1;            // ring: P, the LM head's vocabulary shards (= W)
  std::string ring_mode;             // ring, P > 1: resolved "weights" | "activations" (sched/vocab)
  int64_t params_total = 0;          // P
  int64_t params_per_rank = 0;       // elements of the parameters this rank stores (its FSDP rows, its experts)
  int64_t boundaries_offloaded = 0;  // sco: boundaries that went to host
  int64_t chunks = 0;                // pipelined_llep (W > 1): K, chunks per MoE block (the engine's chunk plan)
  int64_t chunk_tokens = 0;          // pipelined_llep: c_eff, tokens per source per chunk
};

struct Result {
  Sizes sizes;
  Schedules sched;                               // optim resolved (never auto)
  Precision precision;                           // the dtypes it was planned in (Settings::precision)
  CategoryBytes peak{};                          // per-category device peak, bytes per rank
  CategoryBytes at_peak{};                       // what each category held at the step's peak
  uint64_t step_peak = 0;                        // device, all categories at once
  Category binding = Category::Category_params;  // the category holding the most at the step's peak
  std::string peak_tag;                          // the allocation that set the step's peak
  CategoryBytes host_peak{};                     // host memory by category (optimizer state, offloaded boundaries)
  // train.checkpoint_async: the checkpoint's host copy rank 0 holds (checkpoint_image_bytes); 0 without it.
  uint64_t host_checkpoint_copy = 0;
  // The host memory of the rank described, and with a checkpoint copy the larger of that and rank 0's.
  uint64_t host_needed = 0;
  bool fits_device = true;  // step_peak <= device_mem
  bool fits_host = true;    // host_needed <= host_mem
  bool fits() const { return fits_device && fits_host; }
  // Empty: every figure is the engine's own (Note [The engine is its own planner]); otherwise why the
  // model, and so every figure, is approximate.
  std::vector<std::string> approximate;
  bool exact() const { return approximate.empty(); }
  // Per category: what holds it, in words (symbols of the legend).
  std::array<std::string, kNumCategories> formula{};
  double seconds = 0;  // wall time of the engine runs behind this plan
  StepTime time;       // Note [Time in the planner]: counts always, seconds with a profile
};

// One rank's ledgers after a planned step (PlanRun).
struct RankPlan {
  CategoryBytes peak{}, at_peak{}, host_peak{};
  uint64_t step_peak = 0, host_needed = 0;
  uint64_t host_checkpoint_copy = 0;  // train.checkpoint_async, rank 0: checkpoint_image_bytes
  std::string peak_tag;
  int64_t params_per_rank = 0, boundaries_offloaded = 0;
  uint64_t events_seen = 0, host_events_seen = 0;  // every event of the ledgers, replayed or counted
  uint64_t events_repeated = 0;                    // of them, counted (Note [Repeats replayed once])
  std::vector<LedgerEvent> events, host_events;    // with PlanOptions::events only
  WorkLog work{nullptr, 1};                        // the rank's counts of its step (Note [Meta counts the work])
};

struct PlanOptions {
  bool events = false;  // keep every rank's ledger timelines (tests compare them event for event)
  // Replay every repeat of a block (Note [Repeats replayed once] in memory/ledger.h): the same plan, slower;
  // tests compare the two. Without it, repeats are counted unless events are kept.
  bool full_replay = false;
  // Route afresh at every change of a MoE block's token count (Model::set_reroute_each_n, Note [One routing per
  // token count] in model/moe_block.cpp): the same plan, slower; tests compare the two.
  bool reroute_each_n = false;
  // Note [A step that cannot fit is not run] (plan.cpp): when the rank the plan describes holds more than this
  // before the step (0: never), the step is not run and the plan is of what was held then: one that does
  // not fit, and nothing else of it is meaningful (plan_optim's first try only).
  uint64_t skip_over = 0;
  std::vector<RankPlan>* ranks = nullptr;  // every rank's ledgers (tests)
};

// Plans one step: the engine on meta (Note [The engine is its own planner]). The baseline's optimizer
// rule (optim=auto) runs the step with the optimizer on the device and, when that does not fit, again
// with the serial host offload. Throws fp::Error on what the engine refuses (W not dividing E, T not a
// multiple of 2W, ...).
Result plan_step(const Input& in, const PlanOptions& opt = {});

// The largest context T whose step fits device_mem and host_mem: doubling from 1024 tokens, then a
// bisection over meta runs to the engine's granularity (T a multiple of 2W: the zig-zag split of
// context parallelism). max_context 0 when no context fits; capped when T = cap still fits.
struct Reach {
  int64_t max_context = 0;
  int64_t max_pow2 = 0;  // largest power of two that fits
  bool capped = false;
  Result at_max;       // the plan at max_context (when > 0)
  int points = 0;      // contexts planned by the search (Note [Searching the reach] in plan.cpp)
  double seconds = 0;  // wall time of the search
};
// progress (optional) hears of every point planned: its context, whether it fits, its seconds.
using ReachProgress = std::function<void(int64_t context, bool fits, double seconds)>;
Reach plan_reach(Input in, int64_t cap = int64_t{1} << 31, const ReachProgress& progress = {});

// The classic estimate of a step's model FLOPs for `tokens` tokens of sequences of T (one rank's share when
// tokens is per rank): 6 per matmul parameter a token touches (forward 2, backward 4: attention projections,
// the k routed experts, the router, the LM head) plus causal attention's 3 x 2 x 2 x T/2 x hd x nh per token,
// with no recompute.
double model_flops_estimate(const ModelConfig& m, double tokens, double T);

// Parses a context length: "1048576", "1M" (2^20), "128K" (2^17). Throws fp::Error.
int64_t context_parse(std::string_view s);
// "1M", "128K", "1000" (exact binary multiples get a suffix).
std::string context_format(int64_t t);

}  // namespace fp::plan
