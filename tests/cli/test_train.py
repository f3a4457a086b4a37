#!/usr/bin/env python3
"""End-to-end tests of `flatpeak train` / `flatpeak eval`: resume bit-exactness, atomic checkpoints
under kill -9, clear errors on bad input, the demo's falling loss.

usage: test_train.py --bin build/flatpeak --configs configs CASE
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

ARGS = None
SMALL = ["--set", "train.seq_len=64", "--set", "train.batch_size=2", "--set", "model.num_hidden_layers=2"]


def run(args, expect_ok=True, **kw):
    p = subprocess.run([ARGS.bin] + args, capture_output=True, text=True, **kw)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def tiny():
    return os.path.join(ARGS.configs, "tiny.toml")


def case_resume_bit_exact(tmp, extra=()):
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    common = ["train", "--config", tiny(), "--steps", "10", "--quiet"] + SMALL + list(extra)
    run(common + ["--out", a])
    run(common + ["--out", b, "--stop-after", "4"])
    # The interrupted run wrote a checkpoint at step 4 and metrics for steps 1..4.
    assert [m["step"] for m in metrics(b)] == [1, 2, 3, 4], metrics(b)
    run(common + ["--out", b, "--resume", b])
    ma, mb = metrics(a), metrics(b)
    assert [m["step"] for m in mb] == list(range(1, 11)), [m["step"] for m in mb]
    for x, y in zip(ma, mb):
        for key in ("loss", "aux_loss", "grad_norm", "lr"):
            assert x[key] == y[key], f"step {x['step']} {key}: uninterrupted {x[key]!r} vs resumed {y[key]!r}"
    fa = open(os.path.join(a, "checkpoint", "model.safetensors"), "rb").read()
    fb = open(os.path.join(b, "checkpoint", "model.safetensors"), "rb").read()
    assert fa == fb, "final weights differ between the uninterrupted and the resumed run"
    # Keeping every layer's activations (Note [No recompute]) trains the same run bit for bit.
    c = os.path.join(tmp, "c")
    run(common + ["--out", c, "--set", "ckpt.recompute=false"])
    for x, y in zip(ma, metrics(c)):
        for key in ("loss", "aux_loss", "grad_norm"):
            assert x[key] == y[key], f"step {x['step']} {key}: recompute {x[key]!r} vs no recompute {y[key]!r}"
    fc = open(os.path.join(c, "checkpoint", "model.safetensors"), "rb").read()
    assert fa == fc, "final weights differ between ckpt.recompute = true and false"
    # A key that changes the arithmetic is refused on resume, by name (Note [One key registry]); with
    # DeepSeek's router, its bias step too (an older flatpeak did not record it).
    p = run(common + ["--out", b, "--resume", b, "--set", "optim.lr=0.1"], expect_ok=False)
    assert p.returncode == 1 and "another configuration" in p.stderr and "optim.lr: checkpoint" in p.stderr, p.stderr
    if "moe.bias_update_rate=0.01" in extra:
        p = run(common + ["--out", b, "--resume", b, "--set", "moe.bias_update_rate=0.02"], expect_ok=False)
        assert p.returncode == 1 and "moe.bias_update_rate: checkpoint 0.01, now 0.02" in p.stderr, p.stderr
    # A schedule key may change on resume, and the change is said: a run stopped at step 4 resumed without
    # recompute ends with the same weights (the same arithmetic, bit for bit).
    d = os.path.join(tmp, "d")
    run(common + ["--out", d, "--stop-after", "4"])
    p = run(common + ["--out", d, "--resume", d, "--set", "ckpt.recompute=false"])
    assert "ckpt.recompute: checkpoint true, now false" in p.stderr, p.stderr
    fd = open(os.path.join(d, "checkpoint", "model.safetensors"), "rb").read()
    assert fa == fd, "final weights differ after a resume that changed ckpt.recompute"
    print("resumed losses, and those without recompute, equal the uninterrupted run bit for bit over 10 steps; "
          "a changed arithmetic key is refused by name, a changed schedule key allowed and said")


def safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def case_resume_bit_exact_bf16(tmp):
    """The bf16 recipe on cpu: bf16 weights in model.safetensors, AdamW's f32 master beside the
    moments in optimizer.safetensors, and a resume that continues from the master bit for bit."""
    case_resume_bit_exact(tmp, ["--set", "precision.recipe=bf16"])
    ck = os.path.join(tmp, "a", "checkpoint")
    weights = {k: v for k, v in safetensors_header(os.path.join(ck, "model.safetensors")).items() if k != "__metadata__"}
    assert weights and all(v["dtype"] == "BF16" for v in weights.values()), {v["dtype"] for v in weights.values()}
    state = safetensors_header(os.path.join(ck, "optimizer.safetensors"))
    masters = [k for k in state if k.endswith(".master")]
    assert len(masters) == len(weights) and all(state[k]["dtype"] == "F32" for k in masters), masters[:3]
    print("bf16: weights BF16, the f32 master and moments in the optimizer state")


# DeepSeek-V3's layer on configs/tiny.toml, the routing bias moving by 0.01 per step: the --set list the
# multi-process tests use (tests/dist/dist_check.py), so both run the same model.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dist"))
from dist_check import DEEPSEEK  # noqa: E402


def case_resume_bit_exact_bf16_deepseek(tmp):
    """DeepSeek-V3 in the bf16 recipe on cpu resumes bit for bit (the routing bias moved by the bias update
    between steps included); model.safetensors holds BF16 weights but the routers, mlp.gate.weight and
    e_score_correction_bias, in F32 (Note [Tensors transformers keeps in f32]), and the bias holds values
    no bf16 can (it is kept f32 in training: Note [Parameters kept in f32])."""
    case_resume_bit_exact(tmp, ["--set", "precision.recipe=bf16"] + [a for kv in DEEPSEEK for a in ("--set", kv)])
    ck = os.path.join(tmp, "a", "checkpoint")
    weights = {k: v for k, v in safetensors_header(os.path.join(ck, "model.safetensors")).items() if k != "__metadata__"}
    kept = {k for k in weights if k.endswith(".mlp.gate.weight") or k.endswith(".mlp.gate.e_score_correction_bias")}
    assert kept and all(weights[k]["dtype"] == "F32" for k in kept), {k: weights[k]["dtype"] for k in kept}
    assert all(v["dtype"] == "BF16" for k, v in weights.items() if k not in kept), \
        {k: v["dtype"] for k, v in weights.items() if k not in kept and v["dtype"] != "BF16"}
    state = safetensors_header(os.path.join(ck, "optimizer.safetensors"))
    masters = [k for k in state if k.endswith(".master")]
    assert len(masters) == len(weights) and all(state[k]["dtype"] == "F32" for k in masters), masters[:3]
    f32 = safetensors_f32(os.path.join(ck, "model.safetensors"))
    bias = [x for k in kept if k.endswith("e_score_correction_bias") for x in f32[k]]
    assert any(x != 0 for x in bias), "the routing bias never moved"
    assert any(bf16_round(x) != x for x in bias), f"the routing bias holds bf16 values only: {bias}"
    print(f"bf16 DeepSeek-V3: weights BF16 but the routers F32, the routing bias moved off the bf16 grid "
          f"({len(bias)} values in [{min(bias):.4f}, {max(bias):.4f}])")


def safetensors_f32(path):
    """name -> list of floats of every F32 tensor of a safetensors file (no torch here)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k != "__metadata__" and v["dtype"] == "F32":
            b0, b1 = v["data_offsets"]
            out[k] = list(struct.unpack(f"<{(b1 - b0) // 4}f", data[b0:b1]))
    return out


def bf16_round(x):
    """x rounded to bf16 (nearest, ties to even), as a float."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", u))[0]


def case_bench_step_bf16(tmp):
    """flatpeak bench step in the bf16 recipe: the case file it writes for the PyTorch twins holds the
    model's bf16 weights widened (the fp32 run's initial weights, each rounded once), and the step's GEMMs
    are measured against the bf16 GEMM rate of the same run."""
    cases, js = {}, {}
    for recipe in ("fp32", "bf16"):
        cases[recipe], js[recipe] = os.path.join(tmp, f"{recipe}.safetensors"), os.path.join(tmp, f"{recipe}.json")
        run(["bench", "step", "--config", tiny(), "--warmup", "0", "--repeats", "1", "--case", cases[recipe],
             "--json", js[recipe], "--set", f"precision.recipe={recipe}"] + SMALL)
    f32, b16 = safetensors_f32(cases["fp32"]), safetensors_f32(cases["bf16"])
    names = [k for k in f32 if k not in ("input_ids", "targets")]
    assert names and sorted(names) == sorted(k for k in b16 if k not in ("input_ids", "targets")), names[:3]
    for k in names:
        want = [bf16_round(x) for x in f32[k]]
        assert b16[k] == want, f"{k}: the bf16 case's weights are not the fp32 weights rounded"
    j = json.load(open(js["bf16"]))
    assert j["gemm_peak_dtype"] == "bf16" and j["gemm_peak_flops_per_s"] > 0, j
    assert json.load(open(js["fp32"]))["gemm_peak_dtype"] == "f32"
    # The attention tile copy that ran is said, and FLATPEAK_SIMD lowers it (Note [Tile products with FMA]).
    assert j["attention_kernels"] in ("sse2", "avx2", "avx2+fma", "avx512"), j["attention_kernels"]
    # So is what ran the bf16 GEMMs (Note [bf16 GEMMs on the matrix units]), and FLATPEAK_BF16_GEMM moves them.
    assert j["bf16_gemm"].startswith(("oneDNN", "widened to f32")), j["bf16_gemm"]
    low = os.path.join(tmp, "baseline.json")
    p = run(["bench", "step", "--config", tiny(), "--warmup", "0", "--repeats", "1", "--json", low] + SMALL,
            env=dict(os.environ, FLATPEAK_SIMD="baseline", FLATPEAK_BF16_GEMM="widen"))
    assert "attention tiles: sse2" in p.stdout, p.stdout
    assert "bf16 GEMMs: widened to f32, OpenBLAS sgemm (FLATPEAK_BF16_GEMM=widen)" in p.stdout, p.stdout
    assert json.load(open(low))["attention_kernels"] == "sse2"
    print(f"bench step bf16: {len(names)} weights in the case file are the fp32 ones rounded; GEMMs at "
          f"{100 * j['gemm_fraction_of_peak']:.0f}% of the bf16 GEMM rate {j['gemm_peak_flops_per_s'] / 1e9:.1f} GFLOP/s")


def case_kill_during_checkpoint(tmp):
    """kill -9 at random moments of a run that checkpoints every step, 20 times: each time the run is
    resumed from whatever checkpoint survived (Note [Atomic checkpoints]), and in the end every loss
    and the final weights equal an uninterrupted run's bit for bit."""
    rng = random.Random(5)
    d, u = os.path.join(tmp, "k"), os.path.join(tmp, "u")
    # A larger model so that writing a checkpoint takes a while (more chances to kill mid-write).
    model = ["--set", "model.num_experts=32", "--set", "model.moe_intermediate_size=256", "--set", "train.seq_len=32",
             "--set", "train.batch_size=1"]
    cfg = ["train", "--config", tiny(), "--steps", "1000", "--quiet", "--out", d, "--set", "train.checkpoint_every=1"]
    cfg += model
    kills, mid_write = 0, 0
    for i in range(20):
        has_ck = os.path.exists(os.path.join(d, "checkpoint"))
        args = cfg + (["--resume", d] if has_ck else ["--overwrite"])
        p = subprocess.Popen([ARGS.bin] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # Wait (on a loaded machine, start-up is slow) until this run writes checkpoints, then kill it at
        # a random moment, most likely in the middle of writing one.
        deadline = time.time() + 120
        before = set(os.listdir(d)) if os.path.isdir(d) else set()
        while p.poll() is None and time.time() < deadline and not any(
                n.endswith(".tmp") or (n.startswith("step-") and n not in before)
                for n in (os.listdir(d) if os.path.isdir(d) else [])):
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.0))
        if p.poll() is None:
            mid_write += any(n.endswith(".tmp") for n in os.listdir(d))
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait()
    # Whatever survived resumes: one more step, then the uninterrupted run to the same step.
    assert os.path.exists(os.path.join(d, "checkpoint")), "no checkpoint was ever completed"
    run(cfg + ["--resume", d, "--stop-after", "1"])
    last = json.load(open(os.path.join(d, "checkpoint", "trainer_state.json")))["step"]
    run(["train", "--config", tiny(), "--steps", "1000", "--quiet", "--out", u, "--stop-after", str(last)] + model)
    md, mu = metrics(d), metrics(u)
    assert [m["step"] for m in md] == list(range(1, last + 1)), [m["step"] for m in md]
    for x, y in zip(md, mu):
        assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x["step"], x["loss"], y["loss"])
    fd = open(os.path.join(d, "checkpoint", "model.safetensors"), "rb").read()
    fu = open(os.path.join(u, "checkpoint", "model.safetensors"), "rb").read()
    assert fd == fu, "weights after 20 kills and resumes differ from the uninterrupted run's"
    assert kills >= 15, f"only {kills} kills landed"
    print(f"{kills} kills ({mid_write} with a checkpoint being written); resumed to step {last}: every loss and "
          f"the weights equal the uninterrupted run's")


CRC32C_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ (0x82F63B78 if _c & 1 else 0)
    CRC32C_TABLE.append(_c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ CRC32C_TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def flip_byte(path, at=None):
    with open(path, "r+b") as f:
        size = os.path.getsize(path)
        f.seek(size // 2 if at is None else at)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))


def case_checkpoint_checksums(tmp):
    """Note [Checkpoint checksums], Note [Resuming from the newest sound checkpoint] (train/checkpoint.h): every
    file of a checkpoint is in its manifest with its size and CRC32C; a damaged file is refused by name; --resume of
    the run's folder falls back to the previous complete checkpoint, says so, and still trains the uninterrupted
    run's losses and weights bit for bit (on 2 ranks: said once, one process's losses); train.keep_checkpoints keeps
    that many; a checkpoint without a manifest (an older flatpeak's) loads with a warning."""
    common = ["train", "--config", tiny(), "--steps", "6", "--quiet", "--set", "train.checkpoint_every=2"] + SMALL
    u, a = os.path.join(tmp, "u"), os.path.join(tmp, "a")
    run(common + ["--out", u])
    run(common + ["--out", a, "--stop-after", "4"])
    assert sorted(n for n in os.listdir(a) if n.startswith("step-")) == ["step-00000002", "step-00000004"]
    s4 = os.path.join(a, "step-00000004")
    man = json.load(open(os.path.join(s4, "manifest.json")))
    assert man["format"] == "flatpeak-checkpoint-manifest" and man["version"] == 1 and man["checksum"] == "crc32c"
    want = sorted(n for n in os.listdir(s4) if n != "manifest.json")
    assert sorted(man["files"]) == want == ["config.json", "model.safetensors", "optimizer.safetensors",
                                            "trainer_state.json"], (sorted(man["files"]), want)
    for n, e in man["files"].items():
        assert e["bytes"] == os.path.getsize(os.path.join(s4, n)), (n, e)
        if not n.endswith(".safetensors"):  # the big ones: tests/unit/test_crc32c.cpp checks the sum itself
            assert e["crc32c"] == f"{crc32c(open(os.path.join(s4, n), 'rb').read()):08x}", (n, e)
    # One bit of the newest checkpoint's weights flipped: loading it is refused, naming the file and the earlier
    # checkpoint.
    flip_byte(os.path.join(s4, "model.safetensors"))
    expect_error(["train", "--config", tiny(), "--steps", "2", "--quiet", "--out", os.path.join(tmp, "i"),
                  "--init-from", a] + SMALL,
                 f"checkpoint file '{s4}/model.safetensors' is damaged: CRC32C", "manifest.json says",
                 "step-00000002")
    expect_error(common + ["--out", a, "--resume", s4], f"'{s4}/model.safetensors' is damaged")
    # --resume of the run's folder falls back to step 2 and says so; the run then equals the uninterrupted one.
    p = run(common + ["--out", a, "--resume", a])
    assert "not resuming from a damaged checkpoint" in p.stderr and f"{s4}/model.safetensors" in p.stderr, p.stderr
    assert "falling back to the previous complete checkpoint" in p.stderr and "step-00000002" in p.stderr, p.stderr
    ma, mu = metrics(a), metrics(u)
    assert [m["step"] for m in ma] == list(range(1, 7)), [m["step"] for m in ma]
    for x, y in zip(ma, mu):
        assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x["step"], x["loss"], y["loss"])
    for f in ("model.safetensors", "optimizer.safetensors"):
        assert open(os.path.join(a, "checkpoint", f), "rb").read() == open(os.path.join(u, "checkpoint", f),
                                                                            "rb").read(), f
    assert sorted(n for n in os.listdir(a) if n.startswith("step-")) == ["step-00000004", "step-00000006"]
    # Other damage, each refused by name: a truncated file, a missing one, a damaged manifest, a file the load
    # would read that the manifest does not list.
    s6 = os.path.join(a, "step-00000006")
    for what, damage, says in (
            ("truncated", lambda d: os.truncate(os.path.join(d, "optimizer.safetensors"), 100),
             "optimizer.safetensors' is damaged: 100 bytes where manifest.json says"),
            ("missing", lambda d: os.remove(os.path.join(d, "trainer_state.json")),
             "trainer_state.json' is damaged: it is missing"),
            ("manifest", lambda d: open(os.path.join(d, "manifest.json"), "a").write("}"),
             "manifest.json' is damaged: not readable JSON"),
            ("unlisted", lambda d: open(os.path.join(d, "model.safetensors.index.json"), "w").write("{}"),
             "holds 'model.safetensors.index.json', which its manifest.json does not list")):
        c = os.path.join(tmp, "c_" + what)
        shutil.copytree(s6, c, symlinks=True)
        damage(c)
        expect_error(["train", "--config", tiny(), "--steps", "2", "--quiet", "--out", os.path.join(tmp, "i_" + what),
                      "--init-from", c] + SMALL, says)
    # A checkpoint without a manifest (written before checksums) loads, with a warning naming it.
    old = os.path.join(tmp, "old")
    shutil.copytree(s6, old, symlinks=True)
    os.remove(os.path.join(old, "manifest.json"))
    p = run(["train", "--config", tiny(), "--steps", "2", "--quiet", "--out", os.path.join(tmp, "i_old"),
             "--init-from", old] + SMALL)
    assert f"checkpoint '{old}' has no manifest.json" in p.stderr and "unverified" in p.stderr, p.stderr
    # The newest checkpoint's directory gone (the link dangles): the previous one; every one damaged: an error.
    shutil.rmtree(s6)
    p = run(common + ["--out", a, "--resume", a])
    assert "has no model.safetensors (missing or incomplete)" in p.stderr, p.stderr
    assert f"resumed from {os.path.join(a, 'step-00000004')} at step 4" in p.stderr, p.stderr
    flip_byte(os.path.join(a, "step-00000006", "config.json"), at=3)
    flip_byte(os.path.join(a, "step-00000004", "optimizer.safetensors"))
    expect_error(common + ["--out", a, "--resume", a], "no checkpoint of the run in", "step-00000006/config.json",
                 "step-00000004/optimizer.safetensors")
    # On 2 ranks (each rank checks the files it reads, and the ranks agree on the step): the same fallback, said
    # once, and one process's losses.
    b = os.path.join(tmp, "b")
    mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", ARGS.bin]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    for extra in (["--stop-after", "4"], ["--resume", b]):
        p = subprocess.run(mpi + common[:] + ["--out", b] + extra, capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        if extra[0] == "--stop-after":
            flip_byte(os.path.join(b, "step-00000004", "optimizer.safetensors"))
    assert p.stderr.count("falling back to the previous complete checkpoint") == 1, p.stderr
    rel = max(abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(metrics(b), mu))
    assert [m["step"] for m in metrics(b)] == list(range(1, 7)) and rel <= 1e-5, (metrics(b), rel)
    # train.keep_checkpoints: that many of the newest kept; below 1 refused by name.
    k = os.path.join(tmp, "k")
    run(common + ["--out", k, "--set", "train.checkpoint_every=1", "--set", "train.keep_checkpoints=3"])
    assert sorted(n for n in os.listdir(k) if n.startswith("step-")) == ["step-00000004", "step-00000005",
                                                                      "step-00000006"], os.listdir(k)
    expect_error(common + ["--out", os.path.join(tmp, "k0"), "--set", "train.keep_checkpoints=0"],
                 "train.keep_checkpoints")
    print("every checkpoint file in its manifest; damaged files refused by name; --resume fell back to the previous "
          "checkpoint and trained the uninterrupted run bit for bit (2 ranks: within 1e-5); keep_checkpoints kept 3; "
          "an unverified checkpoint loaded with a warning")


def write_tokens(path, ids, magic=20240520, version=1, count=None):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(ids) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(ids)}H", *ids))


def expect_error(args, *fragments):
    p = run(args, expect_ok=False)
    assert p.returncode == 1, f"exit {p.returncode} for {args}\n{p.stderr}"
    for f in fragments:
        assert f in p.stderr, f"'{f}' not in stderr of {args}:\n{p.stderr}"
    assert "error:" in p.stderr and "hint:" in p.stderr, p.stderr


def case_bad_inputs(tmp):
    out = os.path.join(tmp, "o")
    base = ["train", "--config", tiny(), "--out", out, "--quiet"] + SMALL + ["--set", "train.steps=3"]
    bad_cfg = os.path.join(tmp, "bad.toml")
    open(bad_cfg, "w").write("[model\nhidden_size = 3\n")
    expect_error(["train", "--config", bad_cfg, "--out", out], "malformed TOML")
    expect_error(base + ["--set", "model.num_experts_per_tok=99"], "num_experts_per_tok")
    expect_error(base + ["--set", "model.hiden_size=3"], "unknown key model.hiden_size")
    expect_error(base + ["--device-mem", "12 parsecs"], "invalid size")
    # Out of memory names the category and the schedule that flattens it.
    expect_error(base + ["--device-mem", "3MiB"], "out of device memory in category")
    # Token files: wrong magic, truncated, out-of-range id.
    tf = os.path.join(tmp, "t.bin")
    write_tokens(tf, list(range(200)), magic=123)
    expect_error(base + ["--set", f"data.source={tf}"], "magic")
    write_tokens(tf, list(range(200)), count=300)
    expect_error(base + ["--set", f"data.source={tf}"], tf)
    write_tokens(tf, [5] * 500 + [300])
    expect_error(base + ["--set", f"data.source={tf}"], "300")
    # NaN: an absurd learning rate blows the weights up; the run stops with a clear error, exit 1.
    p = run(base + ["--set", "optim.lr=1e30", "--set", "optim.grad_clip=0", "--set", "optim.warmup_steps=0",
                    "--steps", "20"], expect_ok=False)
    assert p.returncode == 1 and any(w in p.stderr for w in ("loss is", "non-finite", "loss spiked")), p.stderr
    # Unreadable checkpoints.
    ck = os.path.join(tmp, "ck")
    os.makedirs(ck)
    expect_error(["eval", "--checkpoint", ck, "--data", tf], "no checkpoint")
    run(["train", "--config", tiny(), "--steps", "1", "--out", ck, "--quiet"] + SMALL)
    good = os.path.join(ck, "checkpoint", "model.safetensors")
    with open(good, "r+b") as f:
        f.write(b"\xff\xff\xff\xff\xff\xff\xff\x7f")
    write_tokens(tf, [5] * 500)
    p = run(["eval", "--checkpoint", ck, "--data", tf], expect_ok=False)
    assert p.returncode == 1 and "model.safetensors" in p.stderr, p.stderr
    print("every bad input gave its clear error")


def case_demo_loss_falls(tmp):
    d = os.path.join(tmp, "demo")
    run(["train", "--config", tiny(), "--steps", "40", "--out", d, "--quiet"])
    m = metrics(d)
    first = sum(x["loss"] for x in m[:5]) / 5
    last = sum(x["loss"] for x in m[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f} over 40 steps")
    assert last < first - 0.5, f"the loss did not fall clearly: {first:.3f} -> {last:.3f}"
    for key in ("step", "loss", "aux_loss", "grad_norm", "lr", "tokens_per_s", "device_peak_bytes", "peak_bytes"):
        assert key in m[0], key
    assert set(m[0]["peak_bytes"]) >= {"params", "grads", "optimizer", "activations", "checkpoints", "dispatch",
                                       "vocab", "comm", "workspace"}
    trace = json.load(open(os.path.join(d, "memory_trace.json")))
    assert any(e.get("ph") == "C" for e in trace["traceEvents"])


def case_eval_token_file(tmp):
    d = os.path.join(tmp, "ev")
    tf = os.path.join(tmp, "e.bin")
    rng = random.Random(1)
    write_tokens(tf, [rng.randrange(256) for _ in range(700)])
    run(["train", "--config", tiny(), "--steps", "2", "--out", d, "--quiet", "--set", f"data.source={tf}"] + SMALL)
    js = os.path.join(tmp, "e.json")
    run(["eval", "--checkpoint", d, "--data", tf, "--seq-len", "64", "--json", js])
    r = json.load(open(js))
    assert r["sequences"] == 10 and r["tokens"] == 640, r
    assert 4.0 < r["loss"] < 7.0, r  # near ln(256) = 5.55 for an almost untrained model
    print(f"eval loss {r['loss']:.4f} over {r['tokens']} tokens")


def documents_stream(rng, n, eos):
    """n token ids: documents of 1 to 90 tokens from [eos + 1, 256), each ending with eos."""
    ids = []
    while len(ids) < n:
        ids += [rng.randrange(eos + 1, 256) for _ in range(rng.randrange(0, 90))] + [eos]
    return ids[:n]


def case_documents_and_held_out(tmp):
    """data.documents = "eos" and held-out evaluation (Note [Held-out evaluation]): eval_loss in
    metrics.jsonl every eval.every steps and after the last, over exactly the non-EOS targets; the last
    one equals `flatpeak eval` of the final checkpoint read the same way; evaluating changes no training
    bit; the report charts it; missing EOS ids and foreign eval keys are refused by name."""
    rng = random.Random(7)
    eos = 3
    train_f, val_f = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
    write_tokens(train_f, documents_stream(rng, 3000, eos))
    val = documents_stream(rng, 700, eos)
    write_tokens(val_f, val)
    docs = ["--set", f"data.source={train_f}", "--set", "data.documents=eos", "--set", f"data.eos_id={eos}"]
    base = ["train", "--config", tiny(), "--quiet"] + SMALL + docs
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    run(base + ["--steps", "6", "--out", a, "--set", f"eval.data={val_f}", "--set", "eval.every=4"])
    run(base + ["--steps", "6", "--out", b])
    ma, mb = metrics(a), metrics(b)
    assert [m["step"] for m in ma if "eval_loss" in m] == [4, 6], [m.get("eval_loss") for m in ma]
    for x, y in zip(ma, mb):
        assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], f"step {x['step']}: evaluating changed training"
    # 10 windows of 64 tokens (700 tokens: the last 59 never a target); no loss where the token is EOS.
    targets = sum(1 for w in range(10) for t in range(64) if val[w * 64 + t] != eos)
    assert ma[-1]["eval_targets"] == targets, (ma[-1]["eval_targets"], targets)
    js = os.path.join(tmp, "e.json")
    run(["eval", "--checkpoint", a, "--data", val_f, "--seq-len", "64", "--batch", "2", "--json", js,
         "--set", "data.documents=eos", "--set", f"data.eos_id={eos}"])
    e = json.load(open(js))
    assert e["tokens"] == targets, e
    assert abs(e["loss"] - ma[-1]["eval_loss"]) <= 1e-12 * e["loss"], (e["loss"], ma[-1]["eval_loss"])
    # Without documents the same file is one stream: another loss over every position.
    run(["eval", "--checkpoint", a, "--data", val_f, "--seq-len", "64", "--batch", "2", "--json", js])
    assert json.load(open(js))["tokens"] == 640
    run(["report", a])
    assert "held-out" in open(os.path.join(a, "report.html")).read()
    # eval.batches: the file's first windows only.
    c = os.path.join(tmp, "c")
    run(base + ["--out", c, "--steps", "1", "--set", f"eval.data={val_f}", "--set", "eval.batches=2"])
    assert metrics(c)[0]["eval_targets"] == sum(1 for t in range(4 * 64) if val[t] != eos), metrics(c)
    # Refusals, by name.
    expect_error(["train", "--config", tiny(), "--steps", "1", "--out", c, "--overwrite", "--quiet"] + SMALL +
                 ["--set", f"data.source={train_f}", "--set", "data.documents=eos"], "data.eos_id")
    expect_error(["train", "--config", tiny(), "--steps", "1", "--out", c, "--overwrite", "--quiet"] + SMALL +
                 ["--set", "data.documents=eos", "--set", "data.eos_id=3"], "recall")
    expect_error(["eval", "--checkpoint", a, "--data", val_f, "--set", "model.hidden_size=3"],
                 "not a key flatpeak eval takes")
    expect_error(["eval", "--checkpoint", a, "--data", val_f, "--set", "data.documents=bos"], "data.documents")
    print(f"held-out loss {ma[-1]['eval_loss']:.4f} over {targets} targets = flatpeak eval's; training unchanged")


def case_grad_accum(tmp):
    """train.grad_accum (Note [Gradient accumulation]): 4 micro-batches of 1 sequence train as batches of 4
    (5 steps: every loss within 1e-6, the final weights within 1e-5 norm-relative) without the load-balancing
    loss; metrics.jsonl reports the global tokens per step; a resume may change grad_accum and says so."""
    base = ["train", "--config", tiny(), "--quiet", "--set", "train.seq_len=64", "--set",
            "model.num_hidden_layers=2", "--set", "model.router_aux_loss_coef=0"]
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    run(base + ["--steps", "5", "--out", a, "--set", "train.batch_size=4"])
    run(base + ["--steps", "5", "--out", b, "--set", "train.batch_size=1", "--set", "train.grad_accum=4"])
    ma, mb = metrics(a), metrics(b)
    for x, y in zip(ma, mb):
        assert abs(x["loss"] - y["loss"]) <= 1e-6 * abs(x["loss"]), f"step {x['step']}: {x['loss']} vs {y['loss']}"
        assert x["tokens"] == y["tokens"] == 4 * 64 and x["target_tokens"] == y["target_tokens"], (x, y)
    wa = safetensors_f32(os.path.join(a, "checkpoint", "model.safetensors"))
    wb = safetensors_f32(os.path.join(b, "checkpoint", "model.safetensors"))
    worst = 0.0
    for k in wa:
        d = sum((p - q) ** 2 for p, q in zip(wa[k], wb[k])) ** 0.5
        n = sum(p * p for p in wa[k]) ** 0.5
        worst = max(worst, d / max(n, 1e-30))
    assert worst <= 1e-5, f"final weights differ by {worst:.2e} (norm-relative)"
    print(f"grad_accum 4 x 1 = batch 4 over 5 steps: losses within 1e-6, weights within {worst:.1e}")
    # A resume may change the accumulation; it says the global batch.
    c = os.path.join(tmp, "c")
    run(base + ["--steps", "5", "--out", c, "--set", "train.batch_size=1", "--set", "train.grad_accum=4",
                "--stop-after", "3"])
    p = run(base + ["--steps", "5", "--out", c, "--resume", c, "--set", "train.batch_size=1", "--set",
                    "train.grad_accum=2"])
    assert "train.grad_accum" in p.stderr and "global batch of 2 sequences" in p.stderr, p.stderr
    assert [m["tokens"] for m in metrics(c)] == [256] * 3 + [128] * 2, [m["tokens"] for m in metrics(c)]


def wait_for_steps(d, n, p, timeout=120):
    """Waits until the run p has written at least n lines of metrics (or ended)."""
    deadline = time.time() + timeout
    while p.poll() is None and time.time() < deadline:
        try:
            if len(metrics(d)) >= n:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)


def case_out_reuse(tmp):
    """Note [A run owns its output folder]: an --out holding a run is refused (its files untouched)
    unless --resume continues it or --overwrite replaces it."""
    d, e = os.path.join(tmp, "d"), os.path.join(tmp, "e")
    common = ["train", "--config", tiny(), "--quiet"] + SMALL + ["--set", "train.checkpoint_every=5"]
    run(common + ["--steps", "20", "--out", d])
    before = {n: open(os.path.join(d, n), "rb").read() for n in ("metrics.jsonl",)}
    link = os.readlink(os.path.join(d, "checkpoint"))
    steps_before = sorted(n for n in os.listdir(d) if n.startswith("step-"))
    # A shorter run into the same folder (the old bug: it pruned its own checkpoints by step number).
    expect_error(common + ["--steps", "3", "--out", d], "already holds a run", "--overwrite", "--resume")
    # --resume of another run's checkpoint into a folder holding a run: refused too.
    run(common + ["--steps", "20", "--out", e, "--stop-after", "5"])
    expect_error(common + ["--steps", "20", "--out", d, "--resume", e], "already holds a run", "not a checkpoint of it")
    assert open(os.path.join(d, "metrics.jsonl"), "rb").read() == before["metrics.jsonl"], "metrics were touched"
    assert os.readlink(os.path.join(d, "checkpoint")) == link
    assert sorted(n for n in os.listdir(d) if n.startswith("step-")) == steps_before
    # --out naming a file, and one that cannot be created.
    f = os.path.join(tmp, "a_file")
    open(f, "w").write("x")
    expect_error(common + ["--steps", "3", "--out", f], "is a file")
    expect_error(common + ["--steps", "3", "--out", os.path.join(f, "sub")], "cannot be created")
    # --overwrite replaces it: the new run's files only.
    run(common + ["--steps", "3", "--out", d, "--overwrite"])
    assert [m["step"] for m in metrics(d)] == [1, 2, 3]
    assert sorted(n for n in os.listdir(d) if n.startswith("step-")) == ["step-00000003"], os.listdir(d)
    assert json.load(open(os.path.join(d, "checkpoint", "trainer_state.json")))["step"] == 3
    # --resume of its own checkpoint continues in place.
    run(common + ["--steps", "20", "--out", e, "--resume", e])
    assert [m["step"] for m in metrics(e)] == list(range(1, 21))
    print("a folder holding a run is refused and untouched; --overwrite and --resume work")


def case_signals(tmp):
    """Note [Stopping on a signal]: SIGTERM / SIGINT finish the step, write a checkpoint, say how to
    resume and exit 143 / 130; the resumed run equals an uninterrupted one bit for bit. A second
    signal ends the run at once."""
    # 120 steps: long enough that a signal sent after step 5 lands before the end (checked below), short
    # enough that the seven runs stay cheap on a loaded machine.
    steps = 120
    a = os.path.join(tmp, "a")
    common = ["train", "--config", tiny(), "--steps", str(steps), "--quiet"] + SMALL
    run(common + ["--out", a])
    for sig, code, when in ((signal.SIGTERM, 143, "step"), (signal.SIGINT, 130, "step"), (signal.SIGTERM, 143, "write")):
        b = os.path.join(tmp, f"b{code}{when}")
        extra = ["--set", "train.checkpoint_every=1"] if when == "write" else []
        p = subprocess.Popen([ARGS.bin] + common + extra + ["--out", b], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        wait_for_steps(b, 5, p)
        if when == "write":  # the signal lands while a checkpoint is being written
            deadline = time.time() + 60
            while p.poll() is None and time.time() < deadline and not any(n.endswith(".tmp") for n in os.listdir(b)):
                time.sleep(0.001)
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
        assert p.returncode == code, f"exit {p.returncode}, expected {code}\n{err}"
        stopped = len(metrics(b))
        assert stopped < steps, "the run ended before the signal: nothing tested"
        assert f"stopped by {signal.Signals(sig).name} after step {stopped}" in err and "--resume" in err, err
        assert json.load(open(os.path.join(b, "checkpoint", "trainer_state.json")))["step"] == stopped
        run(common + ["--out", b, "--resume", b])  # train.checkpoint_every is not part of the run's identity
        ma, mb = metrics(a), metrics(b)
        assert [m["step"] for m in mb] == list(range(1, steps + 1))
        for x, y in zip(ma, mb):
            assert x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x["step"], x["loss"], y["loss"])
        fa = open(os.path.join(a, "checkpoint", "model.safetensors"), "rb").read()
        fb = open(os.path.join(b, "checkpoint", "model.safetensors"), "rb").read()
        assert fa == fb, "final weights differ after a stop on a signal and a resume"
        print(f"{signal.Signals(sig).name} during a {when}: stopped after step {stopped}, exit {code}, resumed bit-exact")
    # Progress lines reach a file as they are printed: a run killed outright keeps every line it printed.
    f = os.path.join(tmp, "progress.txt")
    with open(f, "w") as fh:
        p = subprocess.Popen([ARGS.bin, "train", "--config", tiny(), "--steps", "300", "--log-every", "1", "--out",
                              os.path.join(tmp, "f")] + SMALL, stdout=fh, stderr=subprocess.DEVNULL)
        wait_for_steps(os.path.join(tmp, "f"), 5, p)
        p.send_signal(signal.SIGKILL)
        p.wait()
    lines = [l for l in open(f) if l.startswith("step ")]
    assert len(lines) >= 5, f"only {len(lines)} progress lines reached the file before the kill"
    # Not a terminal: a line every --log-every steps (and the first and last), then the summary.
    g = os.path.join(tmp, "g")
    p = run(["train", "--config", tiny(), "--steps", "25", "--log-every", "10", "--out", g] + SMALL)
    steps = [int(l.split()[1].split("/")[0]) for l in p.stdout.splitlines() if l.startswith("step ")]
    assert steps == [1, 10, 20, 25], steps
    assert "done: 25 steps" in p.stdout and "outputs in " + g in p.stdout, p.stdout
    # Two signals: the second one ends the process by the signal itself (steps of a fraction of a second).
    c = os.path.join(tmp, "c")
    p = subprocess.Popen([ARGS.bin, "train", "--config", tiny(), "--steps", "50", "--quiet", "--out", c,
                          "--set", "train.seq_len=2048", "--set", "train.batch_size=1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_steps(c, 1, p)
    p.send_signal(signal.SIGINT)
    time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=120)
    assert p.returncode == -signal.SIGINT, f"exit {p.returncode}: a second SIGINT must end the run at once"
    print("a second SIGINT ends the run at once")


def case_signal_mpi(tmp):
    """SIGTERM to mpirun (it forwards it to every rank), during a step and during a checkpoint write:
    all ranks stop after the same step with one consistent checkpoint; the resumed run equals the
    uninterrupted one."""
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found (scripts/deps installs openmpi-bin)"
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    mpi = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", ARGS.bin]
    a = os.path.join(tmp, "a")
    common = ["train", "--config", tiny(), "--steps", "150", "--quiet"]
    subprocess.run(mpi + common + ["--out", a], check=True, env=env, capture_output=True)
    for when in ("step", "write"):
        b = os.path.join(tmp, "b" + when)
        extra = ["--set", "train.checkpoint_every=1"] if when == "write" else []
        p = subprocess.Popen(mpi + common + extra + ["--out", b], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
        wait_for_steps(b, 5, p)
        if when == "write":
            deadline = time.time() + 60
            while p.poll() is None and time.time() < deadline and not any(n.endswith(".tmp") for n in os.listdir(b)):
                time.sleep(0.001)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
        stopped = len(metrics(b))
        assert stopped < 150, "the run ended before the signal: nothing tested"
        assert p.returncode != 0, "mpirun exited 0 after SIGTERM"
        assert f"stopped by SIGTERM after step {stopped}" in err, err
        assert json.load(open(os.path.join(b, "checkpoint", "trainer_state.json")))["step"] == stopped
        r = subprocess.run(mpi + common + ["--out", b, "--resume", b], env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        ma, mb = metrics(a), metrics(b)
        assert [m["step"] for m in mb] == list(range(1, 151))
        assert all(x["loss"] == y["loss"] for x, y in zip(ma, mb)), "losses differ after the stop and resume"
        print(f"mpirun -np 2, SIGTERM during a {when}: every rank stopped after step {stopped} (mpirun exit "
              f"{p.returncode}); resumed bit-exact")


def case_faults(tmp):
    """Note [Injected faults]: a loss spike and a non-finite loss stop the run before the update; a
    non-finite weight is never written to a checkpoint, and never loaded."""
    common = ["train", "--config", tiny(), "--quiet"] + SMALL + ["--set", "train.checkpoint_every=5"]

    def faulty(d, fault, *fragments):
        p = subprocess.run([ARGS.bin] + common + ["--steps", "20", "--out", d], capture_output=True, text=True,
                           env=dict(os.environ, FLATPEAK_FAULT=fault))
        assert p.returncode == 1, f"{fault}: exit {p.returncode}\n{p.stderr}"
        for f in fragments:
            assert f in p.stderr, f"{fault}: '{f}' not in\n{p.stderr}"
        assert not any(n.endswith(".tmp") for n in os.listdir(d)), os.listdir(d)
        return p

    d = os.path.join(tmp, "spike")
    faulty(d, "spike:12", "loss spiked at step 12", "no update was applied", "checkpoint of step 10")
    assert json.load(open(os.path.join(d, "checkpoint", "trainer_state.json")))["step"] == 10
    assert max(m["step"] for m in metrics(d)) == 11
    # train.loss_spike_factor = 0 trains through it.
    e = os.path.join(tmp, "through")
    p = subprocess.run([ARGS.bin] + common + ["--out", e, "--set", "train.loss_spike_factor=0", "--steps", "13"],
                       capture_output=True, text=True, env=dict(os.environ, FLATPEAK_FAULT="spike:12"))
    assert p.returncode == 0, p.stderr
    assert metrics(e)[11]["loss"] > 10 * metrics(e)[10]["loss"], "the injected spike did not spike"
    d = os.path.join(tmp, "nan")
    faulty(d, "nan:7", "at step 7", "loss is", "nan", "checkpoint of step 5")
    d = os.path.join(tmp, "nan_update")
    faulty(d, "nan_update:10", "not writing", "step-00000010", "lm_head.weight", "holds nan at element 0")
    assert os.readlink(os.path.join(d, "checkpoint")) == "step-00000005", os.readlink(os.path.join(d, "checkpoint"))
    assert not os.path.exists(os.path.join(d, "step-00000010"))
    # A NaN written into a checkpoint by something else is refused at load, naming the tensor.
    good = os.path.join(tmp, "good")
    run(common + ["--out", good, "--steps", "2"])
    path = os.path.join(good, "checkpoint", "model.safetensors")
    raw = bytearray(open(path, "rb").read())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    name = "model.norm.weight"
    begin = 8 + n + header[name]["data_offsets"][0]
    raw[begin + 4:begin + 8] = struct.pack("<f", float("nan"))
    open(path, "wb").write(raw)
    tf = os.path.join(tmp, "t.bin")
    write_tokens(tf, [5] * 500)
    # Its checksum no longer matches (Note [Checkpoint checksums]); without a manifest (an older flatpeak's
    # checkpoint, loaded unverified) the NaN itself is caught.
    expect_error(["eval", "--checkpoint", good, "--data", tf], "model.safetensors' is damaged: CRC32C")
    os.remove(os.path.join(good, "checkpoint", "manifest.json"))
    expect_error(["eval", "--checkpoint", good, "--data", tf], name, "holds nan at element 1")
    expect_error(common + ["--steps", "2", "--out", good, "--resume", good], name, "holds nan at element 1")
    print("spike, NaN loss, NaN before a checkpoint, NaN in a checkpoint: each stopped with its clear error")


def case_cli_edges(tmp):
    """Item 6 of the robustness work: numbers on the command line are validated, unknown commands
    suggest the nearest one; every one exits 1 with error: and hint:."""
    o = os.path.join(tmp, "o")
    t = ["train", "--config", tiny(), "--out", o]
    expect_error(t + ["--steps", "0"], "--steps", "below 1")
    expect_error(t + ["--steps", "-3"], "--steps")
    expect_error(t + ["--stop-after", "-1"], "--stop-after")
    expect_error(t + ["--steps", "x"], "not a whole number")
    expect_error(["eval", "--checkpoint", o, "--data", o, "--batch", "0"], "--batch")
    expect_error(["eval", "--checkpoint", o, "--data", o, "--seq-len", "0"], "--seq-len")
    expect_error(["plan", "--model", tiny(), "--ranks", "0"], "--ranks")
    expect_error(["trian"], "not a command", "did you mean 'flatpeak train'")
    expect_error(["bench", "stepp"], "did you mean 'flatpeak bench step'")
    expect_error([], "needs a command", "train")
    # A bad value given with --set is blamed on --set, not on the file.
    expect_error(t + ["--set", "model.hidden_size=-5"], "--set model.hidden_size=-5 (over")
    # eval names its own flags.
    ck = os.path.join(tmp, "ck")
    run(["train", "--config", tiny(), "--steps", "1", "--quiet", "--out", ck] + SMALL)
    expect_error(["eval", "--checkpoint", ck, "--data", os.path.join(tmp, "missing.bin")], "(--data)")
    short = os.path.join(tmp, "short.bin")
    write_tokens(short, [5] * 100)
    expect_error(["eval", "--checkpoint", ck, "--data", short, "--seq-len", "500"], "--seq-len + 1")
    # Resuming from weights without a trainer state.
    w = os.path.join(tmp, "weights")
    os.makedirs(w)
    for n in ("model.safetensors", "config.json", "optimizer.safetensors"):
        shutil.copy(os.path.join(ck, "checkpoint", n), w)
    expect_error(["train", "--config", tiny(), "--steps", "2", "--out", os.path.join(tmp, "r"), "--resume", w] + SMALL,
                 "no trainer_state.json")
    # Sizes beyond the host on meta: the user's error, not an internal one.
    expect_error(["step", "--config", tiny(), "--device", "meta", "--set", "train.seq_len=100000000000"],
                 "out of host memory")
    # A read-only filesystem under --out (where mounting is allowed).
    ro = os.path.join(tmp, "ro")
    os.makedirs(ro)
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", ro],
                                            capture_output=True).returncode == 0:
        try:
            expect_error(t[:-1] + [os.path.join(ro, "run")], "--out", "cannot be created")
        finally:
            subprocess.run(["umount", ro], capture_output=True)
    print("command-line edges: each a clear error")


def case_extend(tmp):
    """Note [Extending a finished run]: --extend continues a finished run at the rate its schedule
    ended on; extending in pieces (with a stop and a plain resume) equals extending at once; without
    --extend the finished run says how to go on; another change than --steps is still refused."""
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    common = ["train", "--config", tiny(), "--quiet"] + SMALL + ["--set", "optim.warmup_steps=2"]
    for d in (a, b):
        run(common + ["--steps", "10", "--out", d])
    expect_error(common + ["--steps", "10", "--out", a, "--resume", a], "nothing to do", "--extend")
    expect_error(common + ["--steps", "16", "--out", a, "--resume", a], "train.steps: checkpoint 10, now 16", "--extend")
    expect_error(common + ["--steps", "16", "--out", a, "--resume", a, "--extend", "--set", "optim.lr=0.1"],
                 "optim.lr: checkpoint", "only the number of steps")
    expect_error(common + ["--steps", "16", "--out", os.path.join(tmp, "c"), "--extend"], "--extend without --resume")
    run(common + ["--steps", "16", "--out", a, "--resume", a, "--extend"])
    run(common + ["--steps", "16", "--out", b, "--resume", b, "--extend", "--stop-after", "3"])
    run(common + ["--steps", "16", "--out", b, "--resume", b])
    ma, mb = metrics(a), metrics(b)
    assert [m["step"] for m in ma] == list(range(1, 17)) and [m["step"] for m in mb] == list(range(1, 17))
    floor = 3e-3 * 0.1  # optim.lr x optim.min_lr_ratio of configs/tiny.toml
    for m in ma[10:]:
        assert abs(m["lr"] - floor) < 1e-12 and m["lr_schedule_steps"] == 10, m
    assert all(x["loss"] == y["loss"] and x["lr"] == y["lr"] for x, y in zip(ma, mb)), "extension in pieces differs"
    st = json.load(open(os.path.join(b, "checkpoint", "trainer_state.json")))
    assert st["step"] == 16 and st["schedule_steps"] == 10, st
    print("extended 10 -> 16 at the schedule's final rate; in pieces equals at once")


def case_oom_hints(tmp):
    """A schedule never degrades silently, and no hint recommends the schedule already in use."""
    t = ["train", "--config", tiny(), "--steps", "2", "--quiet"]
    p = run(t + ["--out", os.path.join(tmp, "a"), "--set", "ckpt.schedule=sco", "--host-mem", "100KiB"])
    assert "WARNING" in p.stderr and "room for 0 of the 1 boundaries" in p.stderr, p.stderr
    p = run(t + ["--out", os.path.join(tmp, "b"), "--set", "ckpt.schedule=sco"])
    assert "WARNING" not in p.stderr, p.stderr
    p = run(t + ["--out", os.path.join(tmp, "c"), "--set", "optim.schedule=offload_stream", "--device-mem", "3MiB"],
            expect_ok=False)
    assert p.returncode == 1 and "already offload_stream" in p.stderr and "bucket_params" in p.stderr, p.stderr
    assert 'set optim.schedule = "offload_stream"' not in p.stderr, p.stderr
    p = run(t + ["--out", os.path.join(tmp, "d"), "--set", "optim.schedule=offload_stream", "--host-mem", "1MiB"],
            expect_ok=False)
    assert p.returncode == 1 and "out of host memory" in p.stderr and "raise --host-mem" in p.stderr, p.stderr
    p = run(t + ["--out", os.path.join(tmp, "e"), "--device-mem", "3MiB"], expect_ok=False)
    assert p.returncode == 1 and "hint:" in p.stderr and "already" not in p.stderr, p.stderr
    # Every layer's activations kept: 12 MiB holds the recompute plan's step but not this one, and the
    # hint names the setting that gives the memory back.
    run(t + ["--out", os.path.join(tmp, "f"), "--device-mem", "12MiB"])
    p = run(t + ["--out", os.path.join(tmp, "g"), "--device-mem", "12MiB", "--set", "ckpt.recompute=false"],
            expect_ok=False)
    assert p.returncode == 1 and "category 'activations'" in p.stderr, p.stderr
    assert "set ckpt.recompute = true" in p.stderr, p.stderr
    print("SCO short of host memory warns at launch; out-of-memory hints know the schedule in use")


def case_disk_full(tmp):
    """A full disk during a checkpoint: exit 1 with the reason, no temporary left, and the checkpoint
    before it still the latest and loadable. A small tmpfs where mounting is allowed (root), otherwise
    a file-size limit (RLIMIT_FSIZE) as the injected write failure."""
    import resource
    d = os.path.join(tmp, "full")
    os.makedirs(d)
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", d],
                                                   capture_output=True).returncode == 0
    try:
        out = os.path.join(d, "run")
        args = [ARGS.bin, "train", "--config", tiny(), "--quiet", "--steps", "20", "--out", out,
                "--set", "train.checkpoint_every=2"] + SMALL

        # tmpfs of 5 MB: one checkpoint (about 3.1 MB) fits, its successor does not. The file-size limit
        # is per file: the optimizer file (about 2.1 MB) of the first checkpoint already fails.
        def limit():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (1_500_000, 1_500_000))

        p = subprocess.run(args, capture_output=True, text=True, preexec_fn=None if mounted else limit)
        assert p.returncode == 1, f"exit {p.returncode}\n{p.stderr}"
        assert "cannot write" in p.stderr and ("No space left" in p.stderr or "File too large" in p.stderr), p.stderr
        names = os.listdir(out)
        assert not any(".tmp" in n for n in names), names
        if not mounted:  # the file-size limit hits the first checkpoint's optimizer file already
            assert "checkpoint" not in names or os.path.exists(os.path.join(out, "checkpoint", "model.safetensors"))
        copy = os.path.join(tmp, "copy")
        shutil.copytree(out, copy, symlinks=True)
        if os.path.exists(os.path.join(copy, "checkpoint")):
            step = json.load(open(os.path.join(copy, "checkpoint", "trainer_state.json")))["step"]
            run(["train", "--config", tiny(), "--quiet", "--steps", "20", "--out", copy, "--resume", copy,
                 "--stop-after", "1", "--set", "train.checkpoint_every=2"] + SMALL)
            print(f"disk full ({'tmpfs' if mounted else 'RLIMIT_FSIZE'}): exit 1, no temporary, the checkpoint of "
                  f"step {step} resumed")
        else:
            print(f"disk full ({'tmpfs' if mounted else 'RLIMIT_FSIZE'}) at the first checkpoint: exit 1, no temporary")
    finally:
        if mounted:
            subprocess.run(["umount", d], capture_output=True)


def case_report(tmp):
    """flatpeak report: one self-contained page (no script, no network) with every chart; each line
    chart has one point per recorded step. Rendered in headless Chromium when it is installed
    (scripts/deps installs it): a screenshot with pixels in it and no console error."""
    import xml.etree.ElementTree as ET
    d = os.path.join(tmp, "run")
    run(["train", "--config", tiny(), "--steps", "12", "--quiet", "--out", d] + SMALL)
    run(["plan", "--model", tiny(), "--context", "4K", "--no-reach", "--set", "precision.recipe=fp32", "--timeline",
         os.path.join(d, "memory_story.svg")])
    p = run(["report", d])
    html = open(os.path.join(d, "report.html")).read()
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", ""), "not self-contained"
    root = ET.fromstring(html.replace("<!DOCTYPE html>", ""))
    svg = "{http://www.w3.org/2000/svg}"
    charts = root.findall(".//" + svg + "svg")
    assert len(charts) == 5, f"{len(charts)} charts (loss, recall, speed, peaks, story expected)"
    for chart in charts[:4]:
        for line in chart.findall(svg + "polyline"):
            if "series" in line.get("class", ""):
                pts = line.get("points").split()
                assert len(pts) in (0, 12), len(pts)
    assert any(len(l.get("points").split()) == 12 for l in charts[0].findall(svg + "polyline")), "no loss line"
    assert len(charts[4].findall(svg + "polygon")) >= 4, "the memory story has no areas"
    assert "wrote" in p.stdout
    expect_error(["report", tmp], "not a run folder")
    chromium = shutil.which("chromium")
    if chromium:
        png = os.path.join(tmp, "report.png")
        r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                            "--enable-logging=stderr", "--v=0",
                            f"--screenshot={png}", "--window-size=900,2600", "file://" + os.path.join(d, "report.html")],
                           capture_output=True, text=True, timeout=120)
        assert os.path.exists(png) and os.path.getsize(png) > 20000, (r.returncode, r.stderr[-2000:])
        bad = [l for l in r.stderr.splitlines() if "CONSOLE" in l and ("Error" in l or "error" in l)]
        assert not bad, bad
        print(f"report rendered by {chromium}: {os.path.getsize(png)} bytes of screenshot, no console error")
    else:
        print("chromium not installed: the page was checked as XML only")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("case")
    ARGS = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="flatpeak_cli_")
    try:
        globals()["case_" + ARGS.case](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
