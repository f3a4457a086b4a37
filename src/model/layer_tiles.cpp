// A decoder layer in tiles of the rank's tokens (Note [Sequence-tiled layers]): the attention block's
// token-wise work and the MoE block or dense MLP, one tile at a time, forward, recompute and backward.
// Legend: n tokens (B sequences of T), H hidden, nh/nkv heads, hd head_dim, r rows of a tile.
#include <cmath>

#include "model/blocks.h"
#include "model/ring_attention.h"

namespace fp {

// Note [Sequence-tiled layers]
// With ckpt.layer_tile = N (0 < N < n), a layer runs its token-wise work in tiles of at most N of the rank's
// tokens. Attention is the one op that mixes tokens, and it needs every key of a query's sequence: so each
// layer first computes K and V for all n tokens, tile by tile (keys_values: the input norm, the k and v
// projections, k_norm and RoPE), and then, per tile, the queries, their attention over the keys of their
// sequences (the block kernel of ops/attention_block.h with explicit positions, or the ring with a tile of
// queries, model/ring_attention.h), o_proj and the residual, and the MoE block or dense MLP on the tile's
// rows (which see the tile as the step's tokens: s.n = r while it runs, so the MoE token chunks split the
// tile).
// The backward recomputes K and V, then takes the tiles last first: the tile's forward (keeping its
// activations), the MoE or MLP recompute and backward on the tile's rows of the residual gradient, o_proj's
// backward, the tile's attention backward (dQ of its queries; dK and dV ADDED into f32 accumulators of all
// n tokens), and the query side down to d h1. With cp = 1 a key is seen only by the queries at or after it
// in its sequence, so once a tile's own queries are done its keys' dK and dV are complete, and its key
// side follows at once: dK and dV rounded once into the activations dtype (as the whole-sequence kernel
// writes them) through RoPE, k_norm (k_raw recomputed) and the k/v projections into d h1 (after the q path,
// the whole layer's order of that sum), and the input norm's backward into the residual gradient. The
// ring's keys are seen by every rank's tiles, so with cp > 1 the key sides wait for the last tile, and d h1
// is kept for all n.
// Under SCO a tiled layer keeps its input (read by every tile) and allocates its output before the first
// tile, so the previous boundary must leave the device before that: the step settles the store once K and V
// are computed (their projections give the previous boundary's offload time to finish), and the device holds
// two boundaries, as with whole layers.
// What stays full-length: the boundary x and the residual gradient dx (as without tiles), K and V, their
// f32 gradient accumulators, and with cp > 1 d h1. Everything else, the norms' outputs, q, the attention
// output and its statistics, the projections, the router's and the combine's tensors, the MLP's
// intermediates, lives for one tile. With cp > 1 each tile runs its own ring: its sequences' K/V travel
// once per tile (whole-sequence tiles: the untiled traffic; pieces of a sequence: T / N times its share).
// Exact: every token's output and every input gradient are the same function; the weight gradients
// accumulate tile by tile, and dK/dV over the tiles' queries, so sums run in another order (within 1e-6
// relative, tests/model/test_layer_tiles.cpp). N >= n is the whole layer, bit for bit (the untiled code).
// Tiles: N >= T, groups of min(B, N / T) whole sequences; N < T, pieces of N tokens of each sequence; the
// last group or piece may be shorter. Every rank has the same B and T, so the same tiles: the dispatch
// calls stay matched. A routing profile routes each tile as the step's tokens, once per tile length and step
// (Note [One routing per token count] in model/moe_block.cpp).
// gpt_oss's layer has no q/k norms (the projections go straight through RoPE) and its sinks join every tile's
// rows (Note [Attention sinks]).
//
// Note [MLA in tiles]
// deepseek_v3's multi-head latent attention (Note [Multi-head latent attention] in model/mla_block.cpp) keeps its
// latent full-length instead of K and V: each layer first computes every token's latent rows [kv_a_n | RoPE'd k_pe]
// (kl + dr numbers, 576 for Kimi-K2 and DeepSeek-V3), tile by tile; the expanded keys and values (nh (dqk + dv)
// numbers per key) exist only for a chunk of keys (Note [MLA's keys in chunks] in model/ring_attention.h). Per
// tile: the queries (through the query latent), the attention over the latent's chunks of the tile's sequences
// (cp > 1: the tile's own ring on the latent), o_proj and the residual, then the MoE block or MLP as above. The
// backward adds each chunk's key gradient, through kv_b_proj, into the latent's f32 gradient of every token, and
// kv_b_proj's weight gradient (in f32 across the tiles when the recipe's is not, rounded once); a tile's key side
// (k_pe's RoPE, kv_a_layernorm with kv_a recomputed, kv_a_proj_with_mqa) follows once its latent gradient is
// complete, under the same rule as K and V's. Full-length: the boundary, dx, the latent (act dtype) and its f32
// gradient, and with cp > 1 d h1.

namespace {

// One tile: `rows` tokens from row0, `seqs` whole sequences (len = T, t0 = 0) or a piece of len < T
// consecutive tokens of one sequence from its position t0.
struct Tile {
  int64_t row0 = 0, rows = 0, seqs = 0, len = 0, t0 = 0, T = 0;
  int64_t key_row0() const { return row0 / T * T; }  // its first sequence's first row
};

// The step's tiles: N >= T, groups of min(B, N / T) whole sequences; N < T, pieces of N tokens of each
// sequence. The last group (the last piece of each sequence) may be shorter.
struct Tiles {
  int64_t B = 0, T = 0, group = 0, piece = 0, per_seq = 0, count = 0;
  Tile at(int64_t i) const {
    Tile t;
    t.T = T;
    if (group > 0) {
      t.seqs = std::min(group, B - i * group);
      t.len = T;
      t.row0 = i * group * T;
    } else {
      t.seqs = 1;
      t.t0 = (i % per_seq) * piece;
      t.len = std::min(piece, T - t.t0);
      t.row0 = (i / per_seq) * T + t.t0;
    }
    t.rows = t.seqs * t.len;
    return t;
  }
};

Tiles tiles_of(const StepContext& s) {
  const int64_t N = s.layer_tile;
  Tiles t;
  t.B = s.B;
  t.T = s.T;
  if (N >= s.T) {
    t.group = std::min(s.B, N / s.T);
    t.count = (s.B + t.group - 1) / t.group;
  } else {
    t.piece = N;
    t.per_seq = (s.T + N - 1) / N;
    t.count = s.B * t.per_seq;
  }
  return t;
}

// Note [Tiles replayed once]
// On meta with repeats counted (Note [Repeats replayed once] in memory/ledger.h), a run of tiles of one shape
// (rows, sequences, length) is one tile replayed and the rest counted, where the work per tile allocates by
// its shape alone: the key side (keys_values, mla_latents, the deferred key sides), and a tile's attention,
// MoE block or MLP and backward when its keys are every key of its sequences (the ring, cp > 1) or allocate
// nothing by their count (GQA's block kernel); MLA with cp = 1 expands the keys up to the tile's last query,
// more chunks for later tiles, so those tiles run one by one. The MoE block routes a tile as the step's tokens
// (a profile's choice kept by n, Note [One routing per token count] in model/moe_block.cpp), so tiles of one length
// route alike, and their dispatch calls, collectives included, repeat alike on every rank. What a tile adds
// to the host's router statistics is added again for each tile counted.
bool tiles_alike(const Tile& a, const Tile& b) { return a.rows == b.rows && a.seqs == b.seqs && a.len == b.len; }

// body(t) for every tile, in order (reverse: last first), in runs of tiles alike; alike false: one by one.
// counted(n): n tiles alike to the one body last ran were counted, not run.
template <class Body, class Counted>
void tiles_run(StepContext& s, const Tiles& tiles, bool reverse, bool alike, Body&& body, Counted&& counted) {
  const auto index = [&](int64_t k) { return reverse ? tiles.count - 1 - k : k; };
  for (int64_t k = 0; k < tiles.count;) {
    const Tile first = tiles.at(index(k));
    int64_t run = 1;
    while (alike && k + run < tiles.count && tiles_alike(tiles.at(index(k + run)), first)) ++run;
    const int64_t n = repeat_same(s.be, run, [&](int64_t j) { body(tiles.at(index(k + j))); });
    if (n > 0) counted(n);
    k += run;
  }
}
template <class Body>
void tiles_run(StepContext& s, const Tiles& tiles, bool reverse, Body&& body) {
  tiles_run(s, tiles, reverse, true, std::forward<Body>(body), [](int64_t) {});
}

// Whether a tile's attention (forward and backward) allocates by its shape alone (Note [Tiles replayed once]).
bool attention_alike(const StepContext& s) { return s.cp > 1 || !s.cfg.is_deepseek(); }

// The MoE block and the dense MLP see a tile as the step's tokens while they run on it.
class TileTokens {
 public:
  TileTokens(StepContext& s, int64_t rows) : s_(s), n_(s.n) { s.n = rows; }
  ~TileTokens() { s_.n = n_; }
  TileTokens(const TileTokens&) = delete;
  TileTokens& operator=(const TileTokens&) = delete;

 private:
  StepContext& s_;
  int64_t n_;
};

const Param* bias_of(const StepContext& s, const Param* b) { return s.cfg.attention_bias ? b : nullptr; }

// h1 = input_layernorm(x) of r rows.
void norm_in(StepContext& s, const LayerParams& lp, CBuf x, int64_t r, Tensor& h1, Tensor& rstd1) {
  const int64_t H = s.cfg.hidden_size;
  h1 = s.be.alloc(kAct, {r, H}, s.precision.activations, "tile.h1");
  rstd1 = s.be.alloc_f32(kAct, {r}, "tile.rstd1");
  s.be.kernels().rmsnorm_forward(x, lp.input_layernorm->w.buf(), h1.buf(), rstd1.f32(), r, H,
                                 static_cast<float>(s.cfg.rms_norm_eps));
}

// One head group of r rows from h1 (the attention block's q or k): raw = h1 W^T (+ bias), out = RoPE of
// each head row's rmsnorm, rstd (r * heads); pos: the rows' RoPE positions. Without a norm (gpt_oss) the
// projection goes straight into out and RoPE turns it there; raw and rstd stay empty.
void head_forward(StepContext& s, CBuf h1, const Param& w, const Param* bias, const Param* norm, const int32_t* pos,
                  int64_t r, int64_t heads, Tensor& raw, Buf out, Tensor& rstd) {
  const ops::KernelLauncher K = s.be.kernels();
  const int64_t H = s.cfg.hidden_size, hd = s.cfg.head_dim;
  if (norm == nullptr) {
    linear_forward(s.be, h1, w.w.buf(), out, r, H, heads * hd);
    if (bias) K.bias_add(out, bias->w.buf(), r, heads * hd);
    K.rope_forward(out, pos, r, heads, hd, s.rope_freqs());
    return;
  }
  raw = s.be.alloc(kAct, {r, heads * hd}, s.precision.activations, "tile.head_raw");
  linear_forward(s.be, h1, w.w.buf(), raw.buf(), r, H, heads * hd);
  if (bias) K.bias_add(raw.buf(), bias->w.buf(), r, heads * hd);
  rstd = s.be.alloc_f32(kAct, {r * heads}, "tile.head_rstd");
  K.rmsnorm_forward(raw.buf(), norm->w.buf(), out, rstd.f32(), r * heads, hd, static_cast<float>(s.cfg.rms_norm_eps));
  K.rope_forward(out, pos, r, heads, hd, s.rope_freqs());
}

// The input norm's backward of tile t: its rows of dx += rmsnorm_backward(dh1_t).
void norm_in_backward(StepContext& s, const LayerParams& lp, const Tensor& x, const Tile& t, const Tensor& rstd1,
                      CBuf dh1_t, Tensor& dx) {
  const int64_t r0 = t.row0, r = t.rows, H = s.cfg.hidden_size;
  Tensor dnorm = s.be.alloc(kAct, {r, H}, s.precision.activations, "tile.dnorm");
  rmsnorm_backward(s.be, ptr_at(x.cbuf(), r0 * H), lp.input_layernorm->w.buf(), rstd1.f32(), dh1_t, dnorm.buf(),
                   lp.input_layernorm->g.buf(), r, H);
  s.be.kernels().add_inplace(ptr_at(dx.buf(), r0 * H), dnorm.buf(), r * H);
}

// K and V (n, nkv hd) of every token, tile by tile.
void keys_values(StepContext& s, const LayerParams& lp, const Tensor& x, const Tiles& tiles, Tensor& k, Tensor& v) {
  Backend& be = s.be;
  const int64_t n = s.n, H = s.cfg.hidden_size, kv = s.cfg.num_key_value_heads * s.cfg.head_dim;
  k = be.alloc(kAct, {n, kv}, s.precision.activations, "tile.k");
  v = be.alloc(kAct, {n, kv}, s.precision.activations, "tile.v");
  tiles_run(s, tiles, /*reverse=*/false, [&](const Tile& t) {
    const int64_t r0 = t.row0, r = t.rows;
    Tensor h1, rstd1, k_raw, rstd_k;
    norm_in(s, lp, ptr_at(x.cbuf(), r0 * H), r, h1, rstd1);
    head_forward(s, h1.buf(), *lp.k_proj, bias_of(s, lp.k_bias), lp.k_norm, ptr_at(s.pos.i32(), r0), r,
                 s.cfg.num_key_value_heads, k_raw, ptr_at(k.buf(), r0 * kv), rstd_k);
    linear_forward(be, h1.buf(), lp.v_proj->w.buf(), ptr_at(v.buf(), r0 * kv), r, H, kv);
    if (s.cfg.attention_bias) be.kernels().bias_add(ptr_at(v.buf(), r0 * kv), lp.v_bias->w.buf(), r, kv);
  });
}

// Tile i's queries against the keys of its sequences. cp = 1: the block kernel's positions from
// s.tile_pos, keys up to the tile's last query; the ring: all T keys, its positions from ring_pos.
ops::AttentionSpec tile_spec(const StepContext& s, const LayerParams& lp, const Tile& t) {
  const ModelConfig& c = s.cfg;
  const int64_t hd = c.head_dim, t0 = t.t0;
  ops::AttentionSpec a = ops::attention_spec(t.seqs, t.len, c.num_attention_heads, c.num_key_value_heads, hd, hd,
                                             1.0f / std::sqrt(static_cast<float>(hd)), c.layer_window(lp.index),
                                             s.doc_start.defined() ? ptr_at(s.doc_start.i32(), t.row0) : nullptr);
  if (c.attention_sinks()) a.sinks = lp.sinks->w.buf();  // Note [Attention sinks]: every tile's rows join them
  if (s.cp > 1) {
    a.Tk = s.T;
    return a;
  }
  a.Tk = t0 + t.len;
  a.q_pos = ptr_at(s.tile_pos.i32(), t0);
  a.k_pos = s.tile_pos.i32();
  return a;
}

// Views of the keys (or their gradients) of tile i's sequences: (seqs T, width) from row key_row0.
Tensor keys_view(const Tensor& all, const Tile& t, int64_t width) {
  return Tensor::view(all, t.key_row0() * width, {t.seqs * t.T, width}, all.name());
}

// Tile i of the attention block: its rows of x1 = x + o_proj(attention(q; K, V)) (r, H). keep: a holds
// what the tile's backward reads; otherwise each intermediate goes once consumed.
Tensor tile_attention_forward(StepContext& s, const LayerParams& lp, const Tensor& x, const Tile& t, const Tensor& k,
                              const Tensor& v, AttnActs& a, bool keep) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t r0 = t.row0, r = t.rows, H = c.hidden_size, nh = c.num_attention_heads;
  const int64_t q_w = nh * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  norm_in(s, lp, ptr_at(x.cbuf(), r0 * H), r, a.h1, a.rstd1);
  a.q = be.alloc(kAct, {r, q_w}, s.precision.activations, "tile.q");
  head_forward(s, a.h1.buf(), *lp.q_proj, bias_of(s, lp.q_bias), lp.q_norm, ptr_at(s.pos.i32(), r0), r, nh, a.q_raw,
               a.q.buf(), a.rstd_q);
  if (!keep) {
    a.h1.reset();
    a.rstd1.reset();
    a.q_raw.reset();
    a.rstd_q.reset();
  }
  a.o = be.alloc(kAct, {r, q_w}, s.precision.activations, "tile.o");
  a.lse = be.alloc_f32(kAct, {t.seqs, nh, t.len}, "tile.lse");
  const ops::AttentionSpec spec = tile_spec(s, lp, t);
  if (s.cp > 1) {
    const Tensor kt = keys_view(k, t, kv), vt = keys_view(v, t, kv);
    ring_attention_forward(s, a.q, kt, vt, a.o, a.lse, spec, t.t0);
  } else {
    K.attention_block_forward(a.q.buf(), ptr_at(k.cbuf(), t.key_row0() * kv), ptr_at(v.cbuf(), t.key_row0() * kv),
                              a.o.buf(), a.lse.f32(), true, spec);
  }
  if (!keep) {
    a.q.reset();
    a.lse.reset();
  }
  Tensor x1 = attn_output(s, lp, ptr_at(x.cbuf(), r0 * H), a.o.cbuf(), r, q_w);
  if (!keep) a.o.reset();
  return x1;
}

// Tile i's attention backward from d x1 (its rows of dx): o_proj, the attention (dK, dV added into the
// f32 accumulators dk, dv of every token), RoPE and q_norm, into its rows of d h1 (dh1: r rows, written)
// and the q-side weight gradients. Frees `a` but h1.
void tile_attention_backward(StepContext& s, const LayerParams& lp, const Tile& t, const Tensor& k, const Tensor& v,
                             AttnActs& a, const Tensor& dx, Tensor& dk, Tensor& dv, Buf dh1) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t r0 = t.row0, r = t.rows, H = c.hidden_size, nh = c.num_attention_heads, hd = c.head_dim;
  const int64_t q_w = nh * hd, kv = c.num_key_value_heads * hd;
  const CBuf dx1 = ptr_at(dx.cbuf(), r0 * H);
  Tensor d_o = be.alloc(kAct, {r, q_w}, s.precision.activations, "tile.d_o");
  linear_backward_input(be, dx1, lp.o_proj->w.buf(), d_o.buf(), r, q_w, H);
  linear_backward_weight(be, dx1, a.o.buf(), lp.o_proj->g.buf(), r, q_w, H);
  if (c.attention_bias) K.bias_backward(dx1, lp.o_bias->g.buf(), r, H);

  Tensor dq = be.alloc(kAct, {r, q_w}, s.precision.activations, "tile.dq");
  const ops::AttentionSpec spec = tile_spec(s, lp, t);
  if (c.attention_sinks()) K.attention_sink_backward(a.o.buf(), d_o.buf(), a.lse.f32(), lp.sinks->g.buf(), spec);
  if (s.cp > 1) {
    const Tensor kt = keys_view(k, t, kv), vt = keys_view(v, t, kv);
    Tensor dkt = keys_view(dk, t, kv), dvt = keys_view(dv, t, kv);
    ring_attention_backward(s, a.q, kt, vt, a.o, a.lse, d_o, dq, dkt, dvt, spec, t.t0, /*accumulate=*/true);
  } else {
    // One dtype for the three outputs of a call: dK/dV's f32, so dQ in f32 too, rounded once after.
    const int64_t k0 = t.key_row0() * kv;
    const bool f32 = dq.dtype() == DType::DType_F32;
    Tensor dq_acc = f32 ? Tensor() : be.alloc_f32(kAct, {r, q_w}, "tile.dq_acc");
    const Buf dq_out = f32 ? dq.buf() : dq_acc.buf();
    K.fill(dq_out, 0.0f, r * q_w);
    K.attention_block_backward(a.q.buf(), ptr_at(k.cbuf(), k0), ptr_at(v.cbuf(), k0), a.o.buf(), a.lse.f32(), d_o.buf(),
                               dq_out, ptr_at(dk.buf(), k0), ptr_at(dv.buf(), k0), spec);
    if (!f32) K.copy(dq.buf(), dq_acc.buf(), r * q_w);
  }
  d_o.reset();
  a.o.reset();
  a.lse.reset();
  a.q.reset();

  K.rope_backward(dq.buf(), ptr_at(s.pos.i32(), r0), r, nh, hd, s.rope_freqs());
  Tensor dq_raw;
  if (c.qk_norm()) {
    dq_raw = be.alloc(kAct, {r, q_w}, s.precision.activations, "tile.dq_raw");
    rmsnorm_backward(be, a.q_raw.buf(), lp.q_norm->w.buf(), a.rstd_q.f32(), dq.buf(), dq_raw.buf(), lp.q_norm->g.buf(),
                     r * nh, hd);
  } else {
    dq_raw = std::move(dq);
  }
  dq.reset();
  a.q_raw.reset();
  a.rstd_q.reset();
  if (c.attention_bias) K.bias_backward(dq_raw.buf(), lp.q_bias->g.buf(), r, q_w);
  linear_backward_input(be, dq_raw.buf(), lp.q_proj->w.buf(), dh1, r, H, q_w);
  linear_backward_weight(be, dq_raw.buf(), a.h1.buf(), lp.q_proj->g.buf(), r, H, q_w);
}

// Tile i's key/value side once its rows of dk, dv are complete: RoPE and k_norm (k_raw recomputed), the
// k/v projections into its rows of d h1 (dh1_t: r rows, added after the q path, as the whole layer sums
// them), and the input norm's backward into its rows of dx.
void tile_kv_backward(StepContext& s, const LayerParams& lp, const Tensor& x, const Tile& t, const Tensor& dk,
                      const Tensor& dv, Buf dh1_t, Tensor& dx) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t r0 = t.row0, r = t.rows, H = c.hidden_size, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t kv = nkv * hd;
  Tensor h1, rstd1, k_raw, rstd_k;
  norm_in(s, lp, ptr_at(x.cbuf(), r0 * H), r, h1, rstd1);
  if (c.qk_norm()) {  // k_norm's backward reads k_raw and its statistics
    Tensor k_out = be.alloc(kAct, {r, kv}, s.precision.activations, "tile.k_recomputed");
    head_forward(s, h1.buf(), *lp.k_proj, bias_of(s, lp.k_bias), lp.k_norm, ptr_at(s.pos.i32(), r0), r, nkv, k_raw,
                 k_out.buf(), rstd_k);
  }
  // dK, dV rounded once into the activations dtype, as the whole-sequence kernel writes them.
  Tensor dkt = be.alloc(kAct, {r, kv}, s.precision.activations, "tile.dk");
  Tensor dvt = be.alloc(kAct, {r, kv}, s.precision.activations, "tile.dv");
  K.copy(dkt.buf(), ptr_at(dk.cbuf(), r0 * kv), r * kv);
  K.copy(dvt.buf(), ptr_at(dv.cbuf(), r0 * kv), r * kv);
  K.rope_backward(dkt.buf(), ptr_at(s.pos.i32(), r0), r, nkv, hd, s.rope_freqs());
  Tensor dk_raw;
  if (c.qk_norm()) {
    dk_raw = be.alloc(kAct, {r, kv}, s.precision.activations, "tile.dk_raw");
    rmsnorm_backward(be, k_raw.buf(), lp.k_norm->w.buf(), rstd_k.f32(), dkt.buf(), dk_raw.buf(), lp.k_norm->g.buf(),
                     r * nkv, hd);
  } else {
    dk_raw = std::move(dkt);
  }
  dkt.reset();
  k_raw.reset();
  rstd_k.reset();
  if (c.attention_bias) {
    K.bias_backward(dk_raw.buf(), lp.k_bias->g.buf(), r, kv);
    K.bias_backward(dvt.buf(), lp.v_bias->g.buf(), r, kv);
  }
  linear_backward_input(be, dk_raw.buf(), lp.k_proj->w.buf(), dh1_t, r, H, kv, 1.0f);
  linear_backward_input(be, dvt.buf(), lp.v_proj->w.buf(), dh1_t, r, H, kv, 1.0f);
  linear_backward_weight(be, dk_raw.buf(), h1.buf(), lp.k_proj->g.buf(), r, H, kv);
  linear_backward_weight(be, dvt.buf(), h1.buf(), lp.v_proj->g.buf(), r, H, kv);
  dk_raw.reset();
  dvt.reset();
  h1.reset();

  norm_in_backward(s, lp, x, t, rstd1, dh1_t, dx);
}

// ---- MLA in tiles (Note [MLA in tiles])

// Every token's latent rows [kv_a_n | RoPE'd k_pe] (n, kl + dr), tile by tile: what stays full-length.
Tensor mla_latents(StepContext& s, const LayerParams& lp, const Tensor& x, const Tiles& tiles) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t H = c.hidden_size, kl = c.kv_lora_rank, dr = c.qk_rope_head_dim, lat = kl + dr;
  const DType dt = s.precision.activations;
  Tensor latent = be.alloc(kAct, {s.n, lat}, dt, "tile.latent");
  tiles_run(s, tiles, /*reverse=*/false, [&](const Tile& t) {
    const int64_t r0 = t.row0, r = t.rows;
    Tensor h1, rstd1;
    norm_in(s, lp, ptr_at(x.cbuf(), r0 * H), r, h1, rstd1);
    Tensor kv_a = be.alloc(kAct, {r, kl}, dt, "tile.kv_a");
    Tensor k_pe = be.alloc(kAct, {r, dr}, dt, "tile.k_pe");
    linear_forward(be, h1.buf(), lp.kv_a_proj_with_mqa->w.buf(), kv_a.buf(), r, H, kl);
    linear_forward(be, h1.buf(), ptr_at(lp.kv_a_proj_with_mqa->w.buf(), kl * H), k_pe.buf(), r, H, dr);
    h1.reset();
    rstd1.reset();
    Tensor kv_a_n = be.alloc(kAct, {r, kl}, dt, "tile.kv_a_normed");
    Tensor rstd_k = be.alloc_f32(kAct, {r}, "tile.rstd_kv_a");
    K.rmsnorm_forward(kv_a.buf(), lp.kv_a_layernorm->w.buf(), kv_a_n.buf(), rstd_k.f32(), r, kl,
                      static_cast<float>(c.rms_norm_eps));
    K.rope_strided_forward(k_pe.buf(), ptr_at(s.pos.i32(), r0), r, 1, dr, dr, c.rope_interleave, s.rope_freqs());
    K.copy_2d(ptr_at(latent.buf(), r0 * lat), lat, kv_a_n.cbuf(), kl, r, kl);
    K.copy_2d(ptr_at(latent.buf(), r0 * lat + kl), lat, k_pe.cbuf(), dr, r, dr);
  });
  return latent;
}

// Tile t's MLA spec: its queries against the keys of its sequences (cp = 1: up to its last query, by s.tile_pos;
// the ring: all T, positions from ring_pos).
ops::AttentionSpec mla_tile_spec(const StepContext& s, const Tile& t) {
  const ModelConfig& c = s.cfg;
  const int64_t nh = c.num_attention_heads;
  ops::AttentionSpec a =
      ops::attention_spec(t.seqs, t.len, nh, nh, c.qk_head_dim(), c.v_head_dim, mla_softmax_scale(c), /*window=*/0,
                          s.doc_start.defined() ? ptr_at(s.doc_start.i32(), t.row0) : nullptr);
  if (s.cp > 1) {
    a.Tk = s.T;
    return a;
  }
  a.Tk = t.t0 + t.len;
  a.q_pos = ptr_at(s.tile_pos.i32(), t.t0);
  a.k_pos = s.tile_pos.i32();
  return a;
}

// Tile t of MLA's attention block: its rows of x1, the keys expanded from the latent chunk by chunk (Note [MLA's keys
// in chunks] in model/ring_attention.h). keep: a holds what the tile's backward reads.
Tensor mla_tile_attention_forward(StepContext& s, const LayerParams& lp, const Tensor& x, const Tile& t,
                                  const Tensor& latent, AttnActs& a, bool keep) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t r0 = t.row0, r = t.rows, H = c.hidden_size, nh = c.num_attention_heads, dv = c.v_head_dim;
  const int64_t lat = c.kv_lora_rank + c.qk_rope_head_dim;
  norm_in(s, lp, ptr_at(x.cbuf(), r0 * H), r, a.h1, a.rstd1);
  mla_queries_forward(s, lp, a.h1.buf(), r, ptr_at(s.pos.i32(), r0), a, keep);
  if (!keep) {
    a.h1.reset();
    a.rstd1.reset();
  }
  a.o = be.alloc(kAct, {r, nh * dv}, s.precision.activations, "tile.o");
  a.lse = be.alloc_f32(kAct, {t.seqs, nh, t.len}, "tile.lse");
  const ops::AttentionSpec spec = mla_tile_spec(s, t);
  if (s.cp > 1) {
    ring_attention_mla_forward(s, lp, a.q, keys_view(latent, t, lat), a.o, a.lse, spec, t.t0);
  } else {
    // The chunks merge into o: in f32 with bf16 activations, rounded once (Note [Ring attention accumulates in f32]).
    const bool f32 = a.o.dtype() == DType::DType_F32;
    Tensor o_acc = f32 ? Tensor() : be.alloc_f32(kAct, {r, nh * dv}, "tile.o_acc");
    mla_attend_forward(s, lp, a.q.cbuf(), ptr_at(latent.cbuf(), t.key_row0() * lat), f32 ? a.o.buf() : o_acc.buf(),
                       a.lse.f32(), true, spec, s.layer_tile);
    if (!f32) K.copy(a.o.buf(), o_acc.cbuf(), r * nh * dv);
  }
  if (!keep) {
    a.q.reset();
    a.lse.reset();
  }
  Tensor x1 = attn_output(s, lp, ptr_at(x.cbuf(), r0 * H), a.o.cbuf(), r, nh * dv);
  if (!keep) a.o.reset();
  return x1;
}

// Tile t's MLA backward from d x1 (its rows of dx): o_proj, the attention (the keys' latent gradient added into the
// f32 dlatent of every token, kv_b_proj's into dw_kvb: the parameter's gradient, or an f32 accumulator), the queries
// into its rows of d h1 (dh1: r rows, written). Frees `a` but h1.
void mla_tile_attention_backward(StepContext& s, const LayerParams& lp, const Tile& t, const Tensor& latent,
                                 AttnActs& a, const Tensor& dx, Tensor& dlatent, Buf dw_kvb, Buf dh1) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t r0 = t.row0, r = t.rows, H = c.hidden_size, nh = c.num_attention_heads, dv = c.v_head_dim;
  const int64_t q_w = nh * c.qk_head_dim(), lat = c.kv_lora_rank + c.qk_rope_head_dim;
  const CBuf dx1 = ptr_at(dx.cbuf(), r0 * H);
  Tensor d_o = be.alloc(kAct, {r, nh * dv}, s.precision.activations, "tile.d_o");
  linear_backward_input(be, dx1, lp.o_proj->w.buf(), d_o.buf(), r, nh * dv, H);
  linear_backward_weight(be, dx1, a.o.buf(), lp.o_proj->g.buf(), r, nh * dv, H);

  Tensor dq = be.alloc(kAct, {r, q_w}, s.precision.activations, "tile.dq");
  const ops::AttentionSpec spec = mla_tile_spec(s, t);
  if (s.cp > 1) {
    Tensor dlt = keys_view(dlatent, t, lat);
    ring_attention_mla_backward(s, lp, a.q, keys_view(latent, t, lat), a.o, a.lse, d_o, dq, dlt, spec, t.t0,
                                /*accumulate=*/true);
  } else {
    // One dtype for a call's dq, dk, dv: the chunks' dK, dV are f32, so dQ in f32 too, rounded once after.
    const int64_t k0 = t.key_row0() * lat;
    const bool f32 = dq.dtype() == DType::DType_F32;
    Tensor dq_acc = f32 ? Tensor() : be.alloc_f32(kAct, {r, q_w}, "tile.dq_acc");
    const Buf dq_out = f32 ? dq.buf() : dq_acc.buf();
    K.fill(dq_out, 0.0f, r * q_w);
    mla_attend_backward(s, lp, a.q.cbuf(), ptr_at(latent.cbuf(), k0), a.o.cbuf(), a.lse.f32(), d_o.cbuf(), dq_out,
                        ptr_at(dlatent.buf(), k0), dw_kvb, spec, s.layer_tile);
    if (!f32) K.copy(dq.buf(), dq_acc.buf(), r * q_w);
  }
  d_o.reset();
  a.o.reset();
  a.lse.reset();
  a.q.reset();
  mla_queries_backward(s, lp, dq, a.h1.buf(), r, ptr_at(s.pos.i32(), r0), a, dh1);
}

// Tile t's key side once its rows of dlatent are complete: k_pe's RoPE undone, kv_a_layernorm (kv_a recomputed),
// kv_a_proj_with_mqa into its rows of d h1 (added after the query path, as the whole block sums them), and the input
// norm's backward into its rows of dx.
void mla_tile_kv_backward(StepContext& s, const LayerParams& lp, const Tensor& x, const Tile& t, const Tensor& dlatent,
                          Buf dh1_t, Tensor& dx) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const ModelConfig& c = s.cfg;
  const int64_t r0 = t.row0, r = t.rows, H = c.hidden_size, kl = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  const int64_t lat = kl + dr;
  const DType dt = s.precision.activations;
  Tensor h1, rstd1;
  norm_in(s, lp, ptr_at(x.cbuf(), r0 * H), r, h1, rstd1);
  Tensor kv_a = be.alloc(kAct, {r, kl}, dt, "tile.kv_a");
  Tensor rstd_k = be.alloc_f32(kAct, {r}, "tile.rstd_kv_a");
  linear_forward(be, h1.buf(), lp.kv_a_proj_with_mqa->w.buf(), kv_a.buf(), r, H, kl);
  {
    Tensor kv_a_n = be.alloc(kAct, {r, kl}, dt, "tile.kv_a_normed");
    K.rmsnorm_forward(kv_a.buf(), lp.kv_a_layernorm->w.buf(), kv_a_n.buf(), rstd_k.f32(), r, kl,
                      static_cast<float>(c.rms_norm_eps));
  }
  // The latent's gradient rounded once into the activations dtype: [d kv_a_n | d k_pe].
  Tensor dkv_a_n = be.alloc(kAct, {r, kl}, dt, "tile.dkv_a_normed");
  Tensor dk_pe = be.alloc(kAct, {r, dr}, dt, "tile.dk_pe");
  K.copy_2d(dkv_a_n.buf(), kl, ptr_at(dlatent.cbuf(), r0 * lat), lat, r, kl);
  K.copy_2d(dk_pe.buf(), dr, ptr_at(dlatent.cbuf(), r0 * lat + kl), lat, r, dr);
  K.rope_strided_backward(dk_pe.buf(), ptr_at(s.pos.i32(), r0), r, 1, dr, dr, c.rope_interleave, s.rope_freqs());
  Tensor dkv_a = be.alloc(kAct, {r, kl}, dt, "tile.dkv_a");
  rmsnorm_backward(be, kv_a.buf(), lp.kv_a_layernorm->w.buf(), rstd_k.f32(), dkv_a_n.buf(), dkv_a.buf(),
                   lp.kv_a_layernorm->g.buf(), r, kl);
  dkv_a_n.reset();
  kv_a.reset();
  rstd_k.reset();
  mla_kv_a_backward(s, lp, dkv_a.buf(), dk_pe.buf(), h1.buf(), r, dh1_t);
  dkv_a.reset();
  dk_pe.reset();
  h1.reset();
  norm_in_backward(s, lp, x, t, rstd1, dh1_t, dx);
}

// The tile's counts added into the layer's (its probability sums went into the layer's row on the device).
void stats_add(RouterStats& into, const RouterStats& tile) {
  if (into.counts.empty()) {
    into.counts = tile.counts;
    return;
  }
  for (size_t e = 0; e < tile.counts.size(); ++e) into.counts[e] += tile.counts[e];
}

}  // namespace

Tensor layer_forward_tiled(StepContext& s, const LayerParams& lp, const Tensor& x, bool sparse, RouterStats* stats,
                           Category out_cat, const std::string& out_name, const std::function<void()>& before_output) {
  Backend& be = s.be;
  const int64_t n = s.n, H = s.cfg.hidden_size;
  const Tiles tiles = tiles_of(s);
  const bool mla = s.cfg.is_deepseek();
  Tensor k, v, latent;
  if (mla)
    latent = mla_latents(s, lp, x, tiles);
  else
    keys_values(s, lp, x, tiles, k, v);
  if (before_output) before_output();
  Tensor out = be.alloc(out_cat, {n, H}, s.precision.activations, out_name);
  if (stats) stats->counts.clear();
  RouterStats last;  // the last tile's, added again for each tile counted (Note [Tiles replayed once])
  const auto body = [&](const Tile& t) {
    AttnActs a;
    Tensor x1 = mla ? mla_tile_attention_forward(s, lp, x, t, latent, a, false)
                    : tile_attention_forward(s, lp, x, t, k, v, a, false);
    Tensor x2;
    {
      TileTokens window(s, t.rows);
      if (sparse) {
        RouterStats tile_stats;
        if (stats) tile_stats.prob_sum = stats->prob_sum;  // each tile adds its sums into the layer's row
        x2 = moe_block_forward(s, lp, x1, nullptr, stats ? &tile_stats : nullptr, Category::Category_activations,
                               "tile.x2");
        if (stats) stats_add(*stats, tile_stats);
        last = std::move(tile_stats);
      } else {
        x2 = mlp_block_forward(s, lp, x1, nullptr, Category::Category_activations, "tile.x2");
      }
    }
    x1.reset();
    be.kernels().copy(ptr_at(out.buf(), t.row0 * H), x2.buf(), t.rows * H);
  };
  tiles_run(s, tiles, /*reverse=*/false, attention_alike(s), body, [&](int64_t n_counted) {
    for (int64_t j = 0; stats && sparse && j < n_counted; ++j) stats_add(*stats, last);
  });
  return out;
}

void layer_backward_tiled(StepContext& s, const LayerParams& lp, const Tensor& x, bool sparse, const Tensor& aux_bias,
                          Tensor& dx) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const int64_t n = s.n, H = s.cfg.hidden_size, kv = s.cfg.num_key_value_heads * s.cfg.head_dim;
  const Tiles tiles = tiles_of(s);
  const bool mla = s.cfg.is_deepseek();
  // Full-length: K and V with their f32 gradients, or MLA's latent with its f32 gradient (and, with cp = 1 and a
  // gradient that is not f32, kv_b_proj's in f32 over the tiles, rounded once: the ring keeps its own).
  Tensor k, v, dk, dv, latent, dlatent, dw_kvb;
  if (mla) {
    latent = mla_latents(s, lp, x, tiles);
    dlatent = be.alloc_f32(kAct, {n, latent.numel() / n}, "tile.dlatent_acc");
    K.fill(dlatent.buf(), 0.0f, dlatent.numel());
    const Tensor& g = lp.kv_b_proj->g;
    if (s.cp == 1 && g.dtype() != DType::DType_F32) {
      dw_kvb = be.alloc_f32(Category::Category_workspace, g.shape(), "tile.dkv_b_proj");
      K.fill(dw_kvb.buf(), 0.0f, g.numel());
    }
  } else {
    keys_values(s, lp, x, tiles, k, v);
    dk = be.alloc_f32(kAct, {n, kv}, "tile.dk_acc");
    dv = be.alloc_f32(kAct, {n, kv}, "tile.dv_acc");
    K.fill(dk.buf(), 0.0f, n * kv);
    K.fill(dv.buf(), 0.0f, n * kv);
  }
  const Buf dw_kvb_out = dw_kvb.defined() ? dw_kvb.buf() : mla ? lp.kv_b_proj->g.buf() : Buf();
  // Last tile first: with cp = 1 a tile's keys are then complete once its own queries are done (a key is
  // seen only by the queries at or after it in its sequence), so its key side runs right after it, with d h1
  // for its rows alone. The ring's keys are seen by every rank's tiles: d h1 of all n waits for the last.
  const bool deferred = s.cp > 1;
  Tensor dh1_all = deferred ? be.alloc(kAct, {n, H}, s.precision.activations, "tile.dh1") : Tensor();
  tiles_run(
      s, tiles, /*reverse=*/true, attention_alike(s),
      [&](const Tile& t) {
        AttnActs a;
        Tensor x1 = mla ? mla_tile_attention_forward(s, lp, x, t, latent, a, true)
                        : tile_attention_forward(s, lp, x, t, k, v, a, true);
        Tensor dx_t = Tensor::view(dx, t.row0 * H, {t.rows, H}, "grad.x");
        {
          TileTokens window(s, t.rows);
          if (sparse) {
            moe_block_recompute_backward(s, lp, x1, aux_bias, dx_t);
          } else {
            MlpActs m;
            mlp_block_forward(s, lp, x1, &m, Category::Category_activations, "tile.x2").reset();
            mlp_block_backward(s, lp, x1, m, dx_t);
          }
        }
        x1.reset();
        Tensor dh1 = deferred ? Tensor() : be.alloc(kAct, {t.rows, H}, s.precision.activations, "tile.dh1");
        const Buf dh1_t = deferred ? ptr_at(dh1_all.buf(), t.row0 * H) : dh1.buf();
        if (mla)
          mla_tile_attention_backward(s, lp, t, latent, a, dx, dlatent, dw_kvb_out, dh1_t);
        else
          tile_attention_backward(s, lp, t, k, v, a, dx, dk, dv, dh1_t);
        a = AttnActs{};
        if (deferred) return;
        if (mla)
          mla_tile_kv_backward(s, lp, x, t, dlatent, dh1_t, dx);
        else
          tile_kv_backward(s, lp, x, t, dk, dv, dh1_t, dx);
      },
      [](int64_t) {});
  k.reset();
  v.reset();
  latent.reset();
  if (deferred) {
    tiles_run(s, tiles, /*reverse=*/false, [&](const Tile& t) {
      const Buf dh1_t = ptr_at(dh1_all.buf(), t.row0 * H);
      if (mla)
        mla_tile_kv_backward(s, lp, x, t, dlatent, dh1_t, dx);
      else
        tile_kv_backward(s, lp, x, t, dk, dv, dh1_t, dx);
    });
  }
  if (dw_kvb.defined()) K.add_inplace(lp.kv_b_proj->g.buf(), dw_kvb.cbuf(), dw_kvb.numel());
}

}  // namespace fp
