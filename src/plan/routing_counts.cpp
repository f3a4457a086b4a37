#include "plan/routing_counts.h"

#include <cmath>

#include "core/error.h"

namespace fp::plan {

namespace {
// Integers i in [0, x) with i mod M == r (0 <= r < M).
int64_t count_below(int64_t x, int64_t M, int64_t r) { return x / M + (x % M > r ? 1 : 0); }
// Integers i in [a, b) with i mod M == r.
int64_t count_in(int64_t a, int64_t b, int64_t M, int64_t r) {
  return b <= a ? 0 : count_below(b, M, r) - count_below(a, M, r);
}
int64_t mod(int64_t a, int64_t M) { return ((a % M) + M) % M; }
}  // namespace

std::vector<int64_t> routing_counts(const RoutingProfile& p, int64_t N, int64_t k, int64_t E) {
  FP_CHECK(p.kind != RoutingProfile::Kind::Kind_router, "plan with routing=balanced or routing=hot:R:H",
           "the model's own router is data dependent: the planner needs a routing profile");
  std::vector<int64_t> c(static_cast<size_t>(E), 0);
  if (p.kind == RoutingProfile::Kind::Kind_balanced) {
    // token i, slot j -> (i + j) mod E
    for (int64_t e = 0; e < E; ++e)
      for (int64_t j = 0; j < k; ++j) c[e] += count_in(0, N, E, mod(e - j, E));
    return c;
  }
  const int64_t h = p.hot_experts;
  FP_CHECK(h >= k && E - h >= k, "a hot profile hot:R:H needs top-k <= H <= experts - top-k",
           "routing hot:{}:{} with k = {} and E = {}", p.hot_fraction, h, k, E);
  const int64_t n_hot = static_cast<int64_t>(std::floor(p.hot_fraction * static_cast<double>(N)));
  // the first n_hot tokens: slot j -> j mod h; the others: slot j -> h + (i + j) mod (E - h)
  for (int64_t j = 0; j < k; ++j) c[j % h] += n_hot;
  for (int64_t e = h; e < E; ++e)
    for (int64_t j = 0; j < k; ++j) c[e] += count_in(n_hot, N, E - h, mod(e - h - j, E - h));
  return c;
}

}  // namespace fp::plan
