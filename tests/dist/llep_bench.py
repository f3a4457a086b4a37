#!/usr/bin/env python3
"""`flatpeak bench dispatch` smoke test (issue 6; ctest label mpi).

usage: llep_bench.py --bin-dir BUILD

On 2 ranks, a small cpu run (check against standard, then time) and a meta run under hot:0.95:4:
the JSON has every variant with its peaks, load ratio and (chunked) K, chunk_send_ratio and
recv_frac_of_bound; the variants (PipelinedLLEP with the token side in chunks among them) agree with
standard within 1e-5; the chunk buffers stay within
their launch bound; LLEP balances the ranks that standard leaves skewed; meta reports the same peaks
as cpu.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none",
           OMPI_MCA_rmaps_base_oversubscribe="1")
VARIANTS = ("standard", "llep", "pipelined_llep_strided", "pipelined_llep_contiguous", "pipelined_llep_token_chunks")
KEYS = ("dispatch_peak_bytes", "peak_bytes", "receive_side_peak_bytes", "rank_load_max_over_mean")


def bench(args, device, out):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", os.path.join(args.bin_dir, "flatpeak"),
           "bench", "dispatch", "--tokens", "256", "--experts", "8", "--top-k", "2", "--hidden", "32",
           "--intermediate", "48", "--profile", "hot:0.95:2", "--chunk-cap", "64", "--min-tokens-per-gemm", "16",
           "--token-chunk", "48", "--device", device, "--repeats", "2", "--warmup", "0", "--json", out]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=300)
    if p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    print(p.stdout.strip())
    return json.load(open(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="flatpeak_llep_bench_") as tmp:
        cpu = bench(args, "cpu", os.path.join(tmp, "cpu.json"))
        meta = bench(args, "meta", os.path.join(tmp, "meta.json"))
    for v in VARIANTS:
        for k in KEYS:
            assert k in cpu[v] and k in meta[v], (v, k)
        assert "seconds" in cpu[v] and "seconds" not in meta[v], v
        for k in ("dispatch_peak_bytes", "receive_side_peak_bytes"):
            assert cpu[v][k] == meta[v][k], f"{v} {k}: cpu {cpu[v][k]} meta {meta[v][k]}"
        if v != "standard":
            c = cpu["check"][v]
            assert max(c.values()) <= 1e-5, (v, c)
        if v.startswith("pipelined"):
            # 256 tokens in chunks of 64: K = 4; with the token side in chunks of 48, each of the 6 windows
            # gets its share of max_chunks and c_eff = 48 (one pipelined chunk per window)
            assert cpu[v]["chunks"] == (1 if v.endswith("token_chunks") else 4), cpu[v]
            assert 0 < cpu[v]["recv_frac_of_bound"] <= 1, cpu[v]
            assert cpu[v]["chunk_send_ratio"] >= 1 and not cpu[v]["chunk_bound_exceeded"], cpu[v]
            assert cpu[v]["receive_side_peak_bytes"] <= cpu[v]["chunk_bound_bytes"], cpu[v]
    assert cpu["standard"]["rank_load_max_over_mean"] > 1.5, cpu["standard"]
    assert cpu["llep"]["rank_load_max_over_mean"] < 1.1 and cpu["llep"]["plan_active"], cpu["llep"]
    # The token side in chunks: the activations peak below the whole token side's.
    chunked, whole = cpu["pipelined_llep_token_chunks"], cpu["pipelined_llep_strided"]
    assert chunked["activations_peak_bytes"] < whole["activations_peak_bytes"], (chunked, whole)
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
