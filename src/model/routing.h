// Routing profiles (README, the [moe] settings): the experts each token goes to, overriding the router, so that a
// meta run (which computes no router) and a cpu run allocate exactly the same sizes, and so that
// benchmarks set the skew. Pure host arithmetic.
//
// Per rank, token i of n, slot j of k, E experts (Note [Hot routes per slot]):
//   balanced:   expert (i + j) mod E
//   hot(R, h):  a fraction R of the routes goes to the h hot experts. With s = min(h, k) hot slots per
//               hot token, the first n_hot = floor(R n k / s) tokens send slots j < s to expert j and
//               slots j >= s to h + ((i + j) mod (E - h)); every other token sends slot j to
//               h + ((i + j) mod (E - h)).
//
// Note [Hot routes per slot]: a profile is a benchmark load, not a router: it fixes how many routes
// each expert receives so that a meta run and a cpu run see the same skew. A token's k experts must
// be distinct, so with h >= k a hot token puts all k slots on hot experts (experts 0 .. k-1; the
// other hot experts get nothing, which is the skew the recorded figures were measured with), and
// with h < k only h of them: "hot 0.5/4" at k = 8 (half of the routes to 4 experts) is every token
// sending 4 slots to experts 0-3 and 4 to cold experts. So R <= s / k, and the cold slots need
// E - h >= k distinct cold experts (routing_profile_check).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace fp {

// Refuses (fp::Error naming `key`) a hot profile these k and E cannot route: R > min(h, k) / k, or
// fewer than k cold experts (E - h < k).
void routing_profile_check(const RoutingProfile& p, int64_t k, int64_t E, const std::string& key);

// The profile a run routes with on a backend: one that computes nothing (meta) has no router to run,
// so "router" becomes "balanced" there, said once in the log; any other profile is kept.
RoutingProfile routing_profile_on(const RoutingProfile& p, bool computes);

// topk_idx (n, k). Asserts the profile is not "router".
void routing_profile_assign(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int32_t* topk_idx);

// The tokens of one rank that a profile sends to expert e, in closed form (what meta uses instead of
// the (n, k) routing arrays: Note [Meta routes a profile in closed form]). They are at most k disjoint
// arithmetic progressions {i in [begin, end) : i = res (mod step)}:
//   balanced:  res = (e - j) mod E, step E, over [0, n), for each slot j < k
//   hot(R, h): e < s: every token of [0, n_hot) (slot e);  s <= e < h: none;
//              e >= h: res = (e - h - j) mod (E - h), step E - h, over [n_hot, n) for each slot j, and
//              over [0, n_hot) for each slot j >= s
// A token sends at most one copy to an expert (the k experts of a token are distinct), so expert e's
// rows in expert order (ops::moe_routing_build: tokens ascending, then slots) are these tokens ascending.
class ProfileTokens {
 public:
  ProfileTokens(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int64_t e);
  // Tokens in [lo, hi).
  int64_t count(int64_t lo, int64_t hi) const;
  // Tokens in [lo, hi) that are = c (mod K) (K >= 1).
  int64_t count_mod(int64_t lo, int64_t hi, int64_t K, int64_t c) const;
  // Adds to by_class[c] the tokens in [lo, hi) that are = c (mod K), for every c < K at once
  // (count_mod for each c, in O(k K) without a division per class).
  void count_classes(int64_t lo, int64_t hi, int64_t K, int64_t* by_class) const;
  // The token of the expert's row p (0 <= p < count(0, n)).
  int64_t nth(int64_t p) const;

 private:
  struct Run {
    int64_t begin, end, step, res;
  };
  std::vector<Run> runs_;
  int64_t n_ = 0;
};

// offsets (E + 1): the rows of each expert in expert order under the profile, as ops::moe_routing_build
// would count them from routing_profile_assign's choice.
void routing_profile_offsets(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int64_t* offsets);
// The same for the rank's tokens [t0, t1) only (a chunk of the MoE block's token side): what
// ops::moe_routing_build counts from rows [t0, t1) of routing_profile_assign's (n, k) choice.
void routing_profile_offsets_range(const RoutingProfile& p, int64_t n, int64_t k, int64_t E, int64_t t0, int64_t t1,
                                   int64_t* offsets);

}  // namespace fp
