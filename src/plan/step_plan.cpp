// The allocation sequence of one training step, per rank, with every size in closed form, replayed
// through a PeakReplay (Note [Why the planner replays instead of summing] in plan/replay.h): the
// persistent state, the step's orchestration, the checkpoint boundaries and the optimizer. The
// blocks and heads are in block_plan.cpp. Legend: step_replay.h.
//
// The sequence mirrors, allocation for allocation and free for free, on one rank and on rank r of W:
//   model/params.cpp (ParamStore: FSDP shards of Rp = ceil(R / W) rows, this rank's E / W experts,
//   Note [FSDP layout]), sched/optim/adamw.cpp and offload.cpp (the optimizers, which reserve their
//   working set at construction over the local storage), model/model.cpp (Model::step: the gathered
//   units and their unsharded gradients), sched/ckpt/boundary_store.h (DeviceBoundaryStore) and
//   sched/ckpt/sco.cpp (ScoBoundaryStore).
// A change in any of them must be mirrored here; tests/model/test_plan_vs_meta.cpp fails otherwise
// and prints the first event that differs. Layouts other than the engine's (fsdp or ep != W, cp < W)
// are predicted (flagged in Result::predicted).
#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "plan/step_replay.h"

namespace fp::plan {

using namespace detail;

namespace {

// ---- boundaries (sched/ckpt/boundary_store.h DeviceBoundaryStore, sched/ckpt/sco.h ScoBoundaryStore)
struct Boundaries {
  std::vector<Id> dev;          // (N, H) on the device, per layer
  std::vector<Id> host;         // (N, H) on the host, per layer (sco)
  std::vector<bool> offloaded;  // sco: the boundary went to host
  Id pending = kNone;           // sco: the device copy whose offload is in flight
  uint64_t host_used = 0;       // sco: bytes of boundaries on the host
};

// ScoBoundaryStore::put: finish the previous offload (free its device copy), then send x_l to host
// unless it is the last boundary or it would exceed the budget or the host capacity.
void sco_put(Step& s, Boundaries& b, int64_t l, Id& x, uint64_t budget, uint64_t host_cap) {
  s.d.free(b.pending);
  const uint64_t bytes = s.act(s.N * s.H);
  const bool fits_budget = bytes <= budget - std::min(budget, b.host_used);
  const bool fits_host = host_cap == kUnlimitedBytes || s.h.total_current() + bytes <= host_cap;
  if (l + 1 == s.L || !fits_budget || !fits_host) {
    b.dev[l] = x;
  } else {
    b.host[l] = s.h.alloc(kCkpt, bytes, "sco.host.layer");
    b.host_used += bytes;
    b.offloaded[l] = true;
    b.pending = x;
  }
  x = kNone;
}

// ScoBoundaryStore::get: restore x_l unless prefetched, and prefetch x_{l-1}.
void sco_get(Step& s, Boundaries& b, int64_t l) {
  if (b.offloaded[l] && b.dev[l] == kNone) b.dev[l] = s.d.alloc(kCkpt, s.act(s.N * s.H), "ckpt.layer.restored");
  if (l > 0 && b.offloaded[l - 1] && b.dev[l - 1] == kNone)
    b.dev[l - 1] = s.d.alloc(kCkpt, s.act(s.N * s.H), "ckpt.layer.restored");
}

// The largest bucket of offload_plan_make (sched/optim/offload.cpp) over parameters of these sizes,
// in order: a bucket that splits a parameter ends on a multiple of kOffloadAlign = 16 elements.
int64_t bucket_largest(const std::vector<int64_t>& sizes, int64_t bucket) {
  constexpr int64_t kAlign = 16;
  int64_t largest = 0, cur = 0;
  auto close = [&] {
    largest = std::max(largest, cur);
    cur = 0;
  };
  for (const int64_t n : sizes) {
    int64_t off = 0;
    while (off < n) {
      int64_t take = std::min(n - off, bucket - cur);
      if (take < n - off) {
        const int64_t aligned = (off + take) / kAlign * kAlign - off;
        if (aligned > 0) {
          take = aligned;
        } else if (cur > 0) {
          close();
          continue;
        }
      }
      if (cur == 0 && take == bucket && n - off > bucket && off % kAlign == 0 && bucket % kAlign == 0) {
        // Whole aligned buckets inside one long parameter: the loop would close them one by one.
        largest = std::max(largest, bucket);
        off += (n - off - 1) / bucket * bucket;
        continue;
      }
      cur += take;
      off += take;
      if (cur == bucket) close();
    }
  }
  close();
  return largest;
}

// Elements of an (R, C) tensor's block of rows on one of W ranks, padded to ceil(R / W) rows
// (model/params.h, Note [FSDP layout]).
int64_t rows_local(int64_t R, int64_t C, int64_t W) { return ceil_div(R, W) * C; }

// The sizes of one rank's parameters in ParamStore order (model/params.cpp): every dense tensor as a
// block of rows over fsdp ranks, the E / ep experts of the rank whole (sharded by rows over the
// fsdp / ep ranks that share them when fsdp > ep: predicted, the engine runs fsdp = ep = W).
std::vector<int64_t> param_sizes_local(const ModelConfig& c, int64_t fsdp, int64_t ep) {
  const int64_t H = c.hidden_size, hd = c.head_dim, I = c.moe_intermediate_size, F = fsdp;
  const int64_t Q = c.num_attention_heads * hd, Kv = c.num_key_value_heads * hd, X = std::max<int64_t>(fsdp / ep, 1);
  std::vector<int64_t> v = {rows_local(c.vocab_size, H, F)};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (int64_t n : {rows_local(H, 1, F), rows_local(Q, H, F), rows_local(Kv, H, F), rows_local(Kv, H, F),
                      rows_local(H, Q, F), rows_local(hd, 1, F), rows_local(hd, 1, F), rows_local(H, 1, F),
                      rows_local(c.num_experts, H, F)})
      v.push_back(n);
    for (int64_t e = 0; e < c.num_experts / ep; ++e)
      for (int64_t n : {rows_local(I, H, X), rows_local(I, H, X), rows_local(H, I, X)}) v.push_back(n);
  }
  v.push_back(rows_local(H, 1, F));
  v.push_back(rows_local(c.vocab_size, H, F));
  return v;
}

// The sizes every rank shares (layout, tokens, parameters), checked.
Sizes sizes_resolve(const Input& in) {
  const ModelConfig& c = in.model;
  const Layout& lay = in.settings.layout;
  Sizes z;
  FP_CHECK(lay.ranks >= 1 && lay.batch >= 1, "ranks and batch are at least 1", "ranks {} batch {}", lay.ranks,
           lay.batch);
  z.ranks = lay.ranks;
  z.cp = lay.cp > 0 ? lay.cp : lay.ranks;
  z.ep = lay.ep > 0 ? lay.ep : std::gcd(c.num_experts, lay.ranks);
  z.fsdp = lay.fsdp > 0 ? lay.fsdp : lay.ranks;
  FP_CHECK(z.ranks % z.cp == 0, "cp must divide the rank count", "cp = {} does not divide W = {}", z.cp, z.ranks);
  FP_CHECK(z.ranks % z.fsdp == 0, "fsdp must divide the rank count", "fsdp = {} does not divide W = {}", z.fsdp,
           z.ranks);
  FP_CHECK(z.ranks % z.ep == 0 && c.num_experts % z.ep == 0,
           "ep must divide both the rank count and the number of experts",
           "ep = {} with W = {} ranks and E = {} experts", z.ep, z.ranks, c.num_experts);
  z.dp = z.ranks / z.cp;
  FP_CHECK(in.context * lay.batch >= z.cp, "give at least one token per rank",
           "context {} x batch {} is less than cp = {} ranks", in.context, lay.batch, z.cp);
  z.tokens = ceil_div(in.context * lay.batch, z.cp);
  // Per rank: the dense parameters sharded over fsdp ranks by blocks of rows; the experts spread over
  // ep ranks and, when fsdp > ep, sharded further (FSDP2 over expert parallelism).
  z.params_total = c.param_count();
  const std::vector<int64_t> local_sizes = param_sizes_local(c, z.fsdp, z.ep);
  z.params_per_rank = std::accumulate(local_sizes.begin(), local_sizes.end(), int64_t{0});
  return z;
}

// The sizes of a Step (the model's dimensions, this rank's dispatch), and the layout fields that
// depend on the schedules (Result::sizes).
void step_setup(Step& s, Sizes& z, const DispatchCounts& dc, int64_t rank) {
  const ModelConfig& c = s.cfg;
  s.z = z;
  s.N = z.tokens;
  s.H = c.hidden_size;
  s.nh = c.num_attention_heads;
  s.nkv = c.num_key_value_heads;
  s.Q = s.nh * c.head_dim;
  s.Kv = s.nkv * c.head_dim;
  s.E = c.num_experts;
  s.k = c.num_experts_per_tok;
  s.I = c.moe_intermediate_size;
  s.V = c.vocab_size;
  s.L = c.num_hidden_layers;
  s.m = s.N * s.k;
  s.fsdp = z.fsdp > 1;
  s.ep = z.ep > 1;
  const int64_t H = s.H, N = s.N;

  // This rank's dispatch sizes; on one rank every route stays (the local dispatch).
  s.dc = &dc;
  s.rank = rank;
  z.rank = rank;
  z.routes_sent = s.m;
  z.routes_received = dc.rows;
  s.Re = dc.rows;
  z.llep_active = dc.llep_active;
  z.guests = dc.guests;
  z.chunks = dc.K;
  z.chunk_tokens = dc.c_eff;
  z.chunk_recv_max = dc.chunk_recv_max();
  if (s.sched.vocab == Vocab::Vocab_ring) {
    z.vocab_ring = z.fsdp;  // the LM head's vocabulary shards: replicated parameters keep one ring of 1
    const int64_t Vp = ceil_div(s.V, z.vocab_ring);
    z.ring_mode = s.sched.ring_mode == "auto" ? (N <= Vp ? "activations" : "weights") : s.sched.ring_mode;
    FP_CHECK(s.sched.block_tokens >= 1, "vocab block_tokens is >= 1", "block_tokens = {}", s.sched.block_tokens);
  }
  // A gathered unit holds fsdp blocks of rows of each of its tensors (padding included).
  const int64_t F = z.fsdp;
  const int64_t dense_layer = F * (2 * rows_local(H, 1, F) + rows_local(s.Q, H, F) + rows_local(H, s.Q, F) +
                                   2 * rows_local(s.Kv, H, F) + 2 * rows_local(c.head_dim, 1, F) +
                                   rows_local(s.E, H, F));
  s.unit_params = dense_layer + (z.fsdp > z.ep ? (s.E / z.ep) * 3 * s.I * H : 0);
  s.z = z;
}

// Note [Choosing the rank to plan]
// Ranks differ only inside their MoE blocks (what their experts receive), and every layer runs the
// same blocks: a forward into a boundary, the last layer's forward, and the recompute with its
// backward. So a rank's peaks are the larger of the step's peaks outside those blocks and, per
// block kind, the most held at the start of one of its occurrences plus the block's own peak, which
// is replayed alone per rank. Exact, and it costs one step replay plus three blocks per rank
// instead of one step per rank (hundreds of ranks, thousands of chunk events per layer).
struct BlockStarts {
  bool seen = false;
  uint64_t total = 0;    // the most held at the start of one occurrence
  CategoryBytes cat{};   // the same per category
};
struct Probe {
  std::array<BlockStarts, 3> start;  // 0: forward into a boundary, 1: last forward, 2: recompute + backward
};

void probe_mark(Probe& p, int kind, const PeakReplay& d) {
  BlockStarts& b = p.start[kind];
  b.seen = true;
  b.total = std::max(b.total, d.total_current());
  for (Category c : kAllCategories) b.cat[static_cast<int>(c)] = std::max(b.cat[static_cast<int>(c)], d.current(c));
}

// One rank's step: dc holds its dispatch sizes (ep > 1). With a probe the MoE blocks are left out
// (their net effect, the layer output, stays) and the starts of their occurrences are recorded.
Result replay_rank(const Input& in, const Schedules& sched, const Sizes& sizes, const DispatchCounts& dc,
                   int64_t rank, PeakReplay& dev, PeakReplay& host, Probe* probe = nullptr) {
  const ModelConfig& c = in.model;
  const Settings& set = in.settings;
  Result r;
  r.sched = sched;
  r.sizes = sizes;
  Sizes& z = r.sizes;
  const std::vector<int64_t> local_sizes = param_sizes_local(c, z.fsdp, z.ep);
  Step s(c, set, r.sched, dev, host);
  step_setup(s, z, dc, rank);
  const int64_t H = s.H, L = s.L, N = s.N, F = z.fsdp;

  // ---- persistent: ParamStore (params, grads), then the optimizer (sched/optim/optimizer.cpp).
  const uint64_t wb = dtype_size(set.dtypes.weights), gb = dtype_size(set.dtypes.grads);
  const uint64_t master_b = dtype_size(set.dtypes.master), mom_b = dtype_size(set.dtypes.moments);
  const int64_t P = z.params_per_rank;
  dev.alloc(kParams, P * wb, "params");
  dev.alloc(kGrads, P * gb, "grads");
  const Optim optim = r.sched.optim;
  FP_ASSERT(optim != Optim::Optim_auto, "step_replay receives a resolved optimizer schedule");
  if (optim == Optim::Optim_device) {
    // AdamW (adamw.cpp): m and v on the device, and a master copy when the weights are not fp32.
    const uint64_t master_dev = set.dtypes.weights == set.dtypes.master ? 0 : master_b;
    dev.alloc(kOpt, P * (2 * mom_b + master_dev), "adamw.m_v");
  } else {
    // OffloadAdamW (offload.cpp): fp32 master, m, v in (pinned) host memory, 12 B per parameter.
    host.alloc(kOpt, P * (master_b + 2 * mom_b), "host.master_m_v");
    if (optim == Optim::Optim_offload_serial) {
      host.alloc(kGrads, P * gb, "host.grads");  // every gradient comes down for the CPU update
    } else {
      // OffloadStreamAdamW: S staging slots of the largest bucket, reserved at construction; on the
      // device (update there) rows grad, param, m, v: 16 B per element; on the host: the gradient.
      const int64_t largest = bucket_largest(local_sizes, r.sched.bucket_params);  // over this rank's tensors
      z.bucket_largest = largest;
      for (int64_t k = 0; k < r.sched.slots && largest > 0; ++k) {
        if (r.sched.update_on_host)
          host.alloc(kOpt, static_cast<uint64_t>(largest) * 4, "optim.host_slot");
        else
          dev.alloc(kOpt, static_cast<uint64_t>(largest) * 16, "optim.slot");  // (4, B_max) f32
      }
    }
  }
  dev.alloc(kWs, 4, "adamw.grad_sumsq");  // (1)

  // ---- the step (model.cpp)
  Id tokens = dev.alloc(kAct, s.i32(N), "input.tokens");
  Id targets = dev.alloc(kAct, s.i32(N), "input.targets");
  Id pos = dev.alloc(kAct, s.i32(N), "input.positions");
  const bool sco = r.sched.ckpt == Ckpt::Ckpt_sco;
  Boundaries b;
  b.dev.assign(static_cast<size_t>(L), kNone);
  b.host.assign(static_cast<size_t>(L), kNone);
  b.offloaded.assign(static_cast<size_t>(L), false);
  Id embed_unit = kNone;
  if (s.fsdp) embed_unit = dev.alloc(kParams, s.wt(F * rows_local(s.V, H, F)), "fsdp.embed_tokens");  // (V, H)
  Id x = dev.alloc(kCkpt, s.act(N * H), "ckpt.layer0");
  dev.free(embed_unit);
  for (int64_t l = 0; l < L; ++l) {
    Id unit = kNone;
    if (s.fsdp) unit = dev.alloc(kParams, s.wt(s.unit_params), "fsdp.layer");
    AttnIds attn;
    Id x1 = attn_forward(s, attn, false);
    if (sco) {
      sco_put(s, b, l, x, r.sched.ckpt_host_budget, in.host_mem);
    } else {
      b.dev[l] = x;
      x = kNone;
    }
    const bool last = l + 1 == L;
    MoeIds moe;
    if (probe) {
      probe_mark(*probe, last ? 1 : 0, dev);
      x = dev.alloc(last ? kAct : kCkpt, s.act(N * H), "moe.x2");
    } else {
      x = moe_forward(s, moe, false, last ? kAct : kCkpt);
    }
    dev.free(x1);
    dev.free(unit);
  }
  z.boundaries_offloaded = std::count(b.offloaded.begin(), b.offloaded.end(), true);

  Id aux_bias = kNone;
  if (c.router_aux_loss_coef != 0.0) aux_bias = dev.alloc(kWs, s.f32(s.E), "moe.aux_bias");  // (E)
  Id dx = dev.alloc(kAct, s.act(N * H), "grad.x");
  if (r.sched.vocab == Vocab::Vocab_ring)
    head_ring(s);
  else
    head_full(s);
  dev.free(x);

  for (int64_t l = L - 1; l >= 0; --l) {
    Id unit = kNone, unit_grad = kNone;
    if (s.fsdp) {
      unit = dev.alloc(kParams, s.wt(s.unit_params), "fsdp.layer");
      unit_grad = dev.alloc(kGrads, s.gr(s.unit_params), "fsdp.layer.grad");  // unsharded, then reduce-scatter
    }
    if (sco) {
      if (l == L - 1) dev.free(b.pending);
      sco_get(s, b, l);
    }
    AttnIds attn;
    MoeIds moe;
    Id x1 = attn_forward(s, attn, true);
    if (probe) {
      probe_mark(*probe, 2, dev);
    } else {
      Id x2 = moe_forward(s, moe, true, kAct);
      dev.free(x2);
      moe_backward(s, moe);
    }
    dev.free(x1);
    attn_backward(s, attn);
    dev.free(b.dev[l]);  // store->release(l)
    dev.free(unit_grad);
    dev.free(unit);
  }
  if (s.fsdp) {
    Id g = dev.alloc(kGrads, s.gr(F * rows_local(s.V, H, F)), "fsdp.embed_tokens.grad");  // then reduce-scatter
    dev.free(g);
  }
  dev.free(dx);  // end of Model::step: destroyed in reverse order
  dev.free(aux_bias);
  for (Id& hb : b.host) host.free(hb);  // the store and its host buffers
  dev.free(targets);
  dev.free(tokens);
  dev.free(pos);
  // The optimizer step allocates nothing: every variant reserved its working set at construction.

  // ---- results
  r.sizes = z;
  r.peak = dev.peaks();
  r.at_peak = dev.at_total_peak();
  r.step_peak = dev.total_peak();
  r.peak_tag = dev.total_peak_tag();
  r.binding = kAllCategories[0];
  for (Category cat : kAllCategories)
    if (r.at_peak[static_cast<int>(cat)] > r.at_peak[static_cast<int>(r.binding)]) r.binding = cat;
  r.host_peak = host.peaks();
  r.host_needed = host.total_peak();
  r.fits_device = in.device_mem == kUnlimitedBytes || r.step_peak <= in.device_mem;
  r.fits_host = in.host_mem == kUnlimitedBytes || r.host_needed <= in.host_mem;
  return r;
}

DispatchKind dispatch_kind(Dispatch d) {
  switch (d) {
    case Dispatch::Dispatch_standard: return DispatchKind::DispatchKind_standard;
    case Dispatch::Dispatch_llep: return DispatchKind::DispatchKind_llep;
    case Dispatch::Dispatch_pipelined_llep: return DispatchKind::DispatchKind_pipelined_llep;
  }
  return DispatchKind::DispatchKind_standard;
}

}  // namespace

// Ranks differ only by what their experts receive (the dispatch sizes): each distinct set of sizes
// is replayed and the rank with the largest step peak is the plan, unless layout.rank names one.
Result step_replay(const Input& in, const Schedules& sched, PeakReplay* device_replay, PeakReplay* host_replay) {
  model_config_validate(in.model, "plan");
  FP_CHECK(in.context >= 1, "pass --context T with T >= 1", "context length {} is not positive", in.context);
  const Sizes z = sizes_resolve(in);
  const ModelConfig& c = in.model;
  if (sched.dispatch != Dispatch::Dispatch_standard)
    FP_CHECK(sched.chunk_tokens >= 1 && sched.max_chunks >= 1 && sched.alpha > 0 && sched.min_tokens_per_gemm >= 1,
             "chunk_tokens, max_chunks, min_tokens_per_gemm are >= 1 and alpha > 0",
             "dispatch {}: chunk_tokens = {}, max_chunks = {}, alpha = {}, min_tokens_per_gemm = {}",
             dispatch_name(sched.dispatch), sched.chunk_tokens, sched.max_chunks, sched.alpha,
             sched.min_tokens_per_gemm);
  const LlepParams llep{sched.lambda, sched.alpha, sched.min_tokens_per_gemm};
  const ChunkSettings chunks{sched.chunk_tokens, sched.max_chunks, sched.strided};
  const std::vector<DispatchCounts> all =
      dispatch_counts(in.settings.routing, z.tokens, c.num_experts_per_tok, c.num_experts, z.ep,
                      dispatch_kind(sched.dispatch), llep, chunks);
  const int64_t want = in.settings.layout.rank;
  FP_CHECK(want < z.ranks, "rank= names one of the W ranks (0 .. W-1)", "rank = {} with W = {}", want, z.ranks);
  // Rank r holds the expert shard r mod ep (the engine: ep = W).
  auto replay = [&](const DispatchCounts& dc, int64_t rank, PeakReplay* dev, PeakReplay* host) {
    PeakReplay local_dev, local_host;
    return replay_rank(in, sched, z, dc, rank, dev ? *dev : local_dev, host ? *host : local_host);
  };
  if (want >= 0) return replay(all[static_cast<size_t>(want % z.ep)], want, device_replay, host_replay);
  // The rank with the largest step peak; among equals, the largest sum of category peaks (the rank
  // whose experts receive the most, when the step peak is elsewhere), then the lowest rank (Note
  // [Choosing the rank to plan]).
  size_t best = 0;
  if (all.size() > 1) {
    // The step outside the blocks, per size of the rank's vocabulary shard (the one other size that
    // may differ between ranks: the last ranks' shorter shard, kept strips of Ring-DTP).
    struct Outside {
      int64_t vocab_rows;
      Probe probe;
      Result result;
    };
    std::vector<Outside> outsides;
    outsides.reserve(all.size());  // references into it stay valid
    auto outside_of = [&](int64_t rank) -> const Outside& {
      const int64_t rows = shard_rows(c.vocab_size, z.fsdp, rank);
      for (const Outside& o : outsides)
        if (o.vocab_rows == rows) return o;
      Outside o{rows, {}, {}};
      PeakReplay od, oh;
      o.result = replay_rank(in, sched, z, all[0], rank, od, oh, &o.probe);
      outsides.push_back(std::move(o));
      return outsides.back();
    };
    std::pair<uint64_t, uint64_t> best_key{0, 0};
    for (size_t i = 0; i < all.size(); ++i) {
      bool seen = false;
      for (size_t j = 0; j < i && !seen; ++j)
        seen = all[j].same_sizes(all[i]) &&
               shard_rows(c.vocab_size, z.fsdp, static_cast<int64_t>(j)) ==
                   shard_rows(c.vocab_size, z.fsdp, static_cast<int64_t>(i));
      if (seen) continue;
      const Outside& out = outside_of(static_cast<int64_t>(i));
      const Probe& probe = out.probe;
      const Result& outside = out.result;
      uint64_t total = outside.step_peak;
      CategoryBytes cat = outside.peak;
      for (int kind = 0; kind < 3; ++kind) {
        const BlockStarts& b = probe.start[kind];
        if (!b.seen) continue;
        PeakReplay bd, bh;
        Sizes zb = z;
        Step sb(c, in.settings, sched, bd, bh);
        step_setup(sb, zb, all[i], static_cast<int64_t>(i));
        MoeIds moe;
        if (kind < 2) {
          moe_forward(sb, moe, false, kind == 0 ? kCkpt : kAct);
        } else {
          Id x2 = moe_forward(sb, moe, true, kAct);
          bd.free(x2);
          moe_backward(sb, moe);
        }
        total = std::max(total, b.total + bd.total_peak());
        for (int ci = 0; ci < kNumCategories; ++ci) cat[ci] = std::max(cat[ci], b.cat[ci] + bd.peaks()[ci]);
      }
      const std::pair<uint64_t, uint64_t> key{total, std::accumulate(cat.begin(), cat.end(), uint64_t{0})};
      if (i == 0 || key > best_key) {
        best = i;
        best_key = key;
      }
    }
  }
  return replay(all[best], static_cast<int64_t>(best), device_replay, host_replay);
}

}  // namespace fp::plan