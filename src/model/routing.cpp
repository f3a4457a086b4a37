#include "model/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/log.h"

namespace fp {

namespace {
// Hot slots per hot token, and how many tokens are hot (Note [Hot routes per slot]).
struct HotSplit {
  int64_t s = 0, n_hot = 0;
};
HotSplit hot_split(const RoutingProfile& p, int64_t n, int64_t k, int64_t E) {
  const int64_t h = p.hot_experts;
  routing_profile_check(p, k, E, "routing profile");  // callers validated it already; a direct caller gets the error
  HotSplit hs;
  hs.s = std::min(h, k);
  // k / s is exactly 1 when h >= k: then n_hot = floor(R n), as before per-slot routing existed.
  const double per_token = static_cast<double>(k) / static_cast<double>(hs.s);
  hs.n_hot = std::min<int64_t>(n, static_cast<int64_t>(std::floor(p.hot_fraction * per_token * static_cast<double>(n))));
  return hs;
}
}  // namespace

void routing_profile_check(const RoutingProfile& p, int64_t k, int64_t E, const std::string& key) {
  if (p.kind != RoutingProfile::Kind::Kind_hot) return;
  const int64_t h = p.hot_experts, s = std::min(h, k);
  FP_CHECK(E - h >= k, "a token's k experts are distinct: cold slots need k cold experts",
           "{} = \"{}\" needs at least k = {} cold experts, but E - H = {} - {} = {}", key, p.str(), k, E, h, E - h);
  FP_CHECK(p.hot_fraction * static_cast<double>(k) <= static_cast<double>(s),
           "with H < k a token can send only H of its k routes to the hot experts (Note [Hot routes per slot])",
           "{} = \"{}\": at most H / k = {} / {} of the routes can go to {} hot experts", key, p.str(), s, k, h);
}

void routing_profile_assign(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int32_t* topk_idx) {
  FP_ASSERT(p.kind != RoutingProfile::Kind::Kind_router);
  if (p.kind == RoutingProfile::Kind::Kind_balanced) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) topk_idx[i * k + j] = static_cast<int32_t>((i + j) % E);
    return;
  }
  const int64_t h = p.hot_experts;
  const HotSplit hs = hot_split(p, n, k, E);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      topk_idx[i * k + j] = static_cast<int32_t>(i < hs.n_hot && j < hs.s ? j : h + (i + j) % (E - h));
}

// ---- closed form ---------------------------------------------------------------------------------
// Note [Meta routes a profile in closed form]
// On meta nothing is computed, so the routing arrays (host_topk (n, k), the expert order (m), and
// PipelinedLLEP's per-row destination and chunk) would be built only to be counted: at 1M tokens on
// 64 ranks that is 1.9M routed copies and ~50 MB of host arrays per rank, most of a plan point's
// time (page faults included). Under a profile the counts are arithmetic instead: ProfileTokens gives,
// per expert, how many of its rows lie in a token range (the expert offsets) or in a token range and
// a residue class (a strided chunk), and which token holds its row p (where an LLEP piece starts).
// The cpu backend keeps the arrays (it moves the rows); tests compare the two on the same profiles
// (tests/unit/test_routing.cpp; every cpu-vs-meta ledger test under a profile).

namespace {
int64_t floor_mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }

// Tokens i in [0, t) with i = x (mod L), 0 <= x < L.
int64_t below(int64_t t, int64_t x, int64_t L) { return t > x ? (t - x - 1) / L + 1 : 0; }

// The inverse of a modulo m (gcd(a, m) = 1, m >= 1).
int64_t inverse_mod(int64_t a, int64_t m) {
  int64_t r0 = m, r1 = floor_mod(a, m), s0 = 0, s1 = 1;
  while (r1 != 0) {
    const int64_t q = r0 / r1;
    std::tie(r0, r1) = std::make_pair(r1, r0 - q * r1);
    std::tie(s0, s1) = std::make_pair(s1, s0 - q * s1);
  }
  return floor_mod(s0, m);
}
}  // namespace

ProfileTokens::ProfileTokens(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int64_t e) : n_(n) {
  FP_ASSERT(p.kind != RoutingProfile::Kind::Kind_router && k <= E && e >= 0 && e < E);
  if (p.kind == RoutingProfile::Kind::Kind_balanced) {
    for (int64_t j = 0; j < k; ++j) runs_.push_back({0, n, E, floor_mod(e - j, E)});
    return;
  }
  const int64_t h = p.hot_experts;
  const HotSplit hs = hot_split(p, n, k, E);
  if (e < hs.s) runs_.push_back({0, hs.n_hot, 1, 0});  // slot e of every hot token
  if (e >= h)
    for (int64_t j = 0; j < k; ++j) {
      runs_.push_back({hs.n_hot, n, E - h, floor_mod(e - h - j, E - h)});            // cold tokens, every slot
      if (j >= hs.s) runs_.push_back({0, hs.n_hot, E - h, floor_mod(e - h - j, E - h)});  // hot tokens' cold slots
    }
}

int64_t ProfileTokens::count(int64_t lo, int64_t hi) const {
  // count_mod(lo, hi, 1, 0) without its residue arithmetic (nth's binary search calls this most).
  int64_t total = 0;
  for (const Run& r : runs_) {
    const int64_t a = std::max(lo, r.begin), b = std::min(hi, r.end);
    if (a < b) total += below(b, r.res, r.step) - below(a, r.res, r.step);
  }
  return total;
}

int64_t ProfileTokens::count_mod(int64_t lo, int64_t hi, int64_t K, int64_t c) const {
  int64_t total = 0;
  for (const Run& r : runs_) {
    const int64_t a = std::max(lo, r.begin), b = std::min(hi, r.end);
    if (a >= b) continue;
    // i = r.res (mod r.step) and i = c (mod K): one class modulo lcm, or none (Chinese remainder).
    const int64_t g = std::gcd(r.step, K);
    if (floor_mod(c - r.res, g) != 0) continue;
    const int64_t Kg = K / g, L = r.step * Kg;
    const int64_t t = floor_mod((c - r.res) / g % Kg * inverse_mod(r.step / g, Kg), Kg);
    const int64_t x = floor_mod(r.res + r.step * t, L);
    total += below(b, x, L) - below(a, x, L);
  }
  return total;
}

void ProfileTokens::count_classes(int64_t lo, int64_t hi, int64_t K, int64_t* by_class) const {
  for (const Run& r : runs_) {
    const int64_t a = std::max(lo, r.begin), b = std::min(hi, r.end);
    const int64_t x0 = a + floor_mod(r.res - a, r.step);  // the run's first token at or after a
    if (x0 >= b) continue;
    // N tokens x0 + step q; their classes mod K repeat with period P = K / gcd(step, K).
    const int64_t N = (b - 1 - x0) / r.step + 1, P = K / std::gcd(r.step, K), full = N / P, rem = N % P;
    const int64_t inc = r.step % K;
    int64_t cls = x0 % K;
    for (int64_t q = 0; q < std::min(N, P); ++q) {
      by_class[cls] += full + (q < rem ? 1 : 0);
      cls += inc;
      if (cls >= K) cls -= K;
    }
  }
}

int64_t ProfileTokens::nth(int64_t p) const {
  FP_ASSERT(p >= 0 && p < count(0, n_), "ProfileTokens::nth: row {} of {}", p, count(0, n_));
  int64_t lo = 0, hi = n_ - 1;  // the smallest t with count(0, t + 1) > p
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (count(0, mid + 1) > p)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

void routing_profile_offsets(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int64_t* offsets) {
  routing_profile_offsets_range(p, n, k, E, 0, n, offsets);
}

void routing_profile_offsets_range(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int64_t t0, int64_t t1,
                                   int64_t* offsets) {
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + ProfileTokens(p, n, k, E, e).count(t0, t1);
}

RoutingProfile routing_profile_on(const RoutingProfile& p, bool computes) {
  if (computes || p.kind != RoutingProfile::Kind::Kind_router) return p;
  log_info("meta computes no router: using moe.routing_profile = \"balanced\"");
  RoutingProfile balanced = p;
  balanced.kind = RoutingProfile::Kind::Kind_balanced;
  return balanced;
}

}  // namespace fp
