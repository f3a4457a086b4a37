// Every cuda kernel against the cpu kernel on the same inputs (ggml's test-backend-ops), in the dtypes the
// cpu table takes (bf16 included, which the kernel-table test's f32 cases against ops/ref do not reach).
// Each case draws its inputs from a seeded generator, uploads them to a cpu and a cuda backend, launches the
// entry through each backend's KernelLauncher, downloads every output and compares:
//   bit for bit where the cuda file says it meets the cpu's bits (Note [Bits as the cpu's] in
//     src/backend/cuda/common.cuh): element-wise, reductions, AdamW, permutes, the sorts, nll;
//   else within the error model (tests/common/error_bound.h): the GEMMs (another order of the sums), and
//     the kernels calling exp, log, sin, cos (CUDA's functions, not glibc's).
// Every case skips with the runtime's reason where there is no GPU; a summary line names what compared.
// scripts/gpu_check runs this binary on a lent GPU and turns its JSON report into a table.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../common/error_bound.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/units.h"

namespace fp {

namespace {

constexpr DType kF32 = DType::DType_F32;
constexpr DType kBF16 = DType::DType_BF16;

// One downloaded output: its bytes, and the per-element bound of its comparison (empty: bit for bit).
struct Out {
  std::string name;
  DType dtype;  // F32, BF16, F64, I32 or I64
  std::vector<char> bytes;
  std::vector<double> bound;
};

// A case's inputs and outputs on one backend; the same seed gives the same inputs on every backend.
class Side {
 public:
  Side(Backend& be, uint64_t seed) : be_(be), rng_(seed), K(be.kernels()) {}

  // Normal values (scale s), stored in dtype t (bf16 rounded on the host: both sides get the same bits).
  Buf rand(int64_t n, DType t, const std::string& name, double s = 1.0) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = static_cast<float>(s * rng_.normal());
    return up(v, t, name);
  }
  Buf up(const std::vector<float>& v, DType t, const std::string& name) {
    const int64_t n = static_cast<int64_t>(v.size());
    std::vector<char> bytes(static_cast<size_t>(n) * dtype_size(t));
    for (int64_t i = 0; i < n; ++i) {
      if (t == kF32) {
        std::memcpy(bytes.data() + 4 * i, &v[i], 4);
      } else {
        const uint16_t h = bf16_from_float(v[i]);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    return Buf(upload(bytes, n, t, name), t);
  }
  template <class I>
  I* up_int(const std::vector<I>& v, const std::string& name) {
    std::vector<char> bytes(v.size() * sizeof(I));
    if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
    return static_cast<I*>(
        upload(bytes, static_cast<int64_t>(v.size()), sizeof(I) == 4 ? DType::DType_I32 : DType::DType_I64, name));
  }
  // An output slot of n elements filled with NaN (floats) or -1 (integers): never read by a correct kernel
  // unless the contract says so.
  void* out(int64_t n, DType t, const std::string& name) {
    std::vector<char> bytes(static_cast<size_t>(n) * dtype_size(t), static_cast<char>(0xff));
    return upload(bytes, n, t, name);
  }
  Rng& rng() { return rng_; }
  // Overwrites device memory p with bytes.
  void put(void* p, const std::vector<char>& bytes) { be_.copy_from_host(p, bytes.data(), bytes.size()); }

  // Downloads p (n elements of t) after the compute stream has passed every launch.
  void down(const std::string& name, const void* p, int64_t n, DType t, std::vector<double> bound = {}) {
    be_.compute_stream().synchronize();
    Out o{name, t, std::vector<char>(static_cast<size_t>(n) * dtype_size(t)), std::move(bound)};
    if (n > 0) be_.copy_to_host(o.bytes.data(), p, o.bytes.size());
    outs.push_back(std::move(o));
  }

  std::vector<Out> outs;

 private:
  void* upload(const std::vector<char>& bytes, int64_t n, DType t, const std::string& name) {
    held_.push_back(be_.alloc(Category::Category_workspace, {std::max<int64_t>(n, 1)}, t, name));
    if (!bytes.empty()) be_.copy_from_host(held_.back().data(), bytes.data(), bytes.size());
    return held_.back().data();
  }
  Backend& be_;
  Rng rng_;
  std::vector<Tensor> held_;

 public:
  const ops::KernelLauncher K;
};

using CaseFn = std::function<void(Side&)>;

double value_at(const Out& o, size_t i) {
  switch (o.dtype) {
    case DType::DType_F32: {
      float f;
      std::memcpy(&f, o.bytes.data() + 4 * i, 4);
      return f;
    }
    case DType::DType_BF16: {
      uint16_t h;
      std::memcpy(&h, o.bytes.data() + 2 * i, 2);
      return bf16_to_float(h);
    }
    case DType::DType_F64: {
      double d;
      std::memcpy(&d, o.bytes.data() + 8 * i, 8);
      return d;
    }
    default:
      return 0;
  }
}

// The error model's bound for an output rounded to dtype t from a value within `f32_bound` of the cpu's:
// the f32 bound, plus a rounding of each side to t (a bf16 result may round the other way).
std::vector<double> rounded_bound(const std::vector<double>& f32_bound, const std::vector<float>& want_mag, DType t) {
  std::vector<double> b(f32_bound.size());
  const double u = t == kBF16 ? test_bound::kUnitBF16 : test_bound::kUnitF32;
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_bound[i] + 2 * u * want_mag[i];
  return b;
}

// Added to every error-model bound, times |want|: the relative error of a few f32 roundings and of CUDA's
// expf (2 ulps) against glibc's, which the absolute bounds of the exp/log cases do not scale with.
constexpr double kRelativeSlack = 32 * test_bound::kUnitF32;

// ---- The cases. Sizes straddle warps, blocks and the reductions' 4096-element blocks.

constexpr int64_t kN = 1037, kRows = 70, kCols = 67;

CaseFn elementwise(DType ty, DType tx) {
  return [=](Side& s) {
    Buf y = s.rand(kN, ty, "y"), x = s.rand(kN, tx, "x");
    s.K.add_inplace(y, x, kN);
    s.K.scale_inplace(y, -0.3f, kN);
    s.down("y", y.p, kN, ty);
    Buf z = s.rand(kN, ty, "z");
    s.K.fill(z, 1.1f, kN);  // not a bf16 value: rounded once
    s.down("fill", z.p, kN, ty);
    Buf c = Buf(s.out(kN, ty, "copy"), ty);
    s.K.copy(c, x, kN);
    s.down("copy", c.p, kN, ty);
    const int64_t lds = 11, ldd = 13, rows = 30, cols = 7;
    Buf src = s.rand(rows * lds, tx, "src"), dst = s.rand(rows * ldd, ty, "dst"), dst2 = s.rand(rows * ldd, ty, "d2");
    s.K.copy_2d(dst, ldd, src, lds, rows, cols);
    s.K.add_2d(dst2, ldd, src, lds, rows, cols);
    s.down("copy_2d", dst.p, rows * ldd, ty);
    s.down("add_2d", dst2.p, rows * ldd, ty);
    Buf yb = s.rand(kRows * kCols, ty, "yb"), b = s.rand(kCols, tx, "b");
    s.K.bias_add(yb, b, kRows, kCols);
    s.down("bias_add", yb.p, kRows * kCols, ty);
    Buf dy = s.rand(kRows * kCols, tx, "dy"), db = s.rand(kCols, ty, "db");
    s.K.bias_backward(dy, db, kRows, kCols);
    s.down("bias_backward", db.p, kCols, ty);
    double* cs = static_cast<double*>(s.out(kCols, DType::DType_F64, "colsums"));
    s.K.column_sums_f64(dy, kRows, kCols, cs);
    s.down("column_sums_f64", cs, kCols, DType::DType_F64);
  };
}

CaseFn reductions(DType tx) {
  return [=](Side& s) {
    const std::vector<int64_t> n = {4099, 0, 37, (int64_t{1} << 20) + 5};
    std::vector<CBuf> xs;
    for (size_t i = 0; i < n.size(); ++i) xs.push_back(s.rand(n[i], tx, std::string("x").append(std::to_string(i))));
    float* out = static_cast<float*>(s.out(2 + static_cast<int64_t>(n.size()), kF32, "out"));
    s.K.reduce_sum(xs[3], n[3], out);
    s.K.reduce_sumsq(xs[0], n[0], out + 1);
    s.K.reduce_sumsq_multi(xs.data(), n.data(), static_cast<int64_t>(n.size()), out + 2);
    s.down("sums", out, 2 + static_cast<int64_t>(n.size()), kF32);
  };
}

CaseFn adamw(DType tg, DType tc) {
  return [=](Side& s) {
    const std::vector<int64_t> n = {kN, 0, (int64_t{1} << 16) + 3};
    const ops::AdamWHyper h{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.37f, 3};
    std::vector<ops::AdamWTensor> bucket;
    for (size_t i = 0; i < n.size(); ++i) {
      const std::string k = std::to_string(i);
      ops::AdamWTensor t;
      t.param = static_cast<float*>(s.rand(n[i], kF32, "p" + k).p);
      t.grad = s.rand(n[i], tg, "g" + k, 1e-2);
      t.m = static_cast<float*>(s.rand(n[i], kF32, "m" + k, 1e-3).p);
      std::vector<float> v(static_cast<size_t>(n[i]));
      for (float& x : v) x = static_cast<float>(1e-6 * std::abs(s.rng().normal()) + 1e-9);
      t.v = static_cast<float*>(s.up(v, kF32, "v" + k).p);
      t.n = n[i];
      t.weight_decay = i == 2 ? 0.0f : 0.1f;
      t.param_copy = Buf(s.out(n[i], tc, "copy" + k), tc);
      bucket.push_back(t);
    }
    s.K.adamw_update(bucket[0].param, bucket[0].grad, bucket[0].m, bucket[0].v, n[0], h, bucket[0].param_copy);
    s.K.adamw_update_multi(bucket.data(), static_cast<int64_t>(bucket.size()), h);
    for (size_t i = 0; i < n.size(); ++i) {
      const std::string k = std::to_string(i);
      s.down("param" + k, bucket[i].param, n[i], kF32);
      s.down("m" + k, bucket[i].m, n[i], kF32);
      s.down("v" + k, bucket[i].v, n[i], kF32);
      s.down("copy" + k, bucket[i].param_copy.p, n[i], tc);
    }
  };
}

// The routing of n tokens to k of E experts: a random choice (distinct experts per token).
std::vector<int32_t> random_topk(Rng& rng, int64_t n, int64_t k, int64_t E) {
  std::vector<int32_t> idx(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      bool again;
      do {
        e = static_cast<int32_t>(rng.uniform() * static_cast<double>(E)) % static_cast<int32_t>(E);
        again = false;
        for (int64_t i = 0; i < j; ++i) again = again || idx[t * k + i] == e;
      } while (again);
      idx[t * k + j] = e;
    }
  return idx;
}

CaseFn permutes(DType tx, DType ty) {
  return [=](Side& s) {
    const int64_t n = 37, k = 3, E = 8, H = 67, m = n * k;
    int32_t* topk = s.up_int(random_topk(s.rng(), n, k, E), "topk");
    int32_t* rows = static_cast<int32_t*>(s.out(m, DType::DType_I32, "rows"));
    int32_t* slot = static_cast<int32_t*>(s.out(m, DType::DType_I32, "slot_pos"));
    int64_t* off = static_cast<int64_t*>(s.out(E + 1, DType::DType_I64, "offsets"));
    s.K.moe_routing_build(topk, n, k, E, rows, slot, off);
    s.down("rows", rows, m, DType::DType_I32);
    s.down("slot_pos", slot, m, DType::DType_I32);
    s.down("offsets", off, E + 1, DType::DType_I64);
    Buf x = s.rand(n * H, tx, "x");
    Buf xs = Buf(s.out(m * H, ty, "xs"), ty);
    s.K.moe_gather(x, rows, xs, m, H);
    s.down("gather", xs.p, m * H, ty);
    Buf back = s.rand(m * H, tx, "back");
    s.K.moe_scatter(xs, slot, back, m, H);  // distinct rows: slot_pos is a permutation of [0, m)
    s.down("scatter", back.p, m * H, tx);
    float* w = static_cast<float*>(s.rand(n * k, kF32, "w").p);
    Buf out = s.rand(n * H, ty, "out");
    s.K.moe_combine_forward(xs, slot, w, out, n, k, H);
    s.down("combine_forward", out.p, n * H, ty);
    Buf dout = s.rand(n * H, tx, "dout");
    Buf dys = Buf(s.out(m * H, ty, "dys"), ty);
    float* dw = static_cast<float*>(s.out(n * k, kF32, "dw"));
    s.K.moe_combine_backward(xs, slot, w, dout, dys, dw, n, k, H);
    s.down("combine_backward dys", dys.p, m * H, ty);
    s.down("combine_backward dw", dw, n * k, kF32);
    s.K.moe_combine_backward(xs, slot, w, dout, xs, dw, n, k, H);  // in place: dys = ys
    s.down("combine_backward in place", xs.p, m * H, ty);
    Buf dx = s.rand(n * H, tx, "dx");
    s.K.moe_scatter_add(dys, slot, dx, n, k, H);
    s.down("scatter_add", dx.p, n * H, tx);
  };
}

// C (M, N) = alpha op(A) op(B) + beta C0; the bound: twice gamma(K) |alpha| sum_k |a b| + the output's rounding.
CaseFn gemm(DType ta_t, DType tb_t, DType tc_t, bool ta, bool tb) {
  return [=](Side& s) {
    const int64_t M = 70, N = 67, K = 300;
    const float alpha = 0.75f, beta = 0.5f;
    std::vector<float> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N)), c(static_cast<size_t>(M * N));
    for (float& v : a) v = static_cast<float>(s.rng().normal());
    for (float& v : b) v = static_cast<float>(s.rng().normal());
    for (float& v : c) v = static_cast<float>(s.rng().normal());
    const auto rounded = [](std::vector<float> v, DType t) {
      if (t == kBF16)
        for (float& x : v) x = bf16_to_float(bf16_from_float(x));
      return v;
    };
    const std::vector<float> ar = rounded(a, ta_t), br = rounded(b, tb_t), cr = rounded(c, tc_t);
    const int64_t lda = ta ? M : K, ldb = tb ? K : N;
    std::vector<double> bound(static_cast<size_t>(M * N));
    std::vector<float> mag(static_cast<size_t>(M * N));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double sum = 0, abs_sum = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = static_cast<double>(ta ? ar[k * lda + i] : ar[i * lda + k]) *
                           static_cast<double>(tb ? br[j * ldb + k] : br[k * ldb + j]);
          sum += p;
          abs_sum += std::abs(p);
        }
        const double want = alpha * sum + beta * cr[i * N + j];
        bound[i * N + j] = 2 * test_bound::gamma(static_cast<double>(K + 2)) *
                           (std::abs(alpha) * abs_sum + std::abs(beta * cr[i * N + j]));
        mag[i * N + j] = static_cast<float>(std::abs(want));
      }
    Buf A = s.up(a, ta_t, "A"), B = s.up(b, tb_t, "B"), C = s.up(c, tc_t, "C"), T = s.up(c, tc_t, "Ctiled");
    s.K.gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, N);
    s.down("gemm", C.p, M * N, tc_t, rounded_bound(bound, mag, tc_t));
    s.K.gemm_tiled(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, T, N);
    s.down("gemm_tiled", T.p, M * N, tc_t, rounded_bound(bound, mag, tc_t));
  };
}

// Grouped: G = 3 groups (the middle one empty), bias on the forward, db on the weight gradient. Bounds from
// the operands' magnitudes (every |value| <= 6 sigma): loose, but a wrong group or row is off by O(1).
CaseFn grouped(DType t) {
  return [=](Side& s) {
    const int64_t G = 3, N = 33, K = 65;
    const std::vector<int64_t> off = {0, 20, 20, 51};
    const int64_t r = off[G];
    Buf A = s.rand(r * K, t, "A");
    std::vector<CBuf> B, bias;
    for (int64_t g = 0; g < G; ++g) {
      B.push_back(s.rand(N * K, t, "B" + std::to_string(g)));
      bias.push_back(s.rand(N, t, "bias" + std::to_string(g)));
    }
    Buf C = s.rand(r * N, t, "C");
    s.K.gemm_grouped(true, G, off.data(), N, K, 1.0f, A, B.data(), bias.data(), 0.0f, C);
    const double u = t == kBF16 ? test_bound::kUnitBF16 : test_bound::kUnitF32;
    s.down("gemm_grouped", C.p, r * N, t,
           std::vector<double>(static_cast<size_t>(r * N), 4 * test_bound::gamma(K + 2.0) * K * 36 + 2 * u * 40));
    Buf dY = s.rand(r * N, t, "dY"), X = s.rand(r * K, t, "X");
    std::vector<Buf> dW, db;
    for (int64_t g = 0; g < G; ++g) {
      dW.push_back(s.rand(N * K, t, "dW" + std::to_string(g)));
      db.push_back(s.rand(N, t, "db" + std::to_string(g)));
    }
    s.K.gemm_grouped_weight(G, off.data(), N, K, 1.0f, dY, X, 1.0f, dW.data(), db.data());
    for (int64_t g = 0; g < G; ++g) {
      s.down("gemm_grouped_weight " + std::to_string(g), dW[g].p, N * K, t,
             std::vector<double>(static_cast<size_t>(N * K), 4 * test_bound::gamma(40.0) * 40 * 36 + 2 * u * 40));
      s.down("db " + std::to_string(g), db[g].p, N, t);  // bias_backward: bit for bit
    }
  };
}

// The exp/log kernels' absolute part: a few ulps of f32 at the outputs' scale (expf within 2 ulps, the double
// sums exact to far below); the comparison adds kRelativeSlack |want| to every bound.
std::vector<double> ulps_bound(int64_t n, double ulps, double scale) {
  return std::vector<double>(static_cast<size_t>(n), ulps * test_bound::kUnitF32 * scale);
}

void vocabulary_loss(Side& s) {
  const int64_t n = 19, V = 1037;
  Buf logits = s.rand(n * V, kF32, "logits", 3.0);
  std::vector<int32_t> tg(n);
  for (int64_t t = 0; t < n; ++t) tg[t] = t == 5 ? -100 : static_cast<int32_t>((t * 97) % V);
  int32_t* targets = s.up_int(tg, "targets");
  float* logp = static_cast<float*>(s.out(n * V, kF32, "logp"));
  s.K.log_softmax_forward(static_cast<const float*>(logits.p), logp, n, V);
  s.down("log_softmax_forward", logp, n * V, kF32, ulps_bound(n * V, 16, 20));
  float* loss = static_cast<float*>(s.out(n, kF32, "loss"));
  s.K.nll_forward(logp, targets, loss, n, V);
  s.down("nll_forward", loss, n, kF32, ulps_bound(n, 16, 20));
  float* dl = static_cast<float*>(s.out(n * V, kF32, "dlogits"));
  s.K.cross_entropy_backward(logp, targets, 0.5f, dl, n, V);
  s.down("cross_entropy_backward", dl, n * V, kF32, ulps_bound(n * V, 16, 1));
  // The online LSE over two strips of the same logits, [0, 500) and [500, V).
  float* m = static_cast<float*>(s.out(n, kF32, "m"));
  double* z = static_cast<double*>(s.out(n, DType::DType_F64, "z"));
  float* y = static_cast<float*>(s.out(n, kF32, "y"));
  s.K.online_lse_init(m, z, y, n);
  const float* lg = static_cast<const float*>(logits.p);
  s.K.online_lse_fold(lg, V, targets, n, 0, 500, m, z, y);
  s.K.online_lse_fold(lg + 500, V, targets, n, 500, V, m, z, y);
  s.down("online_lse m", m, n, kF32);  // maxima: exact
  s.down("online_lse z", z, n, DType::DType_F64, ulps_bound(n, 16, 1100));
  double* ls = static_cast<double*>(s.out(1, DType::DType_F64, "loss_sum"));
  s.K.online_lse_loss(m, z, y, targets, n, ls);
  s.down("online_lse_loss", ls, 1, DType::DType_F64, ulps_bound(1, 16, 20 * n));
  Buf strip = s.rand(n * V, kF32, "strip", 3.0);
  s.K.online_lse_backward(static_cast<float*>(strip.p) + 500, V, targets, n, 500, V, m, z, 0.5f);
  s.down("online_lse_backward", strip.p, n * V, kF32, ulps_bound(n * V, 16, 1));
}

void routers(Side& s) {
  ops::RouterSpec spec;
  spec.n = 37, spec.E = 16, spec.k = 4, spec.norm = true;
  const int64_t nE = spec.n * spec.E, nk = spec.n * spec.k;
  Buf logits = s.rand(nE, kF32, "logits");
  float* probs = static_cast<float*>(s.out(nE, kF32, "probs"));
  int32_t* idx = static_cast<int32_t*>(s.out(nk, DType::DType_I32, "idx"));
  float* w = static_cast<float*>(s.out(nk, kF32, "w"));
  s.K.router_forward(static_cast<const float*>(logits.p), probs, idx, w, spec);
  s.down("router_forward probs", probs, nE, kF32, ulps_bound(nE, 8, 1));
  s.down("router_forward idx", idx, nk, DType::DType_I32);  // random logits: no near-ties
  s.down("router_forward w", w, nk, kF32, ulps_bound(nk, 8, 1));
  Buf dw = s.rand(nk, kF32, "dw");
  float* dl = static_cast<float*>(s.out(nE, kF32, "dlogits"));
  s.K.router_backward(probs, idx, static_cast<const float*>(dw.p), nullptr, dl, spec);
  s.down("router_backward", dl, nE, kF32, ulps_bound(nE, 16, 4));
  spec.n_group = 4, spec.topk_group = 2, spec.scaling = 2.5f;
  Buf bias = s.rand(spec.E, kF32, "bias", 0.1);
  s.K.router_sigmoid_forward(static_cast<const float*>(logits.p), static_cast<const float*>(bias.p), probs, idx, w,
                             spec);
  s.down("router_sigmoid_forward scores", probs, nE, kF32, ulps_bound(nE, 8, 1));
  s.down("router_sigmoid_forward idx", idx, nk, DType::DType_I32);
  s.down("router_sigmoid_forward w", w, nk, kF32, ulps_bound(nk, 8, 3));
  s.K.router_sigmoid_backward(probs, idx, static_cast<const float*>(dw.p), dl, spec);
  s.down("router_sigmoid_backward", dl, nE, kF32, ulps_bound(nE, 16, 4));
}

// SwiGLU and the clamped one (limit 1.5 so that both clamps act on normal inputs); expf: the error model.
CaseFn swiglu(DType t) {
  return [=](Side& s) {
    const int64_t n = 4099;
    Buf g = s.rand(n, t, "g", 2.0), u = s.rand(n, t, "u"), da = s.rand(n, t, "da");
    const std::vector<double> b = ulps_bound(n, 16, 8);
    for (const bool clamped : {false, true}) {
      const std::string k = clamped ? "swiglu_clamped" : "swiglu";
      Buf a = Buf(s.out(n, t, k + " a"), t), dg = Buf(s.out(n, t, k + " dg"), t), du = Buf(s.out(n, t, k + " du"), t);
      if (clamped) {
        s.K.swiglu_clamped_forward(g, u, a, n, 1.702f, 1.5f);
        s.K.swiglu_clamped_backward(g, u, da, dg, du, n, 1.702f, 1.5f);
      } else {
        s.K.swiglu_forward(g, u, a, n);
        s.K.swiglu_backward(g, u, da, dg, du, n);
      }
      const double r = t == kBF16 ? 2 * test_bound::kUnitBF16 * 8 : 0;  // a bf16 output may round the other way
      std::vector<double> bb = b;
      for (double& x : bb) x += r;
      s.down(k + "_forward", a.p, n, t, bb);
      s.down(k + "_backward dg", dg.p, n, t, bb);
      s.down(k + "_backward du", du.p, n, t, bb);
    }
  };
}

// RMSNorm forward and backward, the cpu's bits: (70, 67) rows past a warp's groups, and (300, 8) rows past
// the 64-row dw blocks.
CaseFn rmsnorm(DType tx, DType tw) {
  return [=](Side& s) {
    for (const auto& [rows, d] : {std::pair<int64_t, int64_t>{kRows, kCols}, {300, 8}}) {
      const std::string k = std::to_string(rows) + "x" + std::to_string(d);
      Buf x = s.rand(rows * d, tx, "x" + k), w = s.rand(d, tw, "w" + k), dy = s.rand(rows * d, tx, "dy" + k);
      Buf y = Buf(s.out(rows * d, tx, "y" + k), tx), dx = Buf(s.out(rows * d, tx, "dx" + k), tx);
      Buf dw = s.rand(d, tw, "dw" + k);
      float* rstd = static_cast<float*>(s.out(rows, kF32, "rstd" + k));
      float* ws = static_cast<float*>(s.out(std::max<int64_t>(s.K.rmsnorm_backward_workspace(rows, d), 1), kF32, "ws"));
      s.K.rmsnorm_forward(x, w, y, rstd, rows, d, 1e-6f);
      s.K.rmsnorm_backward(x, w, rstd, dy, dx, dw, rows, d, ws);
      s.down("rmsnorm_forward y " + k, y.p, rows * d, tx);
      s.down("rmsnorm_forward rstd " + k, rstd, rows, kF32);
      s.down("rmsnorm_backward dx " + k, dx.p, rows * d, tx);
      s.down("rmsnorm_backward dw " + k, dw.p, d, tw);
    }
  };
}

// Embedding: forward in any dtypes, backward into an f32 table (repeated ids); the cpu's bits.
CaseFn embedding(DType tt, DType to) {
  return [=](Side& s) {
    const int64_t n = 300, H = 67, V = 50;
    std::vector<int32_t> ids(n);
    for (int64_t t = 0; t < n; ++t) ids[t] = static_cast<int32_t>((t * 7 + t / 5) % V);
    int32_t* tokens = s.up_int(ids, "tokens");
    Buf table = s.rand(V * H, tt, "table"), out = Buf(s.out(n * H, to, "out"), to);
    s.K.embedding_forward(tokens, table, out, n, H);
    s.down("embedding_forward", out.p, n * H, to);
    Buf dout = s.rand(n * H, to, "dout"), dtable = s.rand(V * H, kF32, "dtable");
    s.K.embedding_backward(tokens, dout, dtable, n, H);
    s.down("embedding_backward", dtable.p, V * H, kF32);
  };
}

// RoPE: plain, and strided with interleaved pairs in the last 8 of 12 numbers per head; positions to 40000.
CaseFn rope(DType t) {
  return [=](Side& s) {
    const int64_t n = 37, heads = 3, hd = 8;
    std::vector<int32_t> p(n);
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 1237) % 40000);
    int32_t* pos = s.up_int(p, "pos");
    const std::vector<double> f = ops::rope_default_inv_freq(10000.0, hd);
    std::vector<char> fb(f.size() * 8);
    std::memcpy(fb.data(), f.data(), fb.size());
    double* inv = static_cast<double*>(s.out(static_cast<int64_t>(f.size()), DType::DType_F64, "inv_freq"));
    s.put(inv, fb);
    const ops::RopeFreqs freqs{inv, 1.25f};
    Buf x = s.rand(n * heads * hd, t, "x"), y = s.rand(n * heads * 12, t, "y");
    s.K.rope_forward(x, pos, n, heads, hd, freqs);
    s.down("rope_forward", x.p, n * heads * hd, t, ulps_bound(n * heads * hd, 16, 8));
    s.K.rope_backward(x, pos, n, heads, hd, freqs);
    s.down("rope_backward", x.p, n * heads * hd, t, ulps_bound(n * heads * hd, 16, 8));
    s.K.rope_strided_forward(Buf(y.at(4)), pos, n, heads, hd, 12, true, freqs);
    s.down("rope_strided_forward", y.p, n * heads * 12, t, ulps_bound(n * heads * 12, 16, 8));
    s.K.rope_strided_backward(Buf(y.at(4)), pos, n, heads, hd, 12, true, freqs);
    s.down("rope_strided_backward", y.p, n * heads * 12, t, ulps_bound(n * heads * 12, 16, 8));
  };
}

std::string dn(DType t) { return std::string(dtype_name(t)); }

std::map<std::string, CaseFn> all_cases() {
  std::map<std::string, CaseFn> m;
  for (const DType a : {kF32, kBF16})
    for (const DType b : {kF32, kBF16}) {
      m["elementwise_" + dn(a) + "_" + dn(b)] = elementwise(a, b);
      m["adamw_grad_" + dn(a) + "_copy_" + dn(b)] = adamw(a, b);
      m["permutes_" + dn(a) + "_" + dn(b)] = permutes(a, b);
      m["rmsnorm_" + dn(a) + "_" + dn(b)] = rmsnorm(a, b);
      m["embedding_" + dn(a) + "_" + dn(b)] = embedding(a, b);
    }
  for (const DType a : {kF32, kBF16}) {
    m["reductions_" + dn(a)] = reductions(a);
    m["grouped_" + dn(a)] = grouped(a);
    m["swiglu_" + dn(a)] = swiglu(a);
    m["rope_" + dn(a)] = rope(a);
  }
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      const std::string t = std::string(ta ? "t" : "n") + (tb ? "t" : "n");
      m["gemm_f32_" + t] = gemm(kF32, kF32, kF32, ta, tb);
      m["gemm_bf16_bf16_" + t] = gemm(kBF16, kBF16, kBF16, ta, tb);
      m["gemm_bf16_f32_" + t] = gemm(kBF16, kBF16, kF32, ta, tb);
      m["gemm_mixed_" + t] = gemm(kF32, kBF16, kBF16, ta, tb);
    }
  m["vocabulary_loss"] = vocabulary_loss;
  m["routers"] = routers;
  return m;
}

std::vector<std::string> case_names() {
  std::vector<std::string> v;
  for (const auto& [name, fn] : all_cases()) v.push_back(name);
  return v;
}

}  // namespace

class CudaMatchesCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaMatchesCpu, SameInputs) {
  // Without a GPU the cases skip; FLATPEAK_CUDA_MATCHES_CPU_DRY_RUN=1 runs them against a second cpu backend
  // instead (the harness's own check: every case runs, downloads its outputs and compares, on any machine).
  std::string why;
  const bool gpu = cuda_device_available(&why);
  const char* dry = std::getenv("FLATPEAK_CUDA_MATCHES_CPU_DRY_RUN");
  const bool dry_run = !gpu && dry != nullptr && std::string(dry) == "1";
  if (!gpu && !dry_run) GTEST_SKIP() << "no GPU: " << why;
  const CaseFn fn = all_cases().at(GetParam());
  uint64_t seed = 1469598103934665603ull;
  for (const char c : GetParam()) seed = (seed ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  const std::unique_ptr<Backend> cpu = backend_create("cpu", kUnlimitedBytes, kUnlimitedBytes);
  const std::unique_ptr<Backend> other = backend_create(dry_run ? "cpu" : "cuda", kUnlimitedBytes, kUnlimitedBytes);
  Side c(*cpu, seed), g(*other, seed);
  fn(c);
  fn(g);
  ASSERT_EQ(c.outs.size(), g.outs.size());
  for (size_t o = 0; o < c.outs.size(); ++o) {
    const Out &want = c.outs[o], &got = g.outs[o];
    ASSERT_EQ(want.bytes.size(), got.bytes.size()) << want.name;
    if (want.bound.empty()) {
      size_t first = want.bytes.size();
      for (size_t i = 0; i < want.bytes.size() && first == want.bytes.size(); ++i)
        if (want.bytes[i] != got.bytes[i]) first = i;
      EXPECT_EQ(first, want.bytes.size()) << GetParam() << ": " << want.name << " differs from the cpu's bits at byte "
                                          << first << " (element " << first / dtype_size(want.dtype) << ")";
      continue;
    }
    const size_t n = want.bytes.size() / dtype_size(want.dtype);
    std::vector<double> w(n), x(n);
    std::vector<double> bound = want.bound;
    for (size_t i = 0; i < n; ++i) {
      w[i] = value_at(want, i), x[i] = value_at(got, i);
      bound[i] += kRelativeSlack * std::abs(w[i]);
    }
    double worst = 0;
    std::string msg;
    EXPECT_TRUE(test_bound::within_bounds(x.data(), w.data(), bound.data(), static_cast<int64_t>(n), &worst, &msg))
        << GetParam() << ": " << want.name << " " << msg;
    RecordProperty(want.name + " worst/bound", std::to_string(worst));
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaMatchesCpu, ::testing::ValuesIn(case_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace fp
