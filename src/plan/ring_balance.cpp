#include "plan/ring_balance.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "backend/registry.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/attention_block.h"
#include "plan/plan.h"

namespace fp::plan {

namespace {

double max_over_mean(const std::vector<int64_t>& v) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return mean > 0 ? static_cast<double>(*std::max_element(v.begin(), v.end())) / mean : 1.0;
}

// Every rank's work in the window `one` (B = 1) under the assignment `ranks`: its queries against every
// rank's keys.
void window_work(const Batch& one, const std::vector<std::vector<int32_t>>& ranks, int64_t window, SplitWork& out) {
  const int W = static_cast<int>(ranks.size());
  const ops::Kernels& cpu = backend_get("cpu").kernels();  // the cpu kernel's tiles (plan/ring_balance.h)
  std::vector<int64_t> tiles(static_cast<size_t>(W)), pairs(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) {
    const std::vector<int32_t>& q = ranks[r];
    std::vector<int32_t> starts(q.size());
    for (size_t i = 0; i < q.size(); ++i) starts[i] = one.doc_start[q[i]];
    for (int s = 0; s < W; ++s) {
      const std::vector<int32_t>& k = ranks[s];
      const ops::AttentionSpec a =
          ops::attention_block_spec(q.data(), k.data(), 1, static_cast<int64_t>(q.size()),
                                    static_cast<int64_t>(k.size()), 1, 1, 1, 1, 1.0f, window, starts.data());
      tiles[r] += cpu.attention_block_tile_pairs(a);
    }
    pairs[r] = context_work(one, q, window);
  }
  out.tile_pairs.push_back(std::move(tiles));
  out.pairs.push_back(std::move(pairs));
}

// Each window's max / mean over the ranks.
std::vector<double> window_ratios(const std::vector<std::vector<int64_t>>& w) {
  std::vector<double> r;
  for (const std::vector<int64_t>& v : w) r.push_back(max_over_mean(v));
  return r;
}

double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

double SplitWork::mean_max_over_mean() const { return mean(window_ratios(tile_pairs)); }
double SplitWork::worst_max_over_mean() const {
  const std::vector<double> r = window_ratios(tile_pairs);
  return *std::max_element(r.begin(), r.end());
}
double SplitWork::pairs_mean_max_over_mean() const { return mean(window_ratios(pairs)); }

DocMix doc_mix_parse(const std::string& text, const std::string& flag) {
  DocMix m;
  const char* hint = "write mean=SIZE,tail=SIGMA[,seed=N], e.g. --docs mean=16K,tail=1.5";
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find(',', at), text.size()), eq = text.find('=', at);
    FP_CHECK(eq != std::string::npos && eq < end, hint, "{} {}: '{}' is not key=value", flag, text,
             text.substr(at, end - at));
    const std::string key = text.substr(at, eq - at), value = text.substr(eq + 1, end - eq - 1);
    if (key == "mean") {
      m.mean = static_cast<double>(context_parse(value));
    } else if (key == "tail" || key == "seed") {
      char* stop = nullptr;
      const double v = std::strtod(value.c_str(), &stop);
      FP_CHECK(stop != value.c_str() && *stop == '\0' && v >= 0, hint, "{} {}: {} = '{}' is not a number >= 0", flag,
               text, key, value);
      if (key == "tail")
        m.tail = v;
      else
        m.seed = static_cast<uint64_t>(v);
    } else {
      throw Error(fmt::format("{} {}: unknown key '{}'", flag, text, key), hint);
    }
    at = end + 1;
  }
  FP_CHECK(m.mean >= 1, hint, "{} {}: the mean document length must be at least 1 token", flag, text);
  return m;
}

Batch doc_mix_windows(const DocMix& mix, int64_t T, int64_t windows) {
  Rng rng(mix.seed);
  const double mu = std::log(mix.mean) - 0.5 * mix.tail * mix.tail;  // E[exp(mu + tail Z)] = mean
  Batch g;
  g.B = windows;
  g.T = T;
  g.doc_start.resize(static_cast<size_t>(windows * T));
  int64_t left = 0;  // tokens left in the current document
  for (int64_t b = 0; b < windows; ++b) {
    int32_t start = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (left == 0) {
        left = std::max<int64_t>(1, std::llround(std::exp(mu + mix.tail * rng.normal())));
        start = static_cast<int32_t>(t);
      }
      g.doc_start[b * T + t] = start;
      --left;
    }
  }
  return g;
}

RingBalance ring_balance(const DocMix& mix, int64_t T, int W, int64_t windows, int64_t window) {
  RingBalance r;
  r.T = T, r.W = W, r.windows = windows;
  const Batch g = doc_mix_windows(mix, T, windows);
  int64_t documents = 0;
  for (int64_t b = 0; b < windows; ++b) {
    const Batch one = batch_rows(g, b, 1);
    for (int64_t t = 0; t < T; ++t) documents += one.doc_start[t] == t;
    window_work(one, context_assignment(one, W, ContextSplit::ContextSplit_zigzag, window), window, r.zigzag);
    window_work(one, context_assignment(one, W, ContextSplit::ContextSplit_balanced, window), window, r.balanced);
  }
  r.documents_per_window = static_cast<double>(documents) / static_cast<double>(windows);
  return r;
}

std::string ring_balance_table(const DocMix& mix, const RingBalance& r) {
  std::string s = fmt::format(
      "ring attention work per rank and window (attention tile pairs over every rank's key block; a step waits for "
      "its most loaded rank), packed documents of mean {} tokens, tail {:g}: {} windows of {} tokens ({:.1f} "
      "documents each) on {} ranks\n",
      context_format(static_cast<int64_t>(mix.mean)), mix.tail, r.windows, context_format(r.T), r.documents_per_window,
      r.W);
  auto total = [](const SplitWork& w) {
    int64_t t = 0;
    for (const std::vector<int64_t>& v : w.tile_pairs) t = std::accumulate(v.begin(), v.end(), t);
    return static_cast<double>(t);
  };
  s += fmt::format("  {:<10} {:>22} {:>18} {:>22} {:>18}\n", "split", "max/mean (mean window)", "max/mean (worst)",
                   "pairs max/mean (mean)", "all tile pairs");
  for (const auto& [name, w] : {std::pair{"zigzag", &r.zigzag}, {"balanced", &r.balanced}})
    s += fmt::format("  {:<10} {:>22.3f} {:>18.3f} {:>22.3f} {:>17.3f}x\n", name, w->mean_max_over_mean(),
                     w->worst_max_over_mean(), w->pairs_mean_max_over_mean(), total(*w) / total(r.zigzag));
  return s;
}

}  // namespace fp::plan
