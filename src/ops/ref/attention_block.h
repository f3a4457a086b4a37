// Scalar reference of block attention by global positions (ops/attention_block.h), in T. Like
// ops/ref/attention.h it materialises each (b, h)'s (Tq, Tk) probability matrix: the readable oracle.
// Dimensions: B sequences, Tq queries and Tk keys each, nh query heads, nkv key/value heads (query head h
// reads kv head h / (nh / nkv)), hd / hdv the query-key / value-output head widths (Note [Value heads of
// their own width], ops/attention.h). Key j is visible to query i iff k_pos[j] <= q_pos[i] and,
// with a sliding window w > 0, q_pos[i] - w < k_pos[j], and with documents doc_start[b, i] <= k_pos[j]
// (Note [Documents in attention], ops/attention.h; doc_start (B, Tq) or null).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace fp::ops::ref {

// Whether the key at position kp is visible to the query at position qp under the window (0: none).
inline bool attention_block_visible(int32_t qp, int32_t kp, int64_t window) {
  return kp <= qp && (window == 0 || int64_t{qp} - window < kp);
}

// q (B, Tq, nh, hd), k (B, Tk, nkv, hd), v (B, Tk, nkv, hdv), q_pos (Tq), k_pos (Tk); o (B, Tq, nh, hdv),
// lse (B, nh, Tq)
// the running state. The block's o_b = sum_{visible j} p_j v_j, p_j = exp(scale q.k_j - lse_b),
// lse_b = log sum_{visible j} exp(scale q.k_j) (o_b = 0, lse_b = -inf with no visible key); first: the
// state becomes (o_b, lse_b); otherwise lse' = log(exp(lse) + exp(lse_b)),
// o' = o exp(lse - lse') + o_b exp(lse_b - lse'), an empty side (-inf) leaving the other unchanged.
template <class T>
void attention_block_forward(const T* q, const T* k, const T* v, const int32_t* q_pos, const int32_t* k_pos, T* o,
                             T* lse, bool first, int64_t B, int64_t Tq, int64_t Tk, int64_t nh, int64_t nkv, int64_t hd,
                             int64_t hdv, T scale, int64_t window, const int32_t* doc_start = nullptr) {
  const T inf = std::numeric_limits<T>::infinity();
  const int64_t group = nh / nkv;
  std::vector<T> s(Tk);    // (Tk) scaled scores of one query
  std::vector<T> ob(hdv);  // (hdv) the block's output of one query
  for (int64_t b = 0; b < B; ++b) {
    auto seen = [&](int64_t i, int64_t j) {
      return attention_block_visible(q_pos[i], k_pos[j], window) &&
             (doc_start == nullptr || doc_start[b * Tq + i] <= k_pos[j]);
    };
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < Tq; ++i) {
        const T* qi = q + ((b * Tq + i) * nh + h) * hd;  // (hd)
        T m = -inf;
        bool any = false;
        for (int64_t j = 0; j < Tk; ++j) {
          if (!seen(i, j)) continue;
          const T* kj = k + ((b * Tk + j) * nkv + g) * hd;  // (hd)
          T dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += qi[d] * kj[d];
          s[j] = scale * dot;
          m = std::max(m, s[j]);
          any = true;
        }
        T lse_b = -inf;
        std::fill(ob.begin(), ob.end(), T(0));
        if (any) {
          T l = 0;
          for (int64_t j = 0; j < Tk; ++j)
            if (seen(i, j)) l += std::exp(s[j] - m);
          lse_b = m + std::log(l);
          for (int64_t j = 0; j < Tk; ++j) {
            if (!seen(i, j)) continue;
            const T p = std::exp(s[j] - lse_b);
            const T* vj = v + ((b * Tk + j) * nkv + g) * hdv;  // (hdv)
            for (int64_t d = 0; d < hdv; ++d) ob[d] += p * vj[d];
          }
        }
        T* oi = o + ((b * Tq + i) * nh + h) * hdv;  // (hdv)
        T& L = lse[(b * nh + h) * Tq + i];
        if (first || (L == -inf && lse_b != -inf)) {
          std::copy(ob.begin(), ob.end(), oi);
          L = lse_b;
        } else if (L != -inf && lse_b != -inf) {
          const T mx = std::max(L, lse_b);
          const T merged = mx + std::log(std::exp(L - mx) + std::exp(lse_b - mx));
          const T w_old = std::exp(L - merged), w_b = std::exp(lse_b - merged);
          for (int64_t d = 0; d < hdv; ++d) oi[d] = oi[d] * w_old + ob[d] * w_b;
          L = merged;
        }
      }
    }
  }
}

// The block pair's gradient from the final state o, lse (B, Tq, nh, hdv), (B, nh, Tq) and dout (B, Tq, nh,
// hdv), ADDED to dq (B, Tq, nh, hd), dk (B, Tk, nkv, hd), dv (B, Tk, nkv, hdv): with P_ij = exp(scale q_i.k_j - lse_i)
// on visible pairs (0 elsewhere), D_i = sum_d dO_id O_id, dS = P * (dO V^T - D):
//   dq += scale dS K,  dk += scale dS^T Q,  dv += P^T dO, summed over the query heads of each kv head.
template <class T>
void attention_block_backward(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout,
                              const int32_t* q_pos, const int32_t* k_pos, T* dq, T* dk, T* dv, int64_t B, int64_t Tq,
                              int64_t Tk, int64_t nh, int64_t nkv, int64_t hd, int64_t hdv, T scale, int64_t window,
                              const int32_t* doc_start = nullptr) {
  const int64_t group = nh / nkv;
  std::vector<T> P(Tq * Tk);   // (Tq, Tk) probabilities, zero where masked
  std::vector<T> dS(Tq * Tk);  // (Tq, Tk) score gradients (unscaled), zero where masked
  for (int64_t b = 0; b < B; ++b) {
    auto seen = [&](int64_t i, int64_t j) {
      return attention_block_visible(q_pos[i], k_pos[j], window) &&
             (doc_start == nullptr || doc_start[b * Tq + i] <= k_pos[j]);
    };
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / group;
      // The row of query i / key j, head h / kv head g, in a layout of `width` columns a head: (width).
      auto qrow = [&](auto* base, int64_t i, int64_t width) { return base + ((b * Tq + i) * nh + h) * width; };
      auto krow = [&](auto* base, int64_t j, int64_t width) { return base + ((b * Tk + j) * nkv + g) * width; };
      for (int64_t i = 0; i < Tq; ++i) {
        T D = 0;
        for (int64_t d = 0; d < hdv; ++d) D += qrow(dout, i, hdv)[d] * qrow(o, i, hdv)[d];
        for (int64_t j = 0; j < Tk; ++j) {
          P[i * Tk + j] = dS[i * Tk + j] = 0;
          if (!seen(i, j)) continue;
          T dot = 0, dp = 0;
          for (int64_t d = 0; d < hd; ++d) dot += qrow(q, i, hd)[d] * krow(k, j, hd)[d];
          for (int64_t d = 0; d < hdv; ++d) dp += qrow(dout, i, hdv)[d] * krow(v, j, hdv)[d];
          P[i * Tk + j] = std::exp(scale * dot - lse[(b * nh + h) * Tq + i]);
          dS[i * Tk + j] = P[i * Tk + j] * (dp - D);
        }
      }
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j) {
          for (int64_t d = 0; d < hd; ++d) {
            qrow(dq, i, hd)[d] += scale * dS[i * Tk + j] * krow(k, j, hd)[d];
            krow(dk, j, hd)[d] += scale * dS[i * Tk + j] * qrow(q, i, hd)[d];
          }
          for (int64_t d = 0; d < hdv; ++d) krow(dv, j, hdv)[d] += P[i * Tk + j] * qrow(dout, i, hdv)[d];
        }
    }
  }
}

}  // namespace fp::ops::ref
