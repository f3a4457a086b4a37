#include "model/routing.h"

#include <cmath>

#include "core/error.h"

namespace fp {

void routing_profile_assign(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int32_t* topk_idx) {
  FP_ASSERT(p.kind != RoutingProfile::Kind::Kind_router);
  if (p.kind == RoutingProfile::Kind::Kind_balanced) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) topk_idx[i * k + j] = static_cast<int32_t>((i + j) % E);
    return;
  }
  const int64_t h = p.hot_experts;
  FP_ASSERT(h >= k && E - h >= k, "hot profile needs k <= h <= E - k");
  const int64_t n_hot = static_cast<int64_t>(std::floor(p.hot_fraction * static_cast<double>(n)));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j)
      topk_idx[i * k + j] = static_cast<int32_t>(i < n_hot ? j % h : h + (i + j) % (E - h));
}

}  // namespace fp
