#!/usr/bin/env python3
"""End-to-end tests of `flatpeak bench vocab` in the bf16 recipe on the cpu backend (no torch needed):
the bench's own checks (every ring variant against the full head of its recipe, every head against
float64 on dx and dW, Note [bench vocab tolerances] in src/bench/vocab.cpp) fail the run on a wrong
result; here the run must pass them, report bf16 errors of bf16 size (a run that silently computed
fp32 would sit at 1e-6), and halve what bf16 stores while the f32 logits keep the vocab peak.

usage: test_bench.py --bin build/flatpeak CASE
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ARGS = None
# Small enough for the float64 dW oracle (N V H < 2^32) and a second or two per run; V = 1001 leaves
# padding rows when split over ranks.
SHAPE = ["--tokens", "256", "--vocab", "1001", "--hidden", "64", "--repeats", "1", "--warmup", "0"]
N, V, H = 256, 1001, 64


def run(cmd, expect_ok=True, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def checks_hold(j, recipes, W):
    """Every head's dx/dW vs float64 and every ring's comparison with its full head were checked and
    are within the tolerance the bench states; bf16 errors are bf16-sized (the recipe really ran)."""
    c = j["check"]
    for r in recipes:
        tol = c["tolerances"][r]
        if r == "bf16":
            assert abs(tol["dx_dW_vs_fp64"] - (W + 2) * 2.0 ** -7) < 1e-12, tol
        names = [k for k in j if isinstance(j[k], dict) and j[k].get("precision") == r]
        assert any(n.startswith("full") for n in names) and any(n.startswith("ring") for n in names), names
        for n in names:
            for what in ("dx_err_vs_fp64", "dW_err_vs_fp64"):
                err = c[what][n]
                assert 0 <= err <= tol["dx_dW_vs_fp64"], (n, what, err, tol)
                if r == "bf16":
                    assert err > 1e-4, f"{n}: {what} {err} is fp32-sized: did bf16 run?"
                else:
                    assert err < 1e-5, (n, what, err)
            if n.startswith("ring"):
                assert c[n]["loss_rel_diff"] <= tol["loss_ring_vs_full"], (n, c[n])
                assert c[n]["dx_max_rel_diff"] <= tol["dx_dW_ring_vs_full"], (n, c[n])
                assert c[n]["dW_max_rel_diff"] <= tol["dx_dW_ring_vs_full"], (n, c[n])


def case_vocab_bf16(tmp):
    """One rank, fp32 and bf16 in the same run: both recipes pass their checks; in bf16 the vocab
    peak (f32 logits) is fp32's to the byte and the device peak is lower by at least the halved
    lm_head, its gradient, x and dx (4 V H + 4 N H bytes)."""
    out = os.path.join(tmp, "vocab.json")
    p = run([ARGS.bin, "bench", "vocab"] + SHAPE + ["--no-torch", "--precision", "fp32,bf16", "--json", out])
    assert "| full/bf16 | bf16 |" in p.stdout and "| ring/fp32 | fp32 |" in p.stdout, p.stdout
    j = json.load(open(out))
    assert j["precision"] == ["fp32", "bf16"], j["precision"]
    checks_hold(j, ["fp32", "bf16"], 1)
    for v in ("full", "ring"):
        a, b = j[f"{v}/fp32"], j[f"{v}/bf16"]
        assert b["vocab_peak_bytes"] == a["vocab_peak_bytes"], (v, a, b)
        assert a["peak_bytes"] - b["peak_bytes"] >= 4 * V * H + 4 * N * H, (v, a["peak_bytes"], b["peak_bytes"])
    # bf16 alone (the default name set) and a recipe the bench does not know.
    p = run([ARGS.bin, "bench", "vocab"] + SHAPE + ["--no-torch", "--precision", "bf16", "--json", out])
    j = json.load(open(out))
    assert j["precision"] == ["bf16"] and j["full"]["precision"] == "bf16", j
    checks_hold(j, ["bf16"], 1)
    p = run([ARGS.bin, "bench", "vocab"] + SHAPE + ["--no-torch", "--precision", "fp16"], expect_ok=False)
    assert p.returncode != 0 and "fp16" in p.stderr, p.stderr
    print("bench vocab bf16, one rank: checks within bounds, vocab peak kept, device peak lower")


def case_vocab_bf16_mpi(tmp):
    """Two ranks, lm_head FSDP-sharded, both ring modes, fp32 and bf16: every check passes."""
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found (scripts/deps installs openmpi-bin)"
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    out = os.path.join(tmp, "vocab.json")
    run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", ARGS.bin, "bench", "vocab"] + SHAPE +
        ["--fsdp", "--ring-mode", "both", "--precision", "fp32,bf16", "--json", out], env=env)
    j = json.load(open(out))
    assert j["ranks"] == 2
    checks_hold(j, ["fp32", "bf16"], 2)
    print("bench vocab bf16, 2 ranks: checks within bounds")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("case")
    ARGS = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        globals()["case_" + ARGS.case](tmp)


if __name__ == "__main__":
    main()
