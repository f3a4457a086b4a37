// Routing profiles (DESIGN.md): the experts each token goes to, overriding the router, so that a
// meta run (which computes no router) and a cpu run allocate exactly the same sizes, and so that
// benchmarks set the skew. Pure host arithmetic.
//
// Per rank, token i of n, slot j of k, E experts:
//   balanced:   expert (i + j) mod E
//   hot(R, h):  the first floor(R n) tokens send slot j to expert j mod h; every other token sends
//               slot j to h + ((i + j) mod (E - h)).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace fp {

// topk_idx (n, k). Asserts the profile is not "router".
void routing_profile_assign(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int32_t* topk_idx);

}  // namespace fp
