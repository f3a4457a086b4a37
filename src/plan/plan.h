// The planner: closed-form per-rank device-memory peaks of one training step (forward, backward and
// optimizer step) for any model, context length and rank count, the binding category, the host
// memory the schedules need, and the largest context that fits. Pure arithmetic: no backend, no
// memory is allocated (STYLE.md: plan is testable with no device).
//
// Legend: T context (tokens per sequence), B sequences per data-parallel group, W ranks, cp
// context-parallel degree (each rank holds N = B*T/cp tokens), E_p = ep expert-parallel degree, L
// layers, H hidden, V vocabulary, E experts, k top-k, I expert FFN width, m = N*k routes a rank sends,
// R routes a rank receives (routing profile), P parameters.
//
// How a plan is computed: Note [Why the planner replays instead of summing] (plan/replay.h); the
// step's allocation sequence is in plan/step_plan.cpp. What is exact and what is predicted:
//   exact      every schedule and layout the engine runs: one rank, and the rank with the largest
//              step peak of the engine's W-rank layout (cp = ep = fsdp = W: ring attention, FSDP row
//              shards with gathered units, standard EP, LLEP and PipelinedLLEP with each rank's own
//              rows and chunks, Ring-DTP over W shards), with the plain schedules and with Ring-DTP,
//              SCO and the offload optimizers: the same allocation
//              sequence as model.cpp, so with every dtype f32 the plan equals a `--device meta` run
//              event for event, per category and in total (tests/model/test_plan_vs_meta.cpp). Other
//              dtypes scale the bytes of the same sequence.
//   predicted  other multi-rank layouts (cp < W, ep or fsdp != W) and several live Ring-DTP strips: formulas from DESIGN.md, flagged per category (Result::validated, and
//              "predicted, not yet validated against meta" in the JSON; Note [Which plans are
//              validated] in plan.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/units.h"
#include "memory/category.h"
#include "model/config.h"
#include "plan/replay.h"

namespace fp::plan {

// Element types of what real training keeps (bf16 weights, activations and gradients; fp32 master
// weights and moments). RMSNorm/attention statistics, workspace scalars and ids are always fp32/i32,
// as in the engine. `dtype=f32` sets every one to f32: the engine's own (fp32) step.
struct Dtypes {
  DType weights = DType::DType_BF16;
  DType grads = DType::DType_BF16;
  DType activations = DType::DType_BF16;  // also checkpoints, dispatch buffers, activation gradients
  DType master = DType::DType_F32;        // separate master copy only when weights != master
  DType moments = DType::DType_F32;       // AdamW m and v
  DType logits = DType::DType_F32;        // vocab: logits, log-softmax, their gradient, Ring-DTP strips
  DType router = DType::DType_F32;        // router logits, probabilities, top-k weights and their grads
};

// The expert dispatch of sched/dispatch with W > 1 ranks; one rank runs the local dispatch whatever
// is named (the engine's: every expert is on the rank, nothing is sent).
enum class Dispatch { Dispatch_standard, Dispatch_llep, Dispatch_pipelined_llep };
enum class Vocab { Vocab_full, Vocab_ring };
enum class Ckpt { Ckpt_device, Ckpt_sco };
// auto: the baseline's rule, device when the whole step fits, otherwise the serial host offload.
enum class Optim { Optim_auto, Optim_device, Optim_offload_serial, Optim_offload_stream };

std::string_view dispatch_name(Dispatch d);
std::string_view vocab_name(Vocab v);
std::string_view ckpt_name(Ckpt c);
std::string_view optim_name(Optim o);

struct Schedules {
  Dispatch dispatch = Dispatch::Dispatch_standard;
  Vocab vocab = Vocab::Vocab_full;
  Ckpt ckpt = Ckpt::Ckpt_device;
  Optim optim = Optim::Optim_auto;
  int64_t block_tokens = 1024;    // ring: n_blk, tokens per strip
  int64_t vocab_strips = 0;       // ring: strips (n_blk, V/P) live at once (0: 1, as the engine's one-rank head)
  std::string ring_mode = "auto"; // ring, P > 1: weights | activations | auto (activations when N <= V/P)
  bool keep_strips = false;       // ring, P > 1: keep the pass's strips for backward (vocab.keep_strips)
  int64_t chunk_tokens = 1024;    // pipelined_llep: c, tokens per source per chunk (pipelined.chunk_cap)
  int64_t max_chunks = 128;       // pipelined_llep: K_max (pipelined.max_chunks)
  bool strided = true;            // pipelined_llep: chunk membership strided | contiguous (pipelined.membership)
  double lambda = 1.3;            // llep, pipelined_llep: plan when max/mean rank load >= lambda (llep.lambda)
  double alpha = 1.0;             // llep, pipelined_llep: per-rank cap alpha x mean load (llep.alpha)
  int64_t min_tokens_per_gemm = 1024;  // llep, pipelined_llep: smallest spilled piece (llep.min_tokens_per_gemm)
  int64_t bucket_params = 1 << 20;  // offload_stream: parameters per bucket (optim.bucket_params)
  int64_t slots = 2;                // offload_stream: staging slots (optim.slots)
  bool update_on_host = false;      // offload_stream: optim.update_on = "host" (default "device")
  uint64_t ckpt_host_budget = kUnlimitedBytes;  // sco: host bytes for boundaries (also capped by host mem)
};

struct Layout {
  int64_t ranks = 1;  // W
  int64_t cp = 0;     // context-parallel degree; 0: W (the sequence is split over every rank)
  int64_t ep = 0;     // expert-parallel degree; 0: gcd(E, W)
  int64_t fsdp = 0;   // parameter-sharding degree; 0: W (the engine: cp = ep = fsdp = W; fsdp=1 ep=1 replicates)
  int64_t batch = 1;  // B, sequences per data-parallel group (W / cp groups)
  int64_t rank = -1;  // the rank to describe; -1: the one with the largest step peak (ranks differ by
                      // the rows their experts receive)
};

struct Settings {
  Dtypes dtypes;
  Schedules sched;
  Layout layout;
  RoutingProfile routing = routing_profile_parse("balanced");
};

// The schedule families of the baseline (FSDP2-like: standard EP, full logits, boundaries on the
// device, optimizer on the device or offloaded serially, whichever fits) and of flatpeak (all four
// flattened: pipelined_llep, ring, sco, offload_stream). Only the families change; sizes, layout,
// dtypes and routing are kept.
void schedules_set_baseline(Schedules& s);
void schedules_set_flatpeak(Schedules& s);

// Applies one --schedule item: "baseline", "flatpeak", or key=value with keys
//   vocab=full|ring  ckpt=device|sco
//   optim=auto|device|offload_serial|offload_stream
//   dispatch=standard|llep|pipelined_llep
//   block_tokens= vocab_strips= ring_mode= keep_strips=true|false chunk_tokens= (or chunk_cap=) max_chunks=
//   membership=strided|contiguous lambda= alpha= min_tokens_per_gemm= bucket_params= slots=
//   update_on=device|host ckpt_host_budget=SIZE  cp= ep= batch= rank= routing=balanced|hot:R:H
//   dtype=D (all) dtype.weights= dtype.grads= dtype.activations= dtype.master= dtype.moments=
//   dtype.logits= dtype.router=
// Throws fp::Error naming the item.
void settings_apply(Settings& s, std::string_view item);

// A model to plan: the engine's architecture (Qwen3-MoE) with the dimensions of a preset or a
// Hugging Face config.json; notes say what was approximated.
struct Model {
  std::string name;
  std::string source;        // file it came from
  ModelConfig cfg;           // dimensions (rope/eps are not used)
  int64_t default_ranks = 0; // preset's rank count (paper models), 0: none
  std::vector<std::string> notes;
};

struct Input {
  ModelConfig model;
  int64_t context = 0;  // T
  Settings settings;
  uint64_t device_mem = kUnlimitedBytes;  // per rank
  uint64_t host_mem = kUnlimitedBytes;    // per rank (pinned host memory for offloads)
};

// The resolved layout of a plan.
struct Sizes {
  int64_t ranks = 1, cp = 1, ep = 1, fsdp = 1, dp = 1;
  int64_t tokens = 0;           // N, tokens per rank
  int64_t routes_sent = 0;      // m = N*k
  int64_t rank = 0;             // the rank described (W > 1: the largest step peak, or layout.rank)
  int64_t routes_received = 0;  // R: the rows this rank's experts compute (every route it receives); m on one rank
  bool llep_active = false;     // llep, pipelined_llep: LLEP's plan spilled (imbalance >= lambda)
  int64_t guests = 0;           // llep, pipelined_llep: experts this rank computes without owning them
  int64_t chunks = 0;           // pipelined_llep (W > 1): K
  int64_t chunk_tokens = 0;     // pipelined_llep: c_eff
  int64_t chunk_recv_max = 0;   // pipelined_llep: the most rows this rank receives in one chunk (<= W k c_eff)
  int64_t vocab_ring = 1;       // ring: P, the LM head's vocabulary shards (= fsdp)
  std::string ring_mode;        // ring, P > 1: resolved "weights" | "activations"
  int64_t params_total = 0;     // P
  int64_t params_per_rank = 0;  // dense / fsdp (each tensor ceil(R / fsdp) rows) + experts / max(ep, fsdp)
  int64_t boundaries_offloaded = 0;  // sco: boundaries that went to host
  int64_t bucket_largest = 0;        // offload_stream: B_max, elements of the largest bucket
};

struct Result {
  Sizes sizes;
  Schedules sched;                // optim resolved (never auto)
  CategoryBytes peak{};           // per-category device peak, bytes per rank
  CategoryBytes at_peak{};        // what each category held at the step's peak
  uint64_t step_peak = 0;         // device, all categories at once
  Category binding = Category::Category_params;  // the category holding the most at the step's peak
  std::string peak_tag;           // the allocation that set the step's peak
  CategoryBytes host_peak{};      // host memory by category (optimizer state, offloaded boundaries)
  uint64_t host_needed = 0;
  bool fits_device = true;        // step_peak <= device_mem
  bool fits_host = true;          // host_needed <= host_mem
  bool fits() const { return fits_device && fits_host; }
  // Per category: true when every formula that contributes to it has been validated against meta.
  std::array<bool, kNumCategories> validated{};
  // What is predicted (not yet validated against meta), e.g. "vocab=ring (Ring-DTP)".
  std::vector<std::string> predicted;
  // Per category: the closed form in words (symbols of the legend).
  std::array<std::string, kNumCategories> formula{};
};

// Plans one step. device_replay/host_replay (optional) receive the allocation sequence (tests).
// Throws fp::Error on an impossible layout (ep not dividing E or W, T < cp, ...).
Result plan_step(const Input& in, PeakReplay* device_replay = nullptr, PeakReplay* host_replay = nullptr);

// The largest context T whose step fits device_mem and host_mem: doubling from 1024 tokens, then a
// bisection to one token per rank (T a multiple of cp). max_context 0 when no context fits; capped
// when T = cap still fits.
struct Reach {
  int64_t max_context = 0;
  int64_t max_pow2 = 0;   // largest power of two that fits
  bool capped = false;
  Result at_max;          // the plan at max_context (when > 0)
};
Reach plan_reach(Input in, int64_t cap = int64_t{1} << 31);

// Parses a context length: "1048576", "1M" (2^20), "128K" (2^17). Throws fp::Error.
int64_t context_parse(std::string_view s);
// "1M", "128K", "1000" (exact binary multiples get a suffix).
std::string context_format(int64_t t);

}  // namespace fp::plan
