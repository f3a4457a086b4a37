// flatpeak bench step | vocab | checkpoint | optimizer | dispatch | kernels: each subcommand's flags, help and
// validators, parsed into the benchmark's options (bench/*.h), whose library function measures,
// prints and writes the results.
#include <memory>

#include "bench/calibrate.h"
#include "bench/checkpoint.h"
#include "bench/dispatch.h"
#include "bench/kernels.h"
#include "bench/optimizer.h"
#include "bench/step.h"
#include "bench/vocab.h"
#include "cli/commands.h"
#include "train/config_keys.h"

namespace fp::cli {

namespace {

// A flag named after a run-config key (config_key_flag: its flag and doc come from the registry, Note [One
// key registry]); `what` says what the benchmark does with it, when more than setting the key.
template <class T>
void key_option(CLI::App& sub, std::string_view key, T& dst, const std::string& what = "") {
  const KeyFlag f = config_key_flag(key);
  sub.add_option(f.flag, dst, what.empty() ? f.help : what + "; " + f.help);
}

}  // namespace

void bench_step_register(CLI::App& parent, Runner& run) {
  auto opts = std::make_shared<bench::BenchStepOptions>();
  bench::BenchStepOptions& o = *opts;
  CLI::App* step = parent.add_subcommand("step", "the training step: speed, memory, GEMM rate, MFU");
  step->callback([&run, opts] { run = [opts] { return bench::bench_step_run(*opts); }; });
  step->add_option("--config", o.config, "model configuration (TOML)")->required();
  step->add_option("--set", o.overrides, "override a config key (repeatable)");
  step->add_option("--repeats", o.repeats, "timed steps (median reported)");
  step->add_option("--warmup", o.warmup, "untimed steps first");
  step->add_option("--json", o.json, "write the results here");
  step->add_option("--case", o.case_path, "also write the weights and batch (safetensors) for the PyTorch twin");
}

void bench_vocab_register(CLI::App& parent, Runner& run) {
  auto opts = std::make_shared<bench::BenchVocabOptions>();
  bench::BenchVocabOptions& o = *opts;
  CLI::App* sub =
      parent.add_subcommand("vocab", "full vs ring (Ring-DTP) vocabulary projection and loss: peaks and time");
  sub->callback([&run, opts] { run = [opts] { return bench::bench_vocab_run(*opts); }; });
  sub->add_option("--tokens", o.tokens, "N, tokens per rank");
  sub->add_option("--vocab", o.vocab, "V, vocabulary size");
  sub->add_option("--hidden", o.hidden, "H, hidden size");
  key_option(*sub, "vocab.block_tokens", o.block_tokens);
  sub->add_option("--ring-mode", o.ring_mode,
                  "ring on W > 1 ranks: weights, activations, auto (vocab.ring_mode) or both")
      ->check(CLI::IsMember({"weights", "activations", "auto", "both"}));
  sub->add_option("--device", o.device, "cpu (peaks and time) or meta (exact peaks, nothing computed)")
      ->check(CLI::IsMember({"cpu", "meta"}));
  sub->add_option("--repeats", o.repeats, "timed runs per variant (median reported)");
  sub->add_option("--warmup", o.warmup, "untimed runs first");
  sub->add_option("--json", o.json, "write the results here");
  sub->add_flag("--no-torch", o.no_torch, "skip the PyTorch comparison (cpu, one rank)");
  sub->add_flag("--fsdp", o.fsdp,
                "W > 1: the ring variants hold only their V / W rows of lm_head (the FSDP layout train uses) instead "
                "of the whole matrix on every rank");
  sub->add_option("--precision", o.precision,
                  "precision recipes to run, comma separated: fp32, bf16 or fp32,bf16 (each with every variant, in "
                  "the same run; bf16: bf16 hidden states and lm_head, f32 logits)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_flag("--breakdown", o.breakdown, "print every tensor live at each variant's device peak (rank 0)");
  sub->add_option("--torch-script", o.torch_script, "the PyTorch companion script");
  sub->add_option("--python", o.python, "the Python with torch");
}

void bench_checkpoint_register(CLI::App& parent, Runner& run) {
  // The run's flags are every command's (common_register); the runner hands them to the benchmark.
  struct Parsed {
    CommonOptions common;
    bench::BenchCheckpointOptions bench;
  };
  auto opts = std::make_shared<Parsed>();
  bench::BenchCheckpointOptions& o = opts->bench;
  CLI::App* sub = parent.add_subcommand("checkpoint", "device vs SCO checkpoint boundaries: peaks and step time");
  sub->callback([&run, opts] {
    run = [opts] {
      const CommonOptions& c = opts->common;
      bench::BenchCheckpointOptions b = opts->bench;
      b.config = c.config;
      b.overrides = c.overrides;
      b.device = c.device;
      b.device_mem = c.device_mem;
      b.host_mem = c.host_mem;
      return bench::bench_checkpoint_run(b);
    };
  });
  common_register(*sub, opts->common);
  sub->add_option("--layers", o.layers, "model.num_hidden_layers (default: the config's)")->check(at_least(1));
  sub->add_option("--repeats", o.repeats, "timed steps per variant (median reported)");
  sub->add_option("--warmup", o.warmup, "untimed steps per variant first (the first one is the bitwise check)");
  sub->add_option("--link-gbps", o.link_gbps,
                  "emulate a host-device link of this many GB/s for the copy streams (0: plain memcpy)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--json", o.json, "write the results here");
}

void bench_optimizer_register(CLI::App& parent, Runner& run) {
  auto opts = std::make_shared<bench::BenchOptimizerOptions>();
  bench::BenchOptimizerOptions& o = *opts;
  CLI::App* sub = parent.add_subcommand(
      "optimizer", "device / offload_serial / offload_stream AdamW: step time, memory, CPU AdamW vs bandwidth");
  sub->callback([&run, opts] { run = [opts] { return bench::bench_optimizer_run(*opts); }; });
  sub->add_option("--params", o.params, "parameter count of the synthetic MoE layout (50M, 1.5G, ...)");
  sub->add_option("--config", o.config, "use this run config's [model] and [optim] instead of --params");
  sub->add_option("--set", o.overrides, "override a config key (repeatable; with --config)");
  sub->add_option("--bucket-params", o.bucket_params, "parameters per bucket (default: optim.bucket_params)");
  sub->add_option("--slots", o.slots, "staging slot counts to run, comma separated")->delimiter(',');
  sub->add_option("--link-gbps", o.link_gbps,
                  "also run over an emulated host-device link of X GB/s (1e9 bytes/s per direction; comma "
                  "separated for several): copies take bytes / X seconds")
      ->delimiter(',');
  sub->add_option("--precision", o.precision,
                  "precision recipes to run, comma separated: fp32, bf16 or fp32,bf16 (each on its own parameters, "
                  "timed interleaved; default: the config's [precision], else fp32; bf16: bf16 weights and gradients, "
                  "f32 master and moments)")
      ->delimiter(',')
      ->check(CLI::IsMember({"fp32", "bf16"}));
  sub->add_option("--repeats", o.repeats, "timed steps per variant (median reported, >= 5)");
  sub->add_option("--warmup", o.warmup, "untimed steps first (the first copies the master)");
  sub->add_option("--json", o.json, "write the results here");
}

void bench_dispatch_register(CLI::App& parent, Runner& run) {
  auto opts = std::make_shared<bench::BenchDispatchOptions>();
  bench::BenchDispatchOptions& o = *opts;
  CLI::App* sub = parent.add_subcommand(
      "dispatch", "standard vs llep vs pipelined_llep expert dispatch (one MoE block): peaks, loads, time");
  sub->callback([&run, opts] { run = [opts] { return bench::bench_dispatch_run(*opts); }; });
  sub->add_option("--tokens", o.tokens, "N, tokens per rank");
  sub->add_option("--experts", o.experts, "E, experts (a multiple of the rank count)");
  sub->add_option("--top-k", o.top_k, "k, experts per token");
  sub->add_option("--hidden", o.hidden, "H, hidden size");
  sub->add_option("--intermediate", o.intermediate, "I, expert FFN width");
  sub->add_option("--profile", o.profile, "routing profile: balanced or hot:R:H");
  key_option(*sub, "pipelined.chunk_cap", o.chunk_cap);
  key_option(*sub, "pipelined.max_chunks", o.max_chunks);
  key_option(*sub, "llep.lambda", o.lambda);
  key_option(*sub, "llep.alpha", o.alpha);
  key_option(*sub, "llep.min_tokens_per_gemm", o.min_tokens_per_gemm);
  key_option(*sub, "moe.token_chunk", o.token_chunk,
             "also run pipelined_llep (strided) with the token side in chunks of this many tokens (0: not)");
  sub->add_option("--device", o.device, "cpu (peaks and time) or meta (exact peaks, nothing computed)")
      ->check(CLI::IsMember({"cpu", "meta"}));
  sub->add_option("--repeats", o.repeats, "timed runs per variant (median reported)");
  sub->add_option("--warmup", o.warmup, "untimed runs first");
  sub->add_option("--json", o.json, "write the results here");
}

void bench_kernels_register(CLI::App& parent, Runner& run) {
  auto opts = std::make_shared<bench::BenchKernelsOptions>();
  bench::BenchKernelsOptions& o = *opts;
  CLI::App* sub = parent.add_subcommand(
      "kernels", "every entry of the kernel table at the paper's scale: GFLOP/s or GB/s against the machine's limits");
  sub->callback([&run, opts] { run = [opts] { return bench::bench_kernels_run(*opts); }; });
  sub->add_option("--backend", o.backend,
                  "cpu (timed), meta (shapes, FLOPs and bytes, no time) or cuda (a GPU: missing entries listed)");
  sub->add_option("--dtype", o.dtype, "storage dtype of the entries' tensor operands: f32, bf16 or both")
      ->check(CLI::IsMember({"f32", "bf16", "both"}));
  sub->add_option("--only", o.only, "only the entries whose name matches this regex (e.g. 'attention|gemm')");
  sub->add_option("--repeats", o.repeats, "timed calls per entry, at most (median reported; fewer once 2 s are spent)")
      ->check(at_least(1));
  sub->add_option("--warmup", o.warmup, "untimed calls per entry first")->check(CLI::NonNegativeNumber);
  sub->add_option("--scale", o.scale, "paper (the paper's shapes, printed per row) or small (tiny shapes: seconds)")
      ->check(CLI::IsMember({"paper", "small"}));
  sub->add_option("--json", o.json, "write the results here");
}

void bench_calibrate_register(CLI::App& parent, Runner& run) {
  auto opts = std::make_shared<bench::BenchCalibrateOptions>();
  bench::BenchCalibrateOptions& o = *opts;
  CLI::App* sub = parent.add_subcommand(
      "calibrate",
      "measure this machine's device profile `local` (GEMM rates and routes, memory, links, launch) "
      "for plan --profile local");
  sub->callback([&run, opts] { run = [opts] { return bench::bench_calibrate_run(*opts); }; });
  sub->add_option("--out", o.out, "the profile file (default $FLATPEAK_PROFILE_LOCAL, else runs/profile/local.json)");
  sub->add_option("--repeats", o.repeats, "timed runs per measurement (median)")->check(at_least(1));
}

}  // namespace fp::cli
