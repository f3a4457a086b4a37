// Scalar reference of causal grouped-query attention (ops/attention.h), in T. Unlike the cpu kernel it
// materialises each (b, h)'s full (seq, seq) probability matrix: it is the readable oracle.
// Dimensions: B sequences, seq tokens each (the header's T; renamed because T is the scalar type here),
// nh query heads, nkv key/value heads (query head h reads kv head h / (nh / nkv)), hd the query/key head
// width, hdv the value/output head width (Note [Value heads of their own width], ops/attention.h),
// window the sliding window (0: none): query i sees key j iff j <= i and, with window > 0, i - window < j.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace fp::ops::ref {

// The first key query i sees.
inline int64_t attention_first_key(int64_t i, int64_t window) {
  return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
}

// q (B, seq, nh, hd), k (B, seq, nkv, hd), v (B, seq, nkv, hdv) -> o (B, seq, nh, hdv), lse (B, nh, seq).
// o_i = sum_{visible j} p_ij v_j with p_ij = exp(scale q_i.k_j - lse_i), lse_i = log sum_{visible j}
// exp(scale q_i.k_j), the visible j being attention_first_key(i, window) <= j <= i.
// sinks (nh) or null: head h's sink logit joins every row's sum (Note [Attention sinks] in ops/attention.h),
// lse_i = log(sum_{visible j} exp(scale q_i.k_j) + exp(sinks[h])).
template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* o, T* lse, int64_t B, int64_t seq, int64_t nh,
                       int64_t nkv, int64_t hd, int64_t hdv, T scale, int64_t window, const T* sinks = nullptr) {
  const int64_t group = nh / nkv;
  std::vector<T> s(seq);  // (seq) scaled scores of one query
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < seq; ++i) {
        const T* qi = q + ((b * seq + i) * nh + h) * hd;  // (hd)
        const int64_t j0 = attention_first_key(i, window);
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = j0; j <= i; ++j) {
          const T* kj = k + ((b * seq + j) * nkv + g) * hd;  // (hd)
          T dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += qi[d] * kj[d];
          s[j] = scale * dot;
          if (s[j] > m) m = s[j];
        }
        if (sinks != nullptr && sinks[h] > m) m = sinks[h];
        T l = sinks != nullptr ? std::exp(sinks[h] - m) : T(0);
        for (int64_t j = j0; j <= i; ++j) l += std::exp(s[j] - m);
        const T lse_i = m + std::log(l);
        lse[(b * nh + h) * seq + i] = lse_i;
        T* oi = o + ((b * seq + i) * nh + h) * hdv;  // (hdv)
        for (int64_t d = 0; d < hdv; ++d) oi[d] = 0;
        for (int64_t j = j0; j <= i; ++j) {
          const T p = std::exp(s[j] - lse_i);
          const T* vj = v + ((b * seq + j) * nkv + g) * hdv;  // (hdv)
          for (int64_t d = 0; d < hdv; ++d) oi[d] += p * vj[d];
        }
      }
    }
  }
}

// The gradient of the forward above, from the full probability matrix P (seq, seq) of each (b, h),
// recomputed from q, k and lse:
//   dP = dO V^T,  D_i = sum_d dO_id O_id (= sum_j P_ij dP_ij),  dS = P * (dP - D),
//   dq = scale dS K,  dk = scale dS^T Q and dv = P^T dO, summed over the query heads of each kv head.
// o, dout (B, seq, nh, hdv); dq (B, seq, nh, hd), dk (B, seq, nkv, hd), dv (B, seq, nkv, hdv) are
// overwritten. window: the forward's.
template <class T>
void attention_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk,
                        T* dv, int64_t B, int64_t seq, int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, T scale,
                        int64_t window) {
  const int64_t group = nh / nkv;
  for (int64_t x = 0; x < B * seq * nkv * hd; ++x) dk[x] = 0;
  for (int64_t x = 0; x < B * seq * nkv * hdv; ++x) dv[x] = 0;
  std::vector<T> P(seq * seq, T(0));   // (seq, seq) probabilities, zero where masked
  std::vector<T> dS(seq * seq, T(0));  // (seq, seq) score gradients (unscaled), zero where masked
  // The row of token t, head `head` of a (B, seq, heads, width) layout: (width).
  auto row = [&](const T* base, int64_t b, int64_t t, int64_t heads, int64_t head, int64_t width) {
    return base + ((b * seq + t) * heads + head) * width;
  };
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < seq; ++i) {
        const T* qi = row(q, b, i, nh, h, hd);
        const T* oi = row(o, b, i, nh, h, hdv);
        const T* doi = row(dout, b, i, nh, h, hdv);
        T D = 0;
        for (int64_t d = 0; d < hdv; ++d) D += doi[d] * oi[d];
        for (int64_t j = attention_first_key(i, window); j <= i; ++j) {
          const T* kj = row(k, b, j, nkv, g, hd);
          const T* vj = row(v, b, j, nkv, g, hdv);
          T dot = 0, dp = 0;
          for (int64_t d = 0; d < hd; ++d) dot += qi[d] * kj[d];
          for (int64_t d = 0; d < hdv; ++d) dp += doi[d] * vj[d];
          P[i * seq + j] = std::exp(scale * dot - lse[(b * nh + h) * seq + i]);
          dS[i * seq + j] = P[i * seq + j] * (dp - D);
        }
      }
      for (int64_t i = 0; i < seq; ++i) {
        T* dqi = dq + ((b * seq + i) * nh + h) * hd;  // (hd)
        for (int64_t d = 0; d < hd; ++d) dqi[d] = 0;
        for (int64_t j = attention_first_key(i, window); j <= i; ++j) {
          const T* kj = row(k, b, j, nkv, g, hd);
          for (int64_t d = 0; d < hd; ++d) dqi[d] += scale * dS[i * seq + j] * kj[d];
        }
      }
      for (int64_t j = 0; j < seq; ++j) {
        T* dkj = dk + ((b * seq + j) * nkv + g) * hd;    // (hd)
        T* dvj = dv + ((b * seq + j) * nkv + g) * hdv;  // (hdv)
        const int64_t i_end = window > 0 && window < seq - j ? j + window : seq;  // queries that see key j
        for (int64_t i = j; i < i_end; ++i) {
          const T* qi = row(q, b, i, nh, h, hd);
          const T* doi = row(dout, b, i, nh, h, hdv);
          for (int64_t d = 0; d < hd; ++d) dkj[d] += scale * dS[i * seq + j] * qi[d];
          for (int64_t d = 0; d < hdv; ++d) dvj[d] += P[i * seq + j] * doi[d];
        }
      }
    }
  }
}

// The sinks' gradient (ops/attention.h's attention_sink_backward), overwriting dsinks (nh): dsinks[h] =
// -sum over b, i of exp(sinks[h] - lse) (dO_i . O_i), from the forward's o and lse.
template <class T>
void attention_sink_backward(const T* o, const T* dout, const T* lse, const T* sinks, T* dsinks, int64_t B, int64_t seq,
                             int64_t nh, int64_t hdv) {
  for (int64_t h = 0; h < nh; ++h) {
    T sum = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < seq; ++i) {
        const int64_t r = ((b * seq + i) * nh + h) * hdv;
        T D = 0;
        for (int64_t d = 0; d < hdv; ++d) D += dout[r + d] * o[r + d];
        sum += std::exp(sinks[h] - lse[(b * nh + h) * seq + i]) * D;
      }
    dsinks[h] = -sum;
  }
}

}  // namespace fp::ops::ref
