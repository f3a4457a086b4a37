#!/usr/bin/env python3
"""End-to-end tests of the optimizer schedules through the flatpeak command (OffloadStreamAdamW):
training and resuming with the state offloaded gives the device AdamW's losses bit for bit, the
device ledger holds no optimizer state (host placement) or only the staging (device placement), and
`flatpeak bench optimizer` runs, checks and reports, in fp32 and in bf16.

usage: test_optim.py --bin build/flatpeak --configs configs CASE
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ARGS = None
SMALL = ["--set", "train.seq_len=64", "--set", "train.batch_size=2", "--set", "model.num_hidden_layers=2"]


def run(args, expect_ok=True):
    p = subprocess.run([ARGS.bin] + args, capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(args)}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def metrics(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def case_train_resume_offload(tmp):
    """offload_stream (both placements) and offload_serial train with exactly the device AdamW's
    losses, also across a stop and resume (the host moments go through the checkpoint)."""
    common = ["train", "--config", os.path.join(ARGS.configs, "tiny.toml"), "--steps", "6", "--quiet"] + SMALL
    ref = os.path.join(tmp, "device")
    run(common + ["--out", ref])
    want = [m["loss"] for m in metrics(ref)]
    variants = {
        "serial": ["--set", 'optim.schedule="offload_serial"'],
        "stream_device": ["--set", 'optim.schedule="offload_stream"', "--set", "optim.bucket_params=1000",
                          "--set", 'optim.update_on="device"'],
        "stream_host": ["--set", 'optim.schedule="offload_stream"', "--set", "optim.bucket_params=1000",
                        "--set", 'optim.update_on="host"', "--set", "optim.slots=3"],
    }
    for name, extra in variants.items():
        d = os.path.join(tmp, name)
        run(common + extra + ["--out", d, "--stop-after", "3"])
        run(common + extra + ["--out", d, "--resume", d])
        m = metrics(d)
        got = [x["loss"] for x in m]
        assert got == want, f"{name}: losses {got} differ from the device AdamW's {want}"
        opt_peak = max(x["peak_bytes"]["optimizer"] for x in m)
        if name == "stream_device":
            # 2 slots x the largest bucket x 16 B, reserved at launch. A bucket that splits a parameter
            # ends on an offset aligned to 16 elements, so the largest holds 985..1000 parameters.
            assert opt_peak % (2 * 16) == 0 and 2 * 985 * 16 <= opt_peak <= 2 * 1000 * 16, \
                f"{name}: device optimizer peak {opt_peak}"
        else:
            assert opt_peak == 0, f"{name}: device optimizer peak {opt_peak}, expected none"
    print(f"offload variants equal the device AdamW's losses over 6 steps with a resume at 3: {want[-1]}")
    # gpt-oss's parameters (sinks, the router's and every expert's biases: 1-D tensors of their own buckets'
    # edges) through OffloadStreamAdamW on the host, with a resume, against the device AdamW.
    gpt_oss = [a for kv in ("model.model_type=gpt_oss", "model.swiglu_alpha=1.702", "model.swiglu_limit=7.0",
                            "model.sliding_window=32", 'model.layer_types=["sliding_attention","full_attention"]',
                            "model.attention_bias=true", "model.rms_norm_eps=1e-5") for a in ("--set", kv)]
    ref = os.path.join(tmp, "gpt_oss_device")
    run(common + gpt_oss + ["--out", ref])
    want = [m["loss"] for m in metrics(ref)]
    d = os.path.join(tmp, "gpt_oss_stream_host")
    run(common + gpt_oss + variants["stream_host"] + ["--out", d, "--stop-after", "3"])
    run(common + gpt_oss + variants["stream_host"] + ["--out", d, "--resume", d])
    got = [x["loss"] for x in metrics(d)]
    assert got == want, f"gpt_oss stream_host: losses {got} differ from the device AdamW's {want}"
    print(f"gpt-oss: offload_stream on the host equals the device AdamW over 6 steps with a resume: {want[-1]}")


def case_train_emulated_link(tmp):
    """`train --link-gbps X` runs the offload copies over an emulated link, says so, and changes no
    number: the losses equal the run without it bit for bit."""
    common = ["train", "--config", os.path.join(ARGS.configs, "tiny.toml"), "--steps", "3"] + SMALL + [
        "--set", 'optim.schedule="offload_stream"', "--set", "optim.bucket_params=20000", "--set",
        'ckpt.schedule="sco"']
    plain, slow = os.path.join(tmp, "plain"), os.path.join(tmp, "slow")
    run(common + ["--quiet", "--out", plain])
    p = run(common + ["--out", slow, "--link-gbps", "0.05"])
    assert "EMULATED 0.05 GB/s" in p.stdout + p.stderr, p.stdout + p.stderr
    a, b = metrics(plain), metrics(slow)
    assert [m["loss"] for m in a] == [m["loss"] for m in b], (a, b)
    # (That the copies really take bytes / rate is tests/unit EmulatedLink's job: step times of a whole
    # run on a shared machine are too noisy to check it here.)
    p = run(common + ["--quiet", "--out", os.path.join(tmp, "bad"), "--link-gbps", "-1"], expect_ok=False)
    assert p.returncode != 0 and "link-gbps" in p.stderr, p.stderr
    print("emulated link: announced, same losses bit for bit, bad rate refused")


def case_bench_smoke(tmp):
    """A small bench optimizer run with an emulated link, fp32 and bf16 in the same run: exits 0, every
    variant of both recipes checked (bits against offload_serial of its recipe), the JSON holds what the
    benchmark promises, bytes as the recipe stores them (bf16: 2 B weights and gradients, f32 master and
    moments, Note [Offload with bf16 weights]). A run config's precision is honoured, not dropped."""
    out = os.path.join(tmp, "bench.json")
    p = run(["bench", "optimizer", "--params", "2M", "--bucket-params", "50000", "--slots", "1,2",
             "--link-gbps", "20", "--repeats", "5", "--precision", "fp32,bf16", "--json", out])
    assert "CPU AdamW" in p.stdout and "emulated 20 GB/s" in p.stdout, p.stdout
    assert "precision fp32, bf16" in p.stdout and "bf16 gradient in and bf16 weights out" in p.stdout, p.stdout
    j = json.load(open(out))
    assert j["all_bits_equal"] is True
    assert j["precision"] == ["fp32", "bf16"], j["precision"]
    assert j["cpu_adamw_params_per_s"] > 0 and j["cpu_adamw_limit_params_per_s"] > 0
    P = j["params"]
    for recipe, wb in (("fp32", 4), ("bf16", 2)):  # bytes of a weight and of a gradient
        vs = [v for v in j["variants"] if v["precision"] == recipe]
        names = [(v["variant"], v["link"]) for v in vs]
        assert names[0] == ("device", "none"), names
        for link in ("native", "emulated"):
            for v in ("offload_serial", "offload_stream/device S=1", "offload_stream/host S=1",
                      "offload_stream/device S=2", "offload_stream/host S=2"):
                assert (v, link) in names, (recipe, v, link, names)
        for v in vs:
            assert len(v["step_seconds"]) == 5
            if v["schedule"] != "device":
                assert v["bits_equal_serial"] and v["max_rel_diff_vs_device"] <= 1e-6, v
            if v["schedule"] == "offload_stream":
                assert v["model_seconds"] > 0
                assert 0 < v["largest_bucket"] <= 50000, v
                want = v["slots"] * v["largest_bucket"] * 16 if v["update_on"] == "device" else 0
                assert v["device_optimizer_bytes"] == want, v
                # device placement: master, m, v up and down (12 B each way, f32 in both recipes);
                # host placement: the gradient down, the weights up.
                per = 12 if v["update_on"] == "device" else wb
                assert v["down_bytes_per_step"] == per * P and v["up_bytes_per_step"] == per * P, v
            if v["schedule"] == "offload_serial":
                assert v["device_optimizer_bytes"] == 0 and v["host_grads_bytes"] == wb * P, v
                assert v["down_bytes_per_step"] == wb * P and v["up_bytes_per_step"] == wb * P, v
            if v["schedule"] == "device":
                # m and v; bf16 also the f32 master beside the bf16 weights
                assert v["device_optimizer_bytes"] == (8 if recipe == "fp32" else 12) * P, v
    # The run config's [precision] (here through --set) is what runs.
    p = run(["bench", "optimizer", "--config", os.path.join(ARGS.configs, "tiny.toml"), "--set",
             'precision.recipe="bf16"', "--repeats", "5", "--slots", "1", "--json", out])
    j = json.load(open(out))
    assert j["precision"] == ["bf16"] and j["all_bits_equal"] is True, j["precision"]
    dev = [v for v in j["variants"] if v["schedule"] == "device"]
    assert len(dev) == 1 and dev[0]["device_optimizer_bytes"] == 12 * j["params"], dev
    # DeepSeek-V3 in bf16: its routing bias stays f32 (Note [Parameters kept in f32]) and every offloaded
    # variant still gives offload_serial's bits.
    from test_train import DEEPSEEK
    p = run(["bench", "optimizer", "--config", os.path.join(ARGS.configs, "tiny.toml"), "--set",
             'precision.recipe="bf16"', "--repeats", "5", "--slots", "1", "--json", out]
            + [a for kv in DEEPSEEK for a in ("--set", kv)])
    j = json.load(open(out))
    assert j["precision"] == ["bf16"] and j["all_bits_equal"] is True, (j["precision"], p.stdout)
    p = run(["bench", "optimizer", "--params", "2M", "--set", 'precision.recipe="bf16"'], expect_ok=False)
    assert p.returncode == 1 and "--config" in p.stderr, p.stderr
    p = run(["bench", "optimizer", "--config", os.path.join(ARGS.configs, "tiny.toml"), "--set",
             'precision.recipe="bf16"', "--set", 'precision.master="bf16"'], expect_ok=False)
    assert p.returncode == 1 and "recipes fp32 and bf16" in p.stderr, p.stderr
    p = run(["bench", "optimizer", "--params", "2M", "--repeats", "3"], expect_ok=False)
    assert p.returncode == 1 and "repeats" in p.stderr, p.stderr
    p = run(["bench", "optimizer", "--params", "lots"], expect_ok=False)
    assert p.returncode == 1 and "parameter count" in p.stderr, p.stderr
    print("bench optimizer: all variants of fp32 and bf16 checked and reported")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("case")
    ARGS = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        globals()["case_" + ARGS.case](tmp)


if __name__ == "__main__":
    main()
