#!/usr/bin/env python3
"""End-to-end tests of `flatpeak plan` (no torch needed).

usage: test_plan.py --bin build/flatpeak --configs configs CASE
cases: presets_json_plot  matches_meta_step  bad_inputs  compare_timeline  from_run_config  choose_every
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.dom.minidom

CATEGORIES = ["params", "grads", "optimizer", "activations", "checkpoints", "dispatch", "vocab", "comm", "workspace"]


def run(args, check=True):
    p = subprocess.run(args, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def presets_json_plot(a, tmp):
    """Every preset plans at 1M on 8 ranks with its JSON (statuses); one with both reaches and the SVG."""
    models = sorted(os.listdir(os.path.join(a.configs, "models")))
    assert len(models) >= 7, models
    approx_seen = exact_seen = False
    for m in models:
        out_json = os.path.join(tmp, m + ".json")
        args = [a.bin, "plan", "--model", os.path.join(a.configs, "models", m), "--context", "1M", "--ranks", "8",
                "--device-mem", "141GB", "--host-mem", "250GB", "--no-reach", "--json", out_json]
        p = run(args)
        assert "step peak" in p.stdout and "planned by the engine on meta: 8 rank(s)" in p.stdout, p.stdout
        j = json.load(open(out_json))
        assert set(j["peaks"]) == set(CATEGORIES), j["peaks"].keys()
        total_at_peak = sum(j["peaks"][c]["at_step_peak"] for c in CATEGORIES)
        assert total_at_peak == j["step_peak"], (m, total_at_peak, j["step_peak"])
        assert j["precision"]["params"] == "bf16" and j["precision"]["master"] == "f32", j["precision"]
        if j["model"]["approximate"]:
            # a model the engine only approximates (MLA as GQA, another model type): every figure says so,
            # and --strict refuses it
            assert not j["exact"] and j["approximate"], (m, j["approximate"])
            assert j["peaks"]["params"]["status"].startswith("approximate"), j["peaks"]["params"]
            assert "APPROXIMATE:" in p.stdout, p.stdout
            q = run(args + ["--strict"], check=False)
            assert q.returncode == 3 and "--strict" in q.stderr, (q.returncode, q.stderr)
            approx_seen = True
        else:
            assert j["exact"] and j["peaks"]["params"]["status"] == "exact (the engine ran it on meta)", (m, j)
            run(args + ["--strict"])
            exact_seen = True
    assert approx_seen and exact_seen
    # both reaches and the plot on the paper's 7-layer model at its 16 ranks
    out_json, out_svg = os.path.join(tmp, "p7.json"), os.path.join(tmp, "p7.svg")
    p = run([a.bin, "plan", "--model", os.path.join(a.configs, "models", "paper-7l.toml"), "--context", "1M",
             "--device-mem", "141GB", "--host-mem", "250GB", "--json", out_json, "--plot", out_svg])
    assert "reach at" in p.stdout, p.stdout
    j = json.load(open(out_json))
    for sched in ("baseline", "flatpeak"):
        r = j["reach"][sched]
        assert r["max_context"] > 0 and not r["capped"] and r["max_context"] % 32 == 0, (sched, r)
    assert j["reach"]["flatpeak"]["max_context"] > 4 * j["reach"]["baseline"]["max_context"], j["reach"]
    xml.dom.minidom.parse(out_svg)  # well-formed
    assert open(out_svg).read().count("<polyline") >= 18
    # one rank, plain, f32: every category exact; --set takes the run config's [precision] keys
    out_json = os.path.join(tmp, "tiny.json")
    run([a.bin, "plan", "--model", os.path.join(a.configs, "tiny.toml"), "--context", "256", "--set",
         'precision.recipe="fp32"', "--schedule", "optim=device", "--json", out_json])
    j = json.load(open(out_json))
    assert all(j["peaks"][c]["status"] == "exact (the engine ran it on meta)" for c in CATEGORIES), j["peaks"]
    assert j["reach"] is None and j["exact"] and j["precision"]["params"] == "f32"


def matches_meta_step(a, tmp):
    """The plan of a forward+backward equals `flatpeak step --device meta` in every category the step
    touches (the step command builds no optimizer, so optimizer and its workspace scalar are left out)."""
    cfg = os.path.join(a.configs, "tiny.toml")
    for T, B, extra in [(256, 4, []), (1000, 2, ["--set", "model.num_hidden_layers=5"]),
                        (512, 1, ["--set", "vocab.schedule=ring", "--set", "ckpt.schedule=sco"])]:
        out = os.path.join(tmp, f"step{T}")
        run([a.bin, "step", "--config", cfg, "--device", "meta", "--set", f"train.seq_len={T}", "--set",
             f"train.batch_size={B}", "--out", out] + extra)
        step = json.load(open(os.path.join(out, "step.json")))
        model = cfg
        if "model.num_hidden_layers=5" in extra:
            model = os.path.join(tmp, "tiny5.toml")
            open(model, "w").write(open(cfg).read().replace("num_hidden_layers = 2", "num_hidden_layers = 5"))
        sched = ["dtype=f32", "optim=device", f"batch={B}"]
        if "vocab.schedule=ring" in extra:
            sched += ["vocab=ring", "ckpt=sco"]
        pj = os.path.join(tmp, f"plan{T}.json")
        args = [a.bin, "plan", "--model", model, "--context", str(T), "--json", pj]
        for s in sched:
            args += ["--schedule", s]
        run(args)
        plan = json.load(open(pj))
        for c in ["params", "grads", "activations", "checkpoints", "dispatch", "vocab", "comm"]:
            assert plan["peaks"][c]["bytes"] == step["peak_bytes"][c], (T, c, plan["peaks"][c], step["peak_bytes"][c])


def bad_inputs(a, tmp):
    cases = [
        (["--model", "/nonexistent.toml", "--context", "1M"], "cannot read model file"),
        (["--model", os.path.join(a.configs, "tiny.toml"), "--context", "1.5M"], "is not a length"),
        (["--model", os.path.join(a.configs, "tiny.toml"), "--context", "1M", "--schedule", "vocab=rings"],
         "not one of full|ring"),
        (["--model", os.path.join(a.configs, "tiny.toml"), "--context", "1M", "--ranks", "4", "--schedule", "ep=2"],
         "the layout is not a schedule"),
        (["--model", os.path.join(a.configs, "tiny.toml"), "--context", "1M", "--mesh", "dp=2,cp=2,ep=3"],
         "ep = 3 does not divide the 4 ranks"),
        (["--model", os.path.join(a.configs, "tiny.toml"), "--context", "1M", "--ranks", "3"],
         "cannot be spread over 3 ranks"),
        (["--model", os.path.join(a.configs, "tiny.toml"), "--context", "1000", "--ranks", "8"],
         "not divisible by 2 x 8 context-parallel ranks"),
        (["--model", os.path.join(a.configs, "tiny.toml"), "--context", "1K", "--set", "train.seq_len=5"],
         "only precision.* keys apply"),
        (["--model", os.path.join(a.configs, "tiny.toml"), "--context", "1K", "--set", "precision.recipe=fp8"],
         "not one of fp32|bf16"),
    ]
    for args, want in cases:
        p = run([a.bin, "plan"] + args, check=False)
        assert p.returncode == 1, (args, p.returncode, p.stderr)
        assert want in p.stderr and "hint:" in p.stderr, (args, p.stderr)
    bad = os.path.join(tmp, "bad.json")
    open(bad, "w").write('{"hidden_size": 8}')
    p = run([a.bin, "plan", "--model", bad, "--context", "1K"], check=False)
    assert p.returncode == 1 and "num_hidden_layers" in p.stderr, p.stderr


def compare_timeline(a, tmp):
    """--compare prints baseline and flatpeak side by side; each column equals that family's own plan
    (a separate run, its JSON); --timeline writes the per-category memory over one step, both panels."""
    tiny = os.path.join(a.configs, "tiny.toml")
    common = ["plan", "--model", tiny, "--context", "64K", "--no-reach", "--set", "precision.recipe=fp32"]
    svg = os.path.join(tmp, "t.svg")
    p = run([a.bin] + common + ["--timeline", svg])
    rows = {}
    for line in p.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] in CATEGORIES and len(parts) >= 6:
            rows[parts[0]] = line
    assert set(rows) == set(CATEGORIES), p.stdout
    for fam in ("baseline", "flatpeak"):
        pj = os.path.join(tmp, fam + ".json")
        run([a.bin] + common + ["--schedule", fam, "--json", pj])
        j = json.load(open(pj))
        col = 1 if fam == "baseline" else 3  # "params  498.75 KiB  498.75 KiB  1.0x": value + unit pairs
        units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
        for c in CATEGORIES:
            parts = rows[c].split()
            value, unit = float(parts[col]), units[parts[col + 1]]
            want = j["peaks"][c]["bytes"]
            assert abs(value * unit - want) <= 0.006 * unit, (fam, c, parts[col:col + 2], want)
    assert "binding:" in p.stdout and "host needed" in p.stdout
    doc = xml.dom.minidom.parse(svg)
    texts = " ".join(t.firstChild.data for t in doc.getElementsByTagName("text") if t.firstChild)
    assert "baseline (peak" in texts and "flatpeak (peak" in texts, texts
    assert len(doc.getElementsByTagName("polygon")) >= 6


def from_run_config(a, tmp):
    """plan --config takes the run config `train` takes: its model, batch, seq_len, every schedule setting and
    [precision] come from the file (--set overriding any key, --schedule applied after it)."""
    cfg = os.path.join(tmp, "run.toml")
    with open(cfg, "w") as f:
        f.write(open(os.path.join(a.configs, "demo.toml")).read())
        f.write('\n[ckpt]\nschedule = "sco"\nhost_budget = "1MiB"\n'
                '[vocab]\nschedule = "ring"\nblock_tokens = 128\n'
                '[moe]\ndispatch = "pipelined_llep"\n[pipelined]\nchunk_cap = 96\n'
                '[precision]\nrecipe = "bf16"\n')
    out = os.path.join(tmp, "plan.json")
    p = run([a.bin, "plan", "--config", cfg, "--ranks", "2", "--json", out])
    assert "ckpt sco" in p.stdout and "vocab ring" in p.stdout and "optim device" in p.stdout, p.stdout
    j = json.load(open(out))
    s = j["schedule"]
    assert (s["ckpt"], s["vocab"], s["dispatch"], s["optim"]) == ("sco", "ring", "pipelined_llep", "device"), s
    assert s["block_tokens"] == 128 and s["chunk_cap"] == 96 and s["host_budget"] == 1 << 20, s
    assert s["optim_requested"] == "device", s  # the run config's optimizer, never the planner's auto
    assert j["context"] == 1024 and j["layout"]["batch"] == 4, (j["context"], j["layout"])  # train.seq_len, batch
    assert j["precision"]["params"] == "bf16" and j["model"]["vocab_size"] == 83, (j["precision"], j["model"])
    # --set overrides any key of the file, --context its seq_len, --schedule applies last.
    run([a.bin, "plan", "--config", cfg, "--set", "ckpt.schedule=device", "--set", "train.batch_size=2",
         "--context", "2K", "--schedule", "optim.schedule=offload_stream", "--schedule", "optim.slots=3",
         "--json", out])
    j = json.load(open(out))
    assert j["schedule"]["ckpt"] == "device" and j["schedule"]["vocab"] == "ring", j["schedule"]
    assert j["schedule"]["optim"] == "offload_stream" and j["schedule"]["slots"] == 3, j["schedule"]
    assert j["context"] == 2048 and j["layout"]["batch"] == 2, (j["context"], j["layout"])
    # The run config's own validation, and one of --model or --config.
    cases = [
        (["--config", cfg, "--set", "pipelined.chunk_cap=0"], "pipelined.chunk_cap = 0 must be >= 1"),
        (["--config", cfg, "--set", "optim.schedule=auto"], "optim.schedule = \"auto\""),
        (["--config", cfg, "--model", cfg], "one of --model and --config"),
        (["--model", cfg], "needs --context"),
    ]
    for args, want in cases:
        p = run([a.bin, "plan"] + args, check=False)
        assert p.returncode == 1 and want in p.stderr, (args, p.returncode, p.stderr)


def choose_every(a, tmp):
    """--choose-every (Note [Boundaries every k layers]): the flatpeak step of a 6-layer model planned for
    ckpt.every = 1, 2, 3, 4, 6: the boundaries kept and the layer forwards added follow from k, SCO's host
    need falls with the boundaries kept (checked against each k's own --json plan), and the chosen k is the
    smallest whose row fits: with nothing limited k = 1; under a device limit below k = 1's peak, the first
    k under it; under a limit below every k's, none."""
    model = os.path.join(tmp, "tiny6.toml")
    open(model, "w").write(open(os.path.join(a.configs, "tiny.toml")).read()
                           .replace("num_hidden_layers = 2", "num_hidden_layers = 6"))
    # The tile given by name: the planner keeps it (Note [The planner shrinks what binds]), so only k moves.
    base = [a.bin, "plan", "--model", model, "--context", "32K", "--no-reach", "--schedule", "flatpeak",
            "--schedule", "precision.recipe=fp32", "--schedule", "ckpt.layer_tile=8192"]
    mib = lambda f, i: float(f[i]) * {"MiB": 2**20, "KiB": 2**10, "GiB": 2**30, "B": 1}[f[i + 1]]

    def table(extra):
        out = run(base + extra + ["--choose-every"]).stdout
        rows = {}
        for line in out.splitlines():
            f = line.split()
            if len(f) >= 9 and f[0].isdigit() and f[3].endswith("%"):
                rows[int(f[0])] = {"kept": int(f[1]), "extra": int(f[2]), "device": mib(f, 4), "host": mib(f, 6),
                                   "fits": f[8] == "yes"}
        return out, rows

    out, rows = table([])
    assert sorted(rows) == [1, 2, 3, 4, 6], out
    assert [rows[k]["kept"] for k in (1, 2, 3, 4, 6)] == [6, 3, 2, 2, 1], out
    assert [rows[k]["extra"] for k in (1, 2, 3, 4, 6)] == [0, 3, 4, 4, 5], out
    assert all(r["fits"] for r in rows.values()) and "chosen: ckpt.every = 1 " in out, out
    for k in (1, 6):
        pj = os.path.join(tmp, f"every{k}.json")
        run(base + ["--schedule", f"ckpt.every={k}", "--json", pj])
        need = json.load(open(pj))["host"]["needed"]
        assert abs(need - rows[k]["host"]) <= 0.01 * 2**20, (k, need, rows[k])
    assert rows[6]["host"] < rows[1]["host"], out
    # A host-bound plan: a host limit between k = 1's need and k = 6's keeps some of k = 1's boundaries on the
    # device (SCO), so its device peak rises; under a device limit below it, a larger k is chosen.
    host = str(int((rows[1]["host"] + rows[6]["host"]) / 2))
    out, bound = table(["--host-mem", host])
    assert bound[1]["device"] > rows[1]["device"], out
    low = min(r["device"] for k, r in bound.items() if k > 1)
    assert low < bound[1]["device"], out
    limit = int((low + bound[1]["device"]) / 2)
    out, limited = table(["--host-mem", host, "--device-mem", str(limit)])
    want = min(k for k, r in bound.items() if r["device"] <= limit)
    assert want > 1 and not limited[1]["fits"] and f"chosen: ckpt.every = {want} " in out, (limit, out)
    out, _ = table(["--host-mem", host, "--device-mem", str(int(low) - 2**20)])
    assert "no k fits" in out, out


def mesh_experts(a, tmp):
    """--mesh dp=2,cp=2,ep=E (Note [Experts in groups]): the planned rank holds E_total / ep experts whole, so its
    parameters grow by exactly the experts it gains against ep = 4 (every dense parameter still sharded over all
    4 ranks), and the plan says the groups; --mesh ...,fsdp=F (Note [Dense shards in groups]): with ep = fsdp = 1
    the planned rank holds the whole model, with fsdp = 2 half its dense rows."""
    cfg = os.path.join(a.configs, "tiny.toml")
    per_rank, said = {}, {}
    for ep in (4, 2, 1):
        pj = os.path.join(tmp, f"ep{ep}.json")
        p = run([a.bin, "plan", "--model", cfg, "--context", "1K", "--mesh", f"dp=2,cp=2,ep={ep}", "--no-reach",
                 "--json", pj])
        j = json.load(open(pj))
        assert j["layout"]["expert_ranks"] == ep, j["layout"]
        per_rank[ep] = j["layout"]["params_per_rank"]
        said[ep] = f"experts in {4 // ep} group(s) of {ep}" in p.stdout
    expert = 3 * 64 * 64  # gate, up and down of one expert: moe_intermediate_size 64, hidden 64
    layers, experts = 2, 8
    for ep in (2, 1):
        gained = layers * (experts // ep - experts // 4) * expert
        assert per_rank[ep] - per_rank[4] == gained, (ep, per_rank, gained)
    assert all(said.values()), said
    # fsdp = 1 and ep = 1 (Note [Dense shards in groups]): every rank holds the whole model; fsdp = 2 about half
    # the dense rows of fsdp = 1 (padding rows aside).
    held = {}
    for fsdp in (1, 2):
        pj = os.path.join(tmp, f"fsdp{fsdp}.json")
        run([a.bin, "plan", "--model", cfg, "--context", "1K", "--mesh", f"dp=2,cp=2,ep=1,fsdp={fsdp}", "--no-reach",
             "--json", pj])
        j = json.load(open(pj))
        assert j["layout"]["shard_ranks"] == fsdp, j["layout"]
        held[fsdp] = j["layout"]["params_per_rank"]
        total = j["model"]["params"]
    dense = total - layers * experts * expert
    assert held[1] == total, (held, total)
    assert dense / 2 <= held[1] - held[2] <= dense / 2 + 4096, (held, dense)


def shrinks_what_binds(a, tmp):
    """Note [The planner shrinks what binds] (src/plan/plan.cpp): the flatpeak preset's Ring-DTP strip and layer
    tile are halved where they bind until the step fits. The tiny model with a 32768 vocabulary at 96K tokens in
    256 MiB: the preset's 1024-token strip (128 MiB of f32 logits) does not fit, the planner's choice does and
    says which strip it took; the strip given by name is kept and does not fit. A context that fits with the
    preset keeps the preset's strip and tile."""
    model = os.path.join(tmp, "tiny32k.toml")
    open(model, "w").write(open(os.path.join(a.configs, "tiny.toml")).read()
                           .replace("vocab_size = 256", "vocab_size = 32768"))
    base = [a.bin, "plan", "--model", model, "--ranks", "1", "--device-mem", "256MiB", "--no-reach", "--schedule",
            "flatpeak", "--schedule", "precision.recipe=fp32", "--schedule", "batch=1"]

    def plan(context, extra=()):
        return run(base + ["--context", context, *extra]).stdout
    out = plan("96K")
    strip = re.search(r"vocab ring \(strips of (\d+) tokens\)", out)
    assert strip and int(strip.group(1)) < 1024 and "device 256.00 MiB: fits" in out, out
    out = plan("96K", ["--schedule", "vocab.block_tokens=1024"])
    assert "strips of 1024 tokens" in out and "device 256.00 MiB: fits" not in out, out
    out = plan("16K")
    assert "strips of 1024 tokens" in out and "tiles of 8192 tokens" in out and "256.00 MiB: fits" in out, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        globals()[a.case](a, tmp)
    print(f"{a.case}: ok")


if __name__ == "__main__":
    sys.exit(main())
