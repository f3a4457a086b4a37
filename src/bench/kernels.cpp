// flatpeak bench kernels (bench/kernels.h): one case per entry of the kernel table at a shape of the paper's
// scale, its FLOPs and bytes, the machine's limits measured in the same run, and the table.
//
// Note [bench kernels: shapes]: the paper's models have hidden 4096-7168, heads of 128, 32 query and 8 KV
// heads, 64-256 experts with top-8, vocabularies of 128K, and train at T = 4096-8192 tokens per sequence
// on 8192-16384 tokens per rank. Each case takes one call of that scale that a 2-core, 24 GiB machine
// times in seconds (paper_dims below; every row prints its shape). Two choices scale a dimension down and
// say so: attention runs 8 query and 2 KV heads (one quarter of a 32/8-head layer: a head is an independent
// item of work, so the rate does not depend on their count once the threads are busy; T stays 4096), and
// the vocabulary GEMM (gemm_tiled) one Ring-DTP strip of 1024 tokens by 8192 vocabulary ids. --scale small
// runs tiny shapes of the same kinds (the test: every entry in seconds).
//
// Note [bench kernels: FLOPs and bytes]: per call, from the shapes and the storage dtype of the row (s
// bytes per element of every Buf/CBuf operand: 4 for f32, 2 for bf16; float*, int32 and double operands
// are 4, 4 and 8 whatever the row):
//   FLOPs, counted for the GEMMs and attention only (the rows bound by FLOPs): a GEMM 2 M N K; attention
//     over P visible (query, key) pairs and nh heads: forward 2 P nh (hd + hdv) (Q K^T and P V), backward
//     2 P nh (3 hd + 2 hdv) (the recomputed Q K^T, dP = dO V^T, dV, dQ, dK), no exponentials counted.
//   bytes, the least traffic the call needs: every element of every operand it reads once, and of every
//     operand it writes once (read and written: twice), gathered rows counted once per element touched;
//     scratch (rmsnorm's dw partials) written and read once. A kernel that reads an operand twice (a max
//     pass, then a sum) moves more than it is credited, so its GB/s is a lower bound of its traffic.
// The rate of a row is FLOPs / s (GEMMs, attention) or bytes / s (the rest), and its fraction is of the
// matching limit: the sgemm rate (f32 GEMM through the table at a large square shape; bf16 rows too: the
// table's bf16 GEMM on an AVX2 CPU is the sgemm on widened panels, and a bf16 unit would show above 100%)
// or the memory bandwidth (memcpy of a large buffer split over the OpenMP threads, read + written bytes),
// each the best of a few runs before the table (a peak; on a shared machine a median sits lower), and
// measured once more after it (printed, not used) so that a reader sees how much the machine drifted.
// A row above 100% is a kernel that beat the limit's own measurement (a moment of less load, or data that
// stayed in the caches: the small scale's operands all do).
//
// Note [bench kernels: timing]: each call is launched through the backend's KernelLauncher on its compute
// stream and the stream synchronized, so a row's seconds are the wall time of the call from launch to
// completion (on cpu the compute stream runs inline). `warmup` untimed calls, then up to `repeats` timed
// ones, stopping early once kTimeCap seconds are spent (at least one): a row prints its count. In-place
// kernels (rope, AdamW, the += kernels) run again on their own results: the values stay finite, the work
// is the same.
#include "bench/kernels.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels/blas_setup.h"
#include "backend/cpu/kernels/cpu_features.h"
#include "backend/cpu/kernels/gemm_onednn.h"
#include "backend/cpu/kernels/ops.h"
#include "backend/kernels.h"
#include "bench/bench_common.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/units.h"

namespace fp::bench {

namespace kernels_bench {

namespace {

// Timed calls stop once this many seconds are spent (Note [bench kernels: timing]).
constexpr double kTimeCap = 2.0;

// The shapes of every case (Note [bench kernels: shapes]).
struct Dims {
  int64_t gemm_M, gemm_N, gemm_K;                  // gemm: a projection, tokens x hidden -> hidden (x W^T)
  int64_t strip_M, strip_N, strip_K;               // gemm_tiled: a vocabulary strip, tokens x vocab ids over hidden
  int64_t eg_G, eg_rows, eg_H, eg_I;               // gemm_grouped: a rank's experts, their routed rows, hidden, width
  int64_t tokens, H, V_table;                      // embedding, rmsnorm, bias: tokens x hidden, the table's rows
  int64_t rope_n, heads, hd;                       // rope: the queries of one layer
  int64_t mla_n, mla_heads, mla_rope, mla_stride;  // rope_strided: MLA's rope part of each 192-wide head
  int64_t T, nh, nkv, ahd;                         // attention: one causal sequence
  int64_t blk;                                     // block attention: Tq = Tk = blk, queries after the keys
  int64_t ffn_n;                                   // swiglu: routed rows x expert width
  int64_t rn, E, k, n_group, topk_group;           // router: tokens, experts, top-k, sigmoid groups
  int64_t mn, mk, mH;                              // moe permutation: tokens, top-k, hidden (rn's experts)
  int64_t chunks, ranks;                           // moe_chunk_order
  int64_t loss_n, loss_V;                          // the full loss: tokens x the whole vocabulary
  int64_t strip_rows, strip_cols;                  // online log-sum-exp: a strip of logits
  int64_t n;                                       // element-wise kernels and reductions
  int64_t col_rows, col_d;                         // column_sums_f64: router probabilities
  int64_t s2_rows, s2_cols, s2_lds, s2_ldd;        // copy_2d / add_2d: MLA's head split
  int64_t adam_n;                                  // AdamW parameters
  int64_t sgemm_side;                              // the sgemm limit (cpu; a GPU takes sgemm_side_gpu)
  int64_t sgemm_side_gpu;
  uint64_t copy_bytes;  // the bandwidth limit's buffer
};

constexpr int64_t kMi = int64_t{1} << 20;

constexpr Dims paper_dims() {
  Dims d{};
  d.gemm_M = 2048, d.gemm_N = 4096, d.gemm_K = 4096;
  d.strip_M = 1024, d.strip_N = 8192, d.strip_K = 4096;
  d.eg_G = 8, d.eg_rows = 8192, d.eg_H = 4096, d.eg_I = 1536;
  d.tokens = 16384, d.H = 4096, d.V_table = 32768;
  d.rope_n = 8192, d.heads = 32, d.hd = 128;
  d.mla_n = 4096, d.mla_heads = 128, d.mla_rope = 64, d.mla_stride = 192;
  d.T = 4096, d.nh = 8, d.nkv = 2, d.ahd = 128;
  d.blk = 2048;
  d.ffn_n = 32768 * 2048;
  d.rn = 16384, d.E = 256, d.k = 8, d.n_group = 8, d.topk_group = 4;
  d.mn = 4096, d.mk = 8, d.mH = 4096;
  d.chunks = 4, d.ranks = 8;
  d.loss_n = 1024, d.loss_V = 131072;
  d.strip_rows = 8192, d.strip_cols = 16384;
  d.n = 64 * kMi;
  d.col_rows = 16384, d.col_d = 256;
  d.s2_rows = 4096 * 128, d.s2_cols = 128, d.s2_lds = 192, d.s2_ldd = 128;
  d.adam_n = 64 * kMi;
  d.sgemm_side = 2048, d.sgemm_side_gpu = 8192;
  d.copy_bytes = 512ull << 20;
  return d;
}

// Tiny shapes of the same kinds, across a tile or a SIMD width where it is cheap to.
constexpr Dims small_dims() {
  Dims d{};
  d.gemm_M = 64, d.gemm_N = 96, d.gemm_K = 80;
  d.strip_M = 70, d.strip_N = 600, d.strip_K = 64;
  d.eg_G = 4, d.eg_rows = 200, d.eg_H = 64, d.eg_I = 48;
  d.tokens = 256, d.H = 128, d.V_table = 512;
  d.rope_n = 64, d.heads = 4, d.hd = 32;
  d.mla_n = 64, d.mla_heads = 8, d.mla_rope = 16, d.mla_stride = 48;
  d.T = 256, d.nh = 4, d.nkv = 2, d.ahd = 32;
  d.blk = 128;
  d.ffn_n = 65536;
  d.rn = 256, d.E = 32, d.k = 4, d.n_group = 4, d.topk_group = 2;
  d.mn = 128, d.mk = 4, d.mH = 128;
  d.chunks = 2, d.ranks = 2;
  d.loss_n = 64, d.loss_V = 1000;
  d.strip_rows = 64, d.strip_cols = 512;
  d.n = 65536;
  d.col_rows = 256, d.col_d = 32;
  d.s2_rows = 512, d.s2_cols = 32, d.s2_lds = 48, d.s2_ldd = 32;
  d.adam_n = 65536;
  d.sgemm_side = 256, d.sgemm_side_gpu = 512;
  d.copy_bytes = 8ull << 20;
  return d;
}

// One call of one entry: what it is, what it costs, and how to launch it.
struct Case {
  std::string shape;
  double flops = 0;  // Note [bench kernels: FLOPs and bytes]
  double bytes = 0;
  bool by_flops = false;  // its rate is FLOP/s (GEMMs, attention), else bytes/s
  std::function<void()> launch;
};

// The device operands of one case, alive until the case is done; filled with uniform values on a computing
// backend (nothing is written on meta, whose data pointers are null).
class Env {
 public:
  Env(Backend& be, DType t, uint64_t seed)
      : be(be), t(t), s(static_cast<double>(dtype_size(t))), K(be.kernels()), rng(seed) {}
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  // n elements of dtype dt (the row's when omitted), uniform in [lo, hi).
  Buf data(int64_t n, float lo = -1.0f, float hi = 1.0f) { return data_of(t, n, lo, hi); }
  Buf data_of(DType dt, int64_t n, float lo = -1.0f, float hi = 1.0f) {
    Tensor& x = alloc(n, dt);
    if (be.computes()) {
      // A 1 Mi-element random pattern repeated: setup in a fraction of a second at 64 Mi elements.
      std::vector<float> h(static_cast<size_t>(n));
      const int64_t pat = std::min<int64_t>(n, kMi);
      for (int64_t i = 0; i < pat; ++i) h[i] = lo + (hi - lo) * static_cast<float>(rng.uniform());
      for (int64_t i = pat; i < n; i += pat) std::memcpy(h.data() + i, h.data(), sizeof(float) * std::min(pat, n - i));
      device_write_f32(be, x.buf(), h.data(), n);
    }
    return x.buf();
  }
  float* f32(int64_t n, float lo = -1.0f, float hi = 1.0f) { return data_of(DType::DType_F32, n, lo, hi).f32(); }
  // n f32 elements equal to v.
  float* f32_fill(int64_t n, float v) { return f32(n, v, v); }
  double* f64_fill(int64_t n, double v) { return up(std::vector<double>(static_cast<size_t>(n), v)); }
  template <class T>
  T* up(const std::vector<T>& v) {
    Tensor& x = alloc(static_cast<int64_t>(v.size()), dtype_of_host<T>());
    if (be.computes() && !v.empty()) be.copy_from_host(x.data(), v.data(), v.size() * sizeof(T));
    return static_cast<T*>(x.data());
  }
  // n int32 ids uniform in [0, hi).
  std::vector<int32_t> ids(int64_t n, int64_t hi) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(hi)));
    return v;
  }

  Backend& be;
  const DType t;   // the row's storage dtype
  const double s;  // its bytes per element
  const ops::KernelLauncher K;
  Rng rng;

 private:
  template <class T>
  static constexpr DType dtype_of_host() {
    if constexpr (std::is_same_v<T, int32_t>) return DType::DType_I32;
    if constexpr (std::is_same_v<T, int64_t>) return DType::DType_I64;
    if constexpr (std::is_same_v<T, double>) return DType::DType_F64;
    return DType::DType_F32;
  }
  Tensor& alloc(int64_t n, DType dt) {
    held_.push_back(std::make_unique<Tensor>(be.alloc(Category::Category_workspace, {n}, dt, "bench_kernels")));
    return *held_.back();
  }
  std::vector<std::unique_ptr<Tensor>> held_;
};

double f(int64_t x) { return static_cast<double>(x); }

// A routing of n tokens to k of E experts (random, repeats allowed): rows (n k) the token of each copy in
// expert order, slot_pos (n, k) the row of each slot (the host's routing sort, backend/cpu/kernels).
struct Routing {
  std::vector<int32_t> topk, rows, slot_pos;
  std::vector<int64_t> offsets;
  Routing(Env& e, int64_t n, int64_t k, int64_t E)
      : topk(e.ids(n * k, E)), rows(n * k), slot_pos(n * k), offsets(E + 1) {
    ops::cpu::moe_routing_build(topk.data(), n, k, E, rows.data(), slot_pos.data(), offsets.data());
  }
};

// ---- The cases, in FP_KERNEL_LIST's order (Note [bench kernels: FLOPs and bytes] for the formulas)

// C (M, N) = A (M, K) B (N, K)^T, beta = 0: every operand in the row's dtype (a linear layer).
Case case_gemm(Env& e, const Dims& d) {
  const int64_t M = d.gemm_M, N = d.gemm_N, Kd = d.gemm_K;
  const CBuf A = e.data(M * Kd), B = e.data(N * Kd);
  const Buf C = e.data(M * N);
  Case c{fmt::format("M={} N={} K={} (x W^T: tokens x hidden -> hidden)", M, N, Kd),
         2 * f(M) * f(N) * f(Kd),
         (f(M * Kd) + f(N * Kd) + f(M * N)) * e.s,
         true,
         {}};
  c.launch = [K = e.K, M, N, Kd, A, B, C] { K.gemm(false, true, M, N, Kd, 1.0f, A, Kd, B, Kd, 0.0f, C, N); };
  return c;
}

// A Ring-DTP strip: logits (M, N) f32 in every recipe = x (M, K) lm_head block (N, K)^T.
Case case_gemm_tiled(Env& e, const Dims& d) {
  const int64_t M = d.strip_M, N = d.strip_N, Kd = d.strip_K;
  const CBuf A = e.data(M * Kd), B = e.data(N * Kd);
  float* C = e.f32(M * N);
  Case c{fmt::format("M={} N={} K={} (vocab strip: tokens x vocab ids over hidden; C f32)", M, N, Kd),
         2 * f(M) * f(N) * f(Kd),
         (f(M * Kd) + f(N * Kd)) * e.s + f(M * N) * 4,
         true,
         {}};
  c.launch = [K = e.K, M, N, Kd, A, B, C] { K.gemm_tiled(false, true, M, N, Kd, 1.0f, A, Kd, B, Kd, 0.0f, C, N); };
  return c;
}

// A rank's experts: eg_rows routed rows over eg_G experts, unevenly (group g gets a share g + 1; at the
// small scale the last group is empty), in the row's dtype. The FLOPs are the groups' GEMMs; the bytes
// every row, every weight and every output once.
std::vector<int64_t> expert_offsets(const Dims& d) {
  const int64_t G = d.eg_G, shares = G * (G + 1) / 2;
  std::vector<int64_t> off(static_cast<size_t>(G + 1), 0);
  for (int64_t g = 0; g < G; ++g) off[g + 1] = off[g] + d.eg_rows * (g + 1) / shares;
  off[G] = d.eg_rows;
  if (d.eg_rows < 1000) off[G - 1] = off[G];  // an empty group, as a rank with a cold expert has
  return off;
}

// The gate projection of every expert: g (r, I) = x (r, H) W_g (I, H)^T.
Case case_gemm_grouped(Env& e, const Dims& d) {
  const int64_t G = d.eg_G, r = d.eg_rows, H = d.eg_H, I = d.eg_I;
  const std::vector<int64_t> off = expert_offsets(d);
  const CBuf x = e.data(r * H);
  std::vector<CBuf> W;
  for (int64_t g = 0; g < G; ++g) W.push_back(e.data(I * H));
  const Buf y = e.data(r * I);
  Case c{fmt::format("G={} rows={} H={} I={} (x W_g^T: a rank's experts, uneven groups)", G, r, H, I),
         2 * f(r) * f(H) * f(I),
         (f(r * H) + f(G * I * H) + f(r * I)) * e.s,
         true,
         {}};
  c.launch = [K = e.K, G, off, H, I, x, W, y] {
    K.gemm_grouped(true, G, off.data(), I, H, 1.0f, x, W.data(), nullptr, 0.0f, y);
  };
  return c;
}

// Their weight gradients: dW_g (I, H) += dg[rows_g]^T (I, n_g) x[rows_g] (n_g, H).
Case case_gemm_grouped_weight(Env& e, const Dims& d) {
  const int64_t G = d.eg_G, r = d.eg_rows, H = d.eg_H, I = d.eg_I;
  const std::vector<int64_t> off = expert_offsets(d);
  const CBuf dg = e.data(r * I), x = e.data(r * H);
  std::vector<Buf> dW;
  for (int64_t g = 0; g < G; ++g) dW.push_back(e.data(I * H));
  Case c{fmt::format("G={} rows={} H={} I={} (dW_g += dy^T x: a rank's experts, uneven groups)", G, r, H, I),
         2 * f(r) * f(H) * f(I),
         (f(r * H) + f(r * I) + 2 * f(G * I * H)) * e.s,
         true,
         {}};
  c.launch = [K = e.K, G, off, H, I, dg, x, dW] {
    K.gemm_grouped_weight(G, off.data(), I, H, 1.0f, dg, x, 1.0f, dW.data(), nullptr);
  };
  return c;
}

Case case_embedding_forward(Env& e, const Dims& d) {
  const int64_t n = d.tokens, H = d.H;
  const int32_t* tok = e.up(e.ids(n, d.V_table));
  const CBuf table = e.data(d.V_table * H);
  const Buf out = e.data(n * H);
  Case c{fmt::format("n={} H={} V={}", n, H, d.V_table), 0, f(n) * 4 + 2 * f(n * H) * e.s, false, {}};
  c.launch = [K = e.K, tok, table, out, n, H] { K.embedding_forward(tok, table, out, n, H); };
  return c;
}

// dtable rows touched: read and written once each (U distinct tokens).
Case case_embedding_backward(Env& e, const Dims& d) {
  const int64_t n = d.tokens, H = d.H;
  const std::vector<int32_t> ids = e.ids(n, d.V_table);
  const int64_t U = static_cast<int64_t>(std::set<int32_t>(ids.begin(), ids.end()).size());
  const int32_t* tok = e.up(ids);
  const CBuf dout = e.data(n * H, -1e-3f, 1e-3f);
  const Buf dtable = e.data(d.V_table * H);
  Case c{fmt::format("n={} H={} V={} ({} distinct rows)", n, H, d.V_table, U),
         0,
         f(n) * 4 + f(n * H) * e.s + 2 * f(U * H) * e.s,
         false,
         {}};
  c.launch = [K = e.K, tok, dout, dtable, n, H] { K.embedding_backward(tok, dout, dtable, n, H); };
  return c;
}

Case case_rmsnorm_forward(Env& e, const Dims& d) {
  const int64_t rows = d.tokens, D = d.H;
  const CBuf x = e.data(rows * D), w = e.data(D, 0.5f, 1.5f);
  const Buf y = e.data(rows * D);
  float* rstd = e.f32(rows);
  Case c{fmt::format("rows={} d={}", rows, D), 0, 2 * f(rows * D) * e.s + f(D) * e.s + f(rows) * 4, false, {}};
  c.launch = [K = e.K, x, w, y, rstd, rows, D] { K.rmsnorm_forward(x, w, y, rstd, rows, D, 1e-6f); };
  return c;
}

Case case_rmsnorm_backward(Env& e, const Dims& d) {
  const int64_t rows = d.tokens, D = d.H;
  const int64_t ws_n = e.K.rmsnorm_backward_workspace(rows, D);  // a host query (throws on a backend lacking it)
  const CBuf x = e.data(rows * D), w = e.data(D, 0.5f, 1.5f), dy = e.data(rows * D, -1e-3f, 1e-3f);
  const float* rstd = e.f32_fill(rows, 1.0f);
  const Buf dx = e.data(rows * D), dw = e.data(D);
  float* ws = e.f32(std::max<int64_t>(ws_n, 1));
  Case c{fmt::format("rows={} d={} (workspace {} floats)", rows, D, ws_n),
         0,
         3 * f(rows * D) * e.s + f(rows) * 4 + 3 * f(D) * e.s + 2 * f(ws_n) * 4,
         false,
         {}};
  c.launch = [K = e.K, x, w, rstd, dy, dx, dw, rows, D, ws] {
    K.rmsnorm_backward(x, w, rstd, dy, dx, dw, rows, D, ws);
  };
  return c;
}

// pos 0 .. n-1 (one sequence), default RoPE of theta 500000.
Case rope_case(Env& e, const Dims& d, bool backward) {
  const int64_t n = d.rope_n, heads = d.heads, hd = d.hd;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  const int32_t* dpos = e.up(pos);
  const ops::RopeFreqs fr{e.up(ops::rope_default_inv_freq(500000.0, hd)), 1.0f};
  const Buf x = e.data(n * heads * hd);
  Case c{fmt::format("n={} heads={} hd={}", n, heads, hd), 0, 2 * f(n * heads * hd) * e.s + f(n) * 4, false, {}};
  if (backward)
    c.launch = [K = e.K, x, dpos, n, heads, hd, fr] { K.rope_backward(x, dpos, n, heads, hd, fr); };
  else
    c.launch = [K = e.K, x, dpos, n, heads, hd, fr] { K.rope_forward(x, dpos, n, heads, hd, fr); };
  return c;
}

// MLA (DeepSeek-V3): the last qk_rope_head_dim numbers of each 192-wide query head, interleaved pairs.
Case rope_strided_case(Env& e, const Dims& d, bool backward) {
  const int64_t n = d.mla_n, heads = d.mla_heads, hd = d.mla_rope, stride = d.mla_stride;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  const int32_t* dpos = e.up(pos);
  const ops::RopeFreqs fr{e.up(ops::rope_default_inv_freq(10000.0, hd)), 1.0f};
  const Buf x = e.data(n * heads * stride).at(stride - hd);
  Case c{fmt::format("n={} heads={} hd={} head_stride={} interleaved", n, heads, hd, stride),
         0,
         2 * f(n * heads * hd) * e.s + f(n) * 4,
         false,
         {}};
  if (backward)
    c.launch = [K = e.K, x, dpos, n, heads, hd, stride, fr] {
      K.rope_strided_backward(x, dpos, n, heads, hd, stride, true, fr);
    };
  else
    c.launch = [K = e.K, x, dpos, n, heads, hd, stride, fr] {
      K.rope_strided_forward(x, dpos, n, heads, hd, stride, true, fr);
    };
  return c;
}

std::string attention_shape(const Dims& d) {
  return fmt::format("B=1 T={} nh={} nkv={} hd={} causal", d.T, d.nh, d.nkv, d.ahd);
}

// Visible pairs of one causal sequence of T: T (T + 1) / 2.
double causal_pairs(int64_t T) { return f(T) * f(T + 1) / 2; }

Case case_attention_forward(Env& e, const Dims& d) {
  const int64_t T = d.T, nh = d.nh, nkv = d.nkv, hd = d.ahd;
  const ops::AttentionSpec a = ops::attention_spec(1, T, nh, nkv, hd, hd, 1.0f / std::sqrt(f(hd)), 0);
  const CBuf q = e.data(T * nh * hd), k = e.data(T * nkv * hd), v = e.data(T * nkv * hd);
  const Buf o = e.data(T * nh * hd);
  float* lse = e.f32(nh * T);
  Case c{attention_shape(d),
         2 * causal_pairs(T) * f(nh) * f(2 * hd),
         (2 * f(T * nh * hd) + 2 * f(T * nkv * hd)) * e.s + f(nh * T) * 4,
         true,
         {}};
  c.launch = [K = e.K, q, k, v, o, lse, a] { K.attention_forward(q, k, v, o, lse, a); };
  return c;
}

// The forward state: o random, lse = log T (so that every P = exp(s - lse) is finite and small).
Case case_attention_backward(Env& e, const Dims& d) {
  const int64_t T = d.T, nh = d.nh, nkv = d.nkv, hd = d.ahd;
  const ops::AttentionSpec a = ops::attention_spec(1, T, nh, nkv, hd, hd, 1.0f / std::sqrt(f(hd)), 0);
  const CBuf q = e.data(T * nh * hd), k = e.data(T * nkv * hd), v = e.data(T * nkv * hd), o = e.data(T * nh * hd);
  const CBuf dout = e.data(T * nh * hd, -1e-3f, 1e-3f);
  const float* lse = e.f32_fill(nh * T, static_cast<float>(std::log(f(T))));
  const Buf dq = e.data(T * nh * hd), dk = e.data(T * nkv * hd), dv = e.data(T * nkv * hd);
  Case c{attention_shape(d),
         2 * causal_pairs(T) * f(nh) * f(5 * hd),
         (5 * f(T * nh * hd) + 4 * f(T * nkv * hd)) * e.s + f(nh * T) * 4,
         true,
         {}};
  c.launch = [K = e.K, q, k, v, o, lse, dout, dq, dk, dv, a] {
    K.attention_backward(q, k, v, o, lse, dout, dq, dk, dv, a);
  };
  return c;
}

// gpt-oss's sinks: D = rowsum(dout * o) per row, read o, dout and lse once.
Case case_attention_sink_backward(Env& e, const Dims& d) {
  const int64_t T = d.T, nh = d.nh, hd = d.ahd;
  ops::AttentionSpec a = ops::attention_spec(1, T, nh, d.nkv, hd, hd, 1.0f / std::sqrt(f(hd)), 0);
  a.sinks = e.data(nh);
  const CBuf o = e.data(T * nh * hd), dout = e.data(T * nh * hd, -1e-3f, 1e-3f);
  const float* lse = e.f32_fill(nh * T, static_cast<float>(std::log(f(T))));
  const Buf ds = e.data(nh);
  Case c{fmt::format("B=1 T={} nh={} hdv={}", T, nh, hd),
         0,
         2 * f(T * nh * hd) * e.s + f(nh * T) * 4 + 3 * f(nh) * e.s,
         false,
         {}};
  c.launch = [K = e.K, o, dout, lse, ds, a] { K.attention_sink_backward(o, dout, lse, ds, a); };
  return c;
}

// A ring's off-diagonal block pair: queries at blk .. 2 blk - 1 see every key at 0 .. blk - 1.
struct BlockPair {
  const int32_t *q_pos, *k_pos;
  ops::AttentionSpec a;
  BlockPair(Env& e, const Dims& d) {
    std::vector<int32_t> qp(static_cast<size_t>(d.blk)), kp(static_cast<size_t>(d.blk));
    std::iota(qp.begin(), qp.end(), static_cast<int32_t>(d.blk));
    std::iota(kp.begin(), kp.end(), 0);
    q_pos = e.up(qp);
    k_pos = e.up(kp);
    a = ops::attention_block_spec(q_pos, k_pos, 1, d.blk, d.blk, d.nh, d.nkv, d.ahd, d.ahd, 1.0f / std::sqrt(f(d.ahd)),
                                  0);
  }
  static std::string shape(const Dims& d) {
    return fmt::format("B=1 Tq=Tk={} nh={} nkv={} hd={} (off-diagonal: every pair visible)", d.blk, d.nh, d.nkv, d.ahd);
  }
};

// first = false: merged into a running state (o, lse) read and written.
Case case_attention_block_forward(Env& e, const Dims& d) {
  const BlockPair p(e, d);
  const int64_t Tq = d.blk, nh = d.nh, nkv = d.nkv, hd = d.ahd;
  const CBuf q = e.data(Tq * nh * hd), k = e.data(Tq * nkv * hd), v = e.data(Tq * nkv * hd);
  const Buf o = e.data(Tq * nh * hd);
  float* lse = e.f32_fill(nh * Tq, static_cast<float>(std::log(f(Tq))));
  Case c{BlockPair::shape(d) + ", merged (first = false)",
         2 * f(Tq) * f(Tq) * f(nh) * f(2 * hd),
         (3 * f(Tq * nh * hd) + 2 * f(Tq * nkv * hd)) * e.s + 2 * f(nh * Tq) * 4,
         true,
         {}};
  c.launch = [K = e.K, q, k, v, o, lse, a = p.a] { K.attention_block_forward(q, k, v, o, lse, false, a); };
  return c;
}

// Adds to dq, dk, dv (read and written).
Case case_attention_block_backward(Env& e, const Dims& d) {
  const BlockPair p(e, d);
  const int64_t Tq = d.blk, nh = d.nh, nkv = d.nkv, hd = d.ahd;
  const CBuf q = e.data(Tq * nh * hd), k = e.data(Tq * nkv * hd), v = e.data(Tq * nkv * hd), o = e.data(Tq * nh * hd);
  const CBuf dout = e.data(Tq * nh * hd, -1e-3f, 1e-3f);
  const float* lse = e.f32_fill(nh * Tq, static_cast<float>(std::log(f(Tq))));
  const Buf dq = e.data(Tq * nh * hd), dk = e.data(Tq * nkv * hd), dv = e.data(Tq * nkv * hd);
  Case c{BlockPair::shape(d),
         2 * f(Tq) * f(Tq) * f(nh) * f(5 * hd),
         (5 * f(Tq * nh * hd) + 6 * f(Tq * nkv * hd)) * e.s + f(nh * Tq) * 4,
         true,
         {}};
  c.launch = [K = e.K, q, k, v, o, lse, dout, dq, dk, dv, a = p.a] {
    K.attention_block_backward(q, k, v, o, lse, dout, dq, dk, dv, a);
  };
  return c;
}

std::string ffn_shape(const Dims& d) { return fmt::format("n={} (routed rows x expert width)", d.ffn_n); }

Case swiglu_case(Env& e, const Dims& d, bool backward, bool clamped) {
  const int64_t n = d.ffn_n;
  const float alpha = 1.702f, limit = 7.0f;
  const CBuf g = e.data(n, -4.0f, 4.0f), u = e.data(n, -4.0f, 4.0f);
  Case c{ffn_shape(d), 0, (backward ? 5 : 3) * f(n) * e.s, false, {}};
  if (backward) {
    const CBuf da = e.data(n);
    const Buf dg = e.data(n), du = e.data(n);
    if (clamped)
      c.launch = [K = e.K, g, u, da, dg, du, n, alpha, limit] {
        K.swiglu_clamped_backward(g, u, da, dg, du, n, alpha, limit);
      };
    else
      c.launch = [K = e.K, g, u, da, dg, du, n] { K.swiglu_backward(g, u, da, dg, du, n); };
  } else {
    const Buf a = e.data(n);
    if (clamped)
      c.launch = [K = e.K, g, u, a, n, alpha, limit] { K.swiglu_clamped_forward(g, u, a, n, alpha, limit); };
    else
      c.launch = [K = e.K, g, u, a, n] { K.swiglu_forward(g, u, a, n); };
  }
  return c;
}

ops::RouterSpec router_spec(const Dims& d) { return {d.rn, d.E, d.k, true, d.n_group, d.topk_group, 2.5f}; }
std::string router_shape(const Dims& d, bool sigmoid) {
  return sigmoid ? fmt::format("n={} E={} k={} groups {} (best {})", d.rn, d.E, d.k, d.n_group, d.topk_group)
                 : fmt::format("n={} E={} k={}", d.rn, d.E, d.k);
}

Case case_router_forward(Env& e, const Dims& d) {
  const ops::RouterSpec sp = router_spec(d);
  const float* logits = e.f32(sp.n * sp.E, -2.0f, 2.0f);
  float *probs = e.f32(sp.n * sp.E), *w = e.f32(sp.n * sp.k);
  int32_t* idx = e.up(std::vector<int32_t>(static_cast<size_t>(sp.n * sp.k), 0));
  Case c{router_shape(d, false), 0, (2 * f(sp.n * sp.E) + 2 * f(sp.n * sp.k)) * 4, false, {}};
  c.launch = [K = e.K, logits, probs, idx, w, sp] { K.router_forward(logits, probs, idx, w, sp); };
  return c;
}

// A routing profile's choice: the chosen probabilities gathered (one element touched per slot).
Case case_router_gather(Env& e, const Dims& d) {
  const ops::RouterSpec sp = router_spec(d);
  const float* probs = e.f32(sp.n * sp.E, 0.0f, 2.0f / static_cast<float>(sp.E));
  const int32_t* idx = e.up(e.ids(sp.n * sp.k, sp.E));
  float* w = e.f32(sp.n * sp.k);
  Case c{router_shape(d, false), 0, 3 * f(sp.n * sp.k) * 4, false, {}};
  c.launch = [K = e.K, probs, idx, w, sp] { K.router_gather(probs, idx, w, sp); };
  return c;
}

Case case_router_backward(Env& e, const Dims& d) {
  const ops::RouterSpec sp = router_spec(d);
  const float* probs = e.f32(sp.n * sp.E, 0.0f, 2.0f / static_cast<float>(sp.E));
  const int32_t* idx = e.up(e.ids(sp.n * sp.k, sp.E));
  const float *dw = e.f32(sp.n * sp.k), *bias = e.f32(sp.E);
  float* dlogits = e.f32(sp.n * sp.E);
  Case c{router_shape(d, false) + ", with the balance term",
         0,
         (2 * f(sp.n * sp.E) + 2 * f(sp.n * sp.k) + f(sp.E)) * 4,
         false,
         {}};
  c.launch = [K = e.K, probs, idx, dw, bias, dlogits, sp] { K.router_backward(probs, idx, dw, bias, dlogits, sp); };
  return c;
}

Case case_router_sigmoid_forward(Env& e, const Dims& d) {
  const ops::RouterSpec sp = router_spec(d);
  const float *logits = e.f32(sp.n * sp.E, -2.0f, 2.0f), *bias = e.f32(sp.E, -0.3f, 0.3f);
  float *scores = e.f32(sp.n * sp.E), *w = e.f32(sp.n * sp.k);
  int32_t* idx = e.up(std::vector<int32_t>(static_cast<size_t>(sp.n * sp.k), 0));
  Case c{router_shape(d, true), 0, (2 * f(sp.n * sp.E) + f(sp.E) + 2 * f(sp.n * sp.k)) * 4, false, {}};
  c.launch = [K = e.K, logits, bias, scores, idx, w, sp] {
    K.router_sigmoid_forward(logits, bias, scores, idx, w, sp);
  };
  return c;
}

Case case_router_sigmoid_gather(Env& e, const Dims& d) {
  const ops::RouterSpec sp = router_spec(d);
  const float* scores = e.f32(sp.n * sp.E, 0.0f, 1.0f);
  const int32_t* idx = e.up(e.ids(sp.n * sp.k, sp.E));
  float* w = e.f32(sp.n * sp.k);
  Case c{router_shape(d, true), 0, 3 * f(sp.n * sp.k) * 4, false, {}};
  c.launch = [K = e.K, scores, idx, w, sp] { K.router_sigmoid_gather(scores, idx, w, sp); };
  return c;
}

// dlogits (n, E) written whole; scores read at the chosen experts.
Case case_router_sigmoid_backward(Env& e, const Dims& d) {
  const ops::RouterSpec sp = router_spec(d);
  const float* scores = e.f32(sp.n * sp.E, 0.0f, 1.0f);
  const int32_t* idx = e.up(e.ids(sp.n * sp.k, sp.E));
  const float* dw = e.f32(sp.n * sp.k);
  float* dlogits = e.f32(sp.n * sp.E);
  Case c{router_shape(d, true), 0, (f(sp.n * sp.E) + 3 * f(sp.n * sp.k)) * 4, false, {}};
  c.launch = [K = e.K, scores, idx, dw, dlogits, sp] { K.router_sigmoid_backward(scores, idx, dw, dlogits, sp); };
  return c;
}

// The sigmoid router's bias between steps: E entries read and written, E loads read.
Case case_routing_bias_update(Env& e, const Dims& d) {
  const int64_t E = d.E;
  float* bias = e.f32(E);
  const double* load = e.f64_fill(E, 1.0);
  Case c{fmt::format("E={} (aux-loss-free balancing)", E), 0, f(E) * (4 + 4 + 8), false, {}};
  c.launch = [K = e.K, bias, load, E] { K.routing_bias_update(bias, load, E, 1.0, 1e-3); };
  return c;
}

Case case_moe_routing_build(Env& e, const Dims& d) {
  const int64_t n = d.rn, k = d.k, E = d.E;
  const int32_t* idx = e.up(e.ids(n * k, E));
  int32_t *rows = e.up(std::vector<int32_t>(static_cast<size_t>(n * k))),
          *slot = e.up(std::vector<int32_t>(static_cast<size_t>(n * k)));
  int64_t* off = e.up(std::vector<int64_t>(static_cast<size_t>(E + 1)));
  Case c{fmt::format("n={} k={} E={}", n, k, E), 0, 3 * f(n * k) * 4 + f(E + 1) * 8, false, {}};
  c.launch = [K = e.K, idx, n, k, E, rows, slot, off] { K.moe_routing_build(idx, n, k, E, rows, slot, off); };
  return c;
}

std::string moe_shape(const Dims& d) {
  return fmt::format("n={} k={} m={} H={} (E={})", d.mn, d.mk, d.mn * d.mk, d.mH, d.E);
}

Case case_moe_gather(Env& e, const Dims& d) {
  const Routing r(e, d.mn, d.mk, d.E);
  const int64_t m = d.mn * d.mk, H = d.mH;
  const CBuf x = e.data(d.mn * H);
  const int32_t* rows = e.up(r.rows);
  const Buf xs = e.data(m * H);
  Case c{moe_shape(d), 0, f(m) * 4 + 2 * f(m * H) * e.s, false, {}};
  c.launch = [K = e.K, x, rows, xs, m, H] { K.moe_gather(x, rows, xs, m, H); };
  return c;
}

// Every row of dst written once, in a random order (a permutation of m rows).
Case case_moe_scatter(Env& e, const Dims& d) {
  const int64_t m = d.mn * d.mk, H = d.mH;
  std::vector<int32_t> dest(static_cast<size_t>(m));
  std::iota(dest.begin(), dest.end(), 0);
  for (int64_t i = m - 1; i > 0; --i) std::swap(dest[i], dest[e.rng.below(static_cast<uint64_t>(i + 1))]);
  const CBuf src = e.data(m * H);
  const int32_t* rows = e.up(dest);
  const Buf dst = e.data(m * H);
  Case c{fmt::format("m={} H={} (a permutation)", m, H), 0, f(m) * 4 + 2 * f(m * H) * e.s, false, {}};
  c.launch = [K = e.K, src, rows, dst, m, H] { K.moe_scatter(src, rows, dst, m, H); };
  return c;
}

// m copies of n tokens in expert order, P = 64 equal pieces to W ranks (piece p to rank p mod W, its chunk i
// counted in counter p mod W + i W), K contiguous chunks of the tokens.
Case case_moe_chunk_order(Env& e, const Dims& d) {
  const Routing r(e, d.rn, d.k, d.E);
  const int64_t n = d.rn, m = n * d.k, K = d.chunks, W = d.ranks, P = 64, B = K * W;
  std::vector<int64_t> pieces;
  for (int64_t p = 0; p < P; ++p) pieces.insert(pieces.end(), {m * p / P, m * (p + 1) / P, p % W, p % W, W});
  const ops::ChunkOrderSpec spec{m, P, K, (n + K - 1) / K, false, W, B};
  const int32_t* rows = e.up(r.rows);
  const int64_t* dp = e.up(pieces);
  int32_t *order = e.up(std::vector<int32_t>(static_cast<size_t>(m))),
          *tokens = e.up(std::vector<int32_t>(static_cast<size_t>(m)));
  int64_t *goff = e.up(std::vector<int64_t>(static_cast<size_t>(K * W + 1))),
          *blocks = e.up(std::vector<int64_t>(static_cast<size_t>(B)));
  Case c{fmt::format("m={} P={} K={} W={} (contiguous chunks)", m, P, K, W),
         0,
         3 * f(m) * 4 + f(P) * 40 + f(K * W + 1 + B) * 8,
         false,
         {}};
  c.launch = [Kl = e.K, rows, dp, spec, order, tokens, goff, blocks] {
    Kl.moe_chunk_order(rows, dp, spec, order, tokens, goff, blocks);
  };
  return c;
}

Case case_moe_combine_forward(Env& e, const Dims& d) {
  const Routing r(e, d.mn, d.mk, d.E);
  const int64_t n = d.mn, k = d.mk, m = n * k, H = d.mH;
  const CBuf ys = e.data(m * H);
  const int32_t* slot = e.up(r.slot_pos);
  const float* w = e.f32(n * k, 0.0f, 0.25f);
  const Buf out = e.data(n * H);
  Case c{moe_shape(d), 0, f(m * H) * e.s + 2 * f(n * H) * e.s + 2 * f(n * k) * 4, false, {}};
  c.launch = [K = e.K, ys, slot, w, out, n, k, H] { K.moe_combine_forward(ys, slot, w, out, n, k, H); };
  return c;
}

Case case_moe_combine_backward(Env& e, const Dims& d) {
  const Routing r(e, d.mn, d.mk, d.E);
  const int64_t n = d.mn, k = d.mk, m = n * k, H = d.mH;
  const CBuf ys = e.data(m * H), dout = e.data(n * H, -1e-3f, 1e-3f);
  const int32_t* slot = e.up(r.slot_pos);
  const float* w = e.f32(n * k, 0.0f, 0.25f);
  const Buf dys = e.data(m * H);
  float* dw = e.f32(n * k);
  Case c{moe_shape(d), 0, 2 * f(m * H) * e.s + f(n * H) * e.s + 3 * f(n * k) * 4, false, {}};
  c.launch = [K = e.K, ys, slot, w, dout, dys, dw, n, k, H] {
    K.moe_combine_backward(ys, slot, w, dout, dys, dw, n, k, H);
  };
  return c;
}

Case case_moe_scatter_add(Env& e, const Dims& d) {
  const Routing r(e, d.mn, d.mk, d.E);
  const int64_t n = d.mn, k = d.mk, m = n * k, H = d.mH;
  const CBuf dxs = e.data(m * H, -1e-3f, 1e-3f);
  const int32_t* slot = e.up(r.slot_pos);
  const Buf dx = e.data(n * H);
  Case c{moe_shape(d), 0, f(m * H) * e.s + 2 * f(n * H) * e.s + f(n * k) * 4, false, {}};
  c.launch = [K = e.K, dxs, slot, dx, n, k, H] { K.moe_scatter_add(dxs, slot, dx, n, k, H); };
  return c;
}

std::string loss_shape(const Dims& d) { return fmt::format("n={} V={} (the full vocabulary)", d.loss_n, d.loss_V); }

Case case_log_softmax_forward(Env& e, const Dims& d) {
  const int64_t n = d.loss_n, V = d.loss_V;
  const float* logits = e.f32(n * V, -4.0f, 4.0f);
  float* logp = e.f32(n * V);
  Case c{loss_shape(d), 0, 2 * f(n * V) * 4, false, {}};
  c.launch = [K = e.K, logits, logp, n, V] { K.log_softmax_forward(logits, logp, n, V); };
  return c;
}

// Reads one log-probability per token.
Case case_nll_forward(Env& e, const Dims& d) {
  const int64_t n = d.loss_n, V = d.loss_V;
  const float* logp = e.f32(n * V, -12.0f, 0.0f);
  const int32_t* tg = e.up(e.ids(n, V));
  float* loss = e.f32(n);
  Case c{loss_shape(d), 0, 3 * f(n) * 4, false, {}};
  c.launch = [K = e.K, logp, tg, loss, n, V] { K.nll_forward(logp, tg, loss, n, V); };
  return c;
}

Case case_cross_entropy_backward(Env& e, const Dims& d) {
  const int64_t n = d.loss_n, V = d.loss_V;
  const float* logp = e.f32(n * V, -12.0f, 0.0f);
  const int32_t* tg = e.up(e.ids(n, V));
  float* dl = e.f32(n * V);
  Case c{loss_shape(d), 0, 2 * f(n * V) * 4 + f(n) * 4, false, {}};
  c.launch = [K = e.K, logp, tg, dl, n, V] {
    K.cross_entropy_backward(logp, tg, 1.0f / static_cast<float>(n), dl, n, V);
  };
  return c;
}

std::string strip_shape(const Dims& d) {
  return fmt::format("rows={} strip of {} vocab ids", d.strip_rows, d.strip_cols);
}

// The state (m, z, y): 4 + 8 + 4 bytes a row.
Case case_online_lse_init(Env& e, const Dims& d) {
  const int64_t rows = d.strip_rows;
  float *m = e.f32(rows), *y = e.f32(rows);
  double* z = e.f64_fill(rows, 0.0);
  Case c{fmt::format("rows={}", rows), 0, f(rows) * 16, false, {}};
  c.launch = [K = e.K, m, z, y, rows] { K.online_lse_init(m, z, y, rows); };
  return c;
}

Case case_online_lse_fold(Env& e, const Dims& d) {
  const int64_t rows = d.strip_rows, cols = d.strip_cols;
  const float* strip = e.f32(rows * cols, -4.0f, 4.0f);
  const int32_t* tg = e.up(e.ids(rows, cols));
  float *m = e.f32_fill(rows, 0.0f), *y = e.f32_fill(rows, 0.0f);
  double* z = e.f64_fill(rows, 1.0);
  Case c{strip_shape(d), 0, f(rows * cols) * 4 + f(rows) * 4 + 2 * f(rows) * 16, false, {}};
  c.launch = [K = e.K, strip, cols, tg, rows, m, z, y] { K.online_lse_fold(strip, cols, tg, rows, 0, cols, m, z, y); };
  return c;
}

Case case_online_lse_loss(Env& e, const Dims& d) {
  const int64_t rows = d.strip_rows;
  const float *m = e.f32_fill(rows, 0.0f), *y = e.f32(rows);
  const double* z = e.f64_fill(rows, f(d.loss_V));
  const int32_t* tg = e.up(e.ids(rows, d.loss_V));
  double* loss = e.f64_fill(1, 0.0);
  Case c{fmt::format("rows={}", rows), 0, f(rows) * 20 + 8, false, {}};
  c.launch = [K = e.K, m, z, y, tg, rows, loss] { K.online_lse_loss(m, z, y, tg, rows, loss); };
  return c;
}

// In place from a final state with lse = log(cols).
Case case_online_lse_backward(Env& e, const Dims& d) {
  const int64_t rows = d.strip_rows, cols = d.strip_cols;
  float* strip = e.f32(rows * cols, -4.0f, 4.0f);
  const int32_t* tg = e.up(e.ids(rows, cols));
  const float* m = e.f32_fill(rows, 0.0f);
  const double* z = e.f64_fill(rows, f(cols));
  Case c{strip_shape(d), 0, 2 * f(rows * cols) * 4 + f(rows) * 16, false, {}};
  c.launch = [K = e.K, strip, cols, tg, rows, m, z] {
    K.online_lse_backward(strip, cols, tg, rows, 0, cols, m, z, 1.0f / static_cast<float>(rows));
  };
  return c;
}

std::string n_shape(const Dims& d) { return fmt::format("n={}", d.n); }

Case case_add_inplace(Env& e, const Dims& d) {
  const int64_t n = d.n;
  const Buf y = e.data(n);
  const CBuf x = e.data(n, -1e-3f, 1e-3f);
  Case c{n_shape(d), 0, 3 * f(n) * e.s, false, {}};
  c.launch = [K = e.K, y, x, n] { K.add_inplace(y, x, n); };
  return c;
}

Case case_scale_inplace(Env& e, const Dims& d) {
  const int64_t n = d.n;
  const Buf y = e.data(n);
  Case c{n_shape(d), 0, 2 * f(n) * e.s, false, {}};
  c.launch = [K = e.K, y, n] { K.scale_inplace(y, 0.999f, n); };
  return c;
}

Case case_fill(Env& e, const Dims& d) {
  const int64_t n = d.n;
  const Buf y = e.data(n);
  Case c{n_shape(d), 0, f(n) * e.s, false, {}};
  c.launch = [K = e.K, y, n] { K.fill(y, 0.5f, n); };
  return c;
}

Case case_copy(Env& e, const Dims& d) {
  const int64_t n = d.n;
  const Buf dst = e.data(n);
  const CBuf src = e.data(n);
  Case c{n_shape(d) + " (same dtype)", 0, 2 * f(n) * e.s, false, {}};
  c.launch = [K = e.K, dst, src, n] { K.copy(dst, src, n); };
  return c;
}

Case reduce_case(Env& e, const Dims& d, bool squares) {
  const int64_t n = d.n;
  const CBuf x = e.data(n);
  float* out = e.f32(1);
  Case c{n_shape(d), 0, f(n) * e.s + 4, false, {}};
  if (squares)
    c.launch = [K = e.K, x, n, out] { K.reduce_sumsq(x, n, out); };
  else
    c.launch = [K = e.K, x, n, out] { K.reduce_sum(x, n, out); };
  return c;
}

// A bucket of gradients: 64 tensors sharing d.n elements (the partials of the gradient norm).
Case case_reduce_sumsq_multi(Env& e, const Dims& d) {
  constexpr int64_t kTensors = 64;
  const int64_t each = d.n / kTensors;
  std::vector<CBuf> x;
  for (int64_t i = 0; i < kTensors; ++i) x.push_back(e.data(each));
  const std::vector<int64_t> n(kTensors, each);
  float* out = e.f32(kTensors);
  Case c{fmt::format("{} tensors of {}", kTensors, each), 0, f(kTensors * each) * e.s + 4 * kTensors, false, {}};
  c.launch = [K = e.K, x, n, out] { K.reduce_sumsq_multi(x.data(), n.data(), static_cast<int64_t>(x.size()), out); };
  return c;
}

Case case_bias_add(Env& e, const Dims& d) {
  const int64_t rows = d.tokens, D = d.H;
  const Buf y = e.data(rows * D);
  const CBuf b = e.data(D, -1e-3f, 1e-3f);
  Case c{fmt::format("rows={} d={}", rows, D), 0, 2 * f(rows * D) * e.s + f(D) * e.s, false, {}};
  c.launch = [K = e.K, y, b, rows, D] { K.bias_add(y, b, rows, D); };
  return c;
}

Case case_bias_backward(Env& e, const Dims& d) {
  const int64_t rows = d.tokens, D = d.H;
  const CBuf dy = e.data(rows * D, -1e-3f, 1e-3f);
  const Buf db = e.data(D);
  Case c{fmt::format("rows={} d={}", rows, D), 0, f(rows * D) * e.s + 2 * f(D) * e.s, false, {}};
  c.launch = [K = e.K, dy, db, rows, D] { K.bias_backward(dy, db, rows, D); };
  return c;
}

Case case_column_sums_f64(Env& e, const Dims& d) {
  const int64_t rows = d.col_rows, D = d.col_d;
  const CBuf x = e.data(rows * D, 0.0f, 2.0f / static_cast<float>(D));
  double* out = e.f64_fill(D, 0.0);
  Case c{fmt::format("rows={} d={} (router probabilities)", rows, D), 0, f(rows * D) * e.s + f(D) * 8, false, {}};
  c.launch = [K = e.K, x, rows, D, out] { K.column_sums_f64(x, rows, D, out); };
  return c;
}

Case strided_case(Env& e, const Dims& d, bool add) {
  const int64_t rows = d.s2_rows, cols = d.s2_cols, lds = d.s2_lds, ldd = d.s2_ldd;
  const CBuf src = e.data(rows * lds);
  const Buf dst = e.data(rows * ldd);
  Case c{fmt::format("rows={} cols={} lds={} ldd={} (MLA head split)", rows, cols, lds, ldd),
         0,
         (add ? 3 : 2) * f(rows * cols) * e.s,
         false,
         {}};
  if (add)
    c.launch = [K = e.K, dst, ldd, src, lds, rows, cols] { K.add_2d(dst, ldd, src, lds, rows, cols); };
  else
    c.launch = [K = e.K, dst, ldd, src, lds, rows, cols] { K.copy_2d(dst, ldd, src, lds, rows, cols); };
  return c;
}

// param, m, v f32 (read and written), grad in the row's dtype; bf16 rows also write the bf16 working copy
// (the mixed-precision step), f32 rows none (param is the weights).
Case case_adamw_update(Env& e, const Dims& d) {
  const int64_t n = d.adam_n;
  float* param = e.f32(n);
  const CBuf grad = e.data(n, -1e-3f, 1e-3f);
  float *m = e.f32(n, -1e-4f, 1e-4f), *v = e.f32(n, 1e-9f, 1e-8f);
  const bool copy = e.t != DType::DType_F32;
  const Buf pc = copy ? e.data(n) : Buf(nullptr);
  const ops::AdamWHyper h{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10};
  Case c{fmt::format("n={}{}", n, copy ? " (with the bf16 working copy)" : ""),
         0,
         f(n) * (24 + e.s + (copy ? e.s : 0)),
         false,
         {}};
  c.launch = [K = e.K, param, grad, m, v, n, h, pc] { K.adamw_update(param, grad, m, v, n, h, pc); };
  return c;
}

// A bucket of 64 tensors sharing d.adam_n elements, as case_adamw_update's operands (half of them decayed).
Case case_adamw_update_multi(Env& e, const Dims& d) {
  constexpr int64_t kTensors = 64;
  const int64_t each = d.adam_n / kTensors;
  const bool copy = e.t != DType::DType_F32;
  std::vector<ops::AdamWTensor> t;
  for (int64_t i = 0; i < kTensors; ++i) {
    ops::AdamWTensor a;
    a.param = e.f32(each);
    a.grad = e.data(each, -1e-3f, 1e-3f);
    a.m = e.f32(each, -1e-4f, 1e-4f);
    a.v = e.f32(each, 1e-9f, 1e-8f);
    a.n = each;
    a.weight_decay = i % 2 == 0 ? 0.1f : 0.0f;
    a.param_copy = copy ? e.data(each) : Buf(nullptr);
    t.push_back(a);
  }
  const ops::AdamWHyper h{1e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 10};
  Case c{fmt::format("{} tensors of {}{}", kTensors, each, copy ? " (with the bf16 working copies)" : ""),
         0,
         f(kTensors * each) * (24 + e.s + (copy ? e.s : 0)),
         false,
         {}};
  c.launch = [K = e.K, t, h] { K.adamw_update_multi(t.data(), static_cast<int64_t>(t.size()), h); };
  return c;
}

using CaseFn = Case (*)(Env&, const Dims&);

// One case per entry of FP_KERNEL_LIST, by name.
const std::map<std::string, CaseFn>& cases() {
  static const std::map<std::string, CaseFn> m = {
      {"gemm", case_gemm},
      {"gemm_tiled", case_gemm_tiled},
      {"gemm_grouped", case_gemm_grouped},
      {"gemm_grouped_weight", case_gemm_grouped_weight},
      {"embedding_forward", case_embedding_forward},
      {"embedding_backward", case_embedding_backward},
      {"rmsnorm_forward", case_rmsnorm_forward},
      {"rmsnorm_backward", case_rmsnorm_backward},
      {"rope_forward", [](Env& e, const Dims& d) { return rope_case(e, d, false); }},
      {"rope_backward", [](Env& e, const Dims& d) { return rope_case(e, d, true); }},
      {"rope_strided_forward", [](Env& e, const Dims& d) { return rope_strided_case(e, d, false); }},
      {"rope_strided_backward", [](Env& e, const Dims& d) { return rope_strided_case(e, d, true); }},
      {"attention_forward", case_attention_forward},
      {"attention_backward", case_attention_backward},
      {"attention_sink_backward", case_attention_sink_backward},
      {"attention_block_forward", case_attention_block_forward},
      {"attention_block_backward", case_attention_block_backward},
      {"swiglu_forward", [](Env& e, const Dims& d) { return swiglu_case(e, d, false, false); }},
      {"swiglu_backward", [](Env& e, const Dims& d) { return swiglu_case(e, d, true, false); }},
      {"swiglu_clamped_forward", [](Env& e, const Dims& d) { return swiglu_case(e, d, false, true); }},
      {"swiglu_clamped_backward", [](Env& e, const Dims& d) { return swiglu_case(e, d, true, true); }},
      {"router_forward", case_router_forward},
      {"router_gather", case_router_gather},
      {"router_backward", case_router_backward},
      {"router_sigmoid_forward", case_router_sigmoid_forward},
      {"router_sigmoid_gather", case_router_sigmoid_gather},
      {"router_sigmoid_backward", case_router_sigmoid_backward},
      {"routing_bias_update", case_routing_bias_update},
      {"moe_routing_build", case_moe_routing_build},
      {"moe_gather", case_moe_gather},
      {"moe_scatter", case_moe_scatter},
      {"moe_chunk_order", case_moe_chunk_order},
      {"moe_combine_forward", case_moe_combine_forward},
      {"moe_combine_backward", case_moe_combine_backward},
      {"moe_scatter_add", case_moe_scatter_add},
      {"log_softmax_forward", case_log_softmax_forward},
      {"nll_forward", case_nll_forward},
      {"cross_entropy_backward", case_cross_entropy_backward},
      {"online_lse_init", case_online_lse_init},
      {"online_lse_fold", case_online_lse_fold},
      {"online_lse_loss", case_online_lse_loss},
      {"online_lse_backward", case_online_lse_backward},
      {"add_inplace", case_add_inplace},
      {"scale_inplace", case_scale_inplace},
      {"fill", case_fill},
      {"copy", case_copy},
      {"reduce_sum", [](Env& e, const Dims& d) { return reduce_case(e, d, false); }},
      {"reduce_sumsq", [](Env& e, const Dims& d) { return reduce_case(e, d, true); }},
      {"reduce_sumsq_multi", case_reduce_sumsq_multi},
      {"bias_add", case_bias_add},
      {"bias_backward", case_bias_backward},
      {"column_sums_f64", case_column_sums_f64},
      {"copy_2d", [](Env& e, const Dims& d) { return strided_case(e, d, false); }},
      {"add_2d", [](Env& e, const Dims& d) { return strided_case(e, d, true); }},
      {"adamw_update", case_adamw_update},
      {"adamw_update_multi", case_adamw_update_multi},
  };
  return m;
}

// ---- The machine's limits

struct Limits {
  double gemm = 0;  // FLOP/s; 0: not measured
  double bw = 0;    // bytes/s; 0: not measured
  std::string gemm_how, bw_how;
};

// The least seconds of `repeats` timed calls of fn after one untimed call, each synchronized on the stream:
// a limit is the best the machine does (on a shared machine a median would sit below what a kernel reaches).
double best_seconds(Backend& be, const std::function<void()>& fn, int repeats) {
  fn();
  be.compute_stream().synchronize();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    fn();
    be.compute_stream().synchronize();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// Bytes read + written per second by glibc memcpy of `bytes`, split over the OpenMP threads (the cpu's), the
// best of `repeats`.
double memcpy_rate(uint64_t bytes, int repeats) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::vector<double> rates;
  for (int r = 0; r <= repeats; ++r) {
    const auto t0 = Clock::now();
#pragma omp parallel
    {
      const uint64_t nt = static_cast<uint64_t>(omp_get_num_threads()),
                     id = static_cast<uint64_t>(omp_get_thread_num());
      const uint64_t chunk = (bytes + nt - 1) / nt, lo = std::min(bytes, id * chunk), hi = std::min(bytes, lo + chunk);
      std::memcpy((r % 2 ? a : b).data() + lo, (r % 2 ? b : a).data() + lo, hi - lo);
    }
    const double s = seconds_since(t0);
    if (r > 0) rates.push_back(2.0 * static_cast<double>(bytes) / s);  // the first touches the pages
  }
  return *std::max_element(rates.begin(), rates.end());
}

Limits limits_measure(Backend& be, const Dims& d, bool cpu, int repeats) {
  Limits l;
  const ops::Kernels& table = be.kernels().table();
  if (table.supports(ops::KernelId::KernelId_gemm, DType::DType_F32)) {
    const int64_t n = cpu ? d.sgemm_side : d.sgemm_side_gpu;
    Env e(be, DType::DType_F32, 7);
    const CBuf A = e.data(n * n), B = e.data(n * n);
    const Buf C = e.data(n * n);
    const double s = best_seconds(
        be, [K = e.K, n, A, B, C] { K.gemm(false, true, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n); }, repeats);
    l.gemm = 2 * f(n) * f(n) * f(n) / s;
    l.gemm_how = fmt::format("f32 GEMM {}^3 through the table's gemm entry, best of {}", n, repeats);
  }
  if (cpu) {
    l.bw = memcpy_rate(d.copy_bytes, repeats);
    l.bw_how = fmt::format("memcpy of {} split over {} OpenMP threads, bytes read + written, best of {}",
                           bytes_format(d.copy_bytes), omp_get_max_threads(), repeats);
  } else if (table.supports(ops::KernelId::KernelId_copy, DType::DType_F32)) {
    const int64_t n = static_cast<int64_t>(d.copy_bytes / 4);
    Env e(be, DType::DType_F32, 8);
    const Buf a = e.data(n), b = e.data(n);
    const double s = best_seconds(
        be, [K = e.K, a, b, n] { K.copy(a, b, n); }, repeats);
    l.bw = 2.0 * static_cast<double>(d.copy_bytes) / s;
    l.bw_how = fmt::format("the table's copy entry on {} f32, bytes read + written, best of {}",
                           bytes_format(d.copy_bytes), repeats);
  }
  return l;
}

// The GPU's name from the NVIDIA driver (/proc/driver/nvidia/gpus/*/information, "Model:"), without linking
// the CUDA runtime here (bench may not use the cuda plug-in, Note [Layers the build enforces]).
std::string gpu_name() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& dir : fs::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    std::ifstream in(dir.path() / "information");
    for (std::string line; std::getline(in, line);)
      if (line.rfind("Model:", 0) == 0) {
        const size_t p = line.find_first_not_of(" \t", 6);
        return p == std::string::npos ? "" : line.substr(p);
      }
  }
  return "unknown (no /proc/driver/nvidia/gpus)";
}

// One row of the table.
struct Row {
  std::string kernel, dtype, status, shape, note;
  double flops = 0, bytes = 0;
  bool by_flops = false;
  std::vector<double> seconds;
  double median_s = 0, rate = 0, fraction = -1;
};

std::string fmt_rate(const Row& r) {
  return r.by_flops ? fmt::format("{:.4g} GFLOP/s", r.rate / 1e9) : fmt::format("{:.4g} GB/s", r.rate / 1e9);
}

void row_print(const Row& r) {
  const std::string gflop = r.by_flops ? fmt::format("{:.4g}", r.flops / 1e9) : "-";
  if (r.status == "ok")
    fmt::print("| {} | {} | {} | {} | {:.4g} | {:.4g} | {} | {} | {} |\n", r.kernel, r.dtype, r.shape, gflop,
               r.bytes / 1e6, r.median_s * 1e3, r.seconds.size(), fmt_rate(r),
               r.fraction >= 0 ? fmt::format("{:.0f}%", 100 * r.fraction) : "-");
  else
    fmt::print("| {} | {} | {} | {} | {} | - | - | {}{} | - |\n", r.kernel, r.dtype, r.shape.empty() ? "-" : r.shape,
               r.shape.empty() ? "-" : gflop, r.shape.empty() ? "-" : fmt::format("{:.4g}", r.bytes / 1e6), r.status,
               r.note.empty() ? "" : " (" + r.note + ")");
  std::fflush(stdout);
}

nlohmann::json row_json(const Row& r) {
  nlohmann::json j = {{"kernel", r.kernel}, {"dtype", r.dtype}, {"status", r.status}};
  if (!r.note.empty()) j["note"] = r.note;
  if (!r.shape.empty()) {
    j["shape"] = r.shape;
    j["flops"] = r.flops;
    j["bytes"] = r.bytes;
    j["bound"] = r.by_flops ? "flops" : "bytes";
  }
  if (r.status == "ok") {
    j["seconds_median"] = r.median_s;
    j["seconds"] = r.seconds;
    j["runs"] = r.seconds.size();
    j["rate"] = r.rate;
    j["rate_unit"] = r.by_flops ? "flop/s" : "byte/s";
    j["flops_per_s"] = r.flops / r.median_s;
    j["bytes_per_s"] = r.bytes / r.median_s;
    if (r.fraction >= 0) j["fraction_of_limit"] = r.fraction;
  }
  return j;
}

bool not_implemented(const Error& err) { return std::string(err.what()).find("not implemented") != std::string::npos; }

// The benchmark (bench_kernels_run), inside this namespace so that no name of another bench file's (a unity
// batch, Note [Unity builds] in CMakeLists.txt) can meet these.
int run(const BenchKernelsOptions& o) {
  FP_CHECK(o.dtype == "f32" || o.dtype == "bf16" || o.dtype == "both", "--dtype f32, bf16 or both",
           "bench kernels: unknown dtype '{}'", o.dtype);
  FP_CHECK(o.scale == "paper" || o.scale == "small", "--scale paper or small", "bench kernels: unknown scale '{}'",
           o.scale);
  FP_CHECK(o.repeats >= 1 && o.warmup >= 0, "--repeats 1 or more, --warmup 0 or more",
           "bench kernels: repeats {} / warmup {} out of range", o.repeats, o.warmup);
  std::regex only;
  try {
    only = std::regex(o.only.empty() ? std::string(".*") : o.only);
  } catch (const std::regex_error& err) {
    throw Error(fmt::format("bench kernels: --only '{}' is not a regular expression: {}", o.only, err.what()),
                "an ECMAScript regex matched against each entry's name, e.g. 'attention|gemm'");
  }
  {
    int matched = 0;
    for (int i = 0; i < ops::kKernelCount; ++i)
      matched += std::regex_search(ops::kernel_name(static_cast<ops::KernelId>(i)), only) ? 1 : 0;
    FP_CHECK(matched > 0,
             "the entries are the names of FP_KERNEL_LIST in src/backend/kernels.h (gemm, attention_forward, ...)",
             "bench kernels: --only '{}' matches no entry of the kernel table", o.only);
  }
  // The backend's own error for an unknown name (listing the registered ones) or a cuda without a GPU.
  const std::unique_ptr<Backend> be = backend_create(o.backend, kUnlimitedBytes, kUnlimitedBytes);
  const bool computes = be->computes(), cpu = be->name() == "cpu";
  const Dims d = o.scale == "paper" ? paper_dims() : small_dims();
  std::vector<DType> dtypes;
  if (o.dtype != "bf16") dtypes.push_back(DType::DType_F32);
  if (o.dtype != "f32") dtypes.push_back(DType::DType_BF16);
  FP_ASSERT(static_cast<int>(cases().size()) == ops::kKernelCount, "bench kernels: {} cases for {} entries",
            cases().size(), ops::kKernelCount);

  fmt::print("flatpeak bench kernels: backend {}, scale {}, dtype {}, {} entries of the kernel table; {}\n", be->name(),
             o.scale, o.dtype, ops::kKernelCount,
             computes
                 ? fmt::format("each the median of up to {} timed calls after {} warmup (fewer once {:g} s are spent)",
                               o.repeats, o.warmup, kTimeCap)
                 : "meta computes nothing: shapes, FLOPs and bytes only, no time");
  if (be->name() == "cuda") fmt::print("device: {}\n", gpu_name());
  Limits lim;
  if (computes) {
    lim = limits_measure(*be, d, cpu, std::max(3, std::min(o.repeats, 5)));
    fmt::print("limits (measured in this run): GEMM {} ({}); memory {} ({})\n",
               lim.gemm > 0 ? fmt::format("{:.1f} GFLOP/s", lim.gemm / 1e9) : "not measured",
               lim.gemm > 0 ? lim.gemm_how : "the table has no f32 gemm",
               lim.bw > 0 ? fmt::format("{:.2f} GB/s", lim.bw / 1e9) : "not measured",
               lim.bw > 0 ? lim.bw_how : "the table has no f32 copy");
    if (!cpu)
      fmt::print(
          "limits: the device's published peaks (FLOP/s, memory bandwidth) are left for the GPU issue; the "
          "fractions below are of the rates measured above\n");
  }
  fmt::print("\n| kernel | dtype | shape | GFLOP | MB | ms | runs | rate | of limit |\n");
  fmt::print("|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);

  const ops::Kernels& table = be->kernels().table();
  std::vector<Row> rows;
  int ok = 0, unsupported = 0, missing = 0, untimed = 0;
  for (int i = 0; i < ops::kKernelCount; ++i) {
    const ops::KernelId id = static_cast<ops::KernelId>(i);
    const std::string name = ops::kernel_name(id);
    if (!std::regex_search(name, only)) continue;
    const CaseFn fn = cases().at(name);
    for (const DType t : dtypes) {
      Row r;
      r.kernel = name;
      r.dtype = std::string(dtype_name(t));
      const bool contract = (ops::kernel_contract_dtypes(id) & ops::dtype_bit(t)) != 0;
      if (!contract || !table.supports(id, t)) {
        // Note [Kernel coverage] (backend/kernels.h): an entry with no dtype at all is one the backend lacks.
        r.status = table.dtypes[i] == 0 ? "missing" : "not supported";
        r.note = !contract ? fmt::format("no {} operand in the contract", r.dtype)
                           : fmt::format("{} lacks it in {}", be->name(), r.dtype);
        (r.status == "missing" ? missing : unsupported) += 1;
        row_print(r);
        rows.push_back(std::move(r));
        continue;
      }
      {
        Env e(*be, t, 1000 + static_cast<uint64_t>(i));
        Case c;
        try {
          c = fn(e, d);
          r.shape = c.shape;
          r.flops = c.flops;
          r.bytes = c.bytes;
          r.by_flops = c.by_flops;
          if (computes) {
            auto once = [&] {
              const auto t0 = Clock::now();
              c.launch();
              be->compute_stream().synchronize();
              return seconds_since(t0);
            };
            for (int w = 0; w < o.warmup; ++w) once();
            double spent = 0;
            while (static_cast<int>(r.seconds.size()) < o.repeats && (r.seconds.empty() || spent < kTimeCap)) {
              r.seconds.push_back(once());
              spent += r.seconds.back();
            }
          }
        } catch (const Error& err) {
          if (!not_implemented(err)) throw;
          r.status = "missing";
          r.note = err.what();
        }
      }
      if (r.status.empty() && !computes) r.status = "not timed";
      if (r.status.empty()) {
        r.status = "ok";
        r.median_s = median(r.seconds);
        r.rate = (r.by_flops ? r.flops : r.bytes) / r.median_s;
        const double limit = r.by_flops ? lim.gemm : lim.bw;
        if (limit > 0) r.fraction = r.rate / limit;
      }
      (r.status == "ok" ? ok : r.status == "missing" ? missing : untimed) += 1;
      row_print(r);
      rows.push_back(std::move(r));
    }
  }

  fmt::print("\n{} rows: {} timed, {} not supported, {} missing{}\n", rows.size(), ok, unsupported, missing,
             untimed ? fmt::format(", {} not timed", untimed) : "");
  // The limits once more, after the table: on a shared machine they drift, and this says by how much.
  Limits after;
  if (computes) {
    after = limits_measure(*be, d, cpu, std::max(3, std::min(o.repeats, 5)));
    fmt::print(
        "limits again after the table: GEMM {:.4g} GFLOP/s, memory {:.4g} GB/s (the fractions above are of the "
        "first)\n",
        after.gemm / 1e9, after.bw / 1e9);
  }
  nlohmann::json j;
  j["benchmark"] = "kernels";
  j["backend"] = std::string(be->name());
  j["scale"] = o.scale;
  j["dtype"] = o.dtype;
  j["repeats"] = o.repeats;
  j["warmup"] = o.warmup;
  j["time_cap_seconds"] = kTimeCap;
  j["entries"] = ops::kKernelCount;
  if (!o.only.empty()) j["only"] = o.only;
  if (computes) {
    j["limits"] = {
        {"gemm_flops_per_s", lim.gemm}, {"gemm", lim.gemm_how}, {"bytes_per_s", lim.bw}, {"memory", lim.bw_how}};
    j["limits_after"] = {{"gemm_flops_per_s", after.gemm}, {"bytes_per_s", after.bw}};
  }
  // The kernels that ran: cpu names its GEMM library, SIMD level, bf16 route and the CPU; cuda its device.
  if (cpu) {
    machine_json(j);
    j["simd"] = ops::cpu::simd_level_name(ops::cpu::simd_level());
    j["threads"] = omp_get_max_threads();
    fmt::print(
        "kernels: GEMMs {}; bf16 GEMMs {}; SIMD {} (attention tiles {}, backward {}); {} OpenMP threads; cpu: {}\n",
        ops::cpu::blas_setup().str(), ops::cpu::gemm_bf16_library(), ops::cpu::simd_level_name(ops::cpu::simd_level()),
        ops::cpu::attention_kernels(), ops::cpu::attention_backward_sweep(), omp_get_max_threads(),
        ops::cpu::cpu_features().str());
  } else if (be->name() == "cuda") {
    j["device"] = gpu_name();
    fmt::print(
        "kernels: the cuda backend's table (cuBLAS sgemm for gemm, its own kernels for the rest) on {}; host "
        "cpu: {}\n",
        gpu_name(), ops::cpu::cpu_features().str());
  } else {
    fmt::print("kernels: none ran ({} computes nothing)\n", be->name());
  }
  nlohmann::json rj = nlohmann::json::array();
  for (const Row& r : rows) rj.push_back(row_json(r));
  j["kernels"] = rj;
  json_write(o.json, j);
  return 0;
}

}  // namespace

}  // namespace kernels_bench

int bench_kernels_run(const BenchKernelsOptions& o) { return kernels_bench::run(o); }

}  // namespace fp::bench
