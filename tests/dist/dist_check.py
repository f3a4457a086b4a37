#!/usr/bin/env python3
"""Multi-process acceptance tests (ctest label mpi): W ranks against one process.

usage: dist_check.py --bin-dir BUILD --configs CONFIGS CASE
  grads      dist_case on W = 1, 2, 4 (the plain layer; every Hugging Face switch on: biases, sliding
             window, tied embeddings, a dense layer; DeepSeek-V3's layer): loss within 1e-5 relative, every
             gradient within 1e-4 norm-relative, every rank's params/grads bytes (shards, one gathered unit)
             as the FSDP layout implies
  grads_flat     the switched and the DeepSeek model with Ring-DTP, SCO and PipelinedLLEP on 2 and 4 ranks
                 against their plain schedules on one process
  grads_chunked  the MoE token side in chunks through the standard, LLEP and PipelinedLLEP dispatches
  grads_bf16     the bf16 recipe on 2 and 4 ranks against one process
  grads_mesh     2 data-parallel replicas (dp2 x cp1, dp2 x cp2) against one process, with the flattened schedules
  grads_documents  packed documents (EOS boundaries) on 2 and 4 ranks against one process: the plain,
                 the switched (sliding window) and the DeepSeek model; zig-zag and the balanced split
  train      10 steps of flatpeak train on W = 2 and 4 track the single-process losses within 1e-4; meta
             runs peak like cpu in params, grads, optimizer, checkpoints, vocab
  train_deepseek      DeepSeek-V3's layer with its routing bias moving on 2 ranks, and resumed on one process
  train_bf16          the bf16 recipe on 2 and 4 ranks
  train_chunked_meta  the MoE token side in chunks through PipelinedLLEP under a profile: meta allocates as cpu
  train_mesh  dp4, dp2 x cp2 and dp2 with 2 micro-batches against one process on the same global batch
  train_ep    experts in groups of parallel.ep ranks (ep = 1, 2 of 2 and 4 ranks, LLEP, the flattened schedules)
              against one process: losses, gradient norms and final weights
  train_hsdp  dense shards in groups of parallel.fsdp ranks (HSDP; Ring-DTP within a group), the same way
  ckpt       checkpoints written by 2 or 4 ranks equal one process's and resume on 1 or 2 ranks, and vice
             versa, with the same losses within 1e-5
  failure    a failing rank ends every rank non-zero within 30 s, the error printed once
  hosts      4 ranks on 2 hosts (network namespaces, TCP only: netns_hosts) against one process, dp x cp x ep x
             fsdp layouts by slot and by node; exits 77 (skipped) where namespaces cannot be made
  hosts_kill a rank, then a whole host, of a 2-host run killed with SIGKILL, then a host cut off the network:
             every rank ends within 60 s
  bench      (not a test) docs/benchmarks.md's Multi-process table: per-rank peaks, tokens/s at W = 1, 2, 4
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import safetensors_io  # noqa: E402

A = None
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none",
           OMPI_MCA_rmaps_base_oversubscribe="1")


# > 0: mpirun runs across this many hosts made of network namespaces (netns_hosts, the hosts_* cases).
HOSTS = 0
NETNS_HOSTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_hosts")


def mpirun_cmd(np, args, mpi_opts=()):
    """The command line of `args` on np ranks: mpirun on this machine, or across HOSTS namespace hosts (np / HOSTS
    slots each, TCP only; Note [Hosts as network namespaces] in netns_hosts)."""
    if np == 1:
        return list(args)
    if HOSTS:
        return ([NETNS_HOSTS, "--hosts", str(HOSTS), "--slots", str(-(-np // HOSTS)), "--", "-np", str(np),
                 "-x", "OMP_NUM_THREADS", "--bind-to", "none"] + list(mpi_opts) + list(args))
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np)] + list(mpi_opts) + list(args)


def mpirun(np, args, mpi_opts=(), **kw):
    return subprocess.run(mpirun_cmd(np, args, mpi_opts), capture_output=True, text=True, env=ENV, **kw)


def ok(p, what):
    if p.returncode != 0:
        sys.exit(f"FAILED: {what}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def fsdp_expected(shapes, w, rank, tied, elem=4):
    """Bytes the FSDP layout (src/model/params.h, Note [FSDP layout]) puts on `rank` of `w`:
    (shards, largest gathered unit, largest unsharded unit gradient). Dense parameters are cut in
    blocks of ceil(R / w) rows (padded); a unit holds w such blocks per parameter. Rank r holds
    experts [r E/w, (r + 1) E/w) whole and no other. tied: the head unit holds the embedding too
    (Note [Tied embeddings]). elem: bytes per element (4 fp32, 2 bf16); DeepSeek-V3's routing bias is
    f32 in every recipe (Note [Parameters kept in f32])."""
    def rows_padded(shape):
        return -(-shape[0] // w) * (math.prod(shape) // shape[0])
    def expert(name):
        return int(name.split(".mlp.experts.")[1].split(".")[0])
    def size(name):
        return 4 if name.endswith("e_score_correction_bias") else elem
    n_exp = max(expert(k) for k in shapes if ".mlp.experts." in k) + 1
    shards, units = 0, {}
    for name, shape in shapes.items():
        if ".mlp.experts." in name:
            if expert(name) // (n_exp // w) == rank:
                shards += size(name) * math.prod(shape)
            continue
        shards += size(name) * (rows_padded(shape) if w > 1 else math.prod(shape))
        if name.startswith("model.layers."):
            unit = "layer" + name.split(".")[2]
        elif name == "model.embed_tokens.weight":
            unit = "embed"
        else:
            unit = "head"  # model.norm + lm_head
        units[unit] = units.get(unit, 0) + size(name) * w * rows_padded(shape)
        if tied and unit == "embed":
            units["head"] = units.get("head", 0) + size(name) * w * rows_padded(shape)
    largest = max(units.values()) if w > 1 else 0
    return shards, largest, largest


def case_grads(tmp):
    for variant in ("plain", "hf_layers", "deepseek"):
        print(f"-- {variant}")
        grads_variant(tmp, variant)


def case_grads_flat(tmp):
    """The flattened schedules on the same model: W ranks against the plain schedules on one process."""
    for model in ("hf_layers", "deepseek"):
        print(f"-- {model}_flat (Ring-DTP, SCO, PipelinedLLEP) against {model} on one process")
        grads_variant(tmp, f"{model}_flat", reference=model)


def case_grads_chunked(tmp):
    """The MoE token side in chunks, through every dispatch: standard, LLEP, PipelinedLLEP."""
    for variant, model in (("plain_chunked", "plain"), ("plain_llep_chunked", "plain"),
                           ("hf_layers_flat_chunked", "hf_layers"), ("deepseek_flat_chunked", "deepseek")):
        print(f"-- {variant} (the MoE token side in chunks) against {model} on one process")
        grads_variant(tmp, variant, reference=model)


def case_grads_documents(tmp):
    """Packed documents (Note [Documents from EOS]): ring attention masks by each query's document start,
    RoPE restarts per document and no loss is taken at EOS, the same on W ranks as on one process."""
    for variant in ("plain_docs", "hf_layers_docs", "deepseek_docs"):
        print(f"-- {variant}")
        grads_variant(tmp, variant)
    # The balanced split (Note [Balanced rings]): another assignment of positions to ranks, the same function.
    for variant in ("plain_docs", "hf_layers_docs"):
        print(f"-- {variant}_balanced against {variant} on one process")
        grads_variant(tmp, variant + "_balanced", reference=variant)


def case_grads_mesh(tmp):
    """Note [A device mesh]: 2 data-parallel replicas of W/2 context-parallel ranks (dp2 x cp1 on 2 ranks, dp2 x cp2
    on 4) against one process on the whole batch: the plain layer, the switched model with the four flattened
    schedules together, DeepSeek-V3, and packed documents (the replicas' target counts differ: the global
    token mean)."""
    for variant, reference in (("plain_dp2", "plain"), ("hf_layers_flat_dp2", "hf_layers"),
                               ("deepseek_dp2", "deepseek"), ("plain_docs_dp2", "plain_docs")):
        print(f"-- {variant} against {reference} on one process")
        grads_variant(tmp, variant, reference=reference)


def case_grads_tiled(tmp):
    """Note [Sequence-tiled layers]: every layer in tiles of 25 of a rank's tokens, each tile's queries on their own
    ring, against the whole layers on one process: the plain layer, the switched model (a sliding window, biases, a
    dense layer) alone and with the four flattened schedules and the MoE token side in chunks, packed documents,
    and dp2 x cp; DeepSeek-V3's MLA (Note [MLA in tiles]: each tile's ring on the latent, every hop's keys expanded
    in chunks of the tile) alone, with the flattened schedules, and with documents."""
    for variant, reference in (("plain_tiled", "plain"), ("hf_layers_tiled", "hf_layers"),
                               ("hf_layers_flat_chunked_tiled", "hf_layers"), ("plain_docs_tiled", "plain_docs"),
                               ("plain_dp2_tiled", "plain"), ("deepseek_tiled", "deepseek"),
                               ("deepseek_flat_chunked_tiled", "deepseek"), ("deepseek_docs_tiled", "deepseek_docs")):
        print(f"-- {variant} against {reference} on one process")
        grads_variant(tmp, variant, reference=reference)


def case_grads_gptoss(tmp):
    """gpt-oss's layer (sinks in every rank's ring softmax, a sliding layer, biases on the router and the experts,
    the clamped SwiGLU) on 2 and 4 ranks against one process: plain; with Ring-DTP, SCO and PipelinedLLEP; with
    LLEP (the experts' biases travel with their weights); in tiles of 25 tokens (each tile's ring joins the sinks);
    and the bf16 recipe."""
    print("-- gptoss")
    grads_variant(tmp, "gptoss")
    for variant in ("gptoss_flat", "gptoss_llep", "gptoss_flat_chunked", "gptoss_tiled"):
        print(f"-- {variant} against gptoss on one process")
        grads_variant(tmp, variant, reference="gptoss")
    print("-- gptoss_bf16")
    grads_variant(tmp, "gptoss_bf16", loss_rtol=5e-6, grad_rtol=3e-2)


def case_grads_bf16(tmp):
    """The bf16 recipe on W ranks (Note [Summing bf16 over ranks], Note [Ring attention accumulates in
    f32]): the forward differs from one process only in f32 summation order (losses within 5e-6,
    measured <= 5.4e-7), the gradients by where they are rounded to bf16 (each rank's partial sum,
    before the reduce-scatter): within the bf16 tolerance 3e-2 norm-relative (measured <= 0.9%)."""
    for variant, model in (("plain_bf16", None), ("hf_layers_bf16", None), ("deepseek_bf16", None),
                           ("plain_llep_bf16", "plain_bf16"), ("hf_layers_flat_bf16", "hf_layers_bf16"),
                           ("deepseek_flat_bf16", "deepseek_bf16")):
        print(f"-- {variant}" + (f" against {model} on one process" if model else ""))
        grads_variant(tmp, variant, reference=model, loss_rtol=5e-6, grad_rtol=3e-2)


def grads_variant(tmp, variant, reference=None, loss_rtol=1e-5, grad_rtol=1e-4):
    """dist_case `variant` on W ranks against W = 1 (of `reference`, when given, already run): losses
    (max-relative) and gradients (norm-relative, each); the FSDP ledger figures for the plain schedules."""
    files = {}
    dist_case = os.path.join(A.bin_dir, "tests", "dist_case")
    ref_file = os.path.join(tmp, f"{reference}_w1.safetensors")
    if reference and not os.path.exists(ref_file):  # each ctest case runs in its own tmp
        ok(mpirun(1, [dist_case, ref_file, reference]), f"dist_case {reference} W=1")
    for w in ((2, 4) if reference else (1, 2, 4)):
        f = os.path.join(tmp, f"{variant}_w{w}.safetensors")
        ok(mpirun(w, [dist_case, f, variant]), f"dist_case {variant} W={w}")
        files[w], meta = safetensors_io.load(f)
        if reference:
            continue
        # The ledger of every rank: shards only between steps; one gathered unit (params) and one
        # unsharded unit gradient (grads) at a time during the step.
        shapes = {k[5:]: list(v.shape) for k, v in files[w].items() if k.startswith("grad.")}
        led = files[w]["out.ledger"].tolist()
        for r in range(w):
            shards, unit, unit_grad = fsdp_expected(shapes, w, r, meta.get("tied") == "1",
                                                    2 if variant.endswith("_bf16") else 4)
            got = dict(zip(("params", "params_peak", "grads_peak", "grads"), led[r]))
            want = {"params": shards, "params_peak": shards + unit, "grads_peak": shards + unit_grad, "grads": shards}
            assert got == want, f"W={w} rank {r} ledger {got}, FSDP layout implies {want}"
        print(f"W={w}: per-rank params {[l[0] for l in led]} B, peaks params {[l[1] for l in led]} B, "
              f"grads {[l[2] for l in led]} B: as the FSDP and expert layouts imply")
    ref = safetensors_io.load(ref_file)[0] if reference else files[1]
    worst = 0.0
    for w in (2, 4):
        got = files[w]
        lr, lg = ref["out.losses"].double(), got["out.losses"].double()
        rel = ((lg - lr).abs() / lr.abs().clamp(min=1e-30)).max().item()  # aux is 0 for DeepSeek's router
        print(f"W={w}: loss {lg[0].item():.9f} vs {lr[0].item():.9f} (max rel over loss/ce/aux {rel:.2e})")
        assert rel <= loss_rtol, f"W={w} loss differs by {rel:.2e}"
        for name in ref:
            if not name.startswith("grad."):
                continue
            r, g = ref[name].double(), got[name].double()
            err = (g - r).norm().item() / max(r.norm().item(), 1e-30)
            worst = max(worst, err)
            assert err <= grad_rtol, f"W={w} {name}: norm-relative error {err:.2e}"
    print(f"every gradient within {grad_rtol:g} (worst {worst:.2e})")


def train_args(out, steps, extra=()):
    return [os.path.join(A.bin_dir, "flatpeak"), "train", "--config", os.path.join(A.configs, "tiny.toml"),
            "--steps", str(steps), "--out", out, "--quiet", "--set", "train.seq_len=128",
            "--set", "train.batch_size=2"] + list(extra)


def losses(out):
    return [json.loads(l)["loss"] for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]


def case_train_chunked_meta(tmp):
    """The MoE token side in chunks (moe.token_chunk 45, a last chunk of another size) through
    PipelinedLLEP under a skewed profile on 4 ranks: meta's closed-form routing of each chunk (its window
    of the rank's tokens, strided and contiguous chunk membership) allocates as cpu, every category."""
    for membership in ("strided", "contiguous"):
        peaks = {}
        for dev in ("cpu", "meta"):
            d = os.path.join(tmp, f"chunked_{membership}_{dev}")
            ok(mpirun(4, train_args(d, 2, ["--device", dev, "--set", "train.seq_len=512", "--set", "moe.token_chunk=45",
                                           "--set", "moe.dispatch=pipelined_llep", "--set", "pipelined.chunk_cap=16",
                                           "--set", "moe.routing_profile=hot:0.9:2", "--set", "llep.lambda=1.0",
                                           "--set", "llep.min_tokens_per_gemm=4",
                                           "--set", f"pipelined.membership={membership}"])),
               f"chunked token side, {membership}, {dev}")
            peaks[dev] = [json.loads(l)["peak_bytes"] for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()]
        assert peaks["cpu"] == peaks["meta"], f"{membership}: cpu {peaks['cpu']} vs meta {peaks['meta']}"
        print(f"token chunks, {membership}: meta peaks as cpu in every category ({peaks['cpu'][-1]})")


def case_train_bf16(tmp):
    """The bf16 recipe: 10 steps on 2 and 4 ranks track one process within 1e-3 (the gradients differ
    there by where they are rounded, measured 2.5e-5 after 10 steps on 2 ranks), and meta allocates
    what cpu does in the categories that do not depend on the routing."""
    bf16 = ["--set", "precision.recipe=bf16"]
    single = os.path.join(tmp, "bf16_w1")
    ok(mpirun(1, train_args(single, 10, bf16)), "single-process bf16 training")
    ref = losses(single)
    for w in (2, 4):
        d = os.path.join(tmp, f"bf16_w{w}")
        ok(mpirun(w, train_args(d, 10, bf16)), f"bf16 training on {w} ranks")
        got = losses(d)
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        print(f"bf16, W={w}: 10 losses track one process within {rel:.2e}")
        assert len(got) == 10 and rel <= 1e-3, (got, ref)
        dm = os.path.join(tmp, f"bf16_meta{w}")
        ok(mpirun(w, train_args(dm, 10, bf16 + ["--device", "meta", "--stop-after", "2"])), f"bf16 meta on {w} ranks")
        got_meta = [json.loads(l) for l in open(os.path.join(dm, "metrics.jsonl")) if l.strip()][1]["peak_bytes"]
        got_cpu = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()][1]["peak_bytes"]
        for cat in ("params", "grads", "optimizer", "checkpoints", "vocab", "comm"):
            assert got_meta[cat] == got_cpu[cat], f"bf16 W={w} {cat}: meta {got_meta[cat]} B, cpu {got_cpu[cat]} B"
        print(f"bf16, W={w}: meta peaks params/grads/optimizer/comm {got_meta['params']}/{got_meta['grads']}/"
              f"{got_meta['optimizer']}/{got_meta['comm']} B, as on cpu")


def case_train(tmp):
    single = os.path.join(tmp, "w1")
    ok(mpirun(1, train_args(single, 10)), "single-process training")
    ref = losses(single)
    for w in (2, 4):
        d = os.path.join(tmp, f"w{w}")
        ok(mpirun(w, train_args(d, 10)), f"training on {w} ranks")
        got = losses(d)
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        print(f"W={w}: 10 losses track one process within {rel:.2e}")
        assert len(got) == 10 and rel <= 1e-4, (got, ref)
        m = json.loads(open(os.path.join(d, "metrics.jsonl")).readline())
        assert m["ranks"] == w and "peak_rank" in m, m
        # meta allocates what cpu does: the sharded parameters, gathered units and optimizer shards
        # (the categories that do not depend on the routing) peak alike.
        dm = os.path.join(tmp, f"meta{w}")
        ok(mpirun(w, train_args(dm, 10, ["--device", "meta", "--stop-after", "2"])), f"meta on {w} ranks")
        got_meta = [json.loads(l) for l in open(os.path.join(dm, "metrics.jsonl")) if l.strip()][1]["peak_bytes"]
        got_cpu = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()][1]["peak_bytes"]
        for cat in ("params", "grads", "optimizer", "checkpoints", "vocab"):
            assert got_meta[cat] == got_cpu[cat], f"W={w} {cat}: meta {got_meta[cat]} B, cpu {got_cpu[cat]} B"
        print(f"W={w}: meta peaks params/grads/optimizer {got_meta['params']}/{got_meta['grads']}/"
              f"{got_meta['optimizer']} B, as on cpu")


def case_train_mesh(tmp):
    """Note [A device mesh] and [Gradient accumulation], through flatpeak train: 5 steps of one process on a
    global batch of 4 sequences against dp4 (4 ranks), dp2 x cp2 (4 ranks) and dp2 x cp1 (2 ranks) with 2
    micro-batches, each with batch_size sequences per replica so that the global batch is the same: every
    loss within 1e-5 (without the load-balancing loss, a statistic of each micro-batch), the global tokens
    per step reported; a bad layout refused by name; a checkpoint of dp2 x cp2 resumes on one process, on
    cp4 and on dp4."""
    common = ["--set", "model.router_aux_loss_coef=0"]
    single = os.path.join(tmp, "w1")
    ok(mpirun(1, train_args(single, 5, common + ["--set", "train.batch_size=4"])), "one process, batch 4")
    ref = losses(single)
    for w, extra in ((4, ["parallel.dp=4", "train.batch_size=1"]), (4, ["parallel.dp=2", "train.batch_size=2"]),
                     (2, ["parallel.dp=2", "train.batch_size=1", "train.grad_accum=2"])):
        d = os.path.join(tmp, f"mesh_{w}_{'_'.join(extra)}")
        sets = [x for e in extra for x in ("--set", e)]
        ok(mpirun(w, train_args(d, 5, common + sets)), f"training on {w} ranks with {extra}")
        got = losses(d)
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        tokens = [json.loads(l)["tokens"] for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()]
        print(f"W={w} {' '.join(extra)}: 5 losses track one process on batch 4 within {rel:.2e}, tokens {tokens[0]}")
        assert len(got) == 5 and rel <= 1e-5 and tokens == [4 * 128] * 5, (got, ref, tokens)
    # dp2 x cp2, stopped after 3 steps, resumed on one process (batch 4), on cp4 (4 ranks, one replica of 4
    # sequences) and on dp4 (4 replicas of 1): the same global batch each time.
    for w, layout in ((1, ["train.batch_size=4"]), (4, ["train.batch_size=4"]),
                      (4, ["parallel.dp=4", "train.batch_size=1"])):
        d = os.path.join(tmp, f"resume_{w}_{'_'.join(layout)}")
        ok(mpirun(4, train_args(d, 5, common + ["--set", "parallel.dp=2", "--set", "train.batch_size=2",
                                                "--stop-after", "3"])), "dp2 x cp2, 3 steps")
        sets = [x for e in layout for x in ("--set", e)]
        p = ok(mpirun(w, train_args(d, 5, common + sets + ["--resume", d])), f"resumed on {w} with {layout}")
        got = losses(d)
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        print(f"dp2 x cp2 resumed on {w} rank(s) with {' '.join(layout)}: 5 losses within {rel:.2e} of one process")
        assert rel <= 1e-5 and "parallel.dp" in p.stderr, (got, ref, p.stderr[-2000:])
    bad = mpirun(4, train_args(os.path.join(tmp, "bad"), 1, ["--set", "parallel.dp=3"]))
    assert bad.returncode != 0 and "parallel.dp = 3" in bad.stderr, bad.stderr[-2000:]
    bad = mpirun(2, train_args(os.path.join(tmp, "bad2"), 1, ["--set", "parallel.fsdp=3"]))
    assert bad.returncode != 0 and "parallel.fsdp = 3 does not divide the 2 ranks" in bad.stderr, bad.stderr[-2000:]


def grad_norms(out):
    return [json.loads(l)["grad_norm"] for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]


def final_weights(out, steps):
    return safetensors_io.load(os.path.join(out, f"step-{steps:08d}", "model.safetensors"))[0]


def weights_rel(got, want):
    """The worst norm-relative difference over the tensors of two checkpoints (the same names)."""
    assert sorted(got) == sorted(want), "other tensor names"
    worst = 0.0
    for name, t in want.items():
        worst = max(worst, (got[name].double() - t.double()).norm().item() / max(t.double().norm().item(), 1e-30))
    return worst


def layouts_against_one_process(tmp, layouts, resumes, bad, meta=True):
    """5 steps of one process on a global batch of 4 sequences against each (name, W, --set items) layout:
    every loss and gradient norm within 1e-5 relative, the final weights within 1e-5 (norm-relative); the
    first layout also on meta, unless meta is False (params, grads and optimizer peaks as cpu); a checkpoint of the first layout
    after 3 steps resumed on each of `resumes`; each (W, --set item, message) of `bad` refused by name."""
    steps = 5
    base = ["--set", "train.checkpoint_every=5"]
    single = os.path.join(tmp, "w1")
    ok(mpirun(1, train_args(single, steps, base + ["--set", "train.batch_size=4"])), "one process, batch 4")
    ref, ref_w, ref_norm = losses(single), final_weights(single, steps), grad_norms(single)
    for i, (name, w, extra, *mpi_opts) in enumerate(layouts):
        d = os.path.join(tmp, name)
        sets = [x for e in extra for x in ("--set", e)]
        t0 = time.time()
        p = ok(mpirun(w, train_args(d, steps, base + sets), *mpi_opts), f"{name} on {w} ranks")
        secs = time.time() - t0
        got = losses(d)
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        wrel = weights_rel(final_weights(d, steps), ref_w)
        nrel = max(abs(a - b) / b for a, b in zip(grad_norms(d), ref_norm))  # each element counted once
        print(f"{name} ({w} ranks{f' on {HOSTS} hosts' if HOSTS else ''}, {secs:.1f} s): {steps} losses within "
              f"{rel:.2e} of one process, gradient norms within {nrel:.2e}, final weights within {wrel:.2e}")
        assert len(got) == steps and rel <= 1e-5 and nrel <= 1e-5 and wrel <= 1e-5, (name, got, ref, nrel, wrel)
        assert "mesh: " in p.stderr, p.stderr[-2000:]
        if i == 0 and meta:  # meta allocates what cpu does in the categories the routing does not move
            dm = os.path.join(tmp, name + "_meta")
            ok(mpirun(w, train_args(dm, steps, base + sets + ["--device", "meta", "--stop-after", "2"]), *mpi_opts),
               "meta")
            peak = lambda out: [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()][1][
                "peak_bytes"]
            got_meta, got_cpu = peak(dm), peak(d)
            for cat in ("params", "grads", "optimizer"):
                assert got_meta[cat] == got_cpu[cat], f"{name} {cat}: meta {got_meta[cat]} B, cpu {got_cpu[cat]} B"
    name, w0, first, *mpi_opts0 = layouts[0]
    for w, layout in resumes:
        d = os.path.join(tmp, f"resume_{w}_{'_'.join(layout)}")
        sets0 = [x for e in first for x in ("--set", e)]
        ok(mpirun(w0, train_args(d, steps, base + sets0 + ["--stop-after", "3"]), *mpi_opts0), f"{name}, 3 steps")
        sets = [x for e in layout for x in ("--set", e)]
        ok(mpirun(w, train_args(d, steps, base + sets + ["--resume", d])), f"resumed on {w} with {layout}")
        rel = max(abs(a - b) / abs(b) for a, b in zip(losses(d), ref))
        wrel = weights_rel(final_weights(d, steps), ref_w)
        print(f"{name} resumed on {w} rank(s) with {' '.join(layout)}: losses within {rel:.2e}, weights {wrel:.2e}")
        assert rel <= 1e-5 and wrel <= 1e-5, (losses(d), ref, wrel)
    for w, item, says in bad:
        p = mpirun(w, train_args(os.path.join(tmp, "bad_" + item.replace("=", "_")), 1, ["--set", item]))
        assert p.returncode != 0 and says in p.stderr, (item, p.stderr[-2000:])


FLAT = ["vocab.schedule=ring", "ckpt.schedule=sco", "moe.dispatch=pipelined_llep", "optim.schedule=offload_stream",
        "llep.lambda=1.0", "llep.min_tokens_per_gemm=4", "pipelined.chunk_cap=16"]


def case_train_ep(tmp):
    """Note [Experts in groups]: experts in groups of parallel.ep ranks against one process: ep = 2 on dp2 x cp2 (a
    group per replica) and on cp4 (two groups inside one replica), ep = 1 (every rank holds every expert, nothing
    dispatched), LLEP within groups of 2, and the four flattened schedules together on dp2 x cp2 with ep = 2;
    resumed across ep; bad values refused by name."""
    dp2 = ["parallel.dp=2", "train.batch_size=2"]
    layouts_against_one_process(
        tmp,
        (("dp2_cp2_ep2", 4, dp2 + ["parallel.ep=2"]),
         ("cp4_ep2", 4, ["train.batch_size=4", "parallel.ep=2"]),
         ("dp2_cp2_ep1", 4, dp2 + ["parallel.ep=1"]),
         ("dp2_ep1", 2, dp2 + ["parallel.ep=1"]),
         ("cp4_ep2_llep", 4, ["train.batch_size=4", "parallel.ep=2", "moe.dispatch=llep", "llep.lambda=1.0",
                              "llep.min_tokens_per_gemm=4"]),
         ("dp2_cp2_ep2_flat", 4, dp2 + ["parallel.ep=2"] + FLAT)),
        resumes=((1, ["train.batch_size=4"]), (4, dp2 + ["parallel.ep=1"])),
        bad=((4, "parallel.ep=3", "parallel.ep = 3 does not divide the 4 ranks"),
             (4, "parallel.ep=8", "parallel.ep = 8 does not divide the 4 ranks")))
    # tiny.toml has 8 experts: a group of 3 ranks would leave them uneven.
    bad = mpirun(3, train_args(os.path.join(tmp, "bad_e"), 1, ["--set", "train.seq_len=96"]))
    assert bad.returncode != 0 and "8 experts cannot be spread evenly over 3 ranks" in bad.stderr, bad.stderr[-2000:]


def case_train_hsdp(tmp):
    """Note [Dense shards in groups] (HSDP): dense parameters sharded within groups of parallel.fsdp ranks against
    one process: fsdp = 2 on dp2 x cp2 and on cp4, fsdp = 1 (every rank holds every dense parameter; Ring-DTP then a
    ring of one), Ring-DTP within groups of 2 (both ring modes), and the four flattened schedules with ep = 2 and
    fsdp = 2; resumed across fsdp; a bad value refused by name."""
    dp2 = ["parallel.dp=2", "train.batch_size=2"]
    layouts_against_one_process(
        tmp,
        (("dp2_cp2_fsdp2", 4, dp2 + ["parallel.fsdp=2"]),
         ("cp4_fsdp2", 4, ["train.batch_size=4", "parallel.fsdp=2"]),
         ("dp2_fsdp1_ring", 2, dp2 + ["parallel.fsdp=1", "vocab.schedule=ring"]),
         ("cp4_fsdp2_ring_weights", 4, ["train.batch_size=4", "parallel.fsdp=2", "vocab.schedule=ring",
                                        "vocab.ring_mode=weights"]),
         ("cp4_fsdp2_ring_activations", 4, ["train.batch_size=4", "parallel.fsdp=2", "vocab.schedule=ring",
                                            "vocab.ring_mode=activations"]),
         ("dp2_cp2_fsdp2_ep2_flat", 4, dp2 + ["parallel.fsdp=2", "parallel.ep=2"] + FLAT)),
        resumes=((1, ["train.batch_size=4"]), (4, dp2)),
        bad=((4, "parallel.fsdp=3", "parallel.fsdp = 3 does not divide the 4 ranks"),))
    # The bf16 recipe: the replicas' gradients are bf16 sums (Note [Summing bf16 over ranks] in comm/comm.h); 10
    # steps track one bf16 process within 1e-3, as case_train_bf16's W ranks do.
    bf16 = ["--set", "precision.recipe=bf16"]
    single = os.path.join(tmp, "bf16_w1")
    ok(mpirun(1, train_args(single, 10, bf16 + ["--set", "train.batch_size=4"])), "one process, bf16")
    d = os.path.join(tmp, "bf16_groups")
    sets = [x for e in dp2 + ["parallel.fsdp=2", "parallel.ep=2"] for x in ("--set", e)]
    ok(mpirun(4, train_args(d, 10, bf16 + sets)), "bf16, dp2 x cp2, ep = fsdp = 2")
    rel = max(abs(a - b) / abs(b) for a, b in zip(losses(d), losses(single)))
    print(f"bf16, dp2 x cp2 with ep = fsdp = 2: 10 losses track one process within {rel:.2e}")
    assert len(losses(d)) == 10 and rel <= 1e-3, (losses(d), losses(single))


DEEPSEEK = ["model.model_type=deepseek_v3", "model.num_key_value_heads=4", "model.q_lora_rank=24",
            "model.kv_lora_rank=16", "model.qk_nope_head_dim=12", "model.qk_rope_head_dim=16", "model.v_head_dim=10",
            "model.n_shared_experts=1", "model.n_group=4", "model.topk_group=2", "model.routed_scaling_factor=2.5",
            "model.first_k_dense_replace=1", "model.intermediate_size=96", "model.router_aux_loss_coef=0",
            "moe.bias_update_rate=0.01"]


def case_train_deepseek(tmp):
    """DeepSeek-V3's layer (configs/tiny.toml reshaped): 10 steps on 2 ranks track one process within
    1e-4 with the routing bias moving every step (loads summed over the ranks); a run stopped after 4
    steps on 2 ranks and resumed on one process ends with the same losses."""
    sets = [a for kv in DEEPSEEK for a in ("--set", kv)]
    one = os.path.join(tmp, "ds1")
    ok(mpirun(1, train_args(one, 10, sets)), "deepseek, one process")
    ref = losses(one)
    two = os.path.join(tmp, "ds2")
    ok(mpirun(2, train_args(two, 10, sets)), "deepseek, 2 ranks")
    rel = max(abs(a - b) / abs(b) for a, b in zip(losses(two), ref))
    print(f"deepseek W=2: 10 losses track one process within {rel:.2e}")
    assert len(losses(two)) == 10 and rel <= 1e-4, (losses(two), ref)
    half = os.path.join(tmp, "ds_half")
    ok(mpirun(2, train_args(half, 10, sets + ["--stop-after", "4"])), "deepseek, 2 ranks, first 4 steps")
    ok(mpirun(1, train_args(half, 10, sets + ["--resume", half])), "deepseek, one process resumes")
    rel = max(abs(a - b) / abs(b) for a, b in zip(losses(half), ref))
    print(f"deepseek: 2 ranks to step 4, one process on: losses within {rel:.2e} of one process throughout")
    assert len(losses(half)) == 10 and rel <= 1e-4, (losses(half), ref)


def case_ckpt(tmp):
    ref_dir = os.path.join(tmp, "ref")
    ok(mpirun(1, train_args(ref_dir, 4)), "reference run")
    ref = losses(ref_dir)
    # One process stops at step 2: the checkpoint every W must write.
    c = os.path.join(tmp, "c")
    ok(mpirun(1, train_args(c, 4, ["--stop-after", "2"])), "one process, first half (reference checkpoint)")
    # 2 ranks write, one process resumes.
    a = os.path.join(tmp, "a")
    ok(mpirun(2, train_args(a, 4, ["--stop-after", "2"])), "2 ranks, first half")
    ok(mpirun(1, train_args(a, 4, ["--resume", a])), "one process resumes")
    # One process writes, 2 ranks resume.
    b = os.path.join(tmp, "b")
    ok(mpirun(1, train_args(b, 4, ["--stop-after", "2"])), "one process, first half")
    ok(mpirun(2, train_args(b, 4, ["--resume", b])), "2 ranks resume")
    # 4 ranks write, 2 ranks resume (other row blocks than the writer's).
    d = os.path.join(tmp, "d")
    ok(mpirun(4, train_args(d, 4, ["--stop-after", "2"])), "4 ranks, first half")
    step2 = {w: os.path.join(x, "step-00000002") for w, x in ((1, c), (2, a), (4, d))}
    ok(mpirun(2, train_args(d, 4, ["--resume", d])), "2 ranks resume")
    # The files do not depend on W: the same names and full shapes, the same values up to rounding.
    for f in ("model.safetensors", "optimizer.safetensors"):
        want, _ = safetensors_io.load(os.path.join(step2[1], f))
        for w in (2, 4):
            got, _ = safetensors_io.load(os.path.join(step2[w], f))
            assert sorted(got) == sorted(want), f"W={w} {f}: other tensor names"
            worst = 0.0
            for name, t in want.items():
                assert got[name].shape == t.shape, f"W={w} {f} {name}: shape {got[name].shape} vs {t.shape}"
                err = (got[name].double() - t.double()).norm().item() / max(t.double().norm().item(), 1e-30)
                worst = max(worst, err)
                assert err <= 1e-5, f"W={w} {f} {name}: norm-relative difference {err:.2e}"
            print(f"W={w} {f}: {len(want)} whole tensors as one process wrote them (worst {worst:.2e})")
    for x in (a, b, d):
        got = losses(x)
        rel = max(abs(u - v) / abs(v) for u, v in zip(got, ref))
        print(f"{os.path.basename(x)}: losses {['%.6f' % u for u in got]} within {rel:.2e} of one process")
        assert len(got) == 4 and rel <= 1e-5


def case_failure(tmp):
    # A rank-local failure: rank 1 fails at step 2 (FLATPEAK_FAIL_RANK, a test hook), the other ranks
    # are inside collectives by then.
    for np_, spec in ((2, "1:2"), (4, "3:1")):
        env = dict(ENV, FLATPEAK_FAIL_RANK=spec)
        t0 = time.time()
        p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)] +
                           train_args(os.path.join(tmp, f"f{np_}"), 50), capture_output=True, text=True, env=env,
                           timeout=120)
        dt = time.time() - t0
        rank = spec.split(":")[0]
        print(f"np={np_}, rank {rank} fails: exit {p.returncode} after {dt:.1f} s")
        assert p.returncode != 0, p.stderr
        assert dt < 30, f"took {dt:.1f} s"
        assert p.stderr.count("injected failure") == 1, p.stderr
        assert f"[rank {rank}]" in p.stderr, p.stderr
    # The same error on every rank (a bad config key) is printed once.
    p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4"] +
                       train_args(os.path.join(tmp, "g"), 5, ["--set", "model.hiden_size=3"]),
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode != 0
    assert p.stderr.count("unknown key model.hiden_size") == 1, p.stderr
    print("a failed rank ends the run promptly; each error printed once")


def hosts_or_skip(n):
    """Note [Hosts as network namespaces] (netns_hosts): exits 77 (ctest's SKIP_RETURN_CODE), saying why, where
    namespaces cannot be made here."""
    global HOSTS
    p = subprocess.run([NETNS_HOSTS, "--hosts", str(n), "--probe"], capture_output=True, text=True)
    if p.returncode == 77:
        print(p.stderr.strip())
        sys.exit(77)
    ok(p, "netns_hosts --probe")
    HOSTS = n


def case_hosts(tmp):
    """Issue 51, item 1: 4 ranks on 2 hosts (network namespaces joined by a bridge; Open MPI over TCP only, each
    host's ranks started in its namespace by the rsh launcher) against one process: losses, gradient norms and
    final weights within 1e-5. dp2 x cp2 with ep = fsdp = 2, ranks dealt to the hosts round-robin (--map-by node:
    every cp pair, expert group and dense-shard group spans the two hosts, and so does each replica), and cp4 with
    ep = fsdp = 2 and the four flattened schedules, ranks host by host (--map-by slot: the ring crosses between the
    hosts twice, the expert and dense-shard groups stay within one); a checkpoint of the first written on 2 hosts
    and resumed on one process. (meta against cpu is case_train_ep's: nothing of it depends on the hosts.)"""
    hosts_or_skip(2)
    dp2 = ["parallel.dp=2", "train.batch_size=2"]
    layouts_against_one_process(
        tmp,
        (("dp2_cp2_ep2_fsdp2_by_node", 4, dp2 + ["parallel.ep=2", "parallel.fsdp=2"], ["--map-by", "node"]),
         ("cp4_ep2_fsdp2_flat_by_slot", 4, ["train.batch_size=4", "parallel.ep=2", "parallel.fsdp=2"] + FLAT,
          ["--map-by", "slot"])),
        resumes=((1, ["train.batch_size=4"]),), bad=(), meta=False)


def hosts_run_killed(tmp, name, kill, mpi_opts=(), bound=60):
    """A 50-step run of 4 ranks on 2 hosts; once 2 steps are done, kill(netns_hosts_pid, out) does something to host
    1. Returns (mpirun's exit status, seconds from the kill until mpirun has ended and no process of the run is left
    on either host, mpirun's stderr); fails past bound seconds."""
    d = os.path.join(tmp, name)
    p = subprocess.Popen(mpirun_cmd(4, train_args(d, 50), mpi_opts), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=ENV)
    deadline = time.time() + 120
    metrics = os.path.join(d, "metrics.jsonl")
    while p.poll() is None and time.time() < deadline and (
            not os.path.exists(metrics) or sum(1 for l in open(metrics) if l.strip()) < 2):
        time.sleep(0.1)
    assert p.poll() is None, f"the run ended before the kill: {p.communicate()}"
    kill(p.pid, d)
    t0 = time.time()
    try:
        out, err = p.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        p.kill()  # netns_hosts; what it started is left to the next run's sweep and the leftovers below
        out, err = p.communicate()
        left = [pid for pid in os.listdir("/proc") if pid.isdigit() and d in proc_cmdline(pid)]
        for pid in left:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        sys.exit(f"FAILED: {name}: mpirun still running {bound} s after the kill\n{err[-3000:]}")
    while True:  # the other host's ranks end on their own (their daemon lost mpirun, or mpirun told it)
        left = [pid for pid in os.listdir("/proc") if pid.isdigit() and d in proc_cmdline(pid)]
        if not left or time.time() - t0 > bound:
            break
        time.sleep(0.1)
    dt = time.time() - t0
    assert not left, f"{name}: processes of the run left {bound} s after the kill: {left}"
    assert p.returncode != 0, f"{name}: exit 0\n{err[-3000:]}"
    return p.returncode, dt, err


def proc_cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def proc_env(pid):
    try:
        return dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ", "rb").read().decode(
            errors="replace").split("\0") if "=" in kv)
    except OSError:
        return {}


def in_netns(pid, ns):
    """Whether process pid is in the named network namespace (ip netns's /run/netns/ns)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net") == f"net:[{os.stat('/run/netns/' + ns).st_ino}]"
    except OSError:
        return False


def case_hosts_kill(tmp):
    """Issue 51, item 3: on 4 ranks over 2 hosts, mid-run: rank 3 (on host 1) killed with SIGKILL; every process of
    host 1 (its Open MPI daemon and both its ranks: the host lost) killed the same way; host 1 cut off the network
    (a partition, with Open MPI's TCP keepalives shortened). Each time every rank of both hosts ends and mpirun
    exits non-zero within 60 s of the event (measured: see the output)."""
    hosts_or_skip(2)
    bound = 60

    def kill_rank3(netns_pid, out):
        pids = [pid for pid in os.listdir("/proc") if pid.isdigit() and out in proc_cmdline(pid) and
                proc_env(pid).get("OMPI_COMM_WORLD_RANK") == "3"]
        assert len(pids) == 1, f"rank 3: {pids}"
        assert in_netns(pids[0], f"fph{netns_pid}-h1"), "rank 3 is not on host 1"
        os.kill(int(pids[0]), signal.SIGKILL)

    def kill_host1(netns_pid, out):
        pids = [pid for pid in os.listdir("/proc") if pid.isdigit() and in_netns(pid, f"fph{netns_pid}-h1")]
        assert len(pids) >= 3, f"host 1 runs {pids}: its daemon and 2 ranks expected"
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def cut_host1(netns_pid, out):  # its link to the switch down: no FIN, no RST, nothing more arrives
        subprocess.run(["ip", "-n", f"fph{netns_pid}-sw", "link", "set", "h1", "down"], check=True)

    # A partition leaves every connection open: only TCP keepalives on mpirun's links to its daemons notice it
    # (Open MPI's default, 300 s idle then 9 probes 20 s apart, would take 8 minutes; docs/cluster.md).
    keepalive = ["--mca", "oob_tcp_keepalive_time", "5", "--mca", "oob_tcp_keepalive_intvl", "2",
                 "--mca", "oob_tcp_keepalive_probes", "3"]
    for name, kill, opts in (("rank 3 killed", kill_rank3, ()), ("host 1 lost", kill_host1, ()),
                             ("host 1 cut off", cut_host1, keepalive)):
        rc, dt, err = hosts_run_killed(tmp, name.replace(" ", "_"), kill, opts, bound)
        said = " / ".join(l.strip() for l in err.splitlines() if not l.startswith("[flatpeak]") and any(
            w in l for w in ("noticed", "ORTE has lost", "daemon", "unexpectedly disconnected")))
        print(f"{name}: mpirun exit {rc}, every rank gone {dt:.1f} s after; mpirun: {said!r}")


def case_bench(tmp):
    """Not a ctest: the Multi-process table of docs/benchmarks.md. W = 1, 2, 4 in one run on the same
    global batch (2 x 1024 tokens of configs/tiny.toml); per W the per-rank peak of every category (the
    maximum over ranks, exact) and the median tokens/s over the steps after the first."""
    cats = ["activations", "checkpoints", "vocab", "dispatch", "comm", "params", "grads", "optimizer"]
    rows = {}
    for w in (1, 2, 4):
        d = os.path.join(tmp, f"bench{w}")
        ok(mpirun(w, train_args(d, A.steps, ["--set", "train.seq_len=1024"])), f"bench on {w} ranks")
        lines = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()]
        tps = sorted(l["tokens_per_s"] for l in lines[1:])
        last = lines[-1]
        rows[w] = {"device_peak_bytes": last["device_peak_bytes"], "peak_bytes": last["peak_bytes"],
                   "peak_rank": last.get("peak_rank", {}), "tokens_per_s_median": tps[len(tps) // 2],
                   "tokens_per_s": [l["tokens_per_s"] for l in lines[1:]], "loss": last["loss"]}
    print("| W | device peak | " + " | ".join(cats) + " | tokens/s (median) |")
    print("|---" * (len(cats) + 3) + "|")
    for w, r in rows.items():
        cells = [f"{r['peak_bytes'][c]:,}" + (f" ({r['peak_bytes'][c] / rows[1]['peak_bytes'][c]:.2f}x)"
                                              if w > 1 and rows[1]["peak_bytes"][c] else "") for c in cats]
        print(f"| {w} | {r['device_peak_bytes']:,} ({r['device_peak_bytes'] / rows[1]['device_peak_bytes']:.2f}x) | "
              + " | ".join(cells) + f" | {r['tokens_per_s_median']:.0f} |")
    losses = {w: r["loss"] for w, r in rows.items()}
    print(f"last-step losses {losses}")
    if A.json:
        with open(A.json, "w") as f:
            json.dump({"command": "tests/dist/dist_check.py bench", "steps": A.steps, "global_batch": [2, 1024],
                       "ranks": rows}, f, indent=1)


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("--json", help="bench: write the figures here")
    ap.add_argument("--steps", type=int, default=7, help="bench: training steps per W (the first is not timed)")
    ap.add_argument("case")
    A = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="flatpeak_dist_")
    try:
        globals()["case_" + A.case](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
