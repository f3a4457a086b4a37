// flatpeak bench vocab: the LM head (final RMSNorm, projection to the vocabulary, mean cross-entropy,
// forward and backward) with the full and the Ring-DTP vocabulary schedules in the same run, on random
// inputs of N tokens, hidden H, vocabulary V; one rank.
// Legend: N tokens, H hidden, V vocabulary.
//
// For each schedule, on a fresh backend (so each has its own ledger): the device peak, the peak of
// category vocab, and (cpu) the median forward+backward seconds over --repeats after --warmup. On cpu
// the ring's loss and gradients are first checked against the full head's (check, then time), and
// PyTorch's F.linear + F.cross_entropy runs on the same shapes as a subprocess
// (tests/reference/bench_vocab_torch.py: median seconds and max RSS). With --device meta nothing is
// computed and only the peaks are reported (exact, at any N and V).
//
// The embedding table is freed before measuring: the head does not read it, and at V = 131072 it
// would add 2 V H fp32 (weights and gradient) to both device peaks.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/backend.h"
#include "cli/commands.h"
#include "comm/comm.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/units.h"
#include "io/atomic_file.h"
#include "sched/vocab/ring_dtp.h"
#include "sched/vocab/vocab_head.h"

namespace fp::cli {

namespace {

struct VocabBenchOptions {
  int64_t tokens = 8192;
  int64_t vocab = 32768;
  int64_t hidden = 1024;
  int64_t block_tokens = 1024;
  std::string device = "cpu";
  int repeats = 5;
  int warmup = 1;
  std::string json;
  bool no_torch = false;
  std::string torch_script = "tests/reference/bench_vocab_torch.py";
  std::string python = "/usr/bin/python3";
};

// User + system CPU seconds of this process so far, every thread.
double process_cpu_seconds() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The head's configuration: only hidden_size, vocab_size and rms_norm_eps are read; no layer.
ModelConfig head_config(const VocabBenchOptions& o) {
  ModelConfig m;
  m.hidden_size = o.hidden;
  m.num_hidden_layers = 0;
  m.num_attention_heads = 1;
  m.num_key_value_heads = 1;
  m.head_dim = 1;
  m.num_experts = 1;
  m.num_experts_per_tok = 1;
  m.moe_intermediate_size = 1;
  m.vocab_size = o.vocab;
  m.rope_theta = 10000;
  m.rms_norm_eps = 1e-6;
  m.router_aux_loss_coef = 0;
  m.seed = 1;
  return m;
}

// One schedule on its own backend (its own ledger), with the same inputs as the other.
struct Variant {
  explicit Variant(VocabSchedule::Kind k) : kind(k) {}
  VocabSchedule::Kind kind;
  ModelConfig cfg;  // the head's (head_config); s refers to it
  std::unique_ptr<Backend> be;
  std::unique_ptr<Comm> comm;
  std::unique_ptr<ParamStore> ps;
  std::unique_ptr<StepContext> s;
  Tensor xL, targets, dx;  // (N, H), (N) i32, (N, H)
  // Results: peaks over all runs, seconds of the timed runs, host copies from the first run (cpu).
  uint64_t peak_bytes = 0, vocab_peak_bytes = 0;
  std::vector<double> seconds, cpu_seconds;  // wall, and CPU time of the process (all threads)
  double loss = std::nan("");
  std::vector<float> dx_host, dW_host;  // (N, H), (V, H)
};

// The same inputs for both schedules: x ~ N(0, 1), lm_head ~ N(0, 0.02) (HF init), norm = 1, targets
// uniform with the last one ignored (as at the end of a sequence). Host copies for the fp64 check.
struct Inputs {
  std::vector<float> x, W;  // (N, H), (V, H)
  std::vector<int32_t> targets;  // (N)
};

Inputs inputs_make(const VocabBenchOptions& o) {
  Inputs in;
  Rng rng(1);
  in.x.resize(static_cast<size_t>(o.tokens * o.hidden));
  in.W.resize(static_cast<size_t>(o.vocab * o.hidden));
  in.targets.resize(static_cast<size_t>(o.tokens));
  for (float& v : in.x) v = static_cast<float>(rng.normal());
  for (float& v : in.W) v = static_cast<float>(0.02 * rng.normal());
  for (int32_t& t : in.targets) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(o.vocab)));
  in.targets.back() = -100;
  return in;
}

void variant_setup(Variant& v, const VocabBenchOptions& o, const Inputs* in) {
  const int64_t N = o.tokens, H = o.hidden;
  v.be = backend_create(o.device, kUnlimitedBytes, kUnlimitedBytes);
  v.comm = comm_single();  // one rank
  v.cfg = head_config(o);
  v.ps = std::make_unique<ParamStore>(v.cfg, *v.be);
  v.ps->embed_tokens->w.reset();  // not read by the head (see the file comment)
  v.ps->embed_tokens->g.reset();
  v.s = std::make_unique<StepContext>(*v.be, v.cfg, RoutingProfile{}, *v.comm);
  v.s->B = 1;
  v.s->T = N;
  v.s->n = N;
  v.xL = v.be->alloc_f32(Category::Category_activations, {N, H}, "bench.x");
  v.targets = v.be->alloc(Category::Category_activations, {N}, DType::DType_I32, "bench.targets");
  v.dx = v.be->alloc_f32(Category::Category_activations, {N, H}, "bench.dx");
  if (in != nullptr) {
    v.be->copy_from_host(v.xL.data(), in->x.data(), v.xL.bytes());
    v.be->copy_from_host(v.ps->lm_head->w.data(), in->W.data(), v.ps->lm_head->w.bytes());
    v.be->copy_from_host(v.targets.data(), in->targets.data(), v.targets.bytes());
    v.be->kernels().fill(v.ps->norm->w.f32(), 1.0f, H);
  }
}

float loss_scale(const VocabBenchOptions& o) { return 1.0f / static_cast<float>(o.tokens - 1); }

// One forward+backward of the head; run index i (the first `warmup` are not timed).
void variant_run_once(Variant& v, const VocabBenchOptions& o, int i) {
  const int64_t V = o.vocab, H = o.hidden;
  Backend& be = *v.be;
  VocabSchedule sched;
  sched.kind = v.kind;
  sched.block_tokens = o.block_tokens;
  be.kernels().fill(v.ps->lm_head->g.f32(), 0.0f, V * H);
  be.kernels().fill(v.ps->norm->g.f32(), 0.0f, H);
  be.device_ledger().peaks_reset();
  const double cpu0 = process_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  const HeadResult h = head_forward_backward(*v.s, sched, *v.ps, v.xL, v.targets, loss_scale(o), v.dx, nullptr, true);
  be.synchronize();
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = process_cpu_seconds() - cpu0;
  if (i >= o.warmup) {
    v.seconds.push_back(sec);
    v.cpu_seconds.push_back(cpu);
  }
  v.peak_bytes = std::max(v.peak_bytes, be.device_ledger().total_peak());
  v.vocab_peak_bytes = std::max(v.vocab_peak_bytes, be.device_ledger().peak(Category::Category_vocab));
  if (i == 0 && be.computes()) {
    v.loss = h.loss_sum * static_cast<double>(loss_scale(o));
    v.dx_host.resize(static_cast<size_t>(v.dx.numel()));
    v.dW_host.resize(static_cast<size_t>(V * H));
    be.copy_to_host(v.dx_host.data(), v.dx.data(), v.dx.bytes());
    be.copy_to_host(v.dW_host.data(), v.ps->lm_head->g.data(), v.ps->lm_head->g.bytes());
  }
  if (be.computes())
    log_info("bench vocab: {} run {}: {:.3f} s (cpu {:.3f} s)", v.kind == VocabSchedule::Kind::Kind_ring ? "ring" : "full",
             i, sec, cpu);
}

// d x (H) of token t in float64 from the inputs: RMSNorm (weight 1, eps 1e-6), logits, softmax, the
// loss gradient scaled by `scale`, back through the projection and the norm. The oracle both heads
// are measured against (their difference alone cannot say which one rounds more).
std::vector<double> dx_row_fp64(const Inputs& in, int64_t t, int64_t V, int64_t H, double scale) {
  const float* x = in.x.data() + t * H;  // (H)
  double ss = 0;
  for (int64_t h = 0; h < H; ++h) ss += static_cast<double>(x[h]) * x[h];
  const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(H) + 1e-6);
  std::vector<double> xn(static_cast<size_t>(H)), logit(static_cast<size_t>(V)), dxn(static_cast<size_t>(H), 0.0);
  for (int64_t h = 0; h < H; ++h) xn[h] = x[h] * rstd;
  double m = -INFINITY;
  for (int64_t j = 0; j < V; ++j) {
    const float* w = in.W.data() + j * H;  // (H)
    double acc = 0;
    for (int64_t h = 0; h < H; ++h) acc += xn[h] * w[h];
    logit[j] = acc;
    m = std::max(m, acc);
  }
  double z = 0;
  for (int64_t j = 0; j < V; ++j) z += std::exp(logit[j] - m);
  const int32_t target = in.targets[t];
  for (int64_t j = 0; j < V; ++j) {
    const double d = target == -100 ? 0.0 : scale * (std::exp(logit[j] - m) / z - (j == target ? 1.0 : 0.0));
    const float* w = in.W.data() + j * H;
    for (int64_t h = 0; h < H; ++h) dxn[h] += d * w[h];
  }
  double dot = 0;
  for (int64_t h = 0; h < H; ++h) dot += dxn[h] * x[h];
  std::vector<double> dx(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) dx[h] = rstd * dxn[h] - x[h] * rstd * rstd * rstd / static_cast<double>(H) * dot;
  return dx;
}

// max over sampled rows and h of |got - fp64| / max |fp64|.
double dx_error_vs_fp64(const std::vector<float>& got, const std::vector<std::vector<double>>& ref,
                        const std::vector<int64_t>& rows, int64_t H) {
  double d = 0, m = 0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t h = 0; h < H; ++h) {
      d = std::max(d, std::abs(static_cast<double>(got[rows[r] * H + h]) - ref[r][h]));
      m = std::max(m, std::abs(ref[r][h]));
    }
  return m > 0 ? d / m : d;
}

// max_i |a_i - b_i| / max_i |b_i|.
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
    m = std::max(m, std::abs(static_cast<double>(b[i])));
  }
  return m > 0 ? d / m : d;
}

nlohmann::json variant_json(const Variant& r, bool timed) {
  nlohmann::json j;
  j["peak_bytes"] = r.peak_bytes;
  j["vocab_peak_bytes"] = r.vocab_peak_bytes;
  if (timed) {
    j["seconds"] = median(r.seconds);
    j["seconds_all"] = r.seconds;
    j["cpu_seconds"] = median(r.cpu_seconds);
    j["cpu_seconds_all"] = r.cpu_seconds;
  } else {
    j["seconds"] = nullptr;  // meta computes nothing
  }
  return j;
}

std::optional<nlohmann::json> torch_run(const VocabBenchOptions& o) {
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

int bench_vocab_run(const VocabBenchOptions& o) {
  FP_CHECK(o.tokens >= 2 && o.vocab >= 1 && o.hidden >= 1, "e.g. --tokens 8192 --vocab 32768 --hidden 1024",
           "--tokens {} --vocab {} --hidden {}: need at least 2 tokens, a vocabulary and a hidden size", o.tokens,
           o.vocab, o.hidden);
  FP_CHECK(o.block_tokens >= 1, "e.g. --block-tokens 1024", "--block-tokens {} must be >= 1", o.block_tokens);
  FP_CHECK(o.repeats >= 1 && o.warmup >= 0, "e.g. --repeats 5 --warmup 1", "--repeats {} --warmup {}", o.repeats,
           o.warmup);
  const bool timed = o.device == "cpu";
  log_info("bench vocab: N {} V {} H {} block_tokens {} on {}", o.tokens, o.vocab, o.hidden, o.block_tokens, o.device);
  std::optional<Inputs> in;
  if (timed) in = inputs_make(o);
  Variant full(VocabSchedule::Kind::Kind_full), ring(VocabSchedule::Kind::Kind_ring);
  variant_setup(full, o, in ? &*in : nullptr);
  variant_setup(ring, o, in ? &*in : nullptr);
  // Interleaved (full, ring, full, ...) so a change in the machine's load hits both alike.
  const int runs = timed ? o.warmup + o.repeats : 1;
  for (int i = 0; i < runs; ++i) {
    variant_run_once(full, o, i);
    variant_run_once(ring, o, i);
  }

  nlohmann::json j;
  j["tokens"] = o.tokens;
  j["vocab"] = o.vocab;
  j["hidden"] = o.hidden;
  j["block_tokens"] = o.block_tokens;
  j["device"] = o.device;
  j["ranks"] = 1;
  j["full"] = variant_json(full, timed);
  j["ring"] = variant_json(ring, timed);
  VocabSchedule v;
  v.block_tokens = o.block_tokens;
  j["ring"]["vocab_bytes_planned"] = ring_dtp_vocab_bytes(v, o.tokens, o.vocab);
  nlohmann::json& ratios = j["ratios"];
  ratios["vocab_peak_ring_over_full"] = static_cast<double>(ring.vocab_peak_bytes) / static_cast<double>(full.vocab_peak_bytes);
  ratios["peak_ring_over_full"] = static_cast<double>(ring.peak_bytes) / static_cast<double>(full.peak_bytes);
  ratios["vocab_peak_reduction"] = 1.0 - ratios["vocab_peak_ring_over_full"].get<double>();

  fmt::print("bench vocab: N = {}, V = {}, H = {}, block_tokens = {}, one rank, device {}\n", o.tokens, o.vocab,
             o.hidden, o.block_tokens, o.device);
  if (timed) {
    // Check first: the ring must compute what the full head computes.
    const double loss_rel = std::abs(ring.loss - full.loss) / std::abs(full.loss);
    const double dx_rel = max_rel_diff(ring.dx_host, full.dx_host), dW_rel = max_rel_diff(ring.dW_host, full.dW_host);
    // Both heads against float64 on a few tokens: the scale of fp32 rounding the difference is measured by.
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < 8; ++r) rows.push_back(r * (o.tokens - 1) / 7);
    std::vector<std::vector<double>> ref;
    for (const int64_t t : rows) ref.push_back(dx_row_fp64(*in, t, o.vocab, o.hidden, loss_scale(o)));
    const double full_err = dx_error_vs_fp64(full.dx_host, ref, rows, o.hidden);
    const double ring_err = dx_error_vs_fp64(ring.dx_host, ref, rows, o.hidden);
    j["check"] = {{"loss_full", full.loss},       {"loss_ring", ring.loss},      {"loss_rel_diff", loss_rel},
                  {"dx_max_rel_diff", dx_rel},    {"dW_max_rel_diff", dW_rel},   {"dx_rows_vs_fp64", rows},
                  {"dx_full_err_vs_fp64", full_err}, {"dx_ring_err_vs_fp64", ring_err}};
    fmt::print("check: loss full {:.7f} ring {:.7f} (rel diff {:.1e}); ring vs full, max diff / max |full|: dx {:.1e}, "
               "dW {:.1e}; dx of {} tokens vs float64: full {:.1e}, ring {:.1e}\n",
               full.loss, ring.loss, loss_rel, dx_rel, dW_rel, rows.size(), full_err, ring_err);
    FP_CHECK(loss_rel <= 1e-5 && dx_rel <= 1e-5 && dW_rel <= 1e-5, "this is a bug in Ring-DTP: please report it",
             "the ring head disagrees with the full head");
    ratios["seconds_ring_over_full"] = median(ring.seconds) / median(full.seconds);
    ratios["cpu_seconds_ring_over_full"] = median(ring.cpu_seconds) / median(full.cpu_seconds);
  }
  fmt::print("| variant | device peak | vocab peak | fwd+bwd s {} | process cpu s |\n|---|---|---|---|---|\n",
             timed ? fmt::format("(median of {})", o.repeats) : std::string("(meta: not computed)"));
  auto row = [&](const char* name, const Variant& r) {
    fmt::print("| {} | {} | {} | {} | {} |\n", name, bytes_format(r.peak_bytes), bytes_format(r.vocab_peak_bytes),
               timed ? fmt::format("{:.3f}", median(r.seconds)) : std::string("-"),
               timed ? fmt::format("{:.3f}", median(r.cpu_seconds)) : std::string("-"));
  };
  row("full", full);
  row("ring", ring);
  if (timed && !o.no_torch) {
    std::optional<nlohmann::json> t = torch_run(o);
    j["torch"] = *t;
    ratios["seconds_ring_over_torch"] = median(ring.seconds) / (*t)["seconds"].get<double>();
    fmt::print("| PyTorch F.linear + F.cross_entropy (torch {}, {} threads) | max RSS {} ({} over its inputs) | - | {:.3f} | {:.3f} |\n",
               (*t)["torch"].get<std::string>(), (*t)["threads"].get<int>(),
               bytes_format((*t)["max_rss_bytes"].get<uint64_t>()), bytes_format((*t)["vocab_peak_bytes"].get<uint64_t>()),
               (*t)["seconds"].get<double>(), (*t)["cpu_seconds"].get<double>());
  }
  fmt::print("ring / full: vocab peak {:.4f} ({:.1f}% below), device peak {:.4f}", ratios["vocab_peak_ring_over_full"].get<double>(),
             100 * ratios["vocab_peak_reduction"].get<double>(), ratios["peak_ring_over_full"].get<double>());
  if (timed)
    fmt::print(", time {:.3f}x (process cpu time {:.3f}x)", ratios["seconds_ring_over_full"].get<double>(),
               ratios["cpu_seconds_ring_over_full"].get<double>());
  fmt::print("\n");
  if (!o.json.empty()) file_write_atomic(o.json, j.dump(2) + "\n");
  return 0;
}

}  // namespace

void bench_vocab_register(CLI::App& parent, Runner& run) {
  auto opts = std::make_shared<VocabBenchOptions>();
  VocabBenchOptions& o = *opts;
  CLI::App* sub = parent.add_subcommand("vocab", "full vs ring (Ring-DTP) vocabulary projection and loss: peaks and time");
  sub->callback([&run, opts] { run = [opts] { return bench_vocab_run(*opts); }; });
  sub->add_option("--tokens", o.tokens, "N, tokens per rank");
  sub->add_option("--vocab", o.vocab, "V, vocabulary size");
  sub->add_option("--hidden", o.hidden, "H, hidden size");
  sub->add_option("--block-tokens", o.block_tokens, "ring: tokens per strip (vocab.block_tokens)");
  sub->add_option("--device", o.device, "cpu (peaks and time) or meta (exact peaks, nothing computed)")
      ->check(CLI::IsMember({"cpu", "meta"}));
  sub->add_option("--repeats", o.repeats, "timed runs per variant (median reported)");
  sub->add_option("--warmup", o.warmup, "untimed runs first");
  sub->add_option("--json", o.json, "write the results here");
  sub->add_flag("--no-torch", o.no_torch, "skip the PyTorch comparison (cpu)");
  sub->add_option("--torch-script", o.torch_script, "the PyTorch companion script");
  sub->add_option("--python", o.python, "the Python with torch");
}

}  // namespace fp::cli
