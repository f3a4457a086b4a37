// The op tests' one random generator and one comparator (as ggml's test-backend-ops: every op and every
// backend is fed and judged the same way), shared by every tests/ops/*.cpp.
//
// Generator: random_vector draws N(0, stddev^2) floats (or doubles) from the test's own Rng, never an
// exact zero (a zero input hides a missing term: x * 0 is 0 whatever x was paired with).
//
// Comparator: near(op, shape, got, want, tol) passes iff every element i has got and want finite and
// |got_i - want_i| <= tol(i, want_i), NaN and Inf never passing (Note [Element by element, never by
// norm] below). Its failure message names the op, the shape, how many elements failed, the worst one
// (largest |diff| / tolerance; the first non-finite one if any) by its multi-index, the first one, and
// the max-abs, max-relative and norm-relative errors of the whole tensor. The tolerances the tests
// state are built by the tol_* functions, each a formula a test states with its reason.
//
// Note [Element by element, never by norm]: a norm-only comparison (||got - want|| / ||want|| small)
// passes a kernel that gets a few elements badly wrong, e.g. a tile edge or a SIMD remainder; the
// norm-relative error is printed for orientation only, never tested.
#pragma once

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/buf.h"
#include "core/dtype.h"
#include "core/rng.h"

namespace fp::op_test {

// n values ~ N(0, stddev^2), one rng.normal() each, an exact zero replaced by stddev / 2.
template <class T = float>
std::vector<T> random_vector(int64_t n, Rng& rng, double stddev = 1.0) {
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) {
    x = static_cast<T>(stddev * rng.normal());
    if (x == T(0)) x = static_cast<T>(0.5 * stddev);
  }
  return v;
}

// n ids uniform in [0, V).
inline std::vector<int32_t> random_ids(int64_t n, int64_t V, Rng& rng) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& id : t) id = static_cast<int32_t>(rng.below(V));
  return t;
}

// (n, V) logits, row t ~ N(0, scale_t^2) with scale_t cycling through 1, 10 and 1e4 (the last makes all
// but a few exponentials underflow: the max subtraction must hold), an exact zero replaced by 0.5.
inline std::vector<float> random_logits(int64_t n, int64_t V, Rng& rng) {
  std::vector<float> v(static_cast<size_t>(n * V));
  const double scales[3] = {1.0, 10.0, 1e4};
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < V; ++i) {
      float& x = v[t * V + i];
      x = static_cast<float>(scales[t % 3] * rng.normal());
      if (x == 0.0f) x = 0.5f;
    }
  return v;
}

// n targets: every third (t % 3 == 1) the ignored id `ignore`, the others uniform in [0, V).
inline std::vector<int32_t> random_targets(int64_t n, int64_t V, Rng& rng, int32_t ignore) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[i] = i % 3 == 1 ? ignore : static_cast<int32_t>(rng.below(V));
  return t;
}

template <class T>
std::vector<T> converted(const std::vector<float>& x) {
  return std::vector<T>(x.begin(), x.end());
}

// The same bytes (so +0 and -0 differ, and a NaN equals only the same NaN).
inline bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Root mean square of the finite entries (0 when there are none).
template <class W>
double rms_finite(const std::vector<W>& x) {
  double s = 0;
  int64_t n = 0;
  for (const W v : x)
    if (std::isfinite(static_cast<double>(v))) s += static_cast<double>(v) * static_cast<double>(v), ++n;
  return n ? std::sqrt(s / static_cast<double>(n)) : 0.0;
}

// The central difference (L(v + h) - L(v - h)) / 2h of loss() in one of its float64 inputs v (a
// reference into what loss reads), v restored after: the gradient checks of the float64 references.
template <class Loss>
double central_difference(double& v, Loss&& loss, double h = 1e-5) {
  const double saved = v;
  v = saved + h;
  const double lp = loss();
  v = saved - h;
  const double lm = loss();
  v = saved;
  return (lp - lm) / (2 * h);
}

// The tolerance of element i whose expected value is want.
using Tol = std::function<double(size_t i, double want)>;

// Equal values (+0 == -0).
inline Tol tol_exact() {
  return [](size_t, double) { return 0.0; };
}
// A bound per element, computed by the test.
inline Tol tol_each(std::vector<double> bound) {
  return [b = std::move(bound)](size_t i, double) { return b[i]; };
}
// rel (|want_i| + rms(want)): the rms term is the magnitude of the tensor, so an element small only
// through cancellation (a gradient summing terms of both signs) is judged by the size of the terms
// around it, not by its own near-zero value.
template <class W>
Tol tol_near_rms(double rel, const std::vector<W>& want) {
  const double mag = rms_finite(want);
  return [rel, mag](size_t, double w) { return rel * (std::abs(w) + mag); };
}
// k float epsilons of |want_i|, plus floor.
inline Tol tol_ulps(double k, double floor = 0.0) {
  return [k, floor](size_t, double w) { return k * FLT_EPSILON * std::abs(w) + floor; };
}
// abs_rel (1 + |want_i|): absolute near zero, relative away from it.
inline Tol tol_abs_rel(double abs_rel) {
  return [abs_rel](size_t, double w) { return abs_rel * (1.0 + std::abs(w)); };
}

// A shape for the messages: the dims, outermost first, that unravel a flat index. {} or {n}: flat.
using Dims = std::vector<int64_t>;

inline std::string dims_str(const Dims& d) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < d.size(); ++i) s << (i ? ", " : "") << d[i];
  s << ")";
  return s.str();
}

inline std::string index_str(size_t flat, const Dims& d) {
  std::ostringstream s;  // not "[" + std::to_string(..): GCC 12 warns a false -Wrestrict on it
  if (d.size() <= 1) {
    s << "[" << flat << "]";
    return s.str();
  }
  std::vector<int64_t> idx(d.size());
  size_t rest = flat;
  for (size_t k = d.size(); k-- > 0;) {
    idx[k] = static_cast<int64_t>(rest % static_cast<size_t>(d[k]));
    rest /= static_cast<size_t>(d[k]);
  }
  s << dims_str(idx) << " (flat " << flat << ")";
  return s.str();
}

struct Options {
  bool neg_inf_exact = false;  // an expected -inf (a log-sum-exp over nothing) passes when got is -inf too
};

// The comparator (see the top of this file). op names the op and the case, shape the layout of the n
// elements (its product need not be n when only a prefix is compared: the index is unravelled by it).
template <class W>
::testing::AssertionResult near(const std::string& op, const Dims& shape, const float* got, const W* want, size_t n,
                                const Tol& tol, Options opt = {}) {
  size_t bad = 0, first = n, worst = n;
  double worst_ratio = -1.0, max_abs = 0.0, max_rel = 0.0, diff2 = 0.0, want2 = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = static_cast<double>(want[i]);
    if (opt.neg_inf_exact && w == -std::numeric_limits<double>::infinity() && g == w) continue;
    const double t = tol(i, w), d = std::abs(g - w);
    const bool finite = std::isfinite(g) && std::isfinite(w);
    if (finite) {
      max_abs = std::max(max_abs, d);
      if (w != 0.0) max_rel = std::max(max_rel, d / std::abs(w));
      diff2 += d * d;
      want2 += w * w;
    }
    if (finite && d <= t) continue;
    ++bad;
    if (first == n) first = i;
    const double ratio =
        finite ? (t > 0 ? d / t : std::numeric_limits<double>::max()) : std::numeric_limits<double>::infinity();
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  auto element = [&](size_t i) {
    std::ostringstream s;
    s.precision(9);
    const double g = got[i], w = static_cast<double>(want[i]);
    s << index_str(i, shape) << ": expected " << w << ", got " << g << " (|diff| " << std::abs(g - w) << ", tolerance "
      << tol(i, w) << ")";
    return s.str();
  };
  ::testing::AssertionResult r = ::testing::AssertionFailure();
  r << op << " " << dims_str(shape) << ": " << bad << " of " << n << " elements out of tolerance; worst at "
    << element(worst);
  if (first != worst) r << "; first at " << element(first);
  r << "; max-abs err " << max_abs << ", max-rel err " << max_rel << ", norm-rel err "
    << (want2 > 0 ? std::sqrt(diff2 / want2) : std::sqrt(diff2)) << " (finite elements)";
  return r;
}

template <class W>
::testing::AssertionResult near(const std::string& op, const Dims& shape, const std::vector<float>& got,
                                const std::vector<W>& want, const Tol& tol, Options opt = {}) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << op << " " << dims_str(shape) << ": " << got.size() << " elements, expected "
                                         << want.size();
  return near(op, shape, got.data(), want.data(), want.size(), tol, opt);
}

// Flat: the case named in op carries the shape.
template <class W>
::testing::AssertionResult near(const std::string& op, const std::vector<float>& got, const std::vector<W>& want,
                                const Tol& tol, Options opt = {}) {
  return near(op, Dims{static_cast<int64_t>(want.size())}, got, want, tol, opt);
}

// ---- bf16 operands (Note [Kernel operands carry their dtype] in core/buf.h)

inline constexpr DType kF32 = DType::DType_F32, kBF16 = DType::DType_BF16;

// A kernel operand stored as f32 or bf16, made from f32 values (rounded to nearest even for bf16).
struct Operand {
  DType dtype;
  std::vector<float> f;
  std::vector<bf16> h;

  Operand(DType t, const std::vector<float>& v) : dtype(t) {
    if (t == kF32) {
      f = v;
    } else {
      for (const float x : v) h.push_back({bf16_from_float(x)});
    }
  }
  Buf buf() { return dtype == kF32 ? Buf(f.data()) : Buf(h.data()); }
  CBuf cbuf() const { return dtype == kF32 ? CBuf(f.data()) : CBuf(h.data()); }
  // The values held, widened to f32 (exact).
  std::vector<float> values() const {
    if (dtype == kF32) return f;
    std::vector<float> v;
    for (const bf16 x : h) v.push_back(bf16_to_float(x.bits));
    return v;
  }
};

// v as dtype t stores it: rounded to bf16 and widened back, or v itself.
inline std::vector<float> stored(DType t, std::vector<float> v) {
  if (t == kBF16)
    for (float& x : v) x = bf16_to_float(bf16_from_float(x));
  return v;
}

inline std::string dt(DType t) { return std::string(dtype_name(t)); }

// x rounded to bf16 (nearest even), and bf16 values widened back (exact).
inline std::vector<bf16> rounded_bf16(const std::vector<float>& x) {
  std::vector<bf16> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = from_f32<bf16>(x[i]);
  return h;
}
inline std::vector<float> widened(const std::vector<bf16>& h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = to_f32(h[i]);
  return x;
}

// Bit for bit (then a bf16 result is the same bf16 as the expected one): near()'s message for
// differing values, else a note that only the bits (a zero's sign, a NaN's payload) differ.
inline ::testing::AssertionResult same_bits(const std::string& op, const Dims& shape, const std::vector<float>& got,
                                            const std::vector<float>& want) {
  if (bits_equal(got, want)) return ::testing::AssertionSuccess();
  ::testing::AssertionResult r = near(op, shape, got, want, tol_exact());
  if (!r) return r;
  return ::testing::AssertionFailure() << op << ": equal values with different bits";
}
inline ::testing::AssertionResult same_bits(const std::string& op, const std::vector<float>& got,
                                            const std::vector<float>& want) {
  if (bits_equal(got, want)) return ::testing::AssertionSuccess();
  ::testing::AssertionResult r = near(op, got, want, tol_exact());
  if (!r) return r;
  return ::testing::AssertionFailure() << op << ": equal values with different bits";
}

}  // namespace fp::op_test
