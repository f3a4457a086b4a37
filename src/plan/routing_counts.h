// How many routed copies each expert receives under a routing profile, in closed form (the counts
// of model/routing.cpp's routing_profile_assign without enumerating tokens), and the receive volume
// of the hottest rank under standard expert parallelism. Pure arithmetic.
// Legend: N tokens per rank, k top-k, E experts, ep expert-parallel ranks (expert e lives on rank
// e / (E / ep)).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace fp::plan {

// (E) copies per expert from one rank's N tokens. Throws fp::Error for the "router" profile (data
// dependent) and for a hot profile without k <= h <= E - k.
std::vector<int64_t> routing_counts(const RoutingProfile& p, int64_t N, int64_t k, int64_t E);

// The most routes any of the ep ranks receives when each of the ep ranks routes its own N tokens by
// the profile (the same profile on every rank, as in a meta run): ep * (its experts' counts).
int64_t routes_received_max(const RoutingProfile& p, int64_t N, int64_t k, int64_t E, int64_t ep);

}  // namespace fp::plan
