// Every kernel of a backend's table (backend/kernels.h, FP_KERNEL_LIST) against its scalar reference
// (ops/ref), table-driven as ggml's test-backend-ops: one case per kernel name draws its inputs with the
// op tests' generator (op_test.h), uploads them to device tensors of the backend, launches the kernel
// THROUGH a KernelLauncher (never ops::cpu directly), synchronizes the launcher's stream, downloads every
// output and judges each with op_test::near at the tolerance of the op's own test (tests/ops/test_<op>.cpp,
// whose reasoning each case cites; bit for bit where that test demands it).
//
// Where every case runs:
//   cpu compute stream  inline (Backend::kernels());
//   cpu h2d stream      a worker thread (Backend::kernels_on(h2d_stream())): the worker is held at a gate
//                       while the kernel is launched, so every tensor must still hold its uploaded bytes
//                       when the launch returns (the kernel honours its execution context, Note [Kernel
//                       execution context]) and the results appear only after the stream is synchronized;
//                       they must equal the inline run's bit for bit;
//   meta                the do-nothing table on the null data pointers of the meta arena: no crash, no
//                       compare;
//   cuda                with FLATPEAK_HAVE_CUDA and a GPU (skipped otherwise); a kernel the skeleton lacks
//                       throws fp::Error "... not implemented ...": skipped by name, and a summary line
//                       lists which kernels ran and which are missing.
// KernelTable.EveryKernelHasACase walks FP_KERNEL_LIST, so a kernel added to the table without a case here
// fails by name. Each failure names the kernel and the backend/stream ("rmsnorm_forward on cpu/h2d ...").
// Shapes are small (the whole binary runs in seconds) but straddle SIMD widths, tiles and blocks (67, 19,
// 1037, 4099, 70 tokens across a 64-token tile, ...).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/kernels/ops.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/units.h"
#include "op_test.h"
#include "ops/ref/adamw.h"
#include "ops/ref/attention.h"
#include "ops/ref/attention_block.h"
#include "ops/ref/cross_entropy.h"
#include "ops/ref/elementwise.h"
#include "ops/ref/embedding.h"
#include "ops/ref/gemm.h"
#include "ops/ref/gemm_grouped.h"
#include "ops/ref/gemm_tiled.h"
#include "ops/ref/moe_chunk_order.h"
#include "ops/ref/moe_permute.h"
#include "ops/ref/moe_routing.h"
#include "ops/ref/online_lse.h"
#include "ops/ref/rmsnorm.h"
#include "ops/ref/rope.h"
#include "ops/ref/router.h"
#include "ops/ref/swiglu.h"
#ifdef FLATPEAK_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace fp {

namespace {

using op_test::Dims;
using op_test::random_vector;
using op_test::Tol;
using ops::kIgnoreIndex;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr op_test::Options kNegInfExact{.neg_inf_exact = true};

// ---- Running one case on one backend and stream

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::DType_F32;
  if constexpr (std::is_same_v<T, double>) return DType::DType_F64;
  if constexpr (std::is_same_v<T, int32_t>) return DType::DType_I32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::DType_I64;
}

// Holds a worker stream before its next task until released (Note [Stream delays for testing]); gives up
// after 10 s so that a launch that waits for its own task fails the test instead of hanging it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return open; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

enum class On { kCompute, kH2d };

uint64_t seed_of(const std::string& s) {  // FNV-1a: the same inputs for a kernel on every backend and stream
  uint64_t h = 1469598103934665603ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// A kernel's run: its launcher, its rng, the device tensors it uploaded (kept alive until the stream has
// passed them), and the outputs it downloaded (for the bit-for-bit comparison of two runs).
class KernelRun {
 public:
  KernelRun(Backend& be, On on, const std::string& kernel, bool gated)
      : be_(be),
        stream_(on == On::kCompute ? be.compute_stream() : be.h2d_stream()),
        label_(kernel + " on " + std::string(be.name()) + (on == On::kCompute ? "/compute" : "/h2d")),
        K(on == On::kCompute ? be.kernels() : be.kernels_on(be.h2d_stream())),
        rng(seed_of(kernel)) {
    if (gated) {
      gate_ = std::make_shared<Gate>();
      stream_.set_delay_hook([g = gate_] { g->wait(); });
    }
  }
  ~KernelRun() {
    if (gate_) gate_->release();
    try {
      stream_.synchronize();
    } catch (...) {  // already reported (the case threw, or sync() rethrew it)
    }
    if (gate_) stream_.set_delay_hook(nullptr);
  }
  KernelRun(const KernelRun&) = delete;
  KernelRun& operator=(const KernelRun&) = delete;

  // A device tensor holding v (its data pointer; null on meta, where nothing is copied).
  template <class T>
  T* up(const std::vector<T>& v, const std::string& name) {
    Tensor t = be_.alloc(Category::Category_workspace, {static_cast<int64_t>(v.size())}, dtype_of<T>(), name);
    const uint64_t bytes = v.size() * sizeof(T);
    if (be_.computes()) {
      be_.copy_from_host(t.data(), v.data(), bytes);
    } else {
      EXPECT_EQ(t.data(), nullptr) << label_ << ": meta tensor '" << name << "' has data";
    }
    std::vector<char> init(bytes);
    if (bytes) std::memcpy(init.data(), v.data(), bytes);
    held_.push_back({name, t.data(), std::move(init)});
    tensors_.push_back(std::move(t));
    return static_cast<T*>(tensors_.back().data());
  }

  // Waits for the launcher's stream. Gated (the worker held before the kernel's task): first every tensor
  // must still hold its uploaded bytes, i.e. the launch only enqueued the kernel on its stream; then the
  // gate opens, the stream is synchronized, and some tensor must have changed (the task did run).
  void sync() {
    if (gate_) {
      for (const Held& h : held_)
        if (download_bytes(h) != h.init)
          ADD_FAILURE() << label_ << ": tensor '" << h.name
                        << "' changed before the stream was synchronized: the kernel did not run on the stream of "
                           "its execution context";
      gate_->release();
    }
    stream_.synchronize();
    synced_ = true;
    if (gate_) {
      bool changed = false;
      for (const Held& h : held_) changed = changed || download_bytes(h) != h.init;
      EXPECT_TRUE(changed) << label_ << ": no tensor changed after the stream was synchronized";
    }
  }

  // Downloads an output of want.size() elements at p and judges it (nothing on meta).
  void expect(const std::string& out, const Dims& shape, const float* p, const std::vector<float>& want, const Tol& tol,
              op_test::Options opt = {}) {
    if (!ready()) return;
    const std::vector<float> got = download(p, want.size(), out);
    EXPECT_TRUE(op_test::near(label_ + ": " + out, shape, got, want, tol, opt));
  }
  void expect(const std::string& out, const double* p, const std::vector<double>& want, const Tol& tol) {
    if (!ready()) return;
    const std::vector<double> got = download(p, want.size(), out);
    EXPECT_TRUE(near_f64(label_ + ": " + out, got, want, tol));
  }
  template <class I>
  void expect_equal(const std::string& out, const I* p, const std::vector<I>& want) {
    if (!ready()) return;
    const std::vector<I> got = download(p, want.size(), out);
    size_t bad = 0, first = want.size();
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i] != want[i]) ++bad, first = std::min(first, i);
    EXPECT_EQ(bad, 0u) << label_ << ": " << out << ": " << bad << " of " << want.size()
                       << " elements differ; first at [" << first << "]: expected "
                       << (bad ? static_cast<int64_t>(want[first]) : 0) << ", got "
                       << (bad ? static_cast<int64_t>(got[first]) : 0);
  }

  const std::string& label() const { return label_; }
  const std::vector<std::pair<std::string, std::vector<char>>>& outputs() const { return outputs_; }

 private:
  struct Held {
    std::string name;
    const void* ptr;
    std::vector<char> init;
  };

  bool ready() {
    if (!be_.computes()) return false;
    EXPECT_TRUE(synced_) << label_ << ": compared before sync()";
    return true;
  }
  std::vector<char> download_bytes(const Held& h) {
    std::vector<char> b(h.init.size());
    if (!b.empty()) be_.copy_to_host(b.data(), h.ptr, b.size());
    return b;
  }
  template <class T>
  std::vector<T> download(const T* p, size_t n, const std::string& out) {
    std::vector<T> v(n);
    if (n) be_.copy_to_host(v.data(), p, n * sizeof(T));
    std::vector<char> bytes(n * sizeof(T));
    if (n) std::memcpy(bytes.data(), v.data(), bytes.size());
    outputs_.emplace_back(out, std::move(bytes));
    return v;
  }
  // near() for outputs of type double (its got is float).
  static ::testing::AssertionResult near_f64(const std::string& what, const std::vector<double>& got,
                                             const std::vector<double>& want, const Tol& tol) {
    size_t bad = 0, first = want.size();
    for (size_t i = 0; i < want.size(); ++i) {
      const bool ok = std::isfinite(got[i]) && std::isfinite(want[i]) && std::abs(got[i] - want[i]) <= tol(i, want[i]);
      if (!ok) ++bad, first = std::min(first, i);
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    ::testing::AssertionResult r = ::testing::AssertionFailure();
    r << what << ": " << bad << " of " << want.size() << " elements out of tolerance; first at [" << first
      << "]: expected " << std::to_string(want[first]) << ", got " << std::to_string(got[first]) << " (tolerance "
      << tol(first, want[first]) << ")";
    return r;
  }

  Backend& be_;
  Stream& stream_;
  std::string label_;
  std::shared_ptr<Gate> gate_;
  std::vector<Tensor> tensors_;
  std::vector<Held> held_;
  std::vector<std::pair<std::string, std::vector<char>>> outputs_;
  bool synced_ = false;

 public:
  const ops::KernelLauncher K;  // bound to the run's stream
  Rng rng;                      // seeded by the kernel's name
};

// p + off, null stays null (meta): no arithmetic on null pointers.
template <class T>
T* at(T* p, int64_t off) {
  return p ? p + off : nullptr;
}

std::vector<float> filled(int64_t n, float v) { return std::vector<float>(static_cast<size_t>(n), v); }

// ---- The cases, one per kernel, in FP_KERNEL_LIST's order

// gemm, gemm_tiled (test_gemm.cpp, test_gemm_tiled.cpp): the standard bound of a K-term dot product for
// both the reference and BLAS, so their difference is below (2K + 8) eps (|alpha| sum_k |a b| + |beta c0|);
// the padding columns of C exact (never written). gemm: (ta, tb) = (0, 1), alpha and beta; gemm_tiled:
// (1, 0), M one row past a row tile, beta = 0 with C poisoned (must not be read).
void gemm_case(KernelRun& r, bool tiled) {
  const bool ta = tiled, tb = !tiled;
  const int64_t M = tiled ? ops::cpu::kGemmTileRows + 1 : 37, N = 19, Kd = 29, pad = 3;
  const float alpha = tiled ? 1.0f : 0.75f, beta = tiled ? 0.0f : -0.5f;
  const int64_t lda = (ta ? M : Kd) + pad, ldb = (tb ? Kd : N) + pad, ldc = N + pad;
  const std::vector<float> A = random_vector((ta ? Kd : M) * lda, r.rng), B = random_vector((tb ? N : Kd) * ldb, r.rng);
  std::vector<float> C0 = random_vector(M * ldc, r.rng);
  if (beta == 0.0f)
    for (int64_t i = 0; i < M; ++i) std::fill_n(C0.data() + i * ldc, N, kNaN);
  std::vector<float> want = C0;
  ops::ref::gemm<float>(ta, tb, M, N, Kd, alpha, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
  std::vector<double> bound(want.size(), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < Kd; ++k)
        s += std::abs(static_cast<double>(ta ? A[k * lda + i] : A[i * lda + k]) *
                      (tb ? B[j * ldb + k] : B[k * ldb + j]));
      s = std::abs(alpha) * s + (beta == 0.0f ? 0.0 : std::abs(beta * C0[i * ldc + j]));
      bound[i * ldc + j] = (2.0 * Kd + 8.0) * FLT_EPSILON * s;
    }
  const float *dA = r.up(A, "A"), *dB = r.up(B, "B");
  float* dC = r.up(C0, "C");
  if (tiled)
    r.K.gemm_tiled(ta, tb, M, N, Kd, alpha, dA, lda, dB, ldb, beta, dC, ldc);
  else
    r.K.gemm(ta, tb, M, N, Kd, alpha, dA, lda, dB, ldb, beta, dC, ldc);
  r.sync();
  r.expect("C", {M, ldc}, dC, want, op_test::tol_each(bound));
}

// gemm_grouped, gemm_grouped_weight (Note [The experts in one call] in ops/gemm_grouped.h): the reference's
// loop over the groups, each held to gemm_case's bound (a bias adds its |b| to the sum bounded). Four
// groups, the third empty with null operands (never read), one group without a bias. gemm_grouped runs
// both of its forms: x W^T (trans_b) with biases and beta = 0 over a poisoned C, then dy W with beta.
std::vector<int64_t> group_offsets() { return {0, 7, 19, 19, 30}; }

void case_gemm_grouped(KernelRun& r) {
  const std::vector<int64_t> off = group_offsets();
  const int64_t G = 4, rows = off[G], N = 13, Kd = 11;
  const float alpha = 0.75f, beta2 = -0.5f;
  const std::vector<float> A = random_vector(rows * Kd, r.rng);
  std::vector<std::vector<float>> B(G), bias(G);
  for (int64_t g = 0; g < G; ++g) {
    if (g == 2) continue;  // the empty group
    B[g] = random_vector(N * Kd, r.rng);
    if (g != 1) bias[g] = random_vector(N, r.rng);
  }
  const std::vector<float> C1 = filled(rows * N, kNaN), C2 = random_vector(rows * N, r.rng);
  auto ptrs = [](const std::vector<std::vector<float>>& v) {
    std::vector<const float*> p;
    for (const auto& x : v) p.push_back(x.empty() ? nullptr : x.data());
    return p;
  };
  const std::vector<const float*> hB = ptrs(B), hbias = ptrs(bias);
  std::vector<float> want1 = C1, want2 = C2;
  ops::ref::gemm_grouped<float>(true, G, off.data(), N, Kd, alpha, A.data(), hB.data(), hbias.data(), 0.0f,
                                want1.data());
  // The second form reads B[g] as (K, N) = (Kd, N): the same buffers, another layout (N * Kd elements).
  ops::ref::gemm_grouped<float>(false, G, off.data(), N, Kd, alpha, A.data(), hB.data(), nullptr, beta2, want2.data());
  std::vector<double> bound1(want1.size(), 0.0), bound2(want2.size(), 0.0);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t i = off[g]; i < off[g + 1]; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s1 = 0, s2 = 0;
        for (int64_t k = 0; k < Kd; ++k) {
          s1 += std::abs(static_cast<double>(A[i * Kd + k]) * B[g][j * Kd + k]);
          s2 += std::abs(static_cast<double>(A[i * Kd + k]) * B[g][k * N + j]);
        }
        const double b = bias[g].empty() ? 0.0 : std::abs(bias[g][j]);
        bound1[i * N + j] = (2.0 * Kd + 8.0) * FLT_EPSILON * (std::abs(alpha) * s1 + b);
        bound2[i * N + j] = (2.0 * Kd + 8.0) * FLT_EPSILON * (std::abs(alpha) * s2 + std::abs(beta2 * C2[i * N + j]));
      }
  const float* dA = r.up(A, "A");
  std::vector<CBuf> dB(G), dbias(G);
  for (int64_t g = 0; g < G; ++g) {
    if (!B[g].empty()) dB[g] = r.up(B[g], "B" + std::to_string(g));
    if (!bias[g].empty()) dbias[g] = r.up(bias[g], "bias" + std::to_string(g));
  }
  float *dC1 = r.up(C1, "C1"), *dC2 = r.up(C2, "C2");
  r.K.gemm_grouped(true, G, off.data(), N, Kd, alpha, dA, dB.data(), dbias.data(), 0.0f, dC1);
  r.K.gemm_grouped(false, G, off.data(), N, Kd, alpha, dA, dB.data(), nullptr, beta2, dC2);
  r.sync();
  r.expect("C (x W^T + b)", {rows, N}, dC1, want1, op_test::tol_each(bound1));
  r.expect("C (dy W, beta)", {rows, N}, dC2, want2, op_test::tol_each(bound2));
}

void case_gemm_grouped_weight(KernelRun& r) {
  const std::vector<int64_t> off = group_offsets();
  const int64_t G = 4, rows = off[G], M = 13, N = 11;
  const float alpha = 1.0f, beta = 1.0f;
  const std::vector<float> A = random_vector(rows * M, r.rng), B = random_vector(rows * N, r.rng);
  std::vector<std::vector<float>> C(G), db(G);
  for (int64_t g = 0; g < G; ++g) {
    if (g == 2) continue;
    C[g] = random_vector(M * N, r.rng);
    if (g != 3) db[g] = random_vector(M, r.rng);
  }
  std::vector<std::vector<float>> wantC = C, wantdb = db;
  std::vector<float*> hC, hdb;
  for (int64_t g = 0; g < G; ++g) {
    hC.push_back(wantC[g].empty() ? nullptr : wantC[g].data());
    hdb.push_back(wantdb[g].empty() ? nullptr : wantdb[g].data());
  }
  ops::ref::gemm_grouped_weight<float>(G, off.data(), M, N, alpha, A.data(), B.data(), beta, hC.data(), hdb.data());
  const float *dA = r.up(A, "A"), *dB = r.up(B, "B");
  std::vector<Buf> dC(G), ddb(G);
  std::vector<float*> pC(G, nullptr), pdb(G, nullptr);
  for (int64_t g = 0; g < G; ++g) {
    if (!C[g].empty()) dC[g] = pC[g] = r.up(C[g], "C" + std::to_string(g));
    if (!db[g].empty()) ddb[g] = pdb[g] = r.up(db[g], "db" + std::to_string(g));
  }
  r.K.gemm_grouped_weight(G, off.data(), M, N, alpha, dA, dB, beta, dC.data(), ddb.data());
  r.sync();
  for (int64_t g = 0; g < G; ++g) {
    if (C[g].empty()) continue;
    const int64_t n = off[g + 1] - off[g];
    std::vector<double> bound(M * N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = off[g]; k < off[g + 1]; ++k) s += std::abs(static_cast<double>(A[k * M + i]) * B[k * N + j]);
        bound[i * N + j] = (2.0 * n + 8.0) * FLT_EPSILON * (s + std::abs(beta * C[g][i * N + j]));
      }
    r.expect("C" + std::to_string(g), {M, N}, pC[g], wantC[g], op_test::tol_each(bound));
    if (!db[g].empty()) r.expect("db" + std::to_string(g), {M}, pdb[g], wantdb[g], op_test::tol_exact());
  }
}

// embedding (test_embedding.cpp): the same float additions in the same order: bit for bit. V = 11 < n, so
// tokens repeat.
void case_embedding_forward(KernelRun& r) {
  const int64_t n = 37, H = 19, V = 11;
  const std::vector<int32_t> tokens = op_test::random_ids(n, V, r.rng);
  const std::vector<float> table = random_vector(V * H, r.rng);
  std::vector<float> want(n * H);
  ops::ref::embedding_forward<float>(tokens.data(), table.data(), want.data(), n, H);
  const int32_t* dt = r.up(tokens, "tokens");
  const float* dtab = r.up(table, "table");
  float* dout = r.up(filled(n * H, kNaN), "out");
  r.K.embedding_forward(dt, dtab, dout, n, H);
  r.sync();
  r.expect("out", {n, H}, dout, want, op_test::tol_exact());
}

void case_embedding_backward(KernelRun& r) {
  const int64_t n = 37, H = 19, V = 11;
  const std::vector<int32_t> tokens = op_test::random_ids(n, V, r.rng);
  const std::vector<float> dout = random_vector(n * H, r.rng), dtable0 = random_vector(V * H, r.rng);
  std::vector<float> want = dtable0;
  ops::ref::embedding_backward<float>(tokens.data(), dout.data(), want.data(), n, H);
  const int32_t* dt = r.up(tokens, "tokens");
  const float* ddout = r.up(dout, "dout");
  float* dtab = r.up(dtable0, "dtable");
  r.K.embedding_backward(dt, ddout, dtab, n, H);
  r.sync();
  r.expect("dtable", {V, H}, dtab, want, op_test::tol_exact());
}

// Rows of x scaled by 10^-2 .. 10^2 so that rstd varies (test_rmsnorm.cpp).
std::vector<float> rmsnorm_input(int64_t rows, int64_t d, Rng& rng) {
  std::vector<float> x = random_vector(rows * d, rng);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < d; ++j) x[i * d + j] *= static_cast<float>(std::pow(10.0, -2.0 + 4.0 * i / rows));
  return x;
}

// rmsnorm_forward (test_rmsnorm.cpp): both take the sum of squares in double and round rstd alike, then the
// same two float multiplies: y within 4 eps relative, rstd within 2 eps.
void case_rmsnorm_forward(KernelRun& r) {
  const int64_t rows = 5, d = 67;
  const float eps = 1e-6f;
  const std::vector<float> x = rmsnorm_input(rows, d, r.rng), w = random_vector(d, r.rng);
  std::vector<float> y(rows * d), rstd(rows);
  ops::ref::rmsnorm_forward<float>(x.data(), w.data(), y.data(), rstd.data(), rows, d, eps);
  const float *dx = r.up(x, "x"), *dw = r.up(w, "w");
  float *dy = r.up(filled(rows * d, kNaN), "y"), *drstd = r.up(filled(rows, kNaN), "rstd");
  r.K.rmsnorm_forward(dx, dw, dy, drstd, rows, d, eps);
  r.sync();
  r.expect("y", {rows, d}, dy, y, op_test::tol_ulps(4));
  r.expect("rstd", {rows}, drstd, rstd, op_test::tol_ulps(2));
}

// rmsnorm_backward (test_rmsnorm.cpp): dx within 4 eps of the magnitudes of its two terms; dw (kernel: 64-row
// blocks summed in float) within (64 + 8) eps sum_rows |dy x rstd| + eps |dw0|. 70 rows: two row blocks.
// The workspace is poisoned: it is scratch, never read before written.
void case_rmsnorm_backward(KernelRun& r) {
  const int64_t rows = 70, d = 19;
  const std::vector<float> x = rmsnorm_input(rows, d, r.rng), w = random_vector(d, r.rng);
  const std::vector<float> dy = random_vector(rows * d, r.rng), dw0 = random_vector(d, r.rng);
  std::vector<float> y(rows * d), rstd(rows), dx(rows * d), dw = dw0;
  ops::ref::rmsnorm_forward<float>(x.data(), w.data(), y.data(), rstd.data(), rows, d, 1e-6f);
  ops::ref::rmsnorm_backward<float>(x.data(), w.data(), rstd.data(), dy.data(), dx.data(), dw.data(), rows, d);
  std::vector<double> tol_dx(rows * d), tol_dw(d, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const double rs = rstd[i];
    double s = 0;
    for (int64_t j = 0; j < d; ++j) s += static_cast<double>(dy[i * d + j]) * w[j] * x[i * d + j];
    for (int64_t j = 0; j < d; ++j) {
      tol_dx[i * d + j] =
          4 * FLT_EPSILON * (std::abs(rs * w[j] * dy[i * d + j]) + std::abs(x[i * d + j] * rs * rs * rs * s / d));
      tol_dw[j] += std::abs(static_cast<double>(dy[i * d + j]) * x[i * d + j] * rs);
    }
  }
  for (int64_t j = 0; j < d; ++j) tol_dw[j] = (64 + 8) * FLT_EPSILON * tol_dw[j] + FLT_EPSILON * std::abs(dw0[j]);
  const float *dx_in = r.up(x, "x"), *dw_in = r.up(w, "w"), *drstd = r.up(rstd, "rstd"), *ddy = r.up(dy, "dy");
  float* ddx = r.up(filled(rows * d, kNaN), "dx");
  float* ddw = r.up(dw0, "dw");
  float* ws = r.up(filled(ops::cpu::rmsnorm_backward_workspace(rows, d), kNaN), "workspace");
  r.K.rmsnorm_backward(dx_in, dw_in, drstd, ddy, ddx, ddw, rows, d, ws);
  r.sync();
  r.expect("dx", {rows, d}, ddx, dx, op_test::tol_each(tol_dx));
  r.expect("dw", {d}, ddw, dw, op_test::tol_each(tol_dw));
}

// RoPE (test_rope.cpp): the kernel and ref<float> round the same double cos and sin to float and do the
// same float products; with the YaRN factor s = 1.25 multiplying both, 3 eps of the input pair
// (|x_a| + |x_b|) (test_rope.cpp's bound for the scaled rotation). hd = 18: a half of 9, no SIMD multiple.
// Positions up to 40000.
const double kRopeScale = 1.25;

std::vector<int32_t> rope_positions(int64_t n, Rng& rng) {
  std::vector<int32_t> p(n);
  for (int64_t t = 0; t < n; ++t) p[t] = t == 0 ? 0 : static_cast<int32_t>(rng.below(40000));
  return p;
}

// Element idx of rows of hd: k eps (|x_a| + |x_b|) of its input pair (a, b) = (i % half, i % half + half).
Tol tol_pairs(const std::vector<float>& in, int64_t hd, double k) {
  return [x = in, hd, k](size_t idx, double) {
    const int64_t half = hd / 2, i = static_cast<int64_t>(idx % hd), base = static_cast<int64_t>(idx) - i;
    return k * FLT_EPSILON * (std::abs(x[base + i % half]) + std::abs(x[base + i % half + half]));
  };
}

void rope_case(KernelRun& r, bool backward) {
  const int64_t n = 7, heads = 3, hd = 18;
  const std::vector<int32_t> pos = rope_positions(n, r.rng);
  const std::vector<double> inv = ops::rope_default_inv_freq(10000.0, hd);
  const ops::RopeFreqs f{inv.data(), static_cast<float>(kRopeScale)};  // host memory, as the model passes it
  const std::vector<float> x = random_vector(n * heads * hd, r.rng);
  std::vector<float> want = x;
  if (backward)
    ops::ref::rope_backward<float>(want.data(), pos.data(), n, heads, hd, inv.data(), kRopeScale);
  else
    ops::ref::rope_forward<float>(want.data(), pos.data(), n, heads, hd, inv.data(), kRopeScale);
  float* dx = r.up(x, "x");
  const int32_t* dpos = r.up(pos, "pos");
  if (backward)
    r.K.rope_backward(dx, dpos, n, heads, hd, f);
  else
    r.K.rope_forward(dx, dpos, n, heads, hd, f);
  r.sync();
  r.expect("x", {n * heads, hd}, dx, want, tol_pairs(x, hd, 3));
}

// The strided rotation (MLA), plain and interleaved, has no reference of its own: the oracle is ref's
// rotate-half on each row's hd numbers packed (de-interleaved when interleaved, as transformers writes
// them; test_rope.cpp StridedAndInterleavedMatchRotateHalf), at the same 3 eps of the pair; the pad
// numbers between the rows exact (never written).
void rope_strided_case(KernelRun& r, bool backward) {
  const int64_t n = 7, heads = 3, hd = 10, pad = 5, stride = hd + pad, rows = n * heads, half = hd / 2;
  const std::vector<int32_t> pos = rope_positions(n, r.rng);
  const std::vector<double> inv = ops::rope_default_inv_freq(10000.0, hd);
  const ops::RopeFreqs f{inv.data(), static_cast<float>(kRopeScale)};
  const int32_t* dpos = r.up(pos, "pos");
  struct Layout {
    std::vector<float> want;
    std::vector<double> tol;
    float* dev;
  };
  std::vector<Layout> layouts;
  for (const bool inter : {false, true}) {
    const std::vector<float> x = random_vector(rows * stride, r.rng);
    auto src = [&](int64_t i) { return inter ? (i < half ? 2 * i : 2 * (i - half) + 1) : i; };
    std::vector<float> packed(rows * hd);
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t i = 0; i < hd; ++i) packed[row * hd + i] = x[row * stride + pad + src(i)];
    const std::vector<float> packed_in = packed;
    if (backward)
      ops::ref::rope_backward<float>(packed.data(), pos.data(), n, heads, hd, inv.data(), kRopeScale);
    else
      ops::ref::rope_forward<float>(packed.data(), pos.data(), n, heads, hd, inv.data(), kRopeScale);
    Layout l{x, std::vector<double>(x.size(), 0.0), nullptr};
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t i = 0; i < hd; ++i) {
        const float* p = packed_in.data() + row * hd;
        l.want[row * stride + pad + src(i)] = packed[row * hd + i];
        l.tol[row * stride + pad + src(i)] = 3 * FLT_EPSILON * (std::abs(p[i % half]) + std::abs(p[i % half + half]));
      }
    l.dev = r.up(x, inter ? "x interleaved" : "x");
    if (backward)
      r.K.rope_strided_backward(at(l.dev, pad), dpos, n, heads, hd, stride, inter, f);
    else
      r.K.rope_strided_forward(at(l.dev, pad), dpos, n, heads, hd, stride, inter, f);
    layouts.push_back(std::move(l));
  }
  r.sync();
  for (size_t i = 0; i < layouts.size(); ++i)
    r.expect(i ? "x interleaved" : "x", {rows, stride}, layouts[i].dev, layouts[i].want,
             op_test::tol_each(layouts[i].tol));
}

// Attention (test_attention.cpp, MatchesReference and ValueWidthMatchesReference): both float; the kernel
// sums scores in register blocks and the softmax over key tiles with rescaling, the reference in plain
// order: 2e-5 of the magnitude (tol_near_rms), ~5x the largest difference seen there, while a wrong mask,
// rescale or dropped tile errs by 1e-2 and more. T = 70 crosses a 64-token tile; hd = 24, hdv = 13 (value
// heads of their own, odd width); grouped heads 4 / 2; the backward with a sliding window of 50.
struct AttentionShape {
  int64_t B = 2, T = 70, nh = 4, nkv = 2, hd = 24, hdv = 13;
};

void case_attention_forward(KernelRun& r) {
  const AttentionShape s;
  const int64_t window = 0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const std::vector<float> q = random_vector(s.B * s.T * s.nh * s.hd, r.rng, 2.0);
  const std::vector<float> k = random_vector(s.B * s.T * s.nkv * s.hd, r.rng);
  const std::vector<float> v = random_vector(s.B * s.T * s.nkv * s.hdv, r.rng);
  std::vector<float> o(s.B * s.T * s.nh * s.hdv), lse(s.B * s.nh * s.T);
  ops::ref::attention_forward<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), s.B, s.T, s.nh, s.nkv, s.hd,
                                     s.hdv, scale, window);
  const float *dq = r.up(q, "q"), *dk = r.up(k, "k"), *dv = r.up(v, "v");
  float *dout = r.up(filled(o.size(), kNaN), "o"), *dlse = r.up(filled(lse.size(), kNaN), "lse");
  r.K.attention_forward(dq, dk, dv, dout, dlse, ops::attention_spec(s.B, s.T, s.nh, s.nkv, s.hd, s.hdv, scale, window));
  r.sync();
  r.expect("o", {s.B, s.T, s.nh, s.hdv}, dout, o, op_test::tol_near_rms(2e-5, o));
  r.expect("lse", {s.B, s.nh, s.T}, dlse, lse, op_test::tol_near_rms(2e-5, lse));
}

// Attention sinks (gpt-oss): the forward with sinks against the reference's (2e-5 of the magnitude, as
// above), then the sinks' gradient from the reference's o and lse: a sum over B T rows of O(1) terms,
// accumulated in double by the kernel from f32 D: 1e-5 of the terms' magnitude.
void case_attention_sink_backward(KernelRun& r) {
  const AttentionShape s;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const std::vector<float> q = random_vector(s.B * s.T * s.nh * s.hd, r.rng, 2.0);
  const std::vector<float> k = random_vector(s.B * s.T * s.nkv * s.hd, r.rng);
  const std::vector<float> v = random_vector(s.B * s.T * s.nkv * s.hdv, r.rng);
  const std::vector<float> sinks = random_vector(s.nh, r.rng, 2.0),
                           dout = random_vector(s.B * s.T * s.nh * s.hdv, r.rng);
  std::vector<float> o(s.B * s.T * s.nh * s.hdv), lse(s.B * s.nh * s.T), ds(s.nh);
  ops::ref::attention_forward<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), s.B, s.T, s.nh, s.nkv, s.hd,
                                     s.hdv, scale, 30, sinks.data());
  ops::ref::attention_sink_backward<float>(o.data(), dout.data(), lse.data(), sinks.data(), ds.data(), s.B, s.T, s.nh,
                                           s.hdv);
  const float *dq = r.up(q, "q"), *dk = r.up(k, "k"), *dv = r.up(v, "v"), *dsk = r.up(sinks, "sinks");
  float *d_o = r.up(filled(o.size(), kNaN), "o"), *dlse = r.up(filled(lse.size(), kNaN), "lse");
  ops::AttentionSpec a = ops::attention_spec(s.B, s.T, s.nh, s.nkv, s.hd, s.hdv, scale, 30);
  a.sinks = dsk;
  r.K.attention_forward(dq, dk, dv, d_o, dlse, a);
  // The sinks' gradient from the reference's forward state (the kernel adds to dsinks: start at zero).
  const float *ro = r.up(o, "o ref"), *rlse = r.up(lse, "lse ref"), *ddout = r.up(dout, "dout");
  float* dds = r.up(filled(s.nh, 0.0f), "dsinks");
  r.K.attention_sink_backward(ro, ddout, rlse, dds, a);
  r.sync();
  r.expect("o", {s.B, s.T, s.nh, s.hdv}, d_o, o, op_test::tol_near_rms(2e-5, o));
  r.expect("lse", {s.B, s.nh, s.T}, dlse, lse, op_test::tol_near_rms(2e-5, lse));
  r.expect("dsinks", {s.nh}, dds, ds, op_test::tol_near_rms(1e-5, ds));
}

void case_attention_backward(KernelRun& r) {
  const AttentionShape s;
  const int64_t window = 50;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
  const std::vector<float> q = random_vector(s.B * s.T * s.nh * s.hd, r.rng, 2.0);
  const std::vector<float> k = random_vector(s.B * s.T * s.nkv * s.hd, r.rng);
  const std::vector<float> v = random_vector(s.B * s.T * s.nkv * s.hdv, r.rng);
  const std::vector<float> dout = random_vector(s.B * s.T * s.nh * s.hdv, r.rng);
  std::vector<float> o(dout.size()), lse(s.B * s.nh * s.T), dq(q.size()), dk(k.size()), dv(v.size());
  ops::ref::attention_forward<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), s.B, s.T, s.nh, s.nkv, s.hd,
                                     s.hdv, scale, window);
  ops::ref::attention_backward<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(),
                                      dk.data(), dv.data(), s.B, s.T, s.nh, s.nkv, s.hd, s.hdv, scale, window);
  const float *d_q = r.up(q, "q"), *d_k = r.up(k, "k"), *d_v = r.up(v, "v"), *d_o = r.up(o, "o");
  const float *d_lse = r.up(lse, "lse"), *d_dout = r.up(dout, "dout");
  float *d_dq = r.up(filled(dq.size(), kNaN), "dq"), *d_dk = r.up(filled(dk.size(), kNaN), "dk");
  float* d_dv = r.up(filled(dv.size(), kNaN), "dv");
  r.K.attention_backward(d_q, d_k, d_v, d_o, d_lse, d_dout, d_dq, d_dk, d_dv,
                         ops::attention_spec(s.B, s.T, s.nh, s.nkv, s.hd, s.hdv, scale, window));
  r.sync();
  r.expect("dq", {s.B, s.T, s.nh, s.hd}, d_dq, dq, op_test::tol_near_rms(2e-5, dq));
  r.expect("dk", {s.B, s.T, s.nkv, s.hd}, d_dk, dk, op_test::tol_near_rms(2e-5, dk));
  r.expect("dv", {s.B, s.T, s.nkv, s.hdv}, d_dv, dv, op_test::tol_near_rms(2e-5, dv));
}

// Block attention (test_attention_block.cpp, MatchesReference and SlidingWindowMatchesReference): the same
// 2e-5 of the magnitude as attention, an expected -inf (a query that saw no key) exact. One block pair laid
// out as its "offset" staircase (queries from 10 + Tk/2, keys from 10), window 20, merged (first = false)
// into a previous state of which a quarter of the rows is still empty (0, -inf).
struct BlockProblem {
  int64_t B = 1, Tq = 37, Tk = 70, nh = 4, nkv = 1, hd = 8, hdv = 8, window = 20;
  float scale = 1.0f / std::sqrt(8.0f);
  std::vector<int32_t> q_pos, k_pos;
  std::vector<float> q, k, v, o0, lse0;
  explicit BlockProblem(Rng& rng) {
    for (int64_t i = 0; i < Tq; ++i) q_pos.push_back(static_cast<int32_t>(10 + Tk / 2 + i));
    for (int64_t j = 0; j < Tk; ++j) k_pos.push_back(static_cast<int32_t>(10 + j));
    q = random_vector(B * Tq * nh * hd, rng, 2.0);
    k = random_vector(B * Tk * nkv * hd, rng);
    v = random_vector(B * Tk * nkv * hdv, rng);
    o0 = random_vector(B * Tq * nh * hdv, rng);
    lse0 = random_vector(B * nh * Tq, rng, 2.0);
    for (int64_t bh = 0; bh < B * nh; ++bh)
      for (int64_t i = 0; i < Tq; ++i) {
        if (rng.below(4) != 0) continue;
        lse0[bh * Tq + i] = kNegInf;
        std::fill_n(o0.data() + ((bh / nh * Tq + i) * nh + bh % nh) * hdv, hdv, 0.0f);
      }
  }
  // The merged state (o, lse) of the reference.
  void forward_ref(std::vector<float>& o, std::vector<float>& lse) const {
    o = o0;
    lse = lse0;
    ops::ref::attention_block_forward<float>(q.data(), k.data(), v.data(), q_pos.data(), k_pos.data(), o.data(),
                                             lse.data(), false, B, Tq, Tk, nh, nkv, hd, hdv, scale, window);
  }
};

void case_attention_block_forward(KernelRun& r) {
  const BlockProblem p(r.rng);
  std::vector<float> o, lse;
  p.forward_ref(o, lse);
  const float *dq = r.up(p.q, "q"), *dk = r.up(p.k, "k"), *dv = r.up(p.v, "v");
  const int32_t *dqp = r.up(p.q_pos, "q_pos"), *dkp = r.up(p.k_pos, "k_pos");
  float *d_o = r.up(p.o0, "o"), *d_lse = r.up(p.lse0, "lse");
  r.K.attention_block_forward(
      dq, dk, dv, d_o, d_lse, false,
      ops::attention_block_spec(dqp, dkp, p.B, p.Tq, p.Tk, p.nh, p.nkv, p.hd, p.hdv, p.scale, p.window));
  r.sync();
  r.expect("o", {p.B, p.Tq, p.nh, p.hdv}, d_o, o, op_test::tol_near_rms(2e-5, o), kNegInfExact);
  r.expect("lse", {p.B, p.nh, p.Tq}, d_lse, lse, op_test::tol_near_rms(2e-5, lse), kNegInfExact);
}

// The backward ADDS to dq, dk, dv: from gradients already holding other blocks' terms g0, the kernel gives
// fl(g0 + inc) (one rounding, test_attention_block.cpp's += contract), the reference increment inc_ref is
// within 2e-5 (|inc_ref| + rms(inc_ref)) of inc, and the two final roundings add eps |want| each: tolerance
// 2e-5 (|inc_ref_i| + rms(inc_ref)) + 2 eps |want_i|.
void case_attention_block_backward(KernelRun& r) {
  const BlockProblem p(r.rng);
  std::vector<float> o, lse;
  p.forward_ref(o, lse);
  const std::vector<float> dout = random_vector(p.B * p.Tq * p.nh * p.hdv, r.rng);
  const std::vector<float> dq0 = random_vector(p.q.size(), r.rng), dk0 = random_vector(p.k.size(), r.rng),
                           dv0 = random_vector(p.v.size(), r.rng);
  std::vector<float> iq(p.q.size(), 0.0f), ik(p.k.size(), 0.0f), iv(p.v.size(), 0.0f);
  ops::ref::attention_block_backward<float>(p.q.data(), p.k.data(), p.v.data(), o.data(), lse.data(), dout.data(),
                                            p.q_pos.data(), p.k_pos.data(), iq.data(), ik.data(), iv.data(), p.B, p.Tq,
                                            p.Tk, p.nh, p.nkv, p.hd, p.hdv, p.scale, p.window);
  auto want_and_tol = [](const std::vector<float>& g0, const std::vector<float>& inc, std::vector<float>& want) {
    const double mag = op_test::rms_finite(inc);
    std::vector<double> tol(g0.size());
    want.resize(g0.size());
    for (size_t i = 0; i < g0.size(); ++i) {
      want[i] = g0[i] + inc[i];
      tol[i] = 2e-5 * (std::abs(inc[i]) + mag) + 2 * FLT_EPSILON * std::abs(want[i]);
    }
    return op_test::tol_each(tol);
  };
  std::vector<float> wq, wk, wv;
  const Tol tq = want_and_tol(dq0, iq, wq), tk = want_and_tol(dk0, ik, wk), tv = want_and_tol(dv0, iv, wv);
  const float *dq = r.up(p.q, "q"), *dk = r.up(p.k, "k"), *dv = r.up(p.v, "v"), *d_o = r.up(o, "o");
  const float *d_lse = r.up(lse, "lse"), *d_dout = r.up(dout, "dout");
  const int32_t *dqp = r.up(p.q_pos, "q_pos"), *dkp = r.up(p.k_pos, "k_pos");
  float *gq = r.up(dq0, "dq"), *gk = r.up(dk0, "dk"), *gv = r.up(dv0, "dv");
  r.K.attention_block_backward(
      dq, dk, dv, d_o, d_lse, d_dout, gq, gk, gv,
      ops::attention_block_spec(dqp, dkp, p.B, p.Tq, p.Tk, p.nh, p.nkv, p.hd, p.hdv, p.scale, p.window));
  r.sync();
  r.expect("dq", {p.B, p.Tq, p.nh, p.hd}, gq, wq, tq);
  r.expect("dk", {p.B, p.Tk, p.nkv, p.hd}, gk, wk, tk);
  r.expect("dv", {p.B, p.Tk, p.nkv, p.hdv}, gv, wv, tv);
}

// SwiGLU (test_swiglu.cpp): the kernel's own exp is within 1 ulp of std::exp: products within 4 eps
// relative; dg rounds 1 + g (1 - s), which cancels near g = -1.28: 8 eps |da u| s (1 + |g (1 - s)|).
// n = 67: a 4-wide tail of 3.
void case_swiglu_forward(KernelRun& r) {
  const int64_t n = 67;
  const std::vector<float> g = random_vector(n, r.rng, 3.0), u = random_vector(n, r.rng);
  std::vector<float> a(n);
  ops::ref::swiglu_forward<float>(g.data(), u.data(), a.data(), n);
  const float *dg = r.up(g, "g"), *du = r.up(u, "u");
  float* da = r.up(filled(n, kNaN), "a");
  r.K.swiglu_forward(dg, du, da, n);
  r.sync();
  r.expect("a", {n}, da, a, op_test::tol_ulps(4, 1e-40));
}

void case_swiglu_backward(KernelRun& r) {
  const int64_t n = 67;
  const std::vector<float> g = random_vector(n, r.rng, 3.0), u = random_vector(n, r.rng), da = random_vector(n, r.rng);
  std::vector<float> dg(n), du(n);
  ops::ref::swiglu_backward<float>(g.data(), u.data(), da.data(), dg.data(), du.data(), n);
  std::vector<double> tol_dg(n);
  for (int64_t i = 0; i < n; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(g[i])));
    tol_dg[i] =
        8 * FLT_EPSILON * std::abs(static_cast<double>(da[i]) * u[i]) * s * (1.0 + std::abs(g[i] * (1.0 - s))) + 1e-40;
  }
  const float *d_g = r.up(g, "g"), *d_u = r.up(u, "u"), *d_da = r.up(da, "da");
  float *d_dg = r.up(filled(n, kNaN), "dg"), *d_du = r.up(filled(n, kNaN), "du");
  r.K.swiglu_backward(d_g, d_u, d_da, d_dg, d_du, n);
  r.sync();
  r.expect("dg", {n}, d_dg, dg, op_test::tol_each(tol_dg));
  r.expect("du", {n}, d_du, du, op_test::tol_ulps(4, 1e-40));
}

// The clamped SwiGLU (gpt-oss): the same products as the plain SwiGLU's, so the same ulp bounds where a
// clamp is not active, and exact zeros where one is; g and u ~ 3 N(0, 1) against limit 2: about half the
// elements clamped, a few on a bound exactly (the gradient passes there).
constexpr float kClampAlpha = 1.702f, kClampLimit = 2.0f;

void case_swiglu_clamped_forward(KernelRun& r) {
  const int64_t n = 67;
  std::vector<float> g = random_vector(n, r.rng, 3.0), u = random_vector(n, r.rng, 3.0);
  g[0] = kClampLimit, u[1] = -kClampLimit, u[2] = kClampLimit;
  std::vector<double> gd(g.begin(), g.end()), ud(u.begin(), u.end()), ad(n);
  ops::ref::swiglu_clamped_forward<double>(gd.data(), ud.data(), ad.data(), n, kClampAlpha, kClampLimit);
  const std::vector<float> a(ad.begin(), ad.end());
  const float *dg = r.up(g, "g"), *du = r.up(u, "u");
  float* da = r.up(filled(n, kNaN), "a");
  r.K.swiglu_clamped_forward(dg, du, da, n, kClampAlpha, kClampLimit);
  r.sync();
  r.expect("a", {n}, da, a, op_test::tol_ulps(8, 1e-40));
}

void case_swiglu_clamped_backward(KernelRun& r) {
  const int64_t n = 67;
  std::vector<float> g = random_vector(n, r.rng, 3.0), u = random_vector(n, r.rng, 3.0), da = random_vector(n, r.rng);
  g[0] = kClampLimit, u[1] = -kClampLimit, u[2] = kClampLimit;
  std::vector<double> gd(g.begin(), g.end()), ud(u.begin(), u.end()), dad(da.begin(), da.end()), dgd(n), dud(n);
  ops::ref::swiglu_clamped_backward<double>(gd.data(), ud.data(), dad.data(), dgd.data(), dud.data(), n, kClampAlpha,
                                            kClampLimit);
  const std::vector<float> dg(dgd.begin(), dgd.end()), du(dud.begin(), dud.end());
  std::vector<double> tol_dg(n);
  for (int64_t i = 0; i < n; ++i) {  // 1 + alpha g_c (1 - s) cancels near alpha g_c = -1.28, as silu' does
    const double gc = std::min<double>(g[i], kClampLimit), s = 1.0 / (1.0 + std::exp(-kClampAlpha * gc));
    tol_dg[i] = 8 * FLT_EPSILON * std::abs(static_cast<double>(da[i]) * (1.0 + std::clamp<double>(u[i], -2, 2))) * s *
                    (1.0 + std::abs(kClampAlpha * gc * (1.0 - s))) +
                1e-40;
  }
  const float *d_g = r.up(g, "g"), *d_u = r.up(u, "u"), *d_da = r.up(da, "da");
  float *d_dg = r.up(filled(n, kNaN), "dg"), *d_du = r.up(filled(n, kNaN), "du");
  r.K.swiglu_clamped_backward(d_g, d_u, d_da, d_dg, d_du, n, kClampAlpha, kClampLimit);
  r.sync();
  r.expect("dg", {n}, d_dg, dg, op_test::tol_each(tol_dg));
  r.expect("du", {n}, d_du, du, op_test::tol_ulps(8, 1e-40));
}

// The router (test_router.cpp): every value compared is O(1) and a handful of float roundings from the
// reference: absolute-plus-relative 1e-5; the top-k choice exact (the same arithmetic, Note [Router sums in
// double]). Softmax: n = 33 tokens, E = 17 experts, k = 3, renormalised.
Tol router_tol() { return op_test::tol_abs_rel(1e-5); }

struct SoftmaxRouting {
  int64_t n = 33, E = 17, k = 3;
  bool norm = true;
  std::vector<float> logits, probs, w;
  std::vector<int32_t> idx;
  explicit SoftmaxRouting(Rng& rng) : logits(random_vector(n * E, rng, 2.0)), probs(n * E), w(n * k), idx(n * k) {
    ops::ref::router_forward<float>(logits.data(), probs.data(), idx.data(), w.data(), spec());
  }
  ops::RouterSpec spec() const { return {n, E, k, norm}; }
};

void case_router_forward(KernelRun& r) {
  const SoftmaxRouting s(r.rng);
  const float* dl = r.up(s.logits, "logits");
  float *dp = r.up(filled(s.n * s.E, kNaN), "probs"), *dw = r.up(filled(s.n * s.k, kNaN), "topk_w");
  int32_t* di = r.up(std::vector<int32_t>(s.n * s.k, -7), "topk_idx");
  r.K.router_forward(dl, dp, di, dw, s.spec());
  r.sync();
  r.expect("probs", {s.n, s.E}, dp, s.probs, router_tol());
  r.expect_equal("topk_idx", di, s.idx);
  r.expect("topk_w", {s.n, s.k}, dw, s.w, router_tol());
}

// A routing profile's choice: random experts, repeats within a token allowed (k = 4 of 17).
void case_router_gather(KernelRun& r) {
  const SoftmaxRouting s(r.rng);
  const int64_t k = 4;
  const std::vector<int32_t> idx = op_test::random_ids(s.n * k, s.E, r.rng);
  std::vector<float> w(s.n * k);
  ops::ref::router_gather<float>(s.probs.data(), idx.data(), w.data(), {s.n, s.E, k, true});
  const float* dp = r.up(s.probs, "probs");
  const int32_t* di = r.up(idx, "topk_idx");
  float* dw = r.up(filled(s.n * k, kNaN), "topk_w");
  r.K.router_gather(dp, di, dw, ops::RouterSpec{s.n, s.E, k, true});
  r.sync();
  r.expect("topk_w", {s.n, k}, dw, w, router_tol());
}

// With the load-balancing term dprobs_bias.
void case_router_backward(KernelRun& r) {
  const SoftmaxRouting s(r.rng);
  const std::vector<float> dw = random_vector(s.n * s.k, r.rng), db = random_vector(s.E, r.rng);
  std::vector<float> dl(s.n * s.E);
  ops::ref::router_backward<float>(s.probs.data(), s.idx.data(), dw.data(), db.data(), dl.data(), s.spec());
  const float *dp = r.up(s.probs, "probs"), *d_dw = r.up(dw, "d_topk_w"), *d_db = r.up(db, "dprobs_bias");
  const int32_t* di = r.up(s.idx, "topk_idx");
  float* d_dl = r.up(filled(s.n * s.E, kNaN), "dlogits");
  r.K.router_backward(dp, di, d_dw, d_db, d_dl, s.spec());
  r.sync();
  r.expect("dlogits", {s.n, s.E}, d_dl, dl, router_tol());
}

// DeepSeek-V3's sigmoid router (test_router.cpp RouterSigmoid, same tolerances): E = 16 in 4 groups, the
// best 2 groups allowed, k = 4, renormalised, routed_scaling_factor 2.5.
struct SigmoidRouting {
  int64_t n = 21, E = 16, k = 4, n_group = 4, topk_group = 2;
  bool norm = true;
  float scaling = 2.5f;
  std::vector<float> logits, bias, scores, w;
  std::vector<int32_t> idx;
  explicit SigmoidRouting(Rng& rng)
      : logits(random_vector(n * E, rng, 2.0)), bias(random_vector(E, rng, 0.3)), scores(n * E), w(n * k), idx(n * k) {
    ops::ref::router_sigmoid_forward<float>(logits.data(), bias.data(), scores.data(), idx.data(), w.data(), spec());
  }
  ops::RouterSpec spec() const { return {n, E, k, norm, n_group, topk_group, scaling}; }
};

void case_router_sigmoid_forward(KernelRun& r) {
  const SigmoidRouting s(r.rng);
  const float *dl = r.up(s.logits, "logits"), *db = r.up(s.bias, "bias");
  float *ds = r.up(filled(s.n * s.E, kNaN), "scores"), *dw = r.up(filled(s.n * s.k, kNaN), "topk_w");
  int32_t* di = r.up(std::vector<int32_t>(s.n * s.k, -7), "topk_idx");
  r.K.router_sigmoid_forward(dl, db, ds, di, dw, s.spec());
  r.sync();
  r.expect("scores", {s.n, s.E}, ds, s.scores, router_tol());
  r.expect_equal("topk_idx", di, s.idx);
  r.expect("topk_w", {s.n, s.k}, dw, s.w, router_tol());
}

// A routing profile's choice: random experts, repeats allowed.
void case_router_sigmoid_gather(KernelRun& r) {
  const SigmoidRouting s(r.rng);
  const std::vector<int32_t> idx = op_test::random_ids(s.n * s.k, s.E, r.rng);
  std::vector<float> w(s.n * s.k);
  ops::ref::router_sigmoid_gather<float>(s.scores.data(), idx.data(), w.data(), s.spec());
  const float* ds = r.up(s.scores, "scores");
  const int32_t* di = r.up(idx, "topk_idx");
  float* dw = r.up(filled(s.n * s.k, kNaN), "topk_w");
  r.K.router_sigmoid_gather(ds, di, dw, s.spec());
  r.sync();
  r.expect("topk_w", {s.n, s.k}, dw, w, router_tol());
}

void case_router_sigmoid_backward(KernelRun& r) {
  const SigmoidRouting s(r.rng);
  const std::vector<float> dw = random_vector(s.n * s.k, r.rng);
  std::vector<float> dl(s.n * s.E);
  ops::ref::router_sigmoid_backward<float>(s.scores.data(), s.idx.data(), dw.data(), dl.data(), s.spec());
  const float *ds = r.up(s.scores, "scores"), *d_dw = r.up(dw, "d_topk_w");
  const int32_t* di = r.up(s.idx, "topk_idx");
  float* d_dl = r.up(filled(s.n * s.E, kNaN), "dlogits");
  r.K.router_sigmoid_backward(ds, di, d_dw, d_dl, s.spec());
  r.sync();
  r.expect("dlogits", {s.n, s.E}, d_dl, dl, router_tol());
}

// Aux-loss-free balancing between steps (Model::routing_bias_update): exact; loads below, at and above the
// mean, a rate that is not a float.
void case_routing_bias_update(KernelRun& r) {
  constexpr int64_t kRowsBias = 37;
  std::vector<float> bias(kRowsBias);
  for (float& b : bias) b = static_cast<float>(r.rng.normal());
  std::vector<double> load(kRowsBias);
  for (int64_t i = 0; i < kRowsBias; ++i) load[i] = static_cast<double>(i % 5);
  const double mean = 2.0, rate = 1e-3;
  std::vector<float> want = bias;
  ops::ref::routing_bias_update<float>(want.data(), load.data(), kRowsBias, mean, rate);
  float* db = r.up(bias, "bias");
  const double* dl = r.up(load, "load");
  r.K.routing_bias_update(db, dl, kRowsBias, mean, rate);
  r.sync();
  r.expect("bias", {kRowsBias}, db, want, op_test::tol_exact());
}

// The routing sort (test_moe_routing.cpp): byte for byte; random choices with repeats within a token, so
// some experts are empty or shared by a token's slots. Outputs poisoned: every entry must be written.
void case_moe_routing_build(KernelRun& r) {
  const int64_t n = 37, k = 3, E = 9;
  const std::vector<int32_t> idx = op_test::random_ids(n * k, E, r.rng);
  std::vector<int32_t> rows(n * k), slot_pos(n * k);
  std::vector<int64_t> offsets(E + 1);
  ops::ref::moe_routing_build(idx.data(), n, k, E, rows.data(), slot_pos.data(), offsets.data());
  const int32_t* di = r.up(idx, "topk_idx");
  int32_t *d_rows = r.up(std::vector<int32_t>(n * k, -7), "rows"),
          *d_slot = r.up(std::vector<int32_t>(n * k, -7), "slot_pos");
  int64_t* d_off = r.up(std::vector<int64_t>(E + 1, -7), "expert_offsets");
  r.K.moe_routing_build(di, n, k, E, d_rows, d_slot, d_off);
  r.sync();
  r.expect_equal("rows", d_rows, rows);
  r.expect_equal("slot_pos", d_slot, slot_pos);
  r.expect_equal("expert_offsets", d_off, offsets);
}

// PipelinedLLEP's chunk order (test_moe_chunk_order.cpp): byte for byte; 41 tokens, k = 3, W = 3 ranks,
// K = 4 strided chunks, pieces of random lengths (some empty) to random ranks, counters per piece.
// Outputs poisoned: every entry must be written.
void case_moe_chunk_order(KernelRun& r) {
  const int64_t n = 41, k = 3, m = n * k, K = 4, W = 3, B = 4 * 7;
  const std::vector<int32_t> rows = op_test::random_ids(m, n, r.rng);
  std::vector<int64_t> pieces;
  for (int64_t b = 0, p = 0; b < m; ++p) {
    const int64_t e = std::min<int64_t>(m, b + static_cast<int64_t>(r.rng.below(30)));
    pieces.insert(pieces.end(), {b, e, static_cast<int64_t>(r.rng.below(W)), p % 7, 7});
    b = e;
  }
  const int64_t P = static_cast<int64_t>(pieces.size()) / 5;
  std::vector<int32_t> order(m), tokens(m);
  std::vector<int64_t> offsets(K * W + 1), blocks(B);
  const ops::ChunkOrderSpec spec{m, P, K, 0, true, W, B};
  ops::ref::moe_chunk_order(rows.data(), pieces.data(), spec, order.data(), tokens.data(), offsets.data(),
                            blocks.data());
  const int32_t* drows = r.up(rows, "rows");
  const int64_t* dpieces = r.up(pieces, "pieces");
  int32_t *dorder = r.up(std::vector<int32_t>(m, -7), "order"), *dtok = r.up(std::vector<int32_t>(m, -7), "tokens");
  int64_t *doff = r.up(std::vector<int64_t>(K * W + 1, -7), "group_offsets"),
          *dblk = r.up(std::vector<int64_t>(B, -7), "block_counts");
  r.K.moe_chunk_order(drows, dpieces, spec, dorder, dtok, doff, dblk);
  r.sync();
  r.expect_equal("order", dorder, order);
  r.expect_equal("tokens", dtok, tokens);
  r.expect_equal("group_offsets", doff, offsets);
  r.expect_equal("block_counts", dblk, blocks);
}

// The token permutation (test_moe_permute.cpp): n = 13 tokens, k = 3 slots, H = 19, the routing of random
// experts (repeats allowed) built by the reference sort.
struct Permutation {
  int64_t n = 13, k = 3, E = 6, H = 19, m = 39;
  std::vector<int32_t> rows, slot_pos;
  explicit Permutation(Rng& rng) : rows(m), slot_pos(m) {
    const std::vector<int32_t> idx = op_test::random_ids(m, E, rng);
    std::vector<int64_t> offsets(E + 1);
    ops::ref::moe_routing_build(idx.data(), n, k, E, rows.data(), slot_pos.data(), offsets.data());
  }
};

// A copy: exact.
void case_moe_gather(KernelRun& r) {
  const Permutation p(r.rng);
  const std::vector<float> x = random_vector(p.n * p.H, r.rng);
  std::vector<float> xs(p.m * p.H);
  ops::ref::moe_gather<float>(x.data(), p.rows.data(), xs.data(), p.m, p.H);
  const float* dx = r.up(x, "x");
  const int32_t* drows = r.up(p.rows, "rows");
  float* dxs = r.up(filled(p.m * p.H, kNaN), "xs");
  r.K.moe_gather(dx, drows, dxs, p.m, p.H);
  r.sync();
  r.expect("xs", {p.m, p.H}, dxs, xs, op_test::tol_exact());
}

// A copy into about half of the rows of dst, in a random order (a chunk of a plan): exact, the other rows
// untouched.
void case_moe_scatter(KernelRun& r) {
  const Permutation p(r.rng);
  std::vector<int32_t> dest(p.m);
  std::iota(dest.begin(), dest.end(), 0);
  for (int64_t i = p.m - 1; i > 0; --i) std::swap(dest[i], dest[r.rng.below(i + 1)]);
  const int64_t mi = (p.m + 1) / 2;
  dest.resize(mi);
  const std::vector<float> src = random_vector(mi * p.H, r.rng), dst0 = random_vector(p.m * p.H, r.rng);
  std::vector<float> want = dst0;
  ops::ref::moe_scatter<float>(src.data(), dest.data(), want.data(), mi, p.H);
  const float* dsrc = r.up(src, "src");
  const int32_t* ddest = r.up(dest, "rows");
  float* ddst = r.up(dst0, "dst");
  r.K.moe_scatter(dsrc, ddest, ddst, mi, p.H);
  r.sync();
  r.expect("dst", {p.m, p.H}, ddst, want, op_test::tol_exact());
}

// A rounded product and a rounded sum per slot: 4 k eps (|out| + sum_j |w_j y_j|).
void case_moe_combine_forward(KernelRun& r) {
  const Permutation p(r.rng);
  const std::vector<float> ys = random_vector(p.m * p.H, r.rng), out0 = random_vector(p.n * p.H, r.rng);
  std::vector<float> w(p.n * p.k);
  for (float& x : w) x = static_cast<float>(0.05 + r.rng.uniform());
  std::vector<float> want = out0;
  ops::ref::moe_combine_forward<float>(ys.data(), p.slot_pos.data(), w.data(), want.data(), p.n, p.k, p.H);
  std::vector<double> bound(p.n * p.H);
  for (int64_t t = 0; t < p.n; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      double mag = std::abs(out0[t * p.H + h]);
      for (int64_t j = 0; j < p.k; ++j) mag += std::abs(w[t * p.k + j] * ys[p.slot_pos[t * p.k + j] * p.H + h]);
      bound[t * p.H + h] = 4.0 * p.k * FLT_EPSILON * mag;
    }
  const float *dys = r.up(ys, "ys"), *dw = r.up(w, "w");
  const int32_t* dslot = r.up(p.slot_pos, "slot_pos");
  float* dout = r.up(out0, "out");
  r.K.moe_combine_forward(dys, dslot, dw, dout, p.n, p.k, p.H);
  r.sync();
  r.expect("out", {p.n, p.H}, dout, want, op_test::tol_each(bound));
}

// dys one rounded product: eps |dys|; dw a float dot against ref's double one: (H + 1) eps sum |dout y|.
// Poisoned outputs: every row of dys and every dw written.
void case_moe_combine_backward(KernelRun& r) {
  const Permutation p(r.rng);
  const std::vector<float> ys = random_vector(p.m * p.H, r.rng), w = random_vector(p.n * p.k, r.rng),
                           dout = random_vector(p.n * p.H, r.rng);
  std::vector<float> dys(p.m * p.H), dw(p.n * p.k);
  ops::ref::moe_combine_backward<float>(ys.data(), p.slot_pos.data(), w.data(), dout.data(), dys.data(), dw.data(), p.n,
                                        p.k, p.H);
  std::vector<double> bound_dw(p.n * p.k);
  for (int64_t t = 0; t < p.n; ++t)
    for (int64_t j = 0; j < p.k; ++j) {
      double mag = 0;
      for (int64_t h = 0; h < p.H; ++h) mag += std::abs(dout[t * p.H + h] * ys[p.slot_pos[t * p.k + j] * p.H + h]);
      bound_dw[t * p.k + j] = (p.H + 1) * FLT_EPSILON * mag;
    }
  const float *d_ys = r.up(ys, "ys"), *d_w = r.up(w, "w"), *d_dout = r.up(dout, "dout");
  const int32_t* dslot = r.up(p.slot_pos, "slot_pos");
  float *d_dys = r.up(filled(p.m * p.H, kNaN), "dys"), *d_dw = r.up(filled(p.n * p.k, kNaN), "dw");
  r.K.moe_combine_backward(d_ys, dslot, d_w, d_dout, d_dys, d_dw, p.n, p.k, p.H);
  r.sync();
  r.expect("dys", {p.m, p.H}, d_dys, dys, op_test::tol_ulps(1));
  r.expect("dw", {p.n, p.k}, d_dw, dw, op_test::tol_each(bound_dw));
}

// k float additions: 2 k eps (|dx| + sum_j |dxs_j|).
void case_moe_scatter_add(KernelRun& r) {
  const Permutation p(r.rng);
  const std::vector<float> dxs = random_vector(p.m * p.H, r.rng), dx0 = random_vector(p.n * p.H, r.rng);
  std::vector<float> want = dx0;
  ops::ref::moe_scatter_add<float>(dxs.data(), p.slot_pos.data(), want.data(), p.n, p.k, p.H);
  std::vector<double> bound(p.n * p.H);
  for (int64_t t = 0; t < p.n; ++t)
    for (int64_t h = 0; h < p.H; ++h) {
      double mag = std::abs(dx0[t * p.H + h]);
      for (int64_t j = 0; j < p.k; ++j) mag += std::abs(dxs[p.slot_pos[t * p.k + j] * p.H + h]);
      bound[t * p.H + h] = 2.0 * p.k * FLT_EPSILON * mag;
    }
  const float* d_dxs = r.up(dxs, "dxs");
  const int32_t* dslot = r.up(p.slot_pos, "slot_pos");
  float* d_dx = r.up(dx0, "dx");
  r.K.moe_scatter_add(d_dxs, dslot, d_dx, p.n, p.k, p.H);
  r.sync();
  r.expect("dx", {p.n, p.H}, d_dx, want, op_test::tol_each(bound));
}

// The full loss (test_cross_entropy.cpp): n = 7 rows of V = 67 logits at scales 1, 10 and 1e4, every third
// target ignored.
struct Loss {
  int64_t n = 7, V = 67;
  std::vector<float> logits, logp;
  std::vector<int32_t> targets;
  explicit Loss(Rng& rng)
      : logits(op_test::random_logits(n, V, rng)),
        logp(n * V),
        targets(op_test::random_targets(n, V, rng, kIgnoreIndex)) {
    ops::ref::log_softmax_forward<float>(logits.data(), logp.data(), n, V);
  }
};

// Both sum expf in double: lse within ~2 eps absolute, each logp rounded once: 2 eps |logp| + 4 eps.
void case_log_softmax_forward(KernelRun& r) {
  const Loss l(r.rng);
  const float* dl = r.up(l.logits, "logits");
  float* dp = r.up(filled(l.n * l.V, kNaN), "logp");
  r.K.log_softmax_forward(dl, dp, l.n, l.V);
  r.sync();
  std::vector<double> tol(l.logp.size());
  for (size_t i = 0; i < tol.size(); ++i) tol[i] = 2 * FLT_EPSILON * std::abs(l.logp[i]) + 4 * FLT_EPSILON;
  r.expect("logp", {l.n, l.V}, dp, l.logp, op_test::tol_each(tol));
}

// A copy of -logp at the target (0 where ignored): exact.
void case_nll_forward(KernelRun& r) {
  const Loss l(r.rng);
  std::vector<float> loss(l.n);
  ops::ref::nll_forward<float>(l.logp.data(), l.targets.data(), loss.data(), l.n, l.V);
  const float* dp = r.up(l.logp, "logp");
  const int32_t* dt = r.up(l.targets, "targets");
  float* dloss = r.up(filled(l.n, kNaN), "loss");
  r.K.nll_forward(dp, dt, dloss, l.n, l.V);
  r.sync();
  r.expect("loss", {l.n}, dloss, loss, op_test::tol_exact());
}

// The same float operations up to expf: 2 eps |scale| (p + onehot). The ignored rows' logp poisoned (must
// not be read); dlogits starts at 7 (every element overwritten).
void case_cross_entropy_backward(KernelRun& r) {
  const Loss l(r.rng);
  const float scale = 1.0f / 3.0f;
  std::vector<float> d(l.n * l.V), logp_in = l.logp;
  ops::ref::cross_entropy_backward<float>(l.logp.data(), l.targets.data(), scale, d.data(), l.n, l.V);
  std::vector<double> tol(d.size());
  for (int64_t t = 0; t < l.n; ++t)
    for (int64_t i = 0; i < l.V; ++i) {
      if (l.targets[t] == kIgnoreIndex) logp_in[t * l.V + i] = kNaN;
      tol[t * l.V + i] = 2 * FLT_EPSILON * scale *
                         (std::exp(static_cast<double>(l.logp[t * l.V + i])) + (i == l.targets[t] ? 1.0 : 0.0));
    }
  const float* dp = r.up(logp_in, "logp");
  const int32_t* dt = r.up(l.targets, "targets");
  float* dd = r.up(filled(l.n * l.V, 7.0f), "dlogits");
  r.K.cross_entropy_backward(dp, dt, scale, dd, l.n, l.V);
  r.sync();
  r.expect("dlogits", {l.n, l.V}, dd, d, op_test::tol_each(tol));
}

// The online log-sum-exp (test_online_lse.cpp): the Loss's logits cut at 23 into [0, 23) and [23, 67);
// the strips are the columns of the (n, V) logits, ld = V.
struct OnlineState {
  std::vector<float> m, y;
  std::vector<double> z;
  explicit OnlineState(int64_t n) : m(n), y(n), z(n) {}
};
constexpr int64_t kCut = 23;

OnlineState online_fold_ref(const Loss& l, int64_t v1) {  // [0, kCut), then [kCut, v1) if v1 > kCut
  OnlineState s(l.n);
  ops::ref::online_lse_init<float>(s.m.data(), s.z.data(), s.y.data(), l.n);
  ops::ref::online_lse_fold<float>(l.logits.data(), l.V, l.targets.data(), l.n, 0, kCut, s.m.data(), s.z.data(),
                                   s.y.data());
  if (v1 > kCut)
    ops::ref::online_lse_fold<float>(l.logits.data() + kCut, l.V, l.targets.data(), l.n, kCut, v1, s.m.data(),
                                     s.z.data(), s.y.data());
  return s;
}

// The empty state, over poisoned buffers: m = -inf, z = 0, y = 0 exactly.
void case_online_lse_init(KernelRun& r) {
  const int64_t rows = 37;
  OnlineState s(rows);
  ops::ref::online_lse_init<float>(s.m.data(), s.z.data(), s.y.data(), rows);
  float *dm = r.up(filled(rows, kNaN), "m"), *dy = r.up(filled(rows, 5.0f), "y");
  double* dz = r.up(std::vector<double>(rows, 5.0), "z");
  r.K.online_lse_init(dm, dz, dy, rows);
  r.sync();
  r.expect("m", {rows}, dm, s.m, op_test::tol_exact(), kNegInfExact);
  r.expect("z", dz, s.z, op_test::tol_exact());
  r.expect("y", {rows}, dy, s.y, op_test::tol_exact());
}

// The second range folded into the state of the first: m a max and y a copy (exact); z the same float
// exponentials summed in double in another order: 1e-13 relative.
void case_online_lse_fold(KernelRun& r) {
  const Loss l(r.rng);
  const OnlineState s0 = online_fold_ref(l, kCut), s1 = online_fold_ref(l, l.V);
  const float* dx = r.up(l.logits, "logits");
  const int32_t* dt = r.up(l.targets, "targets");
  float *dm = r.up(s0.m, "m"), *dy = r.up(s0.y, "y");
  double* dz = r.up(s0.z, "z");
  r.K.online_lse_fold(at(dx, kCut), l.V, dt, l.n, kCut, l.V, dm, dz, dy);
  r.sync();
  r.expect("m", {l.n}, dm, s1.m, op_test::tol_exact());
  r.expect("z", dz, s1.z, [](size_t, double w) { return 1e-13 * std::abs(w); });
  r.expect("y", {l.n}, dy, s1.y, op_test::tol_exact());
}

// The loss sum in double: 1e-12 relative plus 1e-9.
void case_online_lse_loss(KernelRun& r) {
  const Loss l(r.rng);
  const OnlineState s = online_fold_ref(l, l.V);
  double loss = 0;
  ops::ref::online_lse_loss<float>(s.m.data(), s.z.data(), s.y.data(), l.targets.data(), l.n, &loss);
  const float *dm = r.up(s.m, "m"), *dy = r.up(s.y, "y");
  const double* dz = r.up(s.z, "z");
  const int32_t* dt = r.up(l.targets, "targets");
  double* dloss = r.up(std::vector<double>{std::numeric_limits<double>::quiet_NaN()}, "loss_sum");
  r.K.online_lse_loss(dm, dz, dy, dt, l.n, dloss);
  r.sync();
  r.expect("loss_sum", dloss, {loss}, [](size_t, double w) { return 1e-12 * (1 + std::abs(w)) + 1e-9; });
}

// The strip [23, 67) in place from the same final state: 2 eps scale (|d / scale| + 2); its ignored rows
// poisoned (not read, written 0); the columns outside the strip untouched.
void case_online_lse_backward(KernelRun& r) {
  const Loss l(r.rng);
  const OnlineState s = online_fold_ref(l, l.V);
  const float scale = 1.0f / 3.0f;
  std::vector<float> in = l.logits, want = l.logits;
  ops::ref::online_lse_backward<float>(want.data() + kCut, l.V, l.targets.data(), l.n, kCut, l.V, s.m.data(),
                                       s.z.data(), scale);
  std::vector<double> tol(want.size(), 0.0);
  for (int64_t t = 0; t < l.n; ++t)
    for (int64_t i = kCut; i < l.V; ++i) {
      if (l.targets[t] == kIgnoreIndex) in[t * l.V + i] = kNaN;
      tol[t * l.V + i] = 2 * FLT_EPSILON * scale * (std::abs(want[t * l.V + i] / scale) + 2.0);
    }
  float* dx = r.up(in, "logits");
  const int32_t* dt = r.up(l.targets, "targets");
  const float* dm = r.up(s.m, "m");
  const double* dz = r.up(s.z, "z");
  r.K.online_lse_backward(at(dx, kCut), l.V, dt, l.n, kCut, l.V, dm, dz, scale);
  r.sync();
  r.expect("logits", {l.n, l.V}, dx, want, op_test::tol_each(tol));
}

// Element-wise kernels (test_elementwise.cpp): one float operation per element in both: bit for bit.
// n = 1037: past every SIMD width with a remainder of 13.
constexpr int64_t kN = 1037;

void case_add_inplace(KernelRun& r) {
  const std::vector<float> y0 = random_vector(kN, r.rng), x = random_vector(kN, r.rng);
  std::vector<float> want = y0;
  ops::ref::add_inplace<float>(want.data(), x.data(), kN);
  float* dy = r.up(y0, "y");
  const float* dx = r.up(x, "x");
  r.K.add_inplace(dy, dx, kN);
  r.sync();
  r.expect("y", {kN}, dy, want, op_test::tol_exact());
}

void case_scale_inplace(KernelRun& r) {
  const std::vector<float> y0 = random_vector(kN, r.rng);
  std::vector<float> want = y0;
  ops::ref::scale_inplace<float>(want.data(), -0.3f, kN);
  float* dy = r.up(y0, "y");
  r.K.scale_inplace(dy, -0.3f, kN);
  r.sync();
  r.expect("y", {kN}, dy, want, op_test::tol_exact());
}

void case_fill(KernelRun& r) {
  const std::vector<float> y0 = random_vector(kN, r.rng);
  std::vector<float> want = y0;
  ops::ref::fill<float>(want.data(), 1.25f, kN);
  float* dy = r.up(y0, "y");
  r.K.fill(dy, 1.25f, kN);
  r.sync();
  r.expect("y", {kN}, dy, want, op_test::tol_exact());
}

void case_copy(KernelRun& r) {
  const std::vector<float> src = random_vector(kN, r.rng);
  std::vector<float> want(kN);
  ops::ref::copy<float>(want.data(), src.data(), kN);
  const float* ds = r.up(src, "src");
  float* dd = r.up(filled(kN, kNaN), "dst");
  r.K.copy(dd, ds, kN);
  r.sync();
  r.expect("dst", {kN}, dd, want, op_test::tol_exact());
}

// Reductions (test_elementwise.cpp): both sum in double in different orders: eps |want| + 2 n eps_double
// sum |x| (of x^2 for the sum of squares). n = 4099: past the 4096-element block.
void reduce_case(KernelRun& r, bool squares) {
  const int64_t n = 4099;
  const std::vector<float> x = random_vector(n, r.rng);
  double mag = 0;
  for (const float v : x) mag += squares ? static_cast<double>(v) * v : std::abs(static_cast<double>(v));
  float want = 0;
  if (squares)
    ops::ref::reduce_sumsq<float>(x.data(), n, &want);
  else
    ops::ref::reduce_sum<float>(x.data(), n, &want);
  const float* dx = r.up(x, "x");
  float* dout = r.up(filled(1, kNaN), "out");
  if (squares)
    r.K.reduce_sumsq(dx, n, dout);
  else
    r.K.reduce_sum(dx, n, dout);
  r.sync();
  const double tol = FLT_EPSILON * std::abs(want) + 2.0 * n * DBL_EPSILON * mag;
  r.expect("out", {1}, dout, {want}, [tol](size_t, double) { return tol; });
}

// reduce_sumsq_multi: each tensor of the bucket held as reduce_case's sum of squares; the middle one empty.
void case_reduce_sumsq_multi(KernelRun& r) {
  const std::vector<int64_t> n = {4099, 0, 37};
  std::vector<CBuf> dx;
  std::vector<float> want;
  std::vector<double> tol;
  for (size_t i = 0; i < n.size(); ++i) {
    const std::vector<float> x = random_vector(n[i], r.rng);
    double mag = 0;
    for (const float v : x) mag += static_cast<double>(v) * v;
    float w = 0;
    ops::ref::reduce_sumsq<float>(x.data(), n[i], &w);
    want.push_back(w);
    tol.push_back(FLT_EPSILON * std::abs(w) + 2.0 * static_cast<double>(n[i]) * DBL_EPSILON * mag);
    dx.push_back(x.empty() ? CBuf{} : CBuf(r.up(x, "x" + std::to_string(i))));
  }
  float* dout = r.up(filled(static_cast<int64_t>(n.size()), kNaN), "out");
  r.K.reduce_sumsq_multi(dx.data(), n.data(), static_cast<int64_t>(n.size()), dout);
  r.sync();
  r.expect("out", {static_cast<int64_t>(n.size())}, dout, want, op_test::tol_each(tol));
}

// Bias add, its gradient and the column sums (test_elementwise.cpp BiasMatchesReferenceExactly): one float
// add per element, one double sum per column in row order: bit for bit. (70, 67).
constexpr int64_t kRows = 70, kCols = 67;

void case_bias_add(KernelRun& r) {
  const std::vector<float> y0 = random_vector(kRows * kCols, r.rng), b = random_vector(kCols, r.rng);
  std::vector<float> want = y0;
  ops::ref::bias_add<float>(want.data(), b.data(), kRows, kCols);
  float* dy = r.up(y0, "y");
  const float* db = r.up(b, "b");
  r.K.bias_add(dy, db, kRows, kCols);
  r.sync();
  r.expect("y", {kRows, kCols}, dy, want, op_test::tol_exact());
}

void case_bias_backward(KernelRun& r) {
  const std::vector<float> dy = random_vector(kRows * kCols, r.rng), db0 = random_vector(kCols, r.rng);
  std::vector<float> want = db0;
  ops::ref::bias_backward<float>(dy.data(), want.data(), kRows, kCols);
  const float* d_dy = r.up(dy, "dy");
  float* d_db = r.up(db0, "db");
  r.K.bias_backward(d_dy, d_db, kRows, kCols);
  r.sync();
  r.expect("db", {kCols}, d_db, want, op_test::tol_exact());
}

void case_column_sums_f64(KernelRun& r) {
  const std::vector<float> x = random_vector(kRows * kCols, r.rng);
  // Added into what out holds (a layer's earlier tiles).
  std::vector<double> out0(kCols);
  for (double& v : out0) v = 0.5 + static_cast<double>(r.rng.uniform());
  std::vector<double> want = out0;
  ops::ref::column_sums_f64<float>(x.data(), kRows, kCols, want.data());
  const float* dx = r.up(x, "x");
  double* dout = r.up(out0, "out");
  r.K.column_sums_f64(dx, kRows, kCols, dout);
  r.sync();
  r.expect("out", dout, want, op_test::tol_exact());
}

// Strided blocks (test_elementwise.cpp StridedBlocksCopyAndAdd): exact; the oracle is ref's copy and add
// row by row; the columns outside the block untouched.
void strided_case(KernelRun& r, bool add) {
  const int64_t rows = 30, cols = 7, lds = 11, ldd = 13;
  const std::vector<float> src = random_vector(rows * lds, r.rng), dst0 = random_vector(rows * ldd, r.rng);
  std::vector<float> want = dst0;
  for (int64_t i = 0; i < rows; ++i) {
    if (add)
      ops::ref::add_inplace<float>(want.data() + i * ldd, src.data() + i * lds, cols);
    else
      ops::ref::copy<float>(want.data() + i * ldd, src.data() + i * lds, cols);
  }
  const float* ds = r.up(src, "src");
  float* dd = r.up(dst0, "dst");
  if (add)
    r.K.add_2d(dd, ldd, ds, lds, rows, cols);
  else
    r.K.copy_2d(dd, ldd, ds, lds, rows, cols);
  r.sync();
  r.expect("dst", {rows, ldd}, dd, want, op_test::tol_exact());
}

// AdamW (test_adamw.cpp MatchesReferenceOnOddSizes): m and v go through the same float operations in both:
// 2 ulps of |want|. The weights differ by the rounding of the folded scalars (formed in double in the
// kernel, in float in the reference): 4 eps of the largest magnitude in play (the weight before or after)
// for one step. Step 3 from a state with nonzero moments, weight decay, gradient scale 0.37.
void case_adamw_update(KernelRun& r) {
  const int64_t n = kN;
  const ops::AdamWHyper h{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.37f, 3};
  std::vector<float> param(n), grad(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    param[i] = static_cast<float>(r.rng.normal());
    grad[i] = static_cast<float>(r.rng.normal() * std::pow(10.0, -3.0 + 4.0 * r.rng.uniform()));
    if (grad[i] == 0.0f) grad[i] = 1e-3f;
    const double g = r.rng.normal() * std::pow(10.0, -3.0 + 4.0 * r.rng.uniform());
    m[i] = static_cast<float>(0.3 * g);
    v[i] = static_cast<float>(0.1 * g * g + 1e-12);
  }
  std::vector<float> wp = param, wm = m, wv = v;
  ops::ref::adamw_update<float>(wp.data(), grad.data(), wm.data(), wv.data(), n, h.lr, h.beta1, h.beta2, h.eps,
                                h.weight_decay, h.grad_scale, h.step);
  std::vector<double> tol_p(n);
  for (int64_t i = 0; i < n; ++i) tol_p[i] = 4.0 * FLT_EPSILON * std::max(std::abs(param[i]), std::abs(wp[i]));
  float *dp = r.up(param, "param"), *dm = r.up(m, "m"), *dv = r.up(v, "v");
  const float* dg = r.up(grad, "grad");
  r.K.adamw_update(dp, dg, dm, dv, n, h, nullptr);
  r.sync();
  r.expect("param", {n}, dp, wp, op_test::tol_each(tol_p));
  r.expect("m", {n}, dm, wm, op_test::tol_ulps(2));
  r.expect("v", {n}, dv, wv, op_test::tol_ulps(2));
}

// adamw_update_multi (Note [The optimizer in buckets] in ops/adamw.h): three tensors, the second empty, each
// with its own weight decay, each held to case_adamw_update's bounds against the reference.
void case_adamw_update_multi(KernelRun& r) {
  const std::vector<int64_t> sizes = {kN, 0, 57};
  const std::vector<float> decay = {0.1f, 0.1f, 0.0f};
  const ops::AdamWHyper h{3e-3f, 0.9f, 0.95f, 1e-8f, 0.5f, 0.37f, 3};  // its weight_decay is each tensor's
  struct Host {
    std::vector<float> param, grad, m, v, wp, wm, wv;
    float *dp = nullptr, *dm = nullptr, *dv = nullptr;
  };
  std::vector<Host> t(sizes.size());
  std::vector<ops::AdamWTensor> bucket;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    Host& x = t[i];
    x.param = random_vector(n, r.rng);
    x.grad = random_vector(n, r.rng);
    x.m = random_vector(n, r.rng);
    x.v.resize(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) x.v[j] = 1e-3f * x.m[j] * x.m[j] + 1e-9f;
    x.wp = x.param, x.wm = x.m, x.wv = x.v;
    ops::ref::adamw_update<float>(x.wp.data(), x.grad.data(), x.wm.data(), x.wv.data(), n, h.lr, h.beta1, h.beta2,
                                  h.eps, decay[i], h.grad_scale, h.step);
    const std::string k = std::to_string(i);
    if (n > 0) {
      x.dp = r.up(x.param, "param" + k), x.dm = r.up(x.m, "m" + k), x.dv = r.up(x.v, "v" + k);
    }
    ops::AdamWTensor a;
    a.param = x.dp;
    a.grad = n > 0 ? CBuf(r.up(x.grad, "grad" + k)) : CBuf{};
    a.m = x.dm, a.v = x.dv, a.n = n, a.weight_decay = decay[i];
    bucket.push_back(a);
  }
  r.K.adamw_update_multi(bucket.data(), static_cast<int64_t>(bucket.size()), h);
  r.sync();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Host& x = t[i];
    const int64_t n = sizes[i];
    if (n == 0) continue;
    std::vector<double> tol_p(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) tol_p[j] = 4.0 * FLT_EPSILON * std::max(std::abs(x.param[j]), std::abs(x.wp[j]));
    const std::string k = std::to_string(i);
    r.expect("param" + k, {n}, x.dp, x.wp, op_test::tol_each(tol_p));
    r.expect("m" + k, {n}, x.dm, x.wm, op_test::tol_ulps(2));
    r.expect("v" + k, {n}, x.dv, x.wv, op_test::tol_ulps(2));
  }
}

// ---- The registry

using CaseFn = void (*)(KernelRun&);

const std::map<std::string, CaseFn>& cases() {
  static const std::map<std::string, CaseFn> m = {
      {"gemm", [](KernelRun& r) { gemm_case(r, false); }},
      {"gemm_tiled", [](KernelRun& r) { gemm_case(r, true); }},
      {"gemm_grouped", case_gemm_grouped},
      {"gemm_grouped_weight", case_gemm_grouped_weight},
      {"embedding_forward", case_embedding_forward},
      {"embedding_backward", case_embedding_backward},
      {"rmsnorm_forward", case_rmsnorm_forward},
      {"rmsnorm_backward", case_rmsnorm_backward},
      {"rope_forward", [](KernelRun& r) { rope_case(r, false); }},
      {"rope_backward", [](KernelRun& r) { rope_case(r, true); }},
      {"rope_strided_forward", [](KernelRun& r) { rope_strided_case(r, false); }},
      {"rope_strided_backward", [](KernelRun& r) { rope_strided_case(r, true); }},
      {"attention_forward", case_attention_forward},
      {"attention_backward", case_attention_backward},
      {"attention_block_forward", case_attention_block_forward},
      {"attention_block_backward", case_attention_block_backward},
      {"swiglu_forward", case_swiglu_forward},
      {"swiglu_backward", case_swiglu_backward},
      {"swiglu_clamped_forward", case_swiglu_clamped_forward},
      {"swiglu_clamped_backward", case_swiglu_clamped_backward},
      {"attention_sink_backward", case_attention_sink_backward},
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
      {"reduce_sum", [](KernelRun& r) { reduce_case(r, false); }},
      {"reduce_sumsq", [](KernelRun& r) { reduce_case(r, true); }},
      {"reduce_sumsq_multi", case_reduce_sumsq_multi},
      {"bias_add", case_bias_add},
      {"bias_backward", case_bias_backward},
      {"column_sums_f64", case_column_sums_f64},
      {"copy_2d", [](KernelRun& r) { strided_case(r, false); }},
      {"add_2d", [](KernelRun& r) { strided_case(r, true); }},
      {"adamw_update", case_adamw_update},
      {"adamw_update_multi", case_adamw_update_multi},
  };
  return m;
}

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
#define FP_KERNEL_NAME(name) names.push_back(#name);
  FP_KERNEL_LIST(FP_KERNEL_NAME)
#undef FP_KERNEL_NAME
  return names;
}

// One cpu and one meta backend for the whole binary (a cpu backend's copy streams are threads).
Backend& backend(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Backend>> all;
  std::unique_ptr<Backend>& b = all[name];
  if (!b) b = backend_create(name, kUnlimitedBytes, kUnlimitedBytes);
  return *b;
}

CaseFn case_of(const std::string& kernel) {
  const auto it = cases().find(kernel);
  return it == cases().end() ? nullptr : it->second;
}

}  // namespace

// A kernel of the table without a case here fails by name; so does a case whose kernel left the table.
TEST(KernelTable, EveryKernelHasACase) {
#define FP_EXPECT_CASE(name)                                                                  \
  EXPECT_NE(case_of(#name), nullptr) << "kernel " #name                                       \
                                        " of FP_KERNEL_LIST (backend/kernels.h) has no case " \
                                        "in tests/ops/test_kernel_table.cpp";
  FP_KERNEL_LIST(FP_EXPECT_CASE)
#undef FP_EXPECT_CASE
  const std::vector<std::string> names = kernel_names();
  for (const auto& [name, fn] : cases())
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end())
        << "case '" << name << "' names no kernel of FP_KERNEL_LIST";
  EXPECT_EQ(cases().size(), names.size());
}

class KernelTableCpu : public ::testing::TestWithParam<std::string> {};
class KernelTableMeta : public ::testing::TestWithParam<std::string> {};
#ifdef FLATPEAK_HAVE_CUDA
class KernelTableCuda : public ::testing::TestWithParam<std::string> {
 public:
  static std::vector<std::string>& ran() {
    static std::vector<std::string> v;
    return v;
  }
  static std::vector<std::string>& missing() {
    static std::vector<std::string> v;
    return v;
  }
  static void TearDownTestSuite() {
    if (ran().empty() && missing().empty()) return;  // skipped: no GPU, or not built with cuda
    auto join = [](const std::vector<std::string>& v) {
      std::string s;
      for (const std::string& x : v) s += (s.empty() ? "" : " ") + x;
      return s;
    };
    std::printf("cuda kernel table: %zu ran (%s); %zu not implemented (%s)\n", ran().size(), join(ran()).c_str(),
                missing().size(), join(missing()).c_str());
  }
};
#endif

// Inline on the calling thread (the cpu compute stream).
TEST_P(KernelTableCpu, ComputeStream) {
  const CaseFn fn = case_of(GetParam());
  ASSERT_NE(fn, nullptr) << "kernel " << GetParam() << " has no case";
  KernelRun r(backend("cpu"), On::kCompute, GetParam(), false);
  fn(r);
  EXPECT_FALSE(r.outputs().empty()) << r.label() << ": the case compared no output";
}

// On the h2d stream's worker: enqueued, not run, when the launch returns; then the inline run's bits.
TEST_P(KernelTableCpu, WorkerStream) {
  const CaseFn fn = case_of(GetParam());
  ASSERT_NE(fn, nullptr) << "kernel " << GetParam() << " has no case";
  Backend& be = backend("cpu");
  ASSERT_FALSE(be.h2d_stream().runs_inline());
  std::vector<std::pair<std::string, std::vector<char>>> inline_out;
  {
    KernelRun r(be, On::kCompute, GetParam(), false);
    fn(r);
    inline_out = r.outputs();
  }
  KernelRun w(be, On::kH2d, GetParam(), true);
  fn(w);
  ASSERT_EQ(w.outputs().size(), inline_out.size()) << w.label();
  for (size_t i = 0; i < inline_out.size(); ++i) {
    const auto& [name, bytes] = w.outputs()[i];
    ASSERT_EQ(name, inline_out[i].first) << w.label();
    EXPECT_TRUE(bytes == inline_out[i].second)
        << w.label() << ": output '" << name << "' differs from the compute stream's (inline) bit for bit";
  }
}

// The meta table does nothing, on the null data pointers of the meta arena.
TEST_P(KernelTableMeta, DoesNothingOnNullPointers) {
  const CaseFn fn = case_of(GetParam());
  ASSERT_NE(fn, nullptr) << "kernel " << GetParam() << " has no case";
  Backend& be = backend("meta");
  ASSERT_FALSE(be.computes());
  KernelRun r(be, On::kCompute, GetParam(), false);
  fn(r);
}

#ifdef FLATPEAK_HAVE_CUDA
TEST_P(KernelTableCuda, ComputeStream) {
  std::string why;
  if (!cuda_device_available(&why)) GTEST_SKIP() << "no GPU: " << why;
  const CaseFn fn = case_of(GetParam());
  ASSERT_NE(fn, nullptr) << "kernel " << GetParam() << " has no case";
  // A backend per test, as tests/cuda does (none left for static destruction after the CUDA runtime's).
  const std::unique_ptr<Backend> be = backend_create("cuda", kUnlimitedBytes, kUnlimitedBytes);
  try {
    KernelRun r(*be, On::kCompute, GetParam(), false);
    fn(r);
  } catch (const Error& e) {
    if (std::string(e.what()).find("not implemented") == std::string::npos) throw;
    missing().push_back(GetParam());
    GTEST_SKIP() << "kernel " << GetParam() << " on cuda: " << e.what();
  }
  ran().push_back(GetParam());
}
#else
TEST(KernelTableCuda, ComputeStream) { GTEST_SKIP() << "built without FLATPEAK_CUDA"; }
#endif

const auto kKernelName = [](const ::testing::TestParamInfo<std::string>& info) { return info.param; };
INSTANTIATE_TEST_SUITE_P(Kernels, KernelTableCpu, ::testing::ValuesIn(kernel_names()), kKernelName);
INSTANTIATE_TEST_SUITE_P(Kernels, KernelTableMeta, ::testing::ValuesIn(kernel_names()), kKernelName);
#ifdef FLATPEAK_HAVE_CUDA
INSTANTIATE_TEST_SUITE_P(Kernels, KernelTableCuda, ::testing::ValuesIn(kernel_names()), kKernelName);
#endif

}  // namespace fp
