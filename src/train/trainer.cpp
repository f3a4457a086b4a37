#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/log.h"
#include "core/process.h"
#include "core/signals.h"
#include "core/timing.h"
#include "core/units.h"
#include "core/watchdog.h"
#include "data/context_split.h"
#include "data/documents.h"
#include "data/loader.h"
#include "data/recall_task.h"
#include "data/token_file.h"
#include "io/atomic_file.h"
#include "memory/report.h"
#include "memory/trace.h"
#include "model/hf_config.h"
#include "model/routing.h"
#include "step/step.h"
#include "train/checkpoint.h"
#include "train/checkpoint_writer.h"
#include "train/config_keys.h"
#include "train/progress.h"
#include "train/run_config.h"
#include "train/session.h"

namespace fp {

namespace fs = std::filesystem;

namespace {

// Note [A device mesh]: W = dp x cp ranks (parallel.dp, parallel.cp; mpirun -np W). Rank r is context-
// parallel rank r % cp of replica r / cp: the cp consecutive ranks of a replica share its sequences by
// ring attention (StepContext::cp), and the dp replicas read different sequences. Every rank reads the
// whole global micro-batch, dp x train.batch_size sequences, and takes its replica's rows, so the loss's
// target count (the global token mean over every replica and micro-batch, Note [Gradient accumulation])
// is known on every rank. The dense parameters are sharded over every rank (parallel.fsdp = W, the
// default: the FSDP reduce-scatter over all W ranks sums the replicas' gradients with the cp shards') or
// within groups of parallel.fsdp consecutive ranks, replicated across them (HSDP, Note [Dense shards in
// groups] in model/params.h: the optimizer then sums a shard's gradient over the groups). The experts are split
// over groups of parallel.ep consecutive ranks (default: one group of all W), each group a replica of
// every expert (Note [Experts in groups] in model/params.h): the expert dispatch serves the tokens of
// its group's ranks, whatever their dp replica or cp rank, and the optimizer sums each expert's gradient
// over the groups first. The schedules keep their groups: Ring-DTP's vocabulary ring spans the
// dense-shard group (all W by default), whose ranks hold lm_head's rows; SCO and the optimizer work on
// each rank's own shards; LLEP and PipelinedLLEP plan and move within an expert group; ring attention
// spans the cp ranks of a replica.
struct Mesh {
  int dp = 1, cp = 1;
  int ep = 1;       // ranks per expert group
  int fsdp = 1;     // ranks per dense-shard group
  int replica = 0;  // this rank's, rank / cp
  int cp_rank = 0;  // rank % cp
};

Mesh mesh_resolve(const ParallelConfig& p, const Comm& comm, int64_t seq_len) {
  const int W = comm.size();
  const char* hint = "set parallel.dp and parallel.cp so that dp x cp = the ranks mpirun starts (docs/design.md)";
  FP_CHECK(p.dp <= W && W % p.dp == 0, hint, "parallel.dp = {} does not divide the {} ranks", p.dp, W);
  Mesh m;
  m.dp = static_cast<int>(p.dp);
  m.cp = p.cp > 0 ? static_cast<int>(p.cp) : W / m.dp;
  FP_CHECK(static_cast<int64_t>(m.dp) * m.cp == W, hint,
           "parallel.dp x parallel.cp = {} x {} = {}, but there are {} ranks", m.dp, m.cp, m.dp * m.cp, W);
  m.ep = p.ep > 0 ? static_cast<int>(p.ep) : W;
  FP_CHECK(m.ep <= W && W % m.ep == 0, "choose parallel.ep dividing dp x cp, the number of ranks (0: all of them)",
           "parallel.ep = {} does not divide the {} ranks (dp x cp = {} x {})", p.ep, W, m.dp, m.cp);
  m.fsdp = p.fsdp > 0 ? static_cast<int>(p.fsdp) : W;
  FP_CHECK(m.fsdp <= W && W % m.fsdp == 0,
           "choose parallel.fsdp dividing dp x cp, the number of ranks (0: all of them)",
           "parallel.fsdp = {} does not divide the {} ranks (dp x cp = {} x {})", p.fsdp, W, m.dp, m.cp);
  FP_CHECK(m.cp == 1 || seq_len % (2 * m.cp) == 0, "choose train.seq_len divisible by 2 x parallel.cp",
           "train.seq_len = {} is not divisible by 2 x {} context-parallel ranks (2cp zig-zag pieces)", seq_len, m.cp);
  m.replica = comm.rank() / m.cp;
  m.cp_rank = comm.rank() % m.cp;
  return m;
}

// This rank's piece of a global batch of dp x B sequences: its replica's B rows, then its cp piece of each.
Batch mesh_slice(const Mesh& mesh, const Batch& global, ContextSplit split, int64_t window) {
  const int64_t rows = global.B / mesh.dp;
  return context_slice(batch_rows(global, mesh.replica * rows, rows), mesh.cp_rank, mesh.cp, split, window);
}

// Where batches come from: the built-in recall task or a token file. position() is what a
// checkpoint stores; seek() restores it.
class DataSource {
 public:
  // eos_id: documents_eos_id of the run (-1: not "eos"). sequences: a global micro-batch, dp x batch_size.
  DataSource(const RunConfig& c, int32_t eos_id, int64_t sequences) : B_(sequences) {
    if (c.data.source == "recall") {
      FP_CHECK(documents_parse(c.data.documents) == Documents::Documents_none,
               "leave data.documents = \"none\" with data.source = \"recall\"",
               "data.documents = \"{}\": the recall task's sequences hold no documents", c.data.documents);
      recall_.task = recall_task_parse(c.data.task);
      recall_.vocab_size = c.model.vocab_size;
      recall_.seq_len = c.train.seq_len;
      recall_.pairs = c.data.pairs;
      recall_.seed = c.data.seed;
      recall_.loss_on = c.data.loss_on == "answers" ? LossOn::LossOn_answers : LossOn::LossOn_all;
      is_recall_ = true;
      // Validate now (the first batch would otherwise report a bad config mid-run).
      recall_batch(recall_, 0, 1, nullptr);
    } else {
      file_ = std::make_unique<TokenFile>(c.data.source, c.model.vocab_size);
      loader_ = std::make_unique<TokenFileLoader>(*file_, sequences, c.train.seq_len);
      documents_ = DocumentMarker::make(c.data.documents, eos_id, c.data.source, file_->size());
    }
  }
  Batch next(std::vector<uint8_t>* answer_mask) {
    if (is_recall_) {
      Batch b = recall_batch(recall_, position_, B_, answer_mask);
      position_ += B_;
      return b;
    }
    Batch b = loader_->next();
    documents_.mark(b);
    return b;
  }
  int64_t position() const { return is_recall_ ? position_ : loader_->position(); }
  void seek(int64_t p) {
    if (is_recall_)
      position_ = p;
    else
      loader_->seek(p);
  }
  bool is_recall() const { return is_recall_; }
  const DocumentMarker& documents() const { return documents_; }

 private:
  int64_t B_;
  DocumentMarker documents_;
  bool is_recall_ = false;
  RecallTaskConfig recall_;
  int64_t position_ = 0;
  std::unique_ptr<TokenFile> file_;
  std::unique_ptr<TokenFileLoader> loader_;
};

// Note [Held-out evaluation]: with eval.data the run measures the loss on a held-out token file every
// eval.every steps and after its last step (0: only then): eval.batches batches (0: every window of the
// file once, in file order; token_file_eval_batches), each train.batch_size sequences of train.seq_len
// tokens, the training shapes, so an evaluation's forward fits wherever the step's forward and backward
// did. They are marked with documents as the training data is (data.documents) and split over the ranks
// as a training batch is. The loss is `flatpeak eval`'s (Note [One held-out loss] in train/session.h). Forward
// only: the weights, the optimizer and the data position are untouched, so a run with evaluations trains
// bit for bit as one without. The windows are read once, at the start (8 bytes a token). On meta
// nothing is evaluated (it holds no numbers).
class HeldOut {
 public:
  HeldOut(const RunConfig& c, int32_t eos_id, bool computes, const Mesh& mesh)
      : every_(c.eval.every),
        mesh_(mesh),
        split_(context_split_parse(c.data.context_split)),
        window_(c.model.sliding_window) {
    if (c.eval.data.empty() || !computes) return;
    const TokenFile file(c.eval.data, c.model.vocab_size, "eval.data");
    // Batches of dp x batch_size sequences, each replica its rows; the file's last sequences that would
    // leave a replica without one (fewer than dp) are not evaluated.
    // Read as the training data is: with "index", eval.data's own index (eval.data + ".docs").
    batches_ =
        eval_batches_read(file, c.train.seq_len, mesh.dp * c.train.batch_size, c.eval.batches,
                          DocumentMarker::make(c.data.documents, eos_id, c.eval.data, file.size()), "train.seq_len");
    if (!batches_.empty() && batches_.back().B % mesh.dp != 0) {
      Batch& last = batches_.back();
      last = batch_rows(last, 0, last.B - last.B % mesh.dp);
      if (last.B == 0) batches_.pop_back();
    }
  }
  bool due(int64_t step, int64_t total) const {
    return !batches_.empty() && (step == total || (every_ > 0 && step % every_ == 0));
  }
  // Collective: every rank evaluates its piece of each batch.
  HeldOutLoss run(Model& model) const {
    return held_out_loss(batches_.size(), [&](size_t i) {
      return step_forward(model, mesh_slice(mesh_, batches_[i], split_, window_));
    });
  }
  int64_t batches() const { return static_cast<int64_t>(batches_.size()); }

 private:
  int64_t every_;
  Mesh mesh_;
  ContextSplit split_;
  int64_t window_;
  std::vector<Batch> batches_;
};

// Note [Gradient accumulation]: with train.grad_accum = M an optimizer step reads M micro-batches of
// train.batch_size sequences (each split over the ranks as a step's batch is), zeroes the gradients once
// and adds each micro-batch's forward and backward into them, then updates once. The loss is the token
// mean over every target of the global batch, M x batch_size sequences: the micro-batches are read
// before the first forward, their targets counted (not -100, on the whole windows, so every rank knows the
// total), and each micro-batch's cross-entropy is divided by that total (StepWeights::targets), so a
// micro-batch with fewer targets (documents, ignored positions) weighs less: the global token mean, not a
// mean of means. Loss and gradients are then those of one step on the whole global batch (to the order of
// the float sums: tests/model/test_grad_accum.cpp, cli grad_accum), clipped by the global norm (the
// optimizer sees the accumulated gradient). Two statistics of the batch differ by design, and say how:
//   - the load-balancing loss is computed per micro-batch, over its tokens, and each carries 1/M of it
//     (StepWeights::aux_weight): Megatron's convention. The global batch's own aux (a product of two
//     batch-wide means) would need every micro-batch's routing before the first backward;
//   - DeepSeek-V3's routing bias moves once per optimizer step by the expert loads summed over the
//     micro-batches: exactly the loads of the global batch.
// Under the bf16 recipe the gradients are stored in bf16 (precision.grads) and each micro-batch's
// backward adds into them: M roundings where one batch has one. Accumulating in f32 would need an f32
// gradient beside each bf16 one (2 more bytes per parameter, category grads), and the cpu backend runs
// the bf16 recipe without per-field overrides. Measured (docs/benchmarks.md, "Gradient accumulation"):
// over 20 steps, 4 x 1 bf16 micro-batches follow one bf16 batch of 4 within 4.6e-5 of the loss, where
// bf16 and fp32 differ by 2.1e-4.

// Keeps the lines of metrics.jsonl up to `step` (a resumed run rewrites what came after).
void metrics_truncate(const std::string& path, int64_t step) {
  if (!fs::exists(path)) return;
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    try {
      if (nlohmann::json::parse(line).at("step").get<int64_t>() <= step) kept += line + "\n";
    } catch (const nlohmann::json::exception&) {
      break;  // a torn last line from a killed run
    }
  }
  file_write_atomic(path, kept);
}

// metrics for W ranks: each category's peak is the maximum over ranks, with the rank that holds it.
void peaks_over_ranks(Comm& comm, const Ledger& led, nlohmann::json& j) {
  const int W = comm.size();
  std::vector<int64_t> mine(kNumCategories + 1), all(static_cast<size_t>(W) * (kNumCategories + 1));
  for (int c = 0; c < kNumCategories; ++c) mine[c] = static_cast<int64_t>(led.peak(kAllCategories[c]));
  mine[kNumCategories] = static_cast<int64_t>(led.total_peak());
  comm.all_gather(mine.data(), all.data(), kNumCategories + 1, DType::DType_I64);
  nlohmann::json peaks = nlohmann::json::object(), ranks = nlohmann::json::object();
  for (int c = 0; c <= kNumCategories; ++c) {
    int best = 0;
    for (int r = 1; r < W; ++r)
      if (all[r * (kNumCategories + 1) + c] > all[best * (kNumCategories + 1) + c]) best = r;
    const int64_t v = all[best * (kNumCategories + 1) + c];
    if (c == kNumCategories) {
      j["device_peak_bytes"] = v;
      j["device_peak_rank"] = best;
    } else {
      peaks[std::string(category_name(kAllCategories[c]))] = v;
      ranks[std::string(category_name(kAllCategories[c]))] = best;
    }
  }
  j["peak_bytes"] = peaks;
  j["peak_rank"] = ranks;
  j["ranks"] = W;
  std::string binding = j["binding"];
  for (auto it = peaks.begin(); it != peaks.end(); ++it)
    if (it.value().get<int64_t>() > peaks[binding].get<int64_t>()) binding = it.key();
  j["binding"] = binding;
}

// A schedule never degrades silently: SCO keeps a boundary on the device when the host has no room
// for it (ckpt.host_budget or --host-mem), which is correct but gives back what SCO flattens. Say so at
// launch, with what all of them would need (the host ledger now holds the optimizer's host state).
void sco_launch_report(const RunConfig& cfg, Backend& be, int W) {
  const CkptSchedule& ck = cfg.schedules.ckpt;
  const int64_t L = cfg.model.num_hidden_layers;
  if (ck.kind != CkptSchedule::Kind::Kind_sco || L < 2) return;
  const uint64_t each = static_cast<uint64_t>(cfg.train.batch_size * cfg.train.seq_len / W) *
                        static_cast<uint64_t>(cfg.model.hidden_size) * dtype_size(cfg.precision.activations);
  const int64_t want = L - 1;  // the last boundary stays on the device by design (sco.cpp)
  const Ledger& hl = be.host_ledger();
  const uint64_t host_free =
      hl.capacity() == kUnlimitedBytes ? kUnlimitedBytes : hl.capacity() - std::min(hl.capacity(), hl.total_current());
  const uint64_t room = std::min(host_free, ck.host_budget);
  const int64_t fit =
      each == 0 ? want : static_cast<int64_t>(std::min<uint64_t>(static_cast<uint64_t>(want), room / each));
  if (fit >= want) return;
  log_info(
      "WARNING: ckpt.schedule = \"sco\" but the host has room for {} of the {} boundaries it offloads ({} "
      "each, {} for all; room {} = min(--host-mem free {}, ckpt.host_budget {})): the other {} stay on the "
      "device ({}); raise --host-mem or ckpt.host_budget",
      fit, want, bytes_format(each), bytes_format(each * static_cast<uint64_t>(want)), bytes_format(room),
      host_free == kUnlimitedBytes ? std::string("unlimited") : bytes_format(host_free),
      ck.host_budget == kUnlimitedBytes ? std::string("unlimited") : bytes_format(ck.host_budget), want - fit,
      bytes_format(each * static_cast<uint64_t>(want - fit)));
}

// Note [A run owns its output folder]: what a run writes in --out is metrics.jsonl, memory_trace.json,
// step-N/ checkpoints and the "checkpoint" link. A folder already holding any of them belongs to an
// earlier run: continuing it needs --resume (of a checkpoint in that folder), replacing it needs
// --overwrite; anything else is refused before a byte is written, so a run never prunes, truncates
// or overwrites another run's files.
std::vector<std::string> run_entries(const fs::path& out) {
  std::vector<std::string> found;
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return found;
  for (const auto& entry : fs::directory_iterator(out, ec)) {
    const std::string n = entry.path().filename().string();
    if (n == "metrics.jsonl" || n == "memory_trace.json" || n == "checkpoint" || n.rfind("step-", 0) == 0)
      found.push_back(n);
  }
  std::sort(found.begin(), found.end());
  return found;
}

// The run folder a checkpoint directory belongs to (DIR for DIR, DIR/checkpoint or DIR/step-N).
fs::path run_dir_of(const std::string& resume) {
  fs::path ck = fs::absolute(checkpoint_resolve(resume)).lexically_normal();
  if (ck.filename().empty()) ck = ck.parent_path();
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(ck.parent_path(), ec);
  return ec ? ck.parent_path() : dir;
}

void out_prepare(const TrainOptions& o) {
  const fs::path out(o.out);
  std::error_code ec;
  FP_CHECK(!fs::exists(out, ec) || fs::is_directory(out, ec), "pass a directory (or a new path) to --out",
           "--out '{}' is a file, not a directory", o.out);
  const std::vector<std::string> found = run_entries(out);
  if (!found.empty()) {
    const fs::path here = fs::weakly_canonical(out, ec);
    const bool continuing = !o.resume.empty() && run_dir_of(o.resume) == here;
    if (o.overwrite && !continuing) {
      FP_CHECK(o.init_from.empty() || run_dir_of(o.init_from) != here,
               "write the new run to another --out (or copy the checkpoint elsewhere first)",
               "--overwrite would delete the checkpoint that --init-from '{}' starts from", o.init_from);
      for (const std::string& n : found) fs::remove_all(out / n, ec);
      log_info("--overwrite: removed the earlier run in {} ({})", o.out, fmt::join(found, ", "));
    } else if (!continuing) {
      const size_t shown = std::min<size_t>(found.size(), 4);
      std::string what =
          fmt::format("{}", fmt::join(found.begin(), found.begin() + static_cast<ptrdiff_t>(shown), ", "));
      if (found.size() > shown) what += fmt::format(" and {} more", found.size() - shown);
      throw Error(
          fmt::format("--out '{}' already holds a run ({}){}", o.out, what,
                      o.resume.empty() ? "" : fmt::format(", and --resume '{}' is not a checkpoint of it", o.resume)),
          fmt::format("continue that run with --resume {0}, write elsewhere with another --out, or pass "
                      "--overwrite to replace it",
                      o.out));
    }
  }
  fs::create_directories(out, ec);
  FP_CHECK(!ec, "pass an --out where this user can create a directory", "--out '{}' cannot be created: {}", o.out,
           ec.message());
  const std::string probe = (out / ".flatpeak-write-test").string();
  {
    std::ofstream f(probe);
    FP_CHECK(f.good(), "pass a writable --out (not a read-only filesystem)", "--out '{}' is not writable", o.out);
  }
  fs::remove(probe, ec);
}

// The command that resumes this run where it stopped.
std::string resume_command(const TrainOptions& o, int ranks) {
  std::string cmd = ranks > 1 ? fmt::format("mpirun -np {} flatpeak train", ranks) : "flatpeak train";
  cmd += " --config " + o.config;
  for (const std::string& s : o.overrides) cmd += " --set " + s;
  if (o.steps > 0) cmd += fmt::format(" --steps {}", o.steps);
  if (o.device_mem != "unlimited") cmd += " --device-mem " + o.device_mem;
  if (o.host_mem != "unlimited") cmd += " --host-mem " + o.host_mem;
  return cmd + fmt::format(" --out {0} --resume {0}", o.out);
}

// Note [Injected faults]: FLATPEAK_FAULT=KIND:S makes a test's run go wrong at step S the way real
// runs do, so the guards are shown to work (tests/cli/test_train.py). Unset in normal runs.
//   spike:S       before step S's forward, lm_head's weights x 1000 (a finite loss spike)
//   nan:S         before step S's forward, one weight of lm_head becomes NaN (a non-finite loss)
//   nan_update:S  after step S's update, one weight of lm_head becomes NaN (the loss of step S was
//                 fine: only the checkpoint's own check can catch it)
struct Fault {
  std::string kind;
  int64_t step = -1;
};

Fault fault_from_env() {
  Fault f;
  const char* e = std::getenv("FLATPEAK_FAULT");
  if (e == nullptr || *e == '\0') return f;
  const std::string v = e;
  const size_t colon = v.find(':');
  try {
    FP_CHECK(colon != std::string::npos, "", "");
    f.kind = v.substr(0, colon);
    f.step = std::stoll(v.substr(colon + 1));
  } catch (const std::exception&) {
    f.kind.clear();
  }
  FP_CHECK(f.kind == "spike" || f.kind == "nan" || f.kind == "nan_update", "unset FLATPEAK_FAULT (a test hook)",
           "FLATPEAK_FAULT = '{}': expected spike:S, nan:S or nan_update:S", v);
  return f;
}

// lm_head's local weights on this rank: w = w x scale, or element 0 := NaN.
void fault_apply(Backend& be, ParamStore& params, const std::string& kind) {
  Tensor& w = params.lm_head->local_w();
  std::vector<float> host(static_cast<size_t>(w.numel()));
  be.copy_to_host(host.data(), w.data(), w.bytes());
  if (kind == "spike")
    for (float& x : host) x *= 1000.0f;
  else if (!host.empty())
    host[0] = std::nanf("");
  be.copy_from_host(w.data(), host.data(), w.bytes());
  log_info("FLATPEAK_FAULT: {} injected into lm_head.weight", kind);
}

// Note [Extending a finished run]: `--resume DIR --steps N --extend` continues a run past the
// train.steps it was configured with. Everything else in the config must match. The learning-rate
// schedule keeps its length (the original train.steps, stored as schedule_steps in trainer_state.json
// and as lr_schedule_steps in each metrics line from then on), so the extension runs at the rate the
// schedule ended on, optim.lr x optim.min_lr_ratio (lr_schedule.h: the cosine stays at its floor past
// its end): no jump in the rate, and a run extended in pieces equals one extended at once.

// Note [A loss spike stops the run]: a loss far above its recent level is the first sign of a
// diverging run, usually several steps before a NaN; applying that step's update writes the damage
// into the weights and moments. So a loss above train.loss_spike_factor x the median of the last
// kLossWindow finite losses (once kLossWarm are known) stops the run before the update, naming the
// step, the value and the median; the last checkpoint stays the latest.
constexpr size_t kLossWindow = 32, kLossWarm = 8;

}  // namespace

namespace {
int train_with(const TrainOptions& o, const RunConfig& cfg);
}  // namespace

int32_t documents_eos_id(const std::string& documents, int64_t eos_id, const std::string& from_dir,
                         int64_t vocab_size) {
  if (documents_parse(documents) != Documents::Documents_eos) return -1;
  const char* hint = "set data.eos_id to the id of the token that ends each document (docs/data.md)";
  int64_t id = eos_id;
  std::string where = "data.eos_id";
  if (id < 0 && !from_dir.empty()) {
    const nlohmann::ordered_json& raw = hf_config_read(from_dir).raw;
    const nlohmann::ordered_json e = raw.contains("eos_token_id") ? raw["eos_token_id"] : nlohmann::ordered_json();
    FP_CHECK(!(e.is_array() && e.size() > 1), hint,
             "{}/config.json lists several eos_token_id values {}: which one ends a document is not said", from_dir,
             e.dump());
    const nlohmann::ordered_json one = e.is_array() && e.size() == 1 ? e[0] : e;
    if (one.is_number_integer()) id = one.get<int64_t>();
    where = from_dir + "/config.json: eos_token_id";
  }
  FP_CHECK(id >= 0, hint, "data.documents = \"eos\" needs the EOS id: data.eos_id is not set{}",
           from_dir.empty() ? std::string(" (and no --init-from model gives eos_token_id)")
                            : fmt::format(" and {}/config.json has no eos_token_id", from_dir));
  FP_CHECK(id < vocab_size, hint, "{} = {} is not a token id below the vocabulary size {}", where, id, vocab_size);
  return static_cast<int32_t>(id);
}

int train_run(const TrainOptions& given) {
  FP_CHECK(!given.out.empty(), "pass --out DIR", "flatpeak train needs an output directory");
  TrainOptions o = given;
  std::vector<std::string> overrides = o.overrides;
  if (o.steps > 0) overrides.push_back(fmt::format("train.steps={}", o.steps));
  // Note [A model from a checkpoint] (run_config.cpp): the checkpoint a run starts from or continues
  // describes the model; the run config's [model] may leave it out and must agree where it does not.
  FP_CHECK(o.init_from.empty() || o.resume.empty(),
           "--init-from starts a new run (step 0, fresh optimizer) from a model's weights; --resume continues a "
           "run: pass one of them",
           "--init-from and --resume together");
  // Note [Resuming from the newest sound checkpoint] (train/checkpoint.h): the checkpoint to continue is
  // chosen, its files checked, before anything reads it; run_start loads that one (checked: no second read).
  if (!o.resume.empty()) {
    const ResumePoint rp = checkpoint_resume_point(o.resume);
    if (comm_world().rank() == 0) {
      for (const std::string& s : rp.skipped) log_info("warning: not resuming from a damaged checkpoint: {}", s);
      if (!rp.skipped.empty())
        log_info("falling back to the previous complete checkpoint {} (its files check)", rp.dir);
      if (rp.check == CheckpointCheck::CheckpointCheck_unverified)
        log_info(
            "warning: checkpoint '{}' has no manifest.json (a flatpeak before checksums wrote it): its files "
            "are loaded unverified",
            rp.dir);
    }
    o.resume = rp.dir;
  }
  const std::string from = !o.init_from.empty() ? o.init_from : o.resume;
  std::optional<ModelConfig> model_from;
  if (!from.empty()) model_from = hf_config_read(checkpoint_resolve(from)).model;
  const RunConfig cfg = config_load(o.config, overrides, model_from ? &*model_from : nullptr);
  try {
    return train_with(o, cfg);
  } catch (const OutOfMemoryError& e) {
    throw Error(e.what(), oom_hint(e.category(), e.space(), cfg));  // the hint that knows the schedules in use
  }
}

namespace {

// Where a run starts (Note [Extending a finished run], Note [Checkpoint dtype and shards]): a fresh run
// at step 0, --init-from's weights with a fresh optimizer, or --resume's step, weights, optimizer and
// data position after the registry's comparison of the configs (Note [One key registry]).
struct RunStart {
  int64_t start = 0;           // the last step done
  int64_t schedule_total = 0;  // the learning-rate schedule's length
  CheckpointFormat format;     // the dtype, shards and config.json the checkpoints are written with
};

RunStart run_start(const TrainOptions& o, const RunConfig& cfg, Model& model, Optimizer& optim, Backend& be,
                   DataSource& data, bool lead) {
  const ModelConfig& m = cfg.model;
  const int64_t total = cfg.train.steps;
  RunStart rs;
  int64_t& start = rs.start;
  int64_t& schedule_total = rs.schedule_total;
  schedule_total = total;
  CheckpointFormat& format = rs.format;
  FP_CHECK(!o.extend || !o.resume.empty(), "--extend continues a run: pass --resume DIR too",
           "--extend without --resume");
  format.weights = model.params().precision().params;  // a fresh run: its own weights' dtype
  format.shard_bytes = bytes_parse(o.shard_size);
  FP_CHECK(format.shard_bytes > 0, "pass a size such as 5GB or 500MiB", "--shard-size '{}' must be positive",
           o.shard_size);
  if (!o.init_from.empty() && be.computes()) {  // meta holds no weights: config.json alone sized the run
    // Weights only: the optimizer state starts fresh and the run at step 0 (a trainer state in the
    // directory, if any, is not this run's).
    const TrainerState from = checkpoint_load(o.init_from, m, model.params(), nullptr, be);
    format.weights = from.weights_dtype;
    format.base_config = from.config_json;
    if (lead)
      log_info("initialized the weights from {} (fresh optimizer state, step 0)", checkpoint_resolve(o.init_from));
  }
  if (!o.resume.empty()) {
    // Checked by train_run (checkpoint_resume_point), which chose o.resume.
    TrainerState st = checkpoint_load(o.resume, m, model.params(), &optim, be, /*verify=*/false);
    format.weights = st.weights_dtype;
    format.base_config = st.config_json;
    FP_CHECK(!st.run_config.empty(), "resume from a checkpoint written by flatpeak train (it has trainer_state.json)",
             "'{}' has no trainer_state.json: it holds weights, not a training run to continue", o.resume);
    nlohmann::json then = nlohmann::json::parse(st.run_config);
    const int64_t then_steps = then["train"].value("steps", int64_t{0});
    schedule_total = st.schedule_steps > 0 ? st.schedule_steps : then_steps;
    if (o.extend) {
      // Note [Extending a finished run]: everything but train.steps must match.
      FP_CHECK(total > st.step, "pass --steps N with N above the checkpoint's step",
               "--extend: the checkpoint is at step {}, --steps is {}", st.step, total);
    }
    // Note [One key registry]: a key that changes the arithmetic must match; a schedule or run key may
    // change, and the change is said.
    const ResumeCheck diff = config_resume_check(then, cfg, o.extend);
    FP_CHECK(diff.refused.empty(),
             o.extend ? "--extend changes only the number of steps: resume with the run's own config"
                      : "resume with the same config and --steps as the run that wrote the checkpoint (to train a "
                        "run past its last step, add --extend; schedule keys may change: `flatpeak keys`)",
             "the checkpoint in '{}' was written by a run with another configuration: {}", o.resume,
             fmt::join(diff.refused, "; "));
    if (lead && !diff.changed.empty())
      log_info("resuming with other schedule or run settings (the same arithmetic): {}", fmt::join(diff.changed, "; "));
    if (lead && !diff.not_recorded.empty())
      log_info("the checkpoint does not record {} (an older flatpeak wrote it): this run's values are taken",
               fmt::join(diff.not_recorded, ", "));
    if (o.extend && lead)
      log_info(
          "--extend: from step {} to {}; the learning-rate schedule keeps its length {} (lr {:.3g} after "
          "it: optim.lr x optim.min_lr_ratio)",
          st.step, total, schedule_total, cfg.optim.lr * cfg.optim.min_lr_ratio);
    start = st.step;
    data.seek(st.data_position);
    if (lead) log_info("resumed from {} at step {}", checkpoint_resolve(o.resume), start);
  }
  FP_CHECK(start < total, fmt::format("to train it further, pass --steps N (N > {}) with --extend", start),
           "the checkpoint is at step {} of {}: nothing to do", start, total);

  return rs;
}

// Note [A loss spike stops the run], Note [Stopping on a signal], Note [Injected rank failure]: what ends a
// run between two steps, or before a step's update.
class StopPolicy {
 public:
  StopPolicy(const TrainOptions& o, const RunConfig& cfg, bool computes, int64_t last_ckpt)
      : o_(o), spike_factor_(cfg.train.loss_spike_factor), computes_(computes), last_ckpt_(last_ckpt) {
    // Note [Injected rank failure]: FLATPEAK_FAIL_RANK=R:S makes rank R fail at step S, so tests can show
    // that one failed rank ends every rank promptly (cli/main.cpp). Unset in normal runs.
    if (const char* f = std::getenv("FLATPEAK_FAIL_RANK")) std::sscanf(f, "%d:%ld", &fail_rank_, &fail_step_);
  }
  // Before step `step` on rank `rank`: an injected failure.
  void before_step(int64_t step, int rank) const {
    FP_CHECK(!(rank == fail_rank_ && step == fail_step_), "unset FLATPEAK_FAIL_RANK",
             "injected failure at step {} (FLATPEAK_FAIL_RANK={}:{})", step, fail_rank_, fail_step_);
  }
  // After the forward and backward, before the update: a non-finite or spiking loss stops the run.
  void check_loss(int64_t step, const StepOutputs& out) {
    if (computes_ && !std::isfinite(out.loss))
      throw Error(fmt::format("the loss is {} at step {} (cross-entropy {}, aux {}); no update was applied", out.loss,
                              step, out.ce_loss, out.aux_loss),
                  fmt::format("lower optim.lr or check the data; {}", intact()));
    if (computes_ && spike_factor_ > 0 && recent_.size() >= kLossWarm) {
      const double med = median(std::vector<double>(recent_.begin(), recent_.end()));
      if (out.loss > spike_factor_ * med)
        throw Error(fmt::format("the loss spiked at step {}: {:.6g} is {:.1f}x the median {:.6g} of the last {} steps "
                                "(train.loss_spike_factor = {}); no update was applied",
                                step, out.loss, out.loss / med, med, recent_.size(), spike_factor_),
                    fmt::format("lower optim.lr or check the data, then resume; {}; set train.loss_spike_factor = 0 to "
                                "train through spikes",
                                intact()));
    }
    if (std::isfinite(out.loss)) {
      recent_.push_back(out.loss);
      if (recent_.size() > kLossWindow) recent_.pop_front();
    }
  }
  // After a step: whether the run stops now (--stop-after, or a signal on any rank: every rank stops after
  // the same step).
  bool after_step(Comm& comm) {
    ++done_here_;
    int64_t sig = stop_signal();
    if (comm.size() > 1) comm.all_reduce_max(&sig, 1, DType::DType_I64);
    stopped_by_ = static_cast<int>(sig);
    return (o_.stop_after > 0 && done_here_ >= o_.stop_after) || stopped_by_ != 0;
  }
  void checkpoint_written(int64_t step) { last_ckpt_ = step; }
  int stopped_by() const { return stopped_by_; }

 private:
  std::string intact() const {
    return last_ckpt_ > 0 ? fmt::format("the checkpoint of step {} in {} is intact", last_ckpt_, o_.out)
                          : std::string("no checkpoint was written yet");
  }
  const TrainOptions& o_;
  double spike_factor_;
  bool computes_;
  int64_t last_ckpt_;  // the step of the latest complete checkpoint in o.out (the resumed one at first)
  int fail_rank_ = -1;
  int64_t fail_step_ = -1;
  std::deque<double> recent_;
  int64_t done_here_ = 0;
  int stopped_by_ = 0;
};

// The run's opening lines (rank 0): the model, the batch, the device, the precision, the ranks.
void run_describe(const TrainOptions& o, const RunConfig& cfg, Backend& be, const Comm& comm, const Mesh& mesh) {
  const ModelConfig& m = cfg.model;
  log_info(
      "{}: {:.2f} M parameters ({}: {} layers, hidden {}, {} experts top-{}, vocab {}); {} x {} tokens per step; "
      "{} steps on {} (device memory {}); precision {}{}; outputs in {}",
      cfg.source, static_cast<double>(m.param_count()) / 1e6, model_type_name(m.model_type), m.num_hidden_layers,
      m.hidden_size, m.num_experts, m.num_experts_per_tok, m.vocab_size, cfg.train.batch_size, cfg.train.seq_len,
      cfg.train.steps, be.name(), bytes_format(be.device_ledger().capacity()), precision_describe(cfg.precision),
      cfg.schedules.ckpt.recompute ? "" : "; every layer's activations kept (ckpt.recompute = false)", o.out);
  if (comm.size() > 1)
    log_info("{} ranks ({}): each holds {} of the {} tokens of every sequence of its replica (context parallel over {}, "
             "zig-zag pieces)",
             comm.size(), comm.name(), cfg.train.seq_len / mesh.cp, cfg.train.seq_len, mesh.cp);
  if (o.link_gbps > 0)
    log_info("copy streams over an EMULATED {} GB/s host-device link: offload timings are emulated", o.link_gbps);
}

// One step's line of metrics.jsonl: the device ledger's peaks (the largest over the ranks), the losses,
// the optimizer's gradient norm and rate, the tokens, the time and this rank's host memory (a long run
// stays flat: scripts/soak). schedule_steps: the learning-rate schedule's length when it is not
// train.steps (an extended run), else 0.
nlohmann::json step_metrics(const Ledger& led, Comm& comm, int64_t step, const StepOutputs& out,
                            const Optimizer::StepStats& os, int64_t schedule_steps, int64_t tokens, int64_t targets,
                            double secs) {
  nlohmann::json j = ledger_peaks_json(led);
  if (comm.size() > 1) peaks_over_ranks(comm, led, j);
  j["step"] = step;
  j["loss"] = out.loss;
  j["ce_loss"] = out.ce_loss;
  j["aux_loss"] = out.aux_loss;
  j["grad_norm"] = os.grad_norm;
  j["lr"] = os.lr;
  if (schedule_steps > 0) j["lr_schedule_steps"] = schedule_steps;
  j["tokens"] = tokens;
  j["target_tokens"] = targets;
  j["tokens_per_s"] = static_cast<double>(tokens) / secs;
  j["seconds"] = secs;
  j["host_rss_bytes"] = resident_bytes();
  j["host_heap_bytes"] = heap_in_use_bytes();
  return j;
}

// Note [Gradient accumulation]: one optimizer step's M micro-batches, read before the step is timed;
// their targets, summed, set the step's mean.
struct StepBatches {
  std::vector<Batch> micro;                        // (M) the global micro-batches (every replica's rows)
  std::vector<std::vector<uint8_t>> answer_masks;  // (M) recall: each micro-batch's answer positions
  int64_t targets = 0;                             // the target tokens of all of them
};

StepBatches step_batches_read(DataSource& data, int64_t M) {
  StepBatches sb;
  sb.micro.resize(static_cast<size_t>(M));
  sb.answer_masks.resize(static_cast<size_t>(M));
  for (int64_t mb = 0; mb < M; ++mb) {
    sb.micro[mb] = data.next(data.is_recall() ? &sb.answer_masks[mb] : nullptr);
    sb.targets += batch_targets(sb.micro[mb]);
  }
  return sb;
}

// The forward and backward of every micro-batch on this rank's slice of it (Note [A device mesh]),
// gradients summed into the model's, outputs summed (the aux loss averaged). With logits (recall, the
// full head): this rank's answers predicted exactly and its answers added to answers[0], answers[1].
StepOutputs step_micro_batches(Model& model, const StepBatches& sb, const Mesh& mesh, const ContextSplit& split,
                               int64_t window, std::vector<float>* logits, double answers[2]) {
  const int64_t M = static_cast<int64_t>(sb.micro.size());
  StepOutputs out;
  for (int64_t mb = 0; mb < M; ++mb) {
    const Batch& global = sb.micro[mb];
    const Batch batch = mesh_slice(mesh, global, split, window);
    const int64_t first_row = mesh.replica * batch.B;  // this replica's first sequence in `global`
    const StepOutputs o =
        step_forward_backward(model, batch, logits, StepWeights{M > 1 ? sb.targets : 0, 1.0 / static_cast<double>(M)});
    out.loss += o.loss;
    out.ce_loss += o.ce_loss;
    out.aux_loss += o.aux_loss / static_cast<double>(M);
    out.target_tokens += o.target_tokens;
    if (out.expert_counts.empty()) out.expert_counts.assign(o.expert_counts.size(), 0);
    for (size_t i = 0; i < o.expert_counts.size(); ++i) out.expert_counts[i] += o.expert_counts[i];
    if (logits != nullptr) {
      std::vector<uint8_t> mask;  // this rank's answer positions
      for (int64_t sq = 0; sq < batch.B; ++sq)
        for (int64_t t = 0; t < batch.T; ++t)
          mask.push_back(sb.answer_masks[mb][(first_row + sq) * global.T +
                                             (batch.positions.empty() ? t : batch.positions[t])]);
      double a = 0;
      for (uint8_t x : mask) a += x;
      answers[0] += a > 0 ? recall_accuracy(*logits, batch, mask) * a : 0.0;
      answers[1] += a;
    }
  }
  return out;
}

int train_with(const TrainOptions& o, const RunConfig& cfg) {
  const int64_t total = cfg.train.steps;
  auto be = backend_create(o.device, bytes_parse(o.device_mem), bytes_parse(o.host_mem));
  if (o.link_gbps > 0) be->link_set_gbps(o.link_gbps);  // Note [Emulated link] (backend/backend.h)
  const ModelConfig& m = cfg.model;
  Comm& comm = comm_world();
  const bool lead = comm.rank() == 0;  // rank 0 writes outputs and prints
  const std::string from = !o.init_from.empty() ? o.init_from : o.resume;
  const int32_t eos_id = documents_eos_id(cfg.data.documents, cfg.data.eos_id,
                                          from.empty() ? std::string() : checkpoint_resolve(from), m.vocab_size);
  if (!o.resume.empty() && comm.size() > 1) {
    // Each rank chose its checkpoint (Note [Resuming from the newest sound checkpoint]); on files that some
    // host sees damaged and another not, they could differ, and a run of mixed steps must not start.
    const std::string name = fs::path(o.resume).filename().string();
    const int64_t h = static_cast<int64_t>(std::hash<std::string>{}(name) >> 2);
    int64_t v[2] = {h, -h};
    comm.all_reduce_max(v, 2, DType::DType_I64);
    FP_CHECK(v[0] == -v[1], "check that every host sees the same files of the run's folder (a shared filesystem)",
             "the ranks chose different checkpoints to resume from (rank {} chose {})", comm.rank(), o.resume);
  }
  const Mesh mesh = mesh_resolve(cfg.parallel, comm, cfg.train.seq_len);  // Note [A device mesh]
  if (lead && (mesh.dp > 1 || mesh.ep < comm.size() || mesh.fsdp < comm.size()))
    log_info(
        "mesh: {} data-parallel replica(s) x {} context-parallel ranks; experts over {} group(s) of {} rank(s), "
        "dense shards over {} group(s) of {}",
        mesh.dp, mesh.cp, comm.size() / mesh.ep, mesh.ep, comm.size() / mesh.fsdp, mesh.fsdp);
  DataSource data(cfg, eos_id, mesh.dp * cfg.train.batch_size);
  if (lead && data.documents().kind != Documents::Documents_none) log_info("{}", data.documents().describe());
  const ContextSplit split = context_split_parse(cfg.data.context_split);
  const HeldOut held_out(cfg, eos_id, be->computes(), mesh);
  if (lead && held_out.batches() > 0)
    log_info("held-out evaluation: {} batches of {} x {} from {} every {}", held_out.batches(), cfg.train.batch_size,
             cfg.train.seq_len, cfg.eval.data,
             cfg.eval.every > 0 ? fmt::format("{} steps and after the last", cfg.eval.every)
                                : std::string("run, after the last step"));
  if (lead) out_prepare(o);
  stop_signals_install();                                // Note [Stopping on a signal]
  const std::string run_json = config_json(cfg).dump();  // every key (Note [One key registry])

  const std::unique_ptr<Model> model_ptr = run_model_create(cfg, *be, &comm, RankGroups{mesh.ep, mesh.fsdp});
  Model& model = *model_ptr;
  model.set_context_parallel(mesh.cp);
  std::unique_ptr<Optimizer> optim_ptr = optimizer_create(cfg.optim, cfg.schedules.optim, model.params(), *be);
  Optimizer& optim = *optim_ptr;
  if (lead) sco_launch_report(cfg, *be, comm.size());
  const RunStart rs = run_start(o, cfg, model, optim, *be, data, lead);
  const int64_t start = rs.start, schedule_total = rs.schedule_total;
  const CheckpointFormat& format = rs.format;

  if (lead) run_describe(o, cfg, *be, comm, mesh);
  // Note [Checkpoints off the critical path] (train/checkpoint_writer.h): the host copy, allocated once.
  std::unique_ptr<CheckpointWriter> writer;
  if (cfg.train.checkpoint_async && be->computes()) {
    writer = std::make_unique<CheckpointWriter>(m, model.params(), &optim, format);
    const Ledger& hl = be->host_ledger();
    FP_CHECK(
        hl.capacity() == kUnlimitedBytes || hl.total_current() + writer->host_bytes() <= hl.capacity(),
        "set train.checkpoint_async = false (the step then waits for each checkpoint's files), or raise --host-mem",
        "train.checkpoint_async = true: rank 0's host copy of the checkpoint, {}, does not fit --host-mem {} beside "
        "the {} the run holds there",
        bytes_format(writer->host_bytes()), bytes_format(hl.capacity()), bytes_format(hl.total_current()));
    if (lead)
      log_info(
          "checkpoints written in the background (train.checkpoint_async): rank 0 holds a host copy of {} "
          "(`flatpeak plan --schedule train.checkpoint_async=true` plans it)",
          bytes_format(writer->host_bytes()));
  }

  const std::string metrics_path = o.out + "/metrics.jsonl";
  std::ofstream metrics;
  if (lead) {
    metrics_truncate(metrics_path, start);
    metrics.open(metrics_path, std::ios::app);
    FP_CHECK(metrics.good(), "check that --out is writable", "cannot open '{}'", metrics_path);
  }

  const int64_t ckpt_every = cfg.train.checkpoint_every;
  StopPolicy stop_policy(o, cfg, be->computes(), start);
  const Fault fault = be->computes() ? fault_from_env() : Fault{};  // Note [Injected faults]
  // Note [Gradient accumulation]: M micro-batches of train.batch_size sequences make one optimizer step.
  const int64_t M = cfg.train.grad_accum;
  if (lead && (M > 1 || !o.resume.empty()))
    log_info(
        "gradient accumulation: {} micro-batches of {} x {} tokens{}, a global batch of {} sequences ({} tokens) "
        "per optimizer step",
        M, cfg.train.batch_size, cfg.train.seq_len,
        mesh.dp > 1 ? fmt::format(" on each of {} replicas", mesh.dp) : std::string(),
        M * mesh.dp * cfg.train.batch_size, M * mesh.dp * cfg.train.batch_size * cfg.train.seq_len);
  std::vector<float> logits;
  // Recall accuracy needs the logits (host copy, B x T x V). The full head has them anyway; Ring-DTP
  // never forms them (that is its point), so with it the metric is left out rather than paying
  // N x V bytes for a metric.
  const bool want_logits =
      data.is_recall() && be->computes() && cfg.schedules.vocab.kind == VocabSchedule::Kind::Kind_full;
  if (lead && data.is_recall() && be->computes() && !want_logits)
    log_info("recall accuracy is not reported with vocab.schedule = \"ring\": Ring-DTP forms no logits");
  // Live on a terminal, a line every --log-every steps (default 10) otherwise (train/progress.h).
  Progress progress(start, total, o.log_every > 0 ? o.log_every : 10, o.quiet || !lead);
  int64_t last_step = start;
  // Note [A step that does not finish] (core/watchdog.h): train.step_timeout bounds every step.
  StepWatchdog watchdog(cfg.train.step_timeout, comm.size() > 1 ? fmt::format(" [rank {}]", comm.rank()) : "");
  // What the last checkpoint cost the training loop (sync: the whole save; async: the wait for the previous
  // write and the copy), reported on the next step's line; -1: no checkpoint since the last step.
  double ckpt_blocked = -1, ckpt_wait = 0;
  for (int64_t step = start + 1; step <= total; ++step) {
    watchdog.arm(step);
    watchdog.phase("the batch, forward, backward and update");
    stop_policy.before_step(step, comm.rank());
    const StepBatches sb = step_batches_read(data, M);
    be->device_ledger().peaks_reset();
    const Clock::time_point t0 = Clock::now();
    if (step == fault.step && (fault.kind == "spike" || fault.kind == "nan"))
      fault_apply(*be, model.params(), fault.kind);
    double answers[2] = {0, 0};  // recall: answers predicted exactly, answers (this rank's)
    const TrainStepResult ts = train_step(
        model, optim, step, schedule_total, cfg.moe.bias_update_rate,
        [&] {
          return step_micro_batches(model, sb, mesh, split, m.sliding_window, want_logits ? &logits : nullptr, answers);
        },
        [&](const StepOutputs& o) { stop_policy.check_loss(step, o); });
    const StepOutputs& out = ts.out;
    const Optimizer::StepStats& os = ts.stats;
    if (step == fault.step && fault.kind == "nan_update") fault_apply(*be, model.params(), fault.kind);
    const double secs = seconds_since(t0);
    const int64_t step_tokens = M * sb.micro[0].B * sb.micro[0].T;  // global, every rank's, every micro-batch's
    const double tps = static_cast<double>(step_tokens) / secs;
    // Note [The trace holds the first steps]: memory_trace.json is the timeline of the run's first two
    // steps (the first pays one-time allocations, the second is a step like every later one); past them
    // the ledgers keep counting peaks but store no events, so a long run's memory stays flat (each
    // event holds its tensor's name: thousands per step).
    if (step == start + 2) {
      be->device_ledger().events_limit_set(be->device_ledger().events().size());
      be->host_ledger().events_limit_set(be->host_ledger().events().size());
    }
    watchdog.phase("the step's metrics");
    const Ledger& led = be->device_ledger();
    nlohmann::json j = step_metrics(led, comm, step, out, os, schedule_total != total ? schedule_total : 0,
                                    step_tokens, sb.targets, secs);
    double acc = std::nan("");
    if (want_logits) {  // the share over every micro-batch and rank
      comm.all_reduce_sum(answers, 2, DType::DType_F64);
      acc = answers[1] > 0 ? answers[0] / answers[1] : 0.0;
      j["recall_accuracy"] = acc;
    }
    double eval_loss = std::nan("");
    if (held_out.due(step, total)) {  // Note [Held-out evaluation]
      const HeldOutLoss r = held_out.run(model);
      eval_loss = r.loss;
      j["eval_loss"] = r.loss;
      j["eval_targets"] = r.targets;
    }
    // Note [Checkpoints off the critical path]: whether a background write was still in flight when this step
    // ended (rank 0; it overlapped the step), and what the last checkpoint cost the loop.
    if (writer != nullptr) {
      j["checkpoint_writing"] = writer->busy();
      j["host_checkpoint_copy_bytes"] = writer->host_bytes();
    }
    if (ckpt_blocked >= 0) {
      j["checkpoint_blocked_seconds"] = ckpt_blocked;
      if (writer != nullptr) j["checkpoint_wait_seconds"] = ckpt_wait;
      ckpt_blocked = -1;
    }
    if (lead) {
      metrics << j.dump() << "\n";
      metrics.flush();
    }
    if (lead) {
      const uint64_t peak = j.contains("device_peak_bytes") ? j["device_peak_bytes"].get<uint64_t>() : led.total_peak();
      progress.step({step, out.loss, out.aux_loss, os.grad_norm, os.lr, tps, secs, std::isnan(acc) ? -1.0 : acc, peak,
                     j["binding"].get<std::string>(), eval_loss});
    }
    last_step = step;
    // The background write's completion, said once (rank 0).
    if (writer != nullptr && lead)
      for (const CheckpointWriter::Done& d : writer->poll()) {
        stop_policy.checkpoint_written(d.step);
        if (!o.quiet)
          progress.note(fmt::format("checkpoint: {} (written in the background in {:.2f} s)", d.dir, d.seconds));
      }
    const bool stop = stop_policy.after_step(comm);
    // meta holds no numbers to save: its runs measure peaks and write no checkpoint.
    if (be->computes() && (step == total || stop || (ckpt_every > 0 && step % ckpt_every == 0))) {
      watchdog.phase("the checkpoint");
      TrainerState st;
      st.step = step;
      st.data_position = data.position();
      st.run_config = run_json;
      st.schedule_steps = schedule_total != total ? schedule_total : 0;
      const Clock::time_point c0 = Clock::now();
      if (writer != nullptr) {
        // Collective: the shards are gathered to rank 0 into the host copy; rank 0 writes it in the background.
        const CheckpointWriter::SaveCost cost = writer->save(o.out, st, cfg.train.keep_checkpoints, comm);
        ckpt_wait = cost.wait_seconds;
        if (lead && !o.quiet)
          progress.note(
              fmt::format("checkpoint of step {}: copied to host in {:.2f} s{}, written in the background", step,
                          cost.snapshot_seconds,
                          cost.wait_seconds >= 0.01
                              ? fmt::format(" after waiting {:.2f} s for the previous write", cost.wait_seconds)
                              : std::string()));
      } else {
        // Collective: the shards are gathered to rank 0, which writes them.
        const std::string where =
            checkpoint_save(o.out, m, model.params(), &optim, st, *be, format, cfg.train.keep_checkpoints);
        stop_policy.checkpoint_written(step);
        if (lead && !o.quiet) progress.note(fmt::format("checkpoint: {}", where));
        comm.barrier();
      }
      ckpt_blocked = seconds_since(c0);
    }
    if (stop) break;
  }
  watchdog.disarm();
  // The write in flight, waited for: the run ends with its newest checkpoint complete (collective).
  if (writer != nullptr) {
    for (const CheckpointWriter::Done& d : writer->finish(comm)) {
      stop_policy.checkpoint_written(d.step);
      if (lead && !o.quiet)
        progress.note(fmt::format("checkpoint: {} (written in the background in {:.2f} s)", d.dir, d.seconds));
    }
    if (lead)
      log_info("{} checkpoint(s) written in the background; {} waited for the previous write ({:.2f} s in all)",
               writer->saves(), writer->stalls(), writer->stall_seconds());
  }
  if (lead) progress.finish(o.out);
  std::fflush(stdout);
  if (lead) {
    trace_write_chrome(be->device_ledger(), o.out + "/memory_trace.json");
    log_info("wrote {0}/metrics.jsonl, {0}/memory_trace.json (rank 0){1}", o.out,
             be->computes() ? fmt::format(" and {}/checkpoint/", o.out) : std::string(" (meta: no checkpoint)"));
  }
  if (const int stopped_by = stop_policy.stopped_by(); stopped_by != 0) {
    if (lead)
      log_info("stopped by {} after step {} of {}: {}; resume with:\n  {}", signal_name(stopped_by), last_step, total,
               be->computes() ? fmt::format("checkpoint {}/checkpoint written", o.out)
                              : std::string("meta keeps no checkpoint"),
               resume_command(o, comm.size()));
    return 128 + stopped_by;
  }
  return 0;
}
}  // namespace

}  // namespace fp
