// The vocabulary head (final RMSNorm, lm_head, log-softmax, token-mean cross-entropy and their
// gradients) in double, beside a bound on how far any float evaluation of it can be from that value,
// element by element (Note [Tolerances from an error model] in error_bound.h). The Ring-DTP tests
// (tests/model/test_ring_dtp.cpp on one rank, tests/dist/ring_dtp_case.cpp under mpirun) check the
// full head and the ring against it: whichever BLAS kernels, strip heights, sub-blocks or rank counts
// ordered the sums. Header-only, test code only.
//
// Legend: N tokens, H hidden, V vocabulary; g = scale (softmax - onehot), the logits' gradient.
//
// The model, one evaluation (each e is an absolute bound on that quantity's error; gamma from
// error_bound.h; every stored float adds u of itself):
//   xn = x rstd w                 relative e_xn = gamma(H + 6)          (mean of squares, sqrt, 2 products)
//   z[t,v] = sum_h xn W           e_z = (gamma(H) + e_xn) sum_h |xn W|
//   lse[t]                        e_lse = max_v e_z + gamma(4V + 16) + 4u max_v |z - lse|
//                                 (a weighted mean of the logits' errors; V positive terms, each with an
//                                 exp and the online merges' rescalings: 4 roundings a term is generous)
//   p = exp(z - lse)              relative e_p = e_z + e_lse + 4u (1 + |z - lse|)
//   g = scale (p - y)             e_g = scale p e_p
//   dy[t,h] = sum_v g W           e_dy = gamma(V + ranks) sum_v |g W| + sum_v e_g |W|  (ranks' partials)
//   dx = rstd (w dy - xhat mean_j(w dy xhat))      linear in dy: its coefficients' magnitudes carry e_dy,
//                                 and gamma(H + 6) the magnitudes of its own terms, plus e_xn |dx|
//   dnorm[h] = g0 + sum_t dy xhat        K = N + ranks: sum_t (e_dy |xhat| + e_xn |dy xhat|) + gamma(K) sum
//   dW[v,h] = g0 + sum_t g xn            K = N + 1:     sum_t (e_g |xn| + e_xn |g xn|) + gamma(K) sum
//   loss = sum_t (lse - z_target)        sum_t (e_lse + e_z) + gamma(N + ranks) sum_t |loss_t|
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "error_bound.h"

namespace fp::head_test {

struct HeadReference {
  // Values, in double.
  double loss_sum = 0;
  std::vector<double> logits, dx, dnorm, dW;  // (N, V), (N, H), (H), (V, H); dnorm and dW include g0
  // Bounds on one float evaluation's distance from them, element by element.
  double loss_bound = 0;
  std::vector<double> logits_bound, dx_bound, dnorm_bound, dW_bound;
};

// x (N, H), w (H), W (V, H); targets (N) with -100 ignored; scale the loss's 1/count. dnorm0 (H) and
// dW0 (V, H) are the gradients' starting values (empty: zeros). ranks: how many partial sums of
// dnorm and the loss are added at the end (1 on one process). Logits are kept when keep_logits.
inline HeadReference head_reference(const std::vector<float>& x, const std::vector<float>& w,
                                    const std::vector<float>& W, const std::vector<int32_t>& targets, double scale,
                                    const std::vector<float>& dnorm0, const std::vector<float>& dW0, double eps,
                                    int ranks, bool keep_logits) {
  using test_bound::gamma;
  const double u = test_bound::kUnitF32;
  const int64_t H = static_cast<int64_t>(w.size()), N = static_cast<int64_t>(targets.size());
  const int64_t V = static_cast<int64_t>(W.size()) / H;
  const double e_xn = gamma(static_cast<double>(H + 6));
  HeadReference r;
  r.dx.assign(N * H, 0.0);
  r.dx_bound.assign(N * H, 0.0);
  r.dnorm.assign(H, 0.0);
  r.dW.assign(V * H, 0.0);
  std::vector<double> dnorm_abs(H, 0.0), dnorm_err(H, 0.0);  // sum_t |dy xhat|; sum_t (e_dy |xhat| + e_xn |..|)
  std::vector<double> dW_abs(V * H, 0.0), dW_err(V * H, 0.0);
  if (keep_logits) {
    r.logits.assign(N * V, 0.0);
    r.logits_bound.assign(N * V, 0.0);
  }
  double loss_abs = 0, loss_err = 0;
  std::vector<double> xhat(H), xn(H), z(V), ez(V), g(V), eg(V), dy(H), edy(H), dy_abs(H);
  for (int64_t t = 0; t < N; ++t) {
    double ss = 0;
    for (int64_t h = 0; h < H; ++h) ss += static_cast<double>(x[t * H + h]) * x[t * H + h];
    const double rstd = 1.0 / std::sqrt(ss / static_cast<double>(H) + eps);
    for (int64_t h = 0; h < H; ++h) {
      xhat[h] = x[t * H + h] * rstd;
      xn[h] = xhat[h] * w[h];
    }
    double m = -INFINITY, ez_max = 0;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0, a = 0;
      for (int64_t h = 0; h < H; ++h) {
        s += xn[h] * W[v * H + h];
        a += std::abs(xn[h] * W[v * H + h]);
      }
      z[v] = s;
      ez[v] = (gamma(static_cast<double>(H)) + e_xn) * a + u * std::abs(s);
      m = std::max(m, s);
      ez_max = std::max(ez_max, ez[v]);
      if (keep_logits) {
        r.logits[t * V + v] = s;
        r.logits_bound[t * V + v] = ez[v];
      }
    }
    double se = 0;
    for (int64_t v = 0; v < V; ++v) se += std::exp(z[v] - m);
    const double lse = m + std::log(se);
    double spread = 0;
    for (int64_t v = 0; v < V; ++v) spread = std::max(spread, std::abs(z[v] - lse));
    const double e_lse = ez_max + gamma(static_cast<double>(4 * V + 16)) + 4 * u * spread + u * std::abs(lse);
    const int32_t y = targets[t];
    if (y == -100) continue;  // no loss, no gradient
    const double loss_t = lse - z[y];
    r.loss_sum += loss_t;
    loss_abs += std::abs(loss_t);
    loss_err += e_lse + ez[y] + u * std::abs(loss_t);
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(z[v] - lse);
      const double e_p = ez[v] + e_lse + 4 * u * (1 + std::abs(z[v] - lse));
      g[v] = scale * (p - (v == y ? 1.0 : 0.0));
      eg[v] = scale * p * e_p + u * std::abs(g[v]);
    }
    for (int64_t h = 0; h < H; ++h) {
      double s = 0, a = 0, e = 0;
      for (int64_t v = 0; v < V; ++v) {
        s += g[v] * W[v * H + h];
        a += std::abs(g[v] * W[v * H + h]);
        e += eg[v] * std::abs(W[v * H + h]);
      }
      dy[h] = s;
      dy_abs[h] = a;
      edy[h] = gamma(static_cast<double>(V + ranks)) * a + e + u * std::abs(s);
    }
    // dx = rstd (w dy - xhat c), c = mean_j (w dy xhat).
    double c = 0, c_abs = 0, c_err = 0;
    for (int64_t j = 0; j < H; ++j) {
      c += w[j] * dy[j] * xhat[j] / static_cast<double>(H);
      c_abs += std::abs(w[j] * dy_abs[j] * xhat[j]) / static_cast<double>(H);
      c_err += std::abs(w[j] * xhat[j]) * edy[j] / static_cast<double>(H);
    }
    for (int64_t h = 0; h < H; ++h) {
      const double dxh = rstd * (w[h] * dy[h] - xhat[h] * c);
      r.dx[t * H + h] = dxh;
      const double terms = rstd * (std::abs(w[h] * dy_abs[h]) + std::abs(xhat[h]) * c_abs);
      r.dx_bound[t * H + h] = rstd * (std::abs(w[h]) * edy[h] + std::abs(xhat[h]) * c_err) +
                              (gamma(static_cast<double>(H + 6)) + e_xn) * terms + u * std::abs(dxh);
      r.dnorm[h] += dy[h] * xhat[h];
      dnorm_abs[h] += dy_abs[h] * std::abs(xhat[h]);
      dnorm_err[h] += edy[h] * std::abs(xhat[h]) + e_xn * dy_abs[h] * std::abs(xhat[h]);
    }
    for (int64_t v = 0; v < V; ++v)
      for (int64_t h = 0; h < H; ++h) {
        r.dW[v * H + h] += g[v] * xn[h];
        dW_abs[v * H + h] += std::abs(g[v] * xn[h]);
        dW_err[v * H + h] += eg[v] * std::abs(xn[h]) + e_xn * std::abs(g[v] * xn[h]);
      }
  }
  r.loss_bound = loss_err + gamma(static_cast<double>(N + ranks)) * loss_abs + u * std::abs(r.loss_sum);
  r.dnorm_bound.resize(H);
  for (int64_t h = 0; h < H; ++h) {
    const double g0 = dnorm0.empty() ? 0.0 : dnorm0[h];
    r.dnorm[h] += g0;
    r.dnorm_bound[h] = dnorm_err[h] + gamma(static_cast<double>(N + ranks + 1)) * (std::abs(g0) + dnorm_abs[h]) +
                       u * std::abs(r.dnorm[h]);
  }
  r.dW_bound.resize(V * H);
  for (int64_t i = 0; i < V * H; ++i) {
    const double g0 = dW0.empty() ? 0.0 : dW0[i];
    r.dW[i] += g0;
    r.dW_bound[i] = dW_err[i] + gamma(static_cast<double>(N + 1)) * (std::abs(g0) + dW_abs[i]) + u * std::abs(r.dW[i]);
  }
  return r;
}

}  // namespace fp::head_test
