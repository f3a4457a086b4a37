// How many routed copies each expert receives under a routing profile, in closed form (the counts
// of model/routing.cpp's routing_profile_assign without enumerating tokens). Pure arithmetic; what
// each rank receives is plan/dispatch_counts.h.
// Legend: N tokens per rank, k top-k, E experts.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace fp::plan {

// (E) copies per expert from one rank's N tokens. Throws fp::Error for the "router" profile (data
// dependent) and for a hot profile without k <= h <= E - k.
std::vector<int64_t> routing_counts(const RoutingProfile& p, int64_t N, int64_t k, int64_t E);

}  // namespace fp::plan
