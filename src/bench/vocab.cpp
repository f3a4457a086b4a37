// flatpeak bench vocab (bench/vocab.h): the variants on their own backends, the checks against the
// full head and float64, the timed runs, the PyTorch companion.
//
// The embedding table is freed before measuring: the head does not read it, and at V = 131072 it
// would add 2 V H fp32 (weights and gradient) to both device peaks.
//
// Note [bench vocab in bf16]: each recipe of --precision runs every variant on its own backend, in the
// same interleaved loop. In the bf16 recipe the head's input x and its gradient dx, model.norm, lm_head
// and its gradient are bf16 (params, grads, activations), the logits, strips, loss and the ring's
// partial sums f32 (core/precision.h). The host inputs of a bf16 run are rounded to bf16 once when they
// are made (inputs_make), so what the kernels read and what the float64 oracle reads are the same
// numbers, and the oracle measures the kernels' arithmetic (f32 compute, bf16 stores), not the rounding
// of the inputs. Results are read back widened (exact).
//
// Note [bench vocab tolerances]: every check is max |got - ref| / max |ref| over the compared elements
// (NaN or infinity fails), on W ranks the largest over the ranks.
//   fp32: ring vs full head 1e-5 (loss, dx, dW: f32 sums in other orders); each head vs float64 1e-4
//     on dx and dW (measured 5e-7 .. 1.2e-6 at V = 1001 .. 32768: f32 sums of V or N terms).
//   bf16: loss, ring vs full 1e-5: both heads compute f32 logits from the same bf16 xn and lm_head, so
//     only the f32 summation order differs (measured <= 2.4e-8). dx and dW are stored bf16, and so are
//     values on their way: xn, dxn; in move-weights mode on W > 1 ranks dX of the home tokens
//     accumulates in dxn's dtype, one rounding per ring round (ring_dtp_ring.cpp); the full head's dW
//     on W ranks is the f32 sum of W rank shares each rounded to bf16. So a result takes at most
//     k = W + 2 roundings of 2^-9 relative each. Measured, in units of 2^-9 per rounding: about one
//     against float64 (<= 6.0e-3 at W = 1, 7.6e-3 at W = 2 and 4, 1.1e-2 at W = 8; V 1001 .. 50000,
//     H 64 .. 1024), up to 1.3 between two heads (ring vs full <= 4.8e-3 at W = 1; at W = 2 .. 8 dx
//     1.0e-2 .. 1.1e-2 in move-weights mode, <= 2.6e-3 in move activations, which rounds dX once;
//     dW <= 7.0e-3).
//     Bound, for dx and dW vs float64 and for ring vs full: four units per rounding, (W + 2) 2^-7:
//     2.3e-2 at W = 1, 3.1e-2 at W = 2, 4.7e-2 at W = 4, 7.8e-2 at W = 8, at least 3x what was
//     measured. An operand read in the wrong dtype, a wrong row or a missing term is off by O(1).
#include "bench/vocab.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fmt/ranges.h>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/backend.h"
#include "bench/bench_common.h"
#include "comm/comm.h"
#include "core/error.h"
#include "core/log.h"
#include "core/precision.h"
#include "core/rng.h"
#include "core/units.h"
#include "memory/report.h"
#include "backend/cpu/gemm_profile.h"
#include "sched/vocab/ring_dtp.h"
#include "sched/vocab/vocab_head.h"

namespace fp::bench {

namespace {

// User + system CPU seconds of this process so far, every thread.
double process_cpu_seconds() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// The head's configuration: only hidden_size, vocab_size and rms_norm_eps are read; no layer.
// W: the ranks the store is laid out over (the experts must divide among them; there are none).
ModelConfig head_config(const BenchVocabOptions& o, int W) {
  ModelConfig m;
  m.hidden_size = o.hidden;
  m.num_hidden_layers = 0;
  m.num_attention_heads = 1;
  m.num_key_value_heads = 1;
  m.head_dim = 1;
  m.num_experts = W;
  m.num_experts_per_tok = 1;
  m.moe_intermediate_size = 1;
  m.vocab_size = o.vocab;
  m.rope_theta = 10000;
  m.rms_norm_eps = 1e-6;
  m.router_aux_loss_coef = 0;
  m.seed = 1;
  return m;
}

// One schedule on its own backend (its own ledger), with the same inputs as the others.
struct Inputs;
struct VocabVariant {
  VocabVariant(std::string n, VocabSchedule v, std::string r)
      : name(std::move(n)), sched(std::move(v)), recipe(std::move(r)), precision(precision_recipe(recipe)) {}
  std::string name;  // "full", "ring", "ring_weights", "ring_weights_keep_strips", ... ("full/bf16", ...)
  VocabSchedule sched;
  std::string recipe;  // the precision recipe, "fp32" or "bf16" (Note [bench vocab in bf16])
  Precision precision;
  const Inputs* in = nullptr;  // cpu: the host inputs of its recipe
  bool fsdp = false;  // lm_head rows sharded over the ranks (BenchVocabOptions::fsdp)
  bool ring() const { return sched.kind == VocabSchedule::Kind::Kind_ring; }
  ModelConfig cfg;  // the head's (head_config); s refers to it
  std::unique_ptr<Backend> be;
  std::unique_ptr<ParamStore> ps;
  std::unique_ptr<StepContext> s;
  Tensor xL, targets, dx;  // (N, H), (N) i32, (N, H)
  // Results: peaks over all runs and ranks, per timed run the slowest rank's seconds, and the
  // breakdown of each timed run (means over the ranks), host copies from the first run (cpu).
  uint64_t peak_bytes = 0, vocab_peak_bytes = 0, comm_peak_bytes = 0;
  std::vector<double> seconds, cpu_seconds;  // wall, and CPU time of the process (all threads)
  std::vector<double> gemm_s, softmax_s, comm_wait_s;
  uint64_t comm_bytes = 0;  // sent by one rank in one run (the largest over the ranks)
  std::string breakdown;    // rank 0's tensors at its device peak (BenchVocabOptions::breakdown)
  double loss = std::nan("");
  std::vector<float> dx_host, dW_host;  // (N, H), (V, H)
};

// The same inputs for every variant: lm_head ~ N(0, 0.02) (HF init), the same on every rank; x
// ~ N(0, 1) and targets uniform, each rank its own tokens, the last one ignored (as at the end of a
// sequence); norm = 1. Host copies for the checks: in a recipe with bf16 activations (params) x (W)
// rounded to bf16, the values the device tensors hold (Note [bench vocab in bf16]).
struct Inputs {
  std::vector<float> x, W;  // (N, H), (V, H)
  std::vector<int32_t> targets;  // (N)
};

Inputs inputs_make(const BenchVocabOptions& o, int rank, const Precision& precision) {
  Inputs in;
  Rng rng(1);
  in.W.resize(static_cast<size_t>(o.vocab * o.hidden));
  for (float& v : in.W) v = static_cast<float>(0.02 * rng.normal());
  Rng tok(2 + static_cast<uint64_t>(rank));
  in.x.resize(static_cast<size_t>(o.tokens * o.hidden));
  in.targets.resize(static_cast<size_t>(o.tokens));
  for (float& v : in.x) v = static_cast<float>(tok.normal());
  for (int32_t& t : in.targets) t = static_cast<int32_t>(tok.below(static_cast<uint64_t>(o.vocab)));
  in.targets.back() = -100;
  if (precision.activations == DType::DType_BF16) bf16_round_inplace(in.x);
  if (precision.params == DType::DType_BF16) bf16_round_inplace(in.W);
  return in;
}

void variant_setup(VocabVariant& v, const BenchVocabOptions& o, Comm& comm) {
  const int64_t N = o.tokens, H = o.hidden;
  v.be = backend_create(o.device, kUnlimitedBytes, kUnlimitedBytes);
  // The full head's GEMMs are timed by the kernel table (the ring times its own, RingDtpStats).
  if (o.device == "cpu" && !v.ring()) v.be->kernels_set(ops::kernels_cpu_gemm_profiled());
  v.fsdp = o.fsdp && v.ring() && comm.size() > 1;
  v.cfg = head_config(o, v.fsdp ? comm.size() : 1);
  const Precision& precision = v.precision;
  const Inputs* in = v.in;
  v.ps = std::make_unique<ParamStore>(v.cfg, *v.be, v.fsdp ? &comm : nullptr, precision);
  // The embedding is not read by the head (see the file comment).
  v.ps->embed_tokens->local_w().reset();
  v.ps->embed_tokens->local_g().reset();
  v.s = std::make_unique<StepContext>(*v.be, v.cfg, RoutingProfile{}, comm);
  v.s->precision = precision;
  v.s->B = 1;
  v.s->T = N;
  v.s->n = N;
  v.xL = v.be->alloc(Category::Category_activations, {N, H}, precision.activations, "bench.x");
  v.targets = v.be->alloc(Category::Category_activations, {N}, DType::DType_I32, "bench.targets");
  v.dx = v.be->alloc(Category::Category_activations, {N, H}, precision.activations, "bench.dx");
  if (in != nullptr) {
    device_write_f32(*v.be, v.xL.buf(), in->x.data(), v.xL.numel());
    v.be->copy_from_host(v.targets.data(), in->targets.data(), v.targets.bytes());
    // Every rank passes the whole tensor and keeps its part (its rows under FSDP).
    const std::vector<float> ones(static_cast<size_t>(H), 1.0f);
    for (const ParamInfo& p : v.ps->layout()) {
      if (p.local == v.ps->lm_head) v.ps->full_scatter(p, in->W.data(), &p.local->local_w());
      if (p.local == v.ps->norm) v.ps->full_scatter(p, ones.data(), &p.local->local_w());
    }
  }
}

// 1 / (target tokens of all ranks): each rank's last token is ignored.
float loss_scale(const BenchVocabOptions& o, int W) {
  return 1.0f / static_cast<float>(W * (o.tokens - 1));
}

double mean_over_ranks(Comm& comm, double v) {
  comm.all_reduce_sum(&v, 1, DType::DType_F64);
  return v / comm.size();
}

// One forward+backward of the head; run index i (the first `warmup` are not timed).
void variant_run_once(VocabVariant& v, const BenchVocabOptions& o, Comm& comm, int i) {
  const int64_t V = o.vocab, H = o.hidden;
  Backend& be = *v.be;
  ParamStore& ps = *v.ps;
  for (Param* p : {ps.lm_head, ps.norm}) be.kernels().fill(p->local_g().buf(), 0.0f, p->local_g().numel());
  be.device_ledger().peaks_reset();
  RingDtpStats st;
  ops::GemmProfile& gp = ops::gemm_profile();
  gp = {};
  comm.barrier();  // every rank starts the clock together
  const double cpu0 = process_cpu_seconds();
  const auto t0 = Clock::now();
  const float scale = loss_scale(o, comm.size());
  // Under FSDP the ring reads its own lm_head rows and model.norm is gathered, as in the step (step/step.cpp).
  ps.unit_gather(ps.unit_norm());
  ps.unit_grad_begin(ps.unit_norm());
  const HeadResult h =
      v.ring() ? head_ring_forward_backward(*v.s, v.sched, ps, v.xL, v.targets, scale, v.dx, nullptr, true, &st)
               : head_forward_backward(*v.s, v.sched, ps, v.xL, v.targets, scale, v.dx, nullptr, true);
  ps.unit_grad_reduce(ps.unit_norm());
  ps.unit_release(ps.unit_norm());
  be.synchronize();
  const double sec = seconds_since(t0);
  const double cpu = process_cpu_seconds() - cpu0;
  const double gemm = v.ring() ? st.gemm_s : gp.seconds;
  // The full head's rest is its log-softmax, loss and gradient (and the norm, small).
  const double softmax = v.ring() ? st.lse_s : sec - gemm;
  if (i >= o.warmup) {
    v.seconds.push_back(max_over_ranks(comm, sec));
    v.cpu_seconds.push_back(max_over_ranks(comm, cpu));
    v.gemm_s.push_back(mean_over_ranks(comm, gemm));
    v.softmax_s.push_back(mean_over_ranks(comm, softmax));
    v.comm_wait_s.push_back(mean_over_ranks(comm, st.comm_wait_s));
  }
  v.comm_bytes = static_cast<uint64_t>(max_over_ranks(comm, static_cast<double>(st.comm_bytes)));
  const Ledger& led = be.device_ledger();
  v.peak_bytes = std::max(v.peak_bytes, static_cast<uint64_t>(max_over_ranks(comm, static_cast<double>(led.total_peak()))));
  v.vocab_peak_bytes = std::max(
      v.vocab_peak_bytes, static_cast<uint64_t>(max_over_ranks(comm, static_cast<double>(led.peak(Category::Category_vocab)))));
  v.comm_peak_bytes = std::max(
      v.comm_peak_bytes, static_cast<uint64_t>(max_over_ranks(comm, static_cast<double>(led.peak(Category::Category_comm)))));
  if (i == 0 && o.breakdown) v.breakdown = ledger_peak_breakdown(led);
  if (i == 0 && be.computes()) {
    double loss_sum = head_loss_sum(be, h);
    comm.all_reduce_sum(&loss_sum, 1, DType::DType_F64);
    v.loss = loss_sum * static_cast<double>(scale);
    v.dx_host.resize(static_cast<size_t>(v.dx.numel()));
    v.dW_host.assign(static_cast<size_t>(V * H), 0.0f);
    device_read_f32(be, v.dx.cbuf(), v.dx.numel(), v.dx_host.data());
    const ParamShard sh = ps.lm_head_shard();  // all V rows unless under FSDP
    device_read_f32(be, sh.g, sh.rows * H, v.dW_host.data() + sh.row0 * H);
  }
  if (be.computes() && comm.rank() == 0)
    log_info("bench vocab: {} run {}: {:.3f} s (cpu {:.3f} s)", v.name, i, sec, cpu);
}

// Token t's forward in float64 from the inputs: xn (H) = RMSNorm(x_t) (weight 1, eps 1e-6), logit (V) =
// W xn, and the softmax's max m and sum z = sum_j exp(logit_j - m). The float64 oracles below share it.
struct RowFp64 {
  double rstd, m, z;
};
RowFp64 row_forward_fp64(const Inputs& in, int64_t t, int64_t V, int64_t H, double* xn, double* logit) {
  const float* x = in.x.data() + t * H;  // (H)
  double ss = 0;
  for (int64_t h = 0; h < H; ++h) ss += static_cast<double>(x[h]) * x[h];
  RowFp64 r{1.0 / std::sqrt(ss / static_cast<double>(H) + 1e-6), -INFINITY, 0};
  for (int64_t h = 0; h < H; ++h) xn[h] = x[h] * r.rstd;
  for (int64_t j = 0; j < V; ++j) {
    const float* w = in.W.data() + j * H;  // (H)
    double acc = 0;
    for (int64_t h = 0; h < H; ++h) acc += xn[h] * w[h];
    logit[j] = acc;
    r.m = std::max(r.m, acc);
  }
  for (int64_t j = 0; j < V; ++j) r.z += std::exp(logit[j] - r.m);
  return r;
}

// d x (H) of token t in float64 from the inputs: row_forward_fp64, the loss gradient scaled by `scale`,
// back through the projection and the norm. The oracle both heads are measured against (their
// difference alone cannot say which one rounds more).
std::vector<double> dx_row_fp64(const Inputs& in, int64_t t, int64_t V, int64_t H, double scale) {
  const float* x = in.x.data() + t * H;  // (H)
  std::vector<double> xn(static_cast<size_t>(H)), logit(static_cast<size_t>(V)), dxn(static_cast<size_t>(H), 0.0);
  const RowFp64 r = row_forward_fp64(in, t, V, H, xn.data(), logit.data());
  const double rstd = r.rstd;
  const int32_t target = in.targets[t];
  for (int64_t j = 0; j < V; ++j) {
    const double d = target == -100 ? 0.0 : scale * (std::exp(logit[j] - r.m) / r.z - (j == target ? 1.0 : 0.0));
    const float* w = in.W.data() + j * H;
    for (int64_t h = 0; h < H; ++h) dxn[h] += d * w[h];
  }
  double dot = 0;
  for (int64_t h = 0; h < H; ++h) dot += dxn[h] * x[h];
  std::vector<double> dx(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) dx[h] = rstd * dxn[h] - x[h] * rstd * rstd * rstd / static_cast<double>(H) * dot;
  return dx;
}

// max over sampled rows and h of |got - fp64| / max |fp64|; infinite when got holds a NaN or an
// infinity there (so a check fails).
double dx_error_vs_fp64(const std::vector<float>& got, const std::vector<std::vector<double>>& ref,
                        const std::vector<int64_t>& rows, int64_t H) {
  double d = 0, m = 0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t h = 0; h < H; ++h) {
      if (!std::isfinite(got[rows[r] * H + h])) return INFINITY;
      d = std::max(d, std::abs(static_cast<double>(got[rows[r] * H + h]) - ref[r][h]));
      m = std::max(m, std::abs(ref[r][h]));
    }
  return m > 0 ? d / m : d;
}

// The float64 dW oracle costs N V H multiply-adds per rank (every token's log-sum-exp needs its whole
// logit row); above this it is skipped, and said so.
constexpr double kDwOracleMaxMacs = 0x1p32;  // about 20 s on 2 cores

// Rows `rows` of d lm_head (rows.size(), H) in float64 over this rank's tokens, from the inputs as
// dx_row_fp64: scale * sum_t (softmax(logits_t)_j - [target_t = j]) xn_t, ignored tokens adding
// nothing. Summed over the ranks by the caller.
std::vector<double> dW_rows_fp64(const Inputs& in, const std::vector<int64_t>& rows, int64_t N, int64_t V, int64_t H,
                                 double scale) {
  const size_t R = rows.size();
  std::vector<double> xn(static_cast<size_t>(N * H));  // (N, H)
  std::vector<double> p(static_cast<size_t>(N) * R);   // (N, R): softmax of the sampled rows
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> logit(static_cast<size_t>(V));
    const RowFp64 f = row_forward_fp64(in, t, V, H, xn.data() + t * H, logit.data());
    for (size_t r = 0; r < R; ++r) p[t * R + r] = std::exp(logit[rows[r]] - f.m) / f.z;
  }
  std::vector<double> dW(R * static_cast<size_t>(H), 0.0);
  for (int64_t t = 0; t < N; ++t) {
    if (in.targets[t] == -100) continue;
    for (size_t r = 0; r < R; ++r) {
      const double d = scale * (p[t * R + r] - (rows[r] == in.targets[t] ? 1.0 : 0.0));
      for (int64_t h = 0; h < H; ++h) dW[r * H + h] += d * xn[t * H + h];
    }
  }
  return dW;
}

// max over the sampled rows and h of |got - fp64| / max |fp64|; got (rows.size(), H) f32.
double dW_error_vs_fp64(const std::vector<float>& got, const std::vector<double>& ref) {
  double d = 0, m = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    d = std::max(d, std::abs(static_cast<double>(got[i]) - ref[i]));
    m = std::max(m, std::abs(ref[i]));
  }
  return m > 0 ? d / m : d;
}

// Note [bench vocab tolerances], for a recipe on W ranks.
struct Tolerances {
  double loss, ring_vs_full, vs_fp64;
};
Tolerances tolerances_of(const Precision& p, int W) {
  if (precision_all_f32(p)) return {1e-5, 1e-5, 1e-4};
  const double k = W + 2;  // bf16 roundings on the longest path
  return {1e-5, k * 0x1p-7, k * 0x1p-7};
}

nlohmann::json variant_json(const VocabVariant& r, bool timed, int W) {
  nlohmann::json j;
  j["precision"] = r.recipe;
  if (r.ring()) {
    j["keep_strips"] = r.sched.keep_strips;
    if (W > 1) j["ring_mode"] = r.sched.ring_mode;
  }
  j["peak_bytes"] = r.peak_bytes;
  j["vocab_peak_bytes"] = r.vocab_peak_bytes;
  j["comm_peak_bytes"] = r.comm_peak_bytes;
  if (timed) {
    j["seconds"] = median(r.seconds);
    j["seconds_all"] = r.seconds;
    j["cpu_seconds"] = median(r.cpu_seconds);
    j["cpu_seconds_all"] = r.cpu_seconds;
    j["breakdown_seconds"] = {{"gemm", median(r.gemm_s)},
                              {"softmax", median(r.softmax_s)},
                              {"comm_wait", median(r.comm_wait_s)}};
  } else {
    j["seconds"] = nullptr;  // meta computes nothing
  }
  j["comm_bytes_per_rank"] = r.comm_bytes;
  return j;
}

std::optional<nlohmann::json> torch_run(const BenchVocabOptions& o) {
  FP_CHECK(std::filesystem::exists(o.torch_script), "run from the repository root, pass --torch-script PATH, or --no-torch",
           "the PyTorch companion {} is not there", o.torch_script);
  const std::string out = (std::filesystem::temp_directory_path() / fmt::format("bench_vocab_torch_{}.json", getpid())).string();
  const std::string cmd = fmt::format("{} {} --tokens {} --vocab {} --hidden {} --repeats {} --warmup {} --json {}",
                                      o.python, o.torch_script, o.tokens, o.vocab, o.hidden, o.repeats, o.warmup, out);
  log_info("bench vocab: {}", cmd);
  const int rc = std::system(cmd.c_str());
  FP_CHECK(rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "check that python3-torch is installed, or pass --no-torch",
           "the PyTorch companion failed: {}", cmd);
  std::ifstream f(out);
  nlohmann::json j = nlohmann::json::parse(f);
  std::filesystem::remove(out);
  return j;
}

// The variants of one recipe: full, then the ring (one rank), or on W ranks each requested mode
// with the strips recomputed and kept. suffix: "" with one recipe, else "/<recipe>".
void variants_make(const BenchVocabOptions& o, int W, const std::string& recipe, const std::string& suffix,
                   std::vector<VocabVariant>& vs) {
  VocabSchedule full;
  full.kind = VocabSchedule::Kind::Kind_full;
  vs.emplace_back("full" + suffix, full, recipe);
  VocabSchedule ring;
  ring.kind = VocabSchedule::Kind::Kind_ring;
  ring.block_tokens = o.block_tokens;
  if (W == 1) {
    vs.emplace_back("ring" + suffix, ring, recipe);
    return;
  }
  std::vector<std::string> modes;
  if (o.ring_mode == "both") {
    modes = {"weights", "activations"};
  } else {
    // auto resolved here (as the head does), so the variant's name says what ran.
    const RingMode m = ring_dtp_mode(VocabSchedule{.ring_mode = o.ring_mode}, o.tokens, o.vocab, W);
    modes = {m == RingMode::RingMode_weights ? "weights" : "activations"};
  }
  for (const std::string& mode : modes)
    for (const bool keep : {false, true}) {
      ring.ring_mode = mode;
      ring.keep_strips = keep;
      vs.emplace_back("ring_" + mode + (keep ? "_keep_strips" : "") + suffix, ring, recipe);
    }
}

}  // namespace

int bench_vocab_run(const BenchVocabOptions& o) {
  FP_CHECK(o.tokens >= 2 && o.vocab >= 1 && o.hidden >= 1, "e.g. --tokens 8192 --vocab 32768 --hidden 1024",
           "--tokens {} --vocab {} --hidden {}: need at least 2 tokens, a vocabulary and a hidden size", o.tokens,
           o.vocab, o.hidden);
  FP_CHECK(o.block_tokens >= 1, "e.g. --block-tokens 1024", "--block-tokens {} must be >= 1", o.block_tokens);
  FP_CHECK(!o.precision.empty(), "e.g. --precision fp32,bf16", "--precision names no recipe");
  for (const std::string& r : o.precision) {
    precision_recipe(r);  // an unknown recipe is an fp::Error naming it
    FP_CHECK(std::count(o.precision.begin(), o.precision.end(), r) == 1, "name each recipe once",
             "--precision names {} twice", r);
  }
  FP_CHECK(o.repeats >= 1 && o.warmup >= 0, "e.g. --repeats 5 --warmup 1", "--repeats {} --warmup {}", o.repeats,
           o.warmup);
  Comm& comm = comm_world();
  const int W = comm.size();
  const bool lead = comm.rank() == 0;
  const bool timed = o.device == "cpu";
  const std::string recipes = fmt::format("{}", fmt::join(o.precision, ", "));
  if (lead)
    log_info("bench vocab: N {} per rank, V {}, H {}, block_tokens {}, {} rank(s) on {}, precision {}{}", o.tokens,
             o.vocab, o.hidden, o.block_tokens, W, o.device, recipes, o.fsdp ? ", ring lm_head FSDP-sharded" : "");
  std::vector<VocabVariant> vs;
  for (const std::string& r : o.precision) variants_make(o, W, r, o.precision.size() > 1 ? "/" + r : "", vs);
  // Each recipe's host inputs (cpu): the same draws, rounded where the recipe stores bf16.
  std::map<std::string, Inputs> ins;
  if (timed)
    for (const std::string& r : o.precision) ins.emplace(r, inputs_make(o, comm.rank(), precision_recipe(r)));
  for (VocabVariant& v : vs) {
    if (timed) v.in = &ins.at(v.recipe);
    variant_setup(v, o, comm);
  }
  // Interleaved (full, ring, ..., full, ring, ...; every recipe) so a change in the machine's load hits all alike.
  const int runs = timed ? o.warmup + o.repeats : 1;
  for (int i = 0; i < runs; ++i)
    for (VocabVariant& v : vs) variant_run_once(v, o, comm, i);
  // The full head of v's recipe (variants_make puts it first among them).
  const auto full_of = [&](const VocabVariant& v) -> const VocabVariant& {
    for (const VocabVariant& f : vs)
      if (!f.ring() && f.recipe == v.recipe) return f;
    FP_ASSERT(false, "no full head for recipe {}", v.recipe);
    return vs.front();
  };

  nlohmann::json j;
  j["tokens"] = o.tokens;
  j["vocab"] = o.vocab;
  j["hidden"] = o.hidden;
  j["block_tokens"] = o.block_tokens;
  j["device"] = o.device;
  j["precision"] = o.precision;
  machine_json(j);
  j["ranks"] = W;
  for (const VocabVariant& v : vs) j[v.name] = variant_json(v, timed, W);
  std::vector<int64_t> ns(static_cast<size_t>(W), o.tokens);
  for (VocabVariant& v : vs) {
    if (!v.ring()) continue;
    const RingMode mode = ring_dtp_mode(v.sched, o.tokens, o.vocab, W);
    const uint64_t planned =
        W == 1 ? ring_dtp_vocab_bytes(v.sched, o.tokens, o.vocab)
               : ring_dtp_working_set(v.sched, mode, 0, ns, o.vocab, o.hidden, true, v.precision).vocab_bytes;
    j[v.name]["vocab_bytes_planned"] = planned;  // rank 0's
  }
  nlohmann::json& ratios = j["ratios"];
  for (const VocabVariant& v : vs) {
    if (!v.ring()) continue;
    const VocabVariant& full = full_of(v);
    nlohmann::json& r = ratios[v.name + "_over_full"];
    r["vocab_peak"] = static_cast<double>(v.vocab_peak_bytes) / static_cast<double>(full.vocab_peak_bytes);
    r["vocab_peak_reduction"] = 1.0 - r["vocab_peak"].get<double>();
    r["peak"] = static_cast<double>(v.peak_bytes) / static_cast<double>(full.peak_bytes);
    if (timed) {
      r["seconds"] = median(v.seconds) / median(full.seconds);
      r["cpu_seconds"] = median(v.cpu_seconds) / median(full.cpu_seconds);
    }
  }
  // Every recipe against the first (fp32 vs bf16 in the same run): variant k of each recipe's block.
  const size_t per_recipe = vs.size() / o.precision.size();
  for (size_t k = o.precision.size() > 1 ? per_recipe : vs.size(); k < vs.size(); ++k) {
    const VocabVariant &v = vs[k], &base = vs[k % per_recipe];
    nlohmann::json& r = ratios[v.name + "_over_" + base.recipe];
    r["peak"] = static_cast<double>(v.peak_bytes) / static_cast<double>(base.peak_bytes);
    r["vocab_peak"] = static_cast<double>(v.vocab_peak_bytes) / static_cast<double>(base.vocab_peak_bytes);
    if (timed) r["seconds"] = median(v.seconds) / median(base.seconds);
  }
  if (lead) {
    fmt::print("bench vocab: N = {} per rank, V = {}, H = {}, block_tokens = {}, {} rank(s), device {}, precision {}\n",
               o.tokens, o.vocab, o.hidden, o.block_tokens, W, o.device, recipes);
    machine_print();
  }
  if (timed) {
    // Check first: every ring variant must compute what the full head of its recipe computes, and
    // every head what float64 computes from the same inputs (Note [bench vocab tolerances]). The
    // full head's dW on W ranks is its own tokens' share: summed over the ranks it is the whole
    // gradient, which each ring rank holds for its shard's rows.
    std::map<std::string, std::vector<float>> dW_full;  // by recipe, (V, H) summed over the ranks
    for (const VocabVariant& v : vs) {
      if (v.ring()) continue;
      std::vector<float>& d = dW_full[v.recipe] = v.dW_host;
      comm.all_reduce_sum(d.data(), static_cast<int64_t>(d.size()), DType::DType_F32);
    }
    const VocabShard sh = W == 1 ? VocabShard{0, o.vocab} : ring_dtp_shard(o.vocab, W, comm.rank());
    nlohmann::json& check = j["check"];
    for (const VocabVariant& v : vs) {
      const Tolerances tol = tolerances_of(v.precision, W);
      check["tolerances"][v.recipe] = {{"loss_ring_vs_full", tol.loss},
                                       {"dx_dW_ring_vs_full", tol.ring_vs_full},
                                       {"dx_dW_vs_fp64", tol.vs_fp64}};
      if (!v.ring()) {
        check[v.name] = {{"loss", v.loss}};
        continue;
      }
      const VocabVariant& full = full_of(v);
      const std::vector<float>& dWf = dW_full.at(v.recipe);
      const double loss_rel = std::abs(v.loss - full.loss) / std::abs(full.loss);
      const double dx_rel = max_over_ranks(comm, max_rel_diff(v.dx_host, full.dx_host));
      const double dW_rel = max_over_ranks(comm, max_rel_diff(v.dW_host.data() + sh.v0 * o.hidden,
                                                              dWf.data() + sh.v0 * o.hidden, sh.rows * o.hidden));
      check[v.name] = {{"loss", v.loss}, {"loss_rel_diff", loss_rel}, {"dx_max_rel_diff", dx_rel},
                       {"dW_max_rel_diff", dW_rel}};
      if (lead)
        fmt::print("check {}: loss full {:.7f} ring {:.7f} (rel diff {:.1e}); vs full, max diff / max |full|: dx "
                   "{:.1e}, dW {:.1e} (tolerance {:.1e}, {:.1e})\n",
                   v.name, full.loss, v.loss, loss_rel, dx_rel, dW_rel, tol.loss, tol.ring_vs_full);
      FP_CHECK(loss_rel <= tol.loss && dx_rel <= tol.ring_vs_full && dW_rel <= tol.ring_vs_full,
               "this is a bug in Ring-DTP: please report it", "{} disagrees with the full head", v.name);
    }
    // Every head against float64: dx of a few of each rank's tokens, and (when affordable) dW of a
    // few lm_head rows, the first and last among them. In fp32 this is the scale of rounding the
    // differences above are measured by (two exact fp32 evaluations in different orders differ by
    // about the sum of their errors); in bf16 it checks the recipe's arithmetic itself.
    std::vector<int64_t> rows, vrows;
    for (int64_t r = 0; r < 8; ++r) rows.push_back(r * (o.tokens - 1) / 7);
    for (int64_t r = 0; r < std::min<int64_t>(8, o.vocab); ++r) vrows.push_back(r * (o.vocab - 1) / 7);
    vrows.erase(std::unique(vrows.begin(), vrows.end()), vrows.end());
    const double macs = static_cast<double>(o.tokens) * static_cast<double>(o.vocab) * static_cast<double>(o.hidden);
    const bool dW_oracle = macs <= kDwOracleMaxMacs;
    check["dx_rows_vs_fp64"] = rows;
    if (dW_oracle) check["dW_rows_vs_fp64"] = vrows;
    std::string line = fmt::format("check: vs float64 (max diff / max |fp64|), dx of {} tokens per rank{}:",
                                   rows.size(),
                                   dW_oracle ? fmt::format(", dW of {} lm_head rows", vrows.size())
                                             : fmt::format("; dW not checked (N V H = {:.1e} multiply-adds > {:.1e})",
                                                           macs, kDwOracleMaxMacs));
    for (const std::string& recipe : o.precision) {
      const Inputs& in = ins.at(recipe);
      std::vector<std::vector<double>> ref;
      for (const int64_t t : rows) ref.push_back(dx_row_fp64(in, t, o.vocab, o.hidden, loss_scale(o, W)));
      std::vector<double> dW_ref;
      if (dW_oracle) {
        dW_ref = dW_rows_fp64(in, vrows, o.tokens, o.vocab, o.hidden, loss_scale(o, W));
        comm.all_reduce_sum(dW_ref.data(), static_cast<int64_t>(dW_ref.size()), DType::DType_F64);
      }
      const double tol = tolerances_of(precision_recipe(recipe), W).vs_fp64;
      for (const VocabVariant& v : vs) {
        if (v.recipe != recipe) continue;
        const double dx_err = max_over_ranks(comm, dx_error_vs_fp64(v.dx_host, ref, rows, o.hidden));
        check["dx_err_vs_fp64"][v.name] = dx_err;
        line += fmt::format(" {} dx {:.1e}", v.name, dx_err);
        double dW_err = 0;
        if (dW_oracle) {
          // The sampled rows as this head holds them: the full head's summed over the ranks, a ring
          // rank's only for the rows of its shard (zero elsewhere, then summed: exact).
          std::vector<float> got(vrows.size() * static_cast<size_t>(o.hidden), 0.0f);
          for (size_t r = 0; r < vrows.size(); ++r) {
            const bool mine = !v.ring() ? comm.rank() == 0 : (vrows[r] >= sh.v0 && vrows[r] < sh.v0 + sh.rows);
            const float* src = (v.ring() ? v.dW_host.data() : dW_full.at(recipe).data()) + vrows[r] * o.hidden;
            if (mine) std::copy(src, src + o.hidden, got.begin() + static_cast<int64_t>(r) * o.hidden);
          }
          comm.all_reduce_sum(got.data(), static_cast<int64_t>(got.size()), DType::DType_F32);
          dW_err = dW_error_vs_fp64(got, dW_ref);
          check["dW_err_vs_fp64"][v.name] = dW_err;
          line += fmt::format(" dW {:.1e}", dW_err);
        }
        line += ";";
        FP_CHECK(dx_err <= tol && dW_err <= tol,
                 "this is a bug in the vocabulary head or its kernels: please report it",
                 "{}: dx {:.2e} or dW {:.2e} of its largest float64 element from float64, above the {} tolerance "
                 "{:.1e}", v.name, dx_err, dW_err, recipe, tol);
      }
      line += fmt::format(" (tolerance {:.1e})", tol);
    }
    if (lead) fmt::print("{}\n", line);
  }
  if (lead) {
    fmt::print("| variant | precision | device peak | vocab peak | comm peak | fwd+bwd s {} | GEMM s | softmax s | "
               "comm wait s | process cpu s |\n|---|---|---|---|---|---|---|---|---|---|\n",
               timed ? fmt::format("(median of {})", o.repeats) : std::string("(meta: not computed)"));
    const auto sec = [&](const std::vector<double>& v) {
      return timed ? fmt::format("{:.3f}", median(v)) : std::string("-");
    };
    for (const VocabVariant& v : vs)
      fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", v.name, v.recipe, bytes_format(v.peak_bytes),
                 bytes_format(v.vocab_peak_bytes), bytes_format(v.comm_peak_bytes), sec(v.seconds), sec(v.gemm_s),
                 sec(v.softmax_s), sec(v.comm_wait_s), sec(v.cpu_seconds));
  }
  // PyTorch's head in fp32 beside the fp32 ring (the companion computes fp32 only).
  const auto fp32_ring =
      std::find_if(vs.begin(), vs.end(), [](const VocabVariant& v) { return v.ring() && v.recipe == "fp32"; });
  if (timed && W == 1 && !o.no_torch && fp32_ring != vs.end()) {
    std::optional<nlohmann::json> t = torch_run(o);
    j["torch"] = *t;
    ratios["ring_over_torch"]["seconds"] = median(fp32_ring->seconds) / (*t)["seconds"].get<double>();
    fmt::print("| PyTorch F.linear + F.cross_entropy (torch {}, {} threads) | fp32 | max RSS {} ({} over its "
               "inputs) | - | - | {:.3f} | - | - | - | {:.3f} |\n",
               (*t)["torch"].get<std::string>(), (*t)["threads"].get<int>(),
               bytes_format((*t)["max_rss_bytes"].get<uint64_t>()), bytes_format((*t)["vocab_peak_bytes"].get<uint64_t>()),
               (*t)["seconds"].get<double>(), (*t)["cpu_seconds"].get<double>());
  } else if (timed && W == 1 && !o.no_torch && lead) {
    fmt::print("(PyTorch companion not run: it computes fp32, and --precision has no fp32)\n");
  }
  if (lead) {
    for (const VocabVariant& v : vs) {
      if (!v.ring()) continue;
      const nlohmann::json& r = ratios[v.name + "_over_full"];
      fmt::print("{} / {}: vocab peak {:.4f} ({:.1f}% below), device peak {:.4f}", v.name, full_of(v).name,
                 r["vocab_peak"].get<double>(), 100 * r["vocab_peak_reduction"].get<double>(), r["peak"].get<double>());
      if (timed)
        fmt::print(", time {:.3f}x (process cpu time {:.3f}x)", r["seconds"].get<double>(), r["cpu_seconds"].get<double>());
      fmt::print("\n");
    }
    for (size_t k = o.precision.size() > 1 ? per_recipe : vs.size(); k < vs.size(); ++k) {
      const VocabVariant &v = vs[k], &base = vs[k % per_recipe];
      const nlohmann::json& r = ratios[v.name + "_over_" + base.recipe];
      fmt::print("{} / {}: device peak {:.4f}, vocab peak {:.4f}", v.name, base.name, r["peak"].get<double>(),
                 r["vocab_peak"].get<double>());
      if (timed) fmt::print(", time {:.3f}x", r["seconds"].get<double>());
      fmt::print("\n");
    }
    for (const VocabVariant& v : vs)
      if (!v.breakdown.empty()) fmt::print("\n{}: every tensor at rank 0's device peak\n{}", v.name, v.breakdown);
    json_write(o.json, j);
  }
  return 0;
}

}  // namespace fp::bench
