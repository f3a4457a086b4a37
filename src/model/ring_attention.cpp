// Ring attention: every rank's queries against every rank's keys, the K/V blocks moving round the ring
// (ring_attention.h).
//
// Note [Ring attention accumulates in f32]: the outputs the ring builds over its W blocks (o in the
// forward, merged block by block by the log-sum-exp; dQ, dK, dV in the backward, summed block by
// block) accumulate in f32 whatever the recipe, and are rounded into the recipe's dtype once at the
// end. With bf16 activations and bf16 accumulators each block would round them again: W roundings
// instead of one, and a result that depends on W (a token's router input would then differ in its
// last bit between W, enough to flip a near-tied top-k). The f32 accumulators cost, with bf16
// activations only, (B N nh hdv) x 4 B for o in the forward and (B N nh hd) x 4 B for dQ in the
// backward, beside the blocks (category comm); dK/dV travel in f32 in either recipe.
#include "model/ring_attention.h"

#include "core/error.h"

namespace fp {

namespace {

// The ring of this rank's context-parallel group (StepContext::cp): rank and world within the group, whose
// ranks are first .. first + world - 1 of the comm.
struct RingGeometry {
  int rank, world, first;
  int64_t T;                                                       // global tokens per sequence
  int next() const { return first + (rank + 1) % world; }          // in the comm
  int prev() const { return first + (rank + world - 1) % world; }  // in the comm
  // The group rank whose block this rank holds after `step` hops.
  int source(int step) const { return ((rank - step) % world + world) % world; }
};

RingGeometry ring_geometry(const StepContext& s) { return {s.cp_rank(), s.cp, s.cp_first(), s.T * s.cp}; }

// Sends the first `count` elements of `t` (a chunk's, Note [The ring's blocks in chunks]) to the next rank and
// receives the previous rank's into `into`.
void ring_shift(StepContext& s, const RingGeometry& g, const Tensor& t, Tensor& into, int64_t count) {
  s.data.send_recv(s.be.compute_stream(), t.data(), count, g.next(), into.data(), count, g.prev(), t.dtype());
}

// Note [The ring's blocks in chunks]
// With ckpt.layer_tile = N the ring's traveling blocks (and the backward's f32 gradients travelling with them)
// hold N keys of each sequence, not every key (at most 8 chunks of a block: chunk_of), and the ring goes round
// once per chunk, W hops each (MLA expands a ring chunk's latent N keys at a time still, Note [MLA's keys in
// chunks]), and
// each chunk's partial attention merges into (o, lse) by the log-sum-exp rule as the hops do (the backward adds
// each chunk's share to dQ and takes the chunk's dK, dV home). Its buffers (category comm) are then bounded by
// the tile like the rest of the layer: 2 chunks of K and V and 2 of their f32 gradients (MLA: of the latent),
// for T / N rounds of W smaller messages. N >= T (or 0): one chunk, bit for bit the unchunked ring.
struct RingChunks {
  int64_t Tk = 0, size = 0, count = 0;
};
// Chunks of N keys of Tk; N <= 0 or N >= Tk: one chunk of Tk. MLA's expansion takes these as they are (Note
// [MLA's keys in chunks]: the expanded keys are the big buffer).
int64_t key_chunk(int64_t N, int64_t Tk) { return N > 0 && N < Tk ? N : Tk; }
// The ring's chunks: key_chunk's, at most kMaxKeyChunks of them (then of ceil(Tk / kMaxKeyChunks)), so the
// messages and the planner's loops stay few while the buffers fall by that factor.
constexpr int64_t kMaxKeyChunks = 8;
int64_t chunk_of(int64_t N, int64_t Tk) { return std::max(key_chunk(N, Tk), (Tk + kMaxKeyChunks - 1) / kMaxKeyChunks); }
RingChunks ring_chunks(const StepContext& s, int64_t Tk) {
  const int64_t c = chunk_of(s.layer_tile, Tk);
  return {Tk, c, (Tk + c - 1) / c};
}

// body(j0, c) for the chunks of `size` keys of Tk (the last may be shorter), where what a chunk allocates
// depends on its length alone: the chunks of one length alike (Note [Repeats replayed once] in memory/ledger.h).
template <class Body>
void chunks_run(Backend& be, int64_t Tk, int64_t size, Body&& body) {
  const int64_t whole = Tk / size, rest = Tk - whole * size;
  repeat_same(be, whole, [&](int64_t j) { body(j * size, size); });
  if (rest > 0) body(whole * size, rest);
}

// The rows [j0, j0 + c) of each of B sequences of Tk rows of width w, to or from (B c, w).
void rows_gather(const ops::KernelLauncher& K, Buf dst, CBuf src, int64_t B, int64_t Tk, int64_t j0, int64_t c,
                 int64_t w) {
  for (int64_t b = 0; b < B; ++b) K.copy(ptr_at(dst, b * c * w), ptr_at(src, (b * Tk + j0) * w), c * w);
}
void rows_scatter(const ops::KernelLauncher& K, Buf dst, CBuf src, int64_t B, int64_t Tk, int64_t j0, int64_t c,
                  int64_t w, bool add) {
  for (int64_t b = 0; b < B; ++b) {
    const Buf to = ptr_at(dst, (b * Tk + j0) * w);
    const CBuf from = ptr_at(src, b * c * w);
    if (add)
      K.add_inplace(to, from, c * w);
    else
      K.copy(to, from, c * w);
  }
}

// A chunk's traveling block: (B c, w) rows, or with one chunk the tensor's own shape.
Shape chunk_shape(const Tensor& t, int64_t B, const RingChunks& ch) {
  if (ch.count == 1) return t.shape();
  return {B * ch.size, t.numel() / (B * ch.Tk)};
}

// The chunk's spec: keys j0 .. j0 + c - 1 of the block's.
ops::AttentionSpec chunk_spec(ops::AttentionSpec a, int64_t j0, int64_t c) {
  a.Tk = c;
  a.k_pos = a.k_pos == nullptr ? nullptr : a.k_pos + j0;
  return a;
}

// The spec of the block pair (this rank's queries, the block of `source`'s keys): the positions of both
// from the step's ring_pos (StepContext).
// q0: the first of the queries' rows among the rank's T (a tile's, ring_attention.h).
ops::AttentionSpec block_spec(const StepContext& s, ops::AttentionSpec a, int source, int64_t q0) {
  const int32_t* all = s.ring_pos.i32();
  a.q_pos = all == nullptr ? nullptr : all + s.cp_rank() * s.T + q0;
  a.k_pos = all == nullptr ? nullptr : all + source * s.T;
  return a;
}

// The ring's tensors hold the sizes their contract states (q (B, N, nh, hd), k (B, N, nkv, hd), v and the
// others of hdv columns): the blocks that travel are allocated from k's and v's shapes.
void ring_sizes_check(const StepContext& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                      const ops::AttentionSpec& a, int64_t q0) {
  const int64_t rows = a.B * a.Tq, keys = a.B * a.Tk, nh = a.nh, nkv = a.nkv, hd = a.hd, hdv = a.hdv;
  FP_ASSERT(a.B <= s.B && a.Tk == s.T && q0 >= 0 && q0 + a.Tq <= s.T,
            "ring attention spec B={} queries {} from {} keys {} for B={} N={}", a.B, a.Tq, q0, a.Tk, s.B, s.T);
  FP_ASSERT(hd > 0 && hdv > 0 && q.numel() == rows * nh * hd && k.numel() == keys * nkv * hd &&
                v.numel() == keys * nkv * hdv && o.numel() == rows * nh * hdv,
            "ring attention sizes: q {} k {} v {} o {} elements for B={} Nq={} N={} nh={} nkv={} hd={} hdv={}",
            q.numel(), k.numel(), v.numel(), o.numel(), a.B, a.Tq, a.Tk, nh, nkv, hd, hdv);
}

}  // namespace

void ring_attention_forward(StepContext& s, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o, Tensor& lse,
                            ops::AttentionSpec a, int64_t q0) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  ring_sizes_check(s, q, k, v, o, a, q0);
  const RingGeometry g = ring_geometry(s);
  const RingChunks ch = ring_chunks(s, a.Tk);  // Note [The ring's blocks in chunks]
  const int64_t kw = a.nkv * a.hd, vw = a.nkv * a.hdv;
  const Shape k_shape = chunk_shape(k, a.B, ch), v_shape = chunk_shape(v, a.B, ch);
  const DType act = s.precision.activations;  // K/V blocks travel in the activations dtype
  Tensor kb[2] = {be.alloc(kComm, k_shape, act, "ring.k0"), be.alloc(kComm, k_shape, act, "ring.k1")};
  Tensor vb[2] = {be.alloc(kComm, v_shape, act, "ring.v0"), be.alloc(kComm, v_shape, act, "ring.v1")};
  // Note [Ring attention accumulates in f32]: o itself when it is f32.
  const bool f32_o = o.dtype() == DType::DType_F32;
  Tensor o_acc = f32_o ? Tensor() : be.alloc_f32(kComm, o.shape(), "ring.o_acc");
  const Buf out = f32_o ? o.buf() : o_acc.buf();
  // The chunks, and a chunk's hops, alike (Note [Repeats replayed once] in memory/ledger.h).
  chunks_run(be, a.Tk, ch.size, [&](int64_t j0, int64_t c) {
    const int64_t nk = a.B * c * kw, nv = a.B * c * vw;
    rows_gather(K, kb[0].buf(), k.cbuf(), a.B, a.Tk, j0, c, kw);
    rows_gather(K, vb[0].buf(), v.cbuf(), a.B, a.Tk, j0, c, vw);
    repeat_same(be, g.world, [&](int64_t hop) {
      const int step = static_cast<int>(hop), cur = step % 2;
      // With a sliding window, a block entirely before every local query's window computes nothing: the
      // kernel skips every tile pair (Note [Masks from sorted positions], backend/cpu/kernels/attention_block.cpp), as
      // it skips the pairs across documents. It still travels: the ranks after this one may need it.
      K.attention_block_forward(q.buf(), kb[cur].buf(), vb[cur].buf(), out, lse.f32(), j0 == 0 && step == 0,
                                chunk_spec(block_spec(s, a, g.source(step), q0), j0, c));
      if (step + 1 < g.world) {
        ring_shift(s, g, kb[cur], kb[1 - cur], nk);
        ring_shift(s, g, vb[cur], vb[1 - cur], nv);
      }
    });
  });
  if (!f32_o) K.copy(o.buf(), o_acc.buf(), o.numel());  // rounded once
}

void ring_attention_backward(StepContext& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                             const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                             ops::AttentionSpec a, int64_t q0, bool accumulate) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  ring_sizes_check(s, q, k, v, o, a, q0);
  FP_ASSERT(dout.numel() == o.numel() && dq.numel() == q.numel() && dk.numel() == k.numel() && dv.numel() == v.numel(),
            "ring attention gradients: dout {} dq {} dk {} dv {} elements for o {} q {} k {} v {}", dout.numel(),
            dq.numel(), dk.numel(), dv.numel(), o.numel(), q.numel(), k.numel(), v.numel());
  FP_ASSERT(!accumulate || (dk.dtype() == DType::DType_F32 && dv.dtype() == DType::DType_F32),
            "a tile's dK/dV add into f32");
  const RingGeometry g = ring_geometry(s);
  const RingChunks ch = ring_chunks(s, a.Tk);  // Note [The ring's blocks in chunks]
  const int64_t kw = a.nkv * a.hd, vw = a.nkv * a.hdv;
  const Shape k_shape = chunk_shape(k, a.B, ch), v_shape = chunk_shape(v, a.B, ch);
  const DType act = s.precision.activations;  // K/V blocks travel in the activations dtype
  Tensor kb[2] = {be.alloc(kComm, k_shape, act, "ring.k0"), be.alloc(kComm, k_shape, act, "ring.k1")};
  Tensor vb[2] = {be.alloc(kComm, v_shape, act, "ring.v0"), be.alloc(kComm, v_shape, act, "ring.v1")};
  // dK/dV accumulate in fp32 whatever the recipe (Note [Which dtype each allocation gets]).
  Tensor dkb[2] = {be.alloc_f32(kComm, k_shape, "ring.dk0"), be.alloc_f32(kComm, k_shape, "ring.dk1")};
  Tensor dvb[2] = {be.alloc_f32(kComm, v_shape, "ring.dv0"), be.alloc_f32(kComm, v_shape, "ring.dv1")};
  // Note [Ring attention accumulates in f32]: dq itself when it is f32.
  const bool f32_dq = dq.dtype() == DType::DType_F32;
  Tensor dq_acc = f32_dq ? Tensor() : be.alloc_f32(kComm, dq.shape(), "ring.dq_acc");
  const Buf dq_out = f32_dq ? dq.buf() : dq_acc.buf();
  K.fill(dq_out, 0.0f, dq.numel());
  const int home = g.world % 2;  // the buffer that receives a chunk's last hop
  chunks_run(be, a.Tk, ch.size, [&](int64_t j0, int64_t c) {
    const int64_t nk = a.B * c * kw, nv = a.B * c * vw;
    rows_gather(K, kb[0].buf(), k.cbuf(), a.B, a.Tk, j0, c, kw);
    rows_gather(K, vb[0].buf(), v.cbuf(), a.B, a.Tk, j0, c, vw);
    K.fill(dkb[0].buf(), 0.0f, nk);
    K.fill(dvb[0].buf(), 0.0f, nv);
    // W rounds of compute, each followed by a hop: after the last hop every block (with its complete
    // dK/dV) is back at its home rank.
    repeat_same(be, g.world, [&](int64_t hop) {
      const int step = static_cast<int>(hop), cur = step % 2;
      K.attention_block_backward(q.buf(), kb[cur].buf(), vb[cur].buf(), o.buf(), lse.f32(), dout.buf(), dq_out,
                                 dkb[cur].buf(), dvb[cur].buf(),
                                 chunk_spec(block_spec(s, a, g.source(step), q0), j0, c));
      if (step + 1 < g.world) {
        ring_shift(s, g, kb[cur], kb[1 - cur], nk);
        ring_shift(s, g, vb[cur], vb[1 - cur], nv);
      }
      ring_shift(s, g, dkb[cur], dkb[1 - cur], nk);
      ring_shift(s, g, dvb[cur], dvb[1 - cur], nv);
    });
    rows_scatter(K, dk.buf(), dkb[home].cbuf(), a.B, a.Tk, j0, c, kw, accumulate);
    rows_scatter(K, dv.buf(), dvb[home].cbuf(), a.B, a.Tk, j0, c, vw, accumulate);
  });
  if (!f32_dq) K.copy(dq.buf(), dq_acc.buf(), dq.numel());  // rounded once
}

namespace {

// MLA's sizes (Note [MLA's ring on the latent]).
struct MlaDims {
  int64_t nh, dn, dr, dqk, dv, kl, lat, kv;  // lat = kl + dr, kv = nh (dn + dv)
};
MlaDims mla_dims(const ModelConfig& c) {
  const int64_t nh = c.num_attention_heads, dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim;
  return {nh, dn, dr, dn + dr, dv, c.kv_lora_rank, c.kv_lora_rank + dr, nh * (dn + dv)};
}

// The keys k (rows, nh, dqk) and values v (rows, nh, dv) of latent rows [c | k_pe] (rows, kl + dr): k_nope and v
// per head from kv_b_proj(c), every head's key ending with k_pe (model/mla_block.cpp's expansion).
void mla_expand(StepContext& s, const LayerParams& lp, const MlaDims& d, CBuf lat, int64_t rows, Buf k, Buf v) {
  const ops::KernelLauncher K = s.be.kernels();
  Tensor kv = s.be.alloc(Category::Category_activations, {rows, d.kv}, s.precision.activations, "ring.mla_kv_b");
  K.gemm(false, true, rows, d.kv, d.kl, 1.0f, lat, d.lat, lp.kv_b_proj->w.cbuf(), d.kl, 0.0f, kv.buf(), d.kv);
  K.copy_2d(k, d.dqk, kv.cbuf(), d.dn + d.dv, rows * d.nh, d.dn);
  K.copy_2d(v, d.dv, ptr_at(kv.cbuf(), d.dn), d.dn + d.dv, rows * d.nh, d.dv);
  for (int64_t h = 0; h < d.nh; ++h)
    K.copy_2d(ptr_at(k, h * d.dqk + d.dn), d.nh * d.dqk, ptr_at(lat, d.kl), d.lat, rows, d.dr);
}

}  // namespace

namespace {

// The latent rows of keys [j0, j0 + c) of each of B sequences of Tk rows: the rows themselves when they are
// contiguous (one sequence, or every key), else gathered into `into` (B c, lat).
CBuf latent_chunk(StepContext& s, const MlaDims& d, CBuf latent, int64_t B, int64_t Tk, int64_t j0, int64_t c,
                  Tensor& into) {
  if (B == 1 || c == Tk) return ptr_at(latent, j0 * d.lat);
  into = s.be.alloc(Category::Category_activations, {B * c, d.lat}, s.precision.activations, "mla.latent_chunk");
  rows_gather(s.be.kernels(), into.buf(), latent, B, Tk, j0, c, d.lat);
  return into.cbuf();
}

}  // namespace

void mla_attend_forward(StepContext& s, const LayerParams& lp, CBuf q, CBuf latent, Buf o, float* lse, bool first,
                        const ops::AttentionSpec& a, int64_t chunk) {
  const ops::KernelLauncher K = s.be.kernels();
  const MlaDims d = mla_dims(s.cfg);
  const DType act = s.precision.activations;
  const int64_t cmax = key_chunk(chunk, a.Tk);  // never capped (Note [MLA's keys in chunks])
  chunks_run(s.be, a.Tk, cmax, [&](int64_t j0, int64_t c) {
    const int64_t rows = a.B * c;
    Tensor gathered;
    const CBuf lat = latent_chunk(s, d, latent, a.B, a.Tk, j0, c, gathered);
    Tensor kb = s.be.alloc(Category::Category_activations, {rows, d.nh * d.dqk}, act, "ring.mla_k");
    Tensor vb = s.be.alloc(Category::Category_activations, {rows, d.nh * d.dv}, act, "ring.mla_v");
    mla_expand(s, lp, d, lat, rows, kb.buf(), vb.buf());
    gathered.reset();
    K.attention_block_forward(q, kb.buf(), vb.buf(), o, lse, first && j0 == 0, chunk_spec(a, j0, c));
  });
}

void mla_attend_backward(StepContext& s, const LayerParams& lp, CBuf q, CBuf latent, CBuf o, const float* lse,
                         CBuf dout, Buf dq, Buf dlatent, Buf dw, const ops::AttentionSpec& a, int64_t chunk) {
  const ops::KernelLauncher K = s.be.kernels();
  const MlaDims d = mla_dims(s.cfg);
  const DType act = s.precision.activations;
  const int64_t cmax = key_chunk(chunk, a.Tk);  // never capped (Note [MLA's keys in chunks])
  chunks_run(s.be, a.Tk, cmax, [&](int64_t j0, int64_t c) {
    const int64_t rows = a.B * c;
    Tensor gathered;
    const CBuf lat = latent_chunk(s, d, latent, a.B, a.Tk, j0, c, gathered);
    Tensor kb = s.be.alloc(kAct, {rows, d.nh * d.dqk}, act, "ring.mla_k");
    Tensor vb = s.be.alloc(kAct, {rows, d.nh * d.dv}, act, "ring.mla_v");
    mla_expand(s, lp, d, lat, rows, kb.buf(), vb.buf());
    Tensor dkb = s.be.alloc_f32(kAct, {rows, d.nh * d.dqk}, "ring.mla_dk");
    Tensor dvb = s.be.alloc_f32(kAct, {rows, d.nh * d.dv}, "ring.mla_dv");
    K.fill(dkb.buf(), 0.0f, dkb.numel());
    K.fill(dvb.buf(), 0.0f, dvb.numel());
    K.attention_block_backward(q, kb.buf(), vb.buf(), o, lse, dout, dq, dkb.buf(), dvb.buf(), chunk_spec(a, j0, c));
    kb.reset();
    vb.reset();
    // The chunk's latent gradient: dlatent's rows themselves when contiguous, else gathered and added after.
    Tensor dl_chunk = gathered.defined() ? s.be.alloc_f32(kAct, {rows, d.lat}, "mla.dlatent_chunk") : Tensor();
    if (dl_chunk.defined()) K.fill(dl_chunk.buf(), 0.0f, rows * d.lat);
    const Buf dl = dl_chunk.defined() ? dl_chunk.buf() : ptr_at(dlatent, j0 * d.lat);
    // d k_pe: the heads' RoPE parts, summed in head order.
    for (int64_t h = 0; h < d.nh; ++h)
      K.add_2d(ptr_at(dl, d.kl), d.lat, ptr_at(dkb.cbuf(), h * d.dqk + d.dn), d.nh * d.dqk, rows, d.dr);
    // [dK_nope | dV] per head through kv_b_proj: into d c and kv_b_proj's gradient.
    Tensor dkv = s.be.alloc_f32(kAct, {rows, d.kv}, "ring.mla_dkv_b_out");
    K.copy_2d(dkv.buf(), d.dn + d.dv, dkb.cbuf(), d.dqk, rows * d.nh, d.dn);
    K.copy_2d(ptr_at(dkv.buf(), d.dn), d.dn + d.dv, dvb.cbuf(), d.dv, rows * d.nh, d.dv);
    dkb.reset();
    dvb.reset();
    K.gemm(false, false, rows, d.kl, d.kv, 1.0f, dkv.cbuf(), d.kv, lp.kv_b_proj->w.cbuf(), d.kl, 1.0f, dl, d.lat);
    K.gemm(true, false, d.kv, d.kl, rows, 1.0f, dkv.cbuf(), d.kv, lat, d.lat, 1.0f, dw, d.kl);
    if (dl_chunk.defined()) rows_scatter(K, dlatent, dl_chunk.cbuf(), a.B, a.Tk, j0, c, d.lat, /*add=*/true);
  });
}

void ring_attention_mla_forward(StepContext& s, const LayerParams& lp, const Tensor& q, const Tensor& latent, Tensor& o,
                                Tensor& lse, ops::AttentionSpec a, int64_t q0) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const MlaDims d = mla_dims(s.cfg);
  const RingGeometry g = ring_geometry(s);
  FP_ASSERT(a.Tk == s.T && q0 >= 0 && q0 + a.Tq <= s.T && latent.numel() == a.B * a.Tk * d.lat &&
                q.numel() == a.B * a.Tq * d.nh * d.dqk,
            "MLA ring: q {} latent {} elements for B={} queries {} from {} of N={}", q.numel(), latent.numel(), a.B,
            a.Tq, q0, s.T);
  const RingChunks ch = ring_chunks(s, a.Tk);  // Note [The ring's blocks in chunks]
  const Shape l_shape = chunk_shape(latent, a.B, ch);
  const DType act = s.precision.activations;
  Tensor lb[2] = {be.alloc(kComm, l_shape, act, "ring.latent0"), be.alloc(kComm, l_shape, act, "ring.latent1")};
  const bool f32_o = o.dtype() == DType::DType_F32;  // Note [Ring attention accumulates in f32]
  Tensor o_acc = f32_o ? Tensor() : be.alloc_f32(kComm, o.shape(), "ring.o_acc");
  const Buf out = f32_o ? o.buf() : o_acc.buf();
  chunks_run(be, a.Tk, ch.size, [&](int64_t j0, int64_t c) {
    const int64_t nl = a.B * c * d.lat;
    rows_gather(K, lb[0].buf(), latent.cbuf(), a.B, a.Tk, j0, c, d.lat);
    repeat_same(be, g.world, [&](int64_t hop) {
      const int step = static_cast<int>(hop), cur = step % 2;
      mla_attend_forward(s, lp, q.cbuf(), lb[cur].cbuf(), out, lse.f32(), j0 == 0 && step == 0,
                         chunk_spec(block_spec(s, a, g.source(step), q0), j0, c), s.layer_tile);
      if (step + 1 < g.world) ring_shift(s, g, lb[cur], lb[1 - cur], nl);
    });
  });
  if (!f32_o) K.copy(o.buf(), o_acc.buf(), o.numel());
}

void ring_attention_mla_backward(StepContext& s, const LayerParams& lp, const Tensor& q, const Tensor& latent,
                                 const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dlatent,
                                 ops::AttentionSpec a, int64_t q0, bool accumulate) {
  Backend& be = s.be;
  const ops::KernelLauncher K = be.kernels();
  const MlaDims d = mla_dims(s.cfg);
  const RingGeometry g = ring_geometry(s);
  FP_ASSERT(dlatent.dtype() == DType::DType_F32 && dlatent.numel() == latent.numel(),
            "MLA ring: dlatent (rows, kl + dr) f32");
  const RingChunks ch = ring_chunks(s, a.Tk);  // Note [The ring's blocks in chunks]
  const Shape l_shape = chunk_shape(latent, a.B, ch);
  const DType act = s.precision.activations;
  Tensor lb[2] = {be.alloc(kComm, l_shape, act, "ring.latent0"), be.alloc(kComm, l_shape, act, "ring.latent1")};
  Tensor dlb[2] = {be.alloc_f32(kComm, l_shape, "ring.dlatent0"), be.alloc_f32(kComm, l_shape, "ring.dlatent1")};
  // One dtype for a call's dq, dk, dv: the hop's dK, dV are f32, so dQ accumulates in f32 (rounded once).
  const bool f32_dq = dq.dtype() == DType::DType_F32;
  Tensor dq_acc = f32_dq ? Tensor() : be.alloc_f32(kComm, dq.shape(), "ring.dq_acc");
  const Buf dq_out = f32_dq ? dq.buf() : dq_acc.buf();
  // kv_b_proj's gradient over the hops, in f32 when the parameter's is not (one rounding at the end).
  Param& kvb = *lp.kv_b_proj;
  const bool f32_g = kvb.g.dtype() == DType::DType_F32;
  Tensor dw = f32_g ? Tensor() : be.alloc_f32(Category::Category_workspace, {d.kv, d.kl}, "ring.mla_dkv_b");
  if (!f32_g) K.fill(dw.buf(), 0.0f, d.kv * d.kl);
  const Buf dw_out = f32_g ? kvb.g.buf() : dw.buf();
  K.fill(dq_out, 0.0f, dq.numel());
  const int home = g.world % 2;
  chunks_run(be, a.Tk, ch.size, [&](int64_t j0, int64_t c) {
    const int64_t nl = a.B * c * d.lat;
    rows_gather(K, lb[0].buf(), latent.cbuf(), a.B, a.Tk, j0, c, d.lat);
    K.fill(dlb[0].buf(), 0.0f, nl);
    repeat_same(be, g.world, [&](int64_t hop) {
      const int step = static_cast<int>(hop), cur = step % 2;
      mla_attend_backward(s, lp, q.cbuf(), lb[cur].cbuf(), o.cbuf(), lse.f32(), dout.cbuf(), dq_out, dlb[cur].buf(),
                          dw_out, chunk_spec(block_spec(s, a, g.source(step), q0), j0, c), s.layer_tile);
      if (step + 1 < g.world) ring_shift(s, g, lb[cur], lb[1 - cur], nl);
      ring_shift(s, g, dlb[cur], dlb[1 - cur], nl);
    });
    rows_scatter(K, dlatent.buf(), dlb[home].cbuf(), a.B, a.Tk, j0, c, d.lat, accumulate);
  });
  if (!f32_dq) K.copy(dq.buf(), dq_acc.buf(), dq.numel());
  if (!f32_g) K.add_inplace(kvb.g.buf(), dw.cbuf(), d.kv * d.kl);
}

}  // namespace fp
