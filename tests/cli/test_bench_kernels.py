#!/usr/bin/env python3
"""End-to-end tests of `flatpeak bench kernels` (src/bench/kernels.h): the kernel table's perf mode.

  cpu_small      --scale small --dtype both on cpu: every entry of FP_KERNEL_LIST (read from
                 src/backend/kernels.h) appears in each dtype, timed with a positive rate, FLOPs or bytes and
                 fraction of the measured limit, or with an explicit "not supported" / "missing"; the limits
                 (sgemm, memory bandwidth) are measured and positive; --only selects by regex.
  meta_and_bad   --backend meta prints the same rows with shapes, FLOPs and bytes and no time; an unknown
                 backend, a bad regex, a regex that matches no entry and a bad dtype fail with a clear error
                 and no table.

usage: test_bench_kernels.py --bin build/flatpeak --root . CASE
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ARGS = None


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if expect_ok and p.returncode != 0:
        sys.exit(f"FAILED: {' '.join(cmd)}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def kernel_list():
    """The entries of FP_KERNEL_LIST, in order, from the header itself."""
    src = open(os.path.join(ARGS.root, "src/backend/kernels.h")).read()
    body = src[src.index("#define FP_KERNEL_LIST(X)"):]
    body = body[:body.index("\n\n")]
    names = re.findall(r"X\((\w+)\)", body)
    assert len(names) >= 51 and len(set(names)) == len(names), names
    return names


def case_cpu_small(tmp):
    names = kernel_list()
    out = os.path.join(tmp, "k.json")
    p = run([ARGS.bin, "bench", "kernels", "--scale", "small", "--dtype", "both", "--repeats", "2", "--json", out])
    j = json.load(open(out))
    assert j["backend"] == "cpu" and j["scale"] == "small" and j["entries"] == len(names), {k: j[k] for k in j if k != "kernels"}
    lim = j["limits"]
    assert lim["gemm_flops_per_s"] > 0 and lim["bytes_per_s"] > 0, lim
    rows = {(r["kernel"], r["dtype"]): r for r in j["kernels"]}
    assert len(rows) == len(j["kernels"]) == 2 * len(names), (len(rows), len(j["kernels"]))
    timed = 0
    for n in names:
        for dt in ("f32", "bf16"):
            r = rows.get((n, dt))
            assert r is not None, f"{n} ({dt}) is not in the table"
            if r["status"] == "ok":
                timed += 1
                assert r["rate"] > 0 and r["seconds_median"] > 0 and r["runs"] >= 1, r
                assert r["bytes"] > 0 and r["shape"], r
                assert r["bound"] in ("flops", "bytes"), r
                if r["bound"] == "flops":
                    assert r["flops"] > 0 and abs(r["rate"] - r["flops"] / r["seconds_median"]) <= 1e-6 * r["rate"], r
                else:
                    assert abs(r["rate"] - r["bytes"] / r["seconds_median"]) <= 1e-6 * r["rate"], r
                assert r["fraction_of_limit"] > 0, r
            else:
                assert r["status"] in ("not supported", "missing"), r
                assert r.get("note"), r
            # the printed table has the row too
            assert re.search(rf"^\| {n} \| {dt} \|", p.stdout, re.M), f"{n} {dt} not printed"
    # The cpu table is the contract: every f32 row runs, and bf16 runs where the contract has a bf16 operand.
    for n in names:
        assert rows[(n, "f32")]["status"] == "ok", rows[(n, "f32")]
    unsupported = [n for n in names if rows[(n, "bf16")]["status"] != "ok"]
    assert all(rows[(n, "bf16")]["status"] == "not supported" for n in unsupported), unsupported
    assert "gemm" not in unsupported and "attention_forward" not in unsupported and "adamw_update" not in unsupported
    assert "router_forward" in unsupported and "online_lse_fold" in unsupported, unsupported
    assert timed == 2 * len(names) - len(unsupported), timed
    # The kernels that ran are named (GEMM library, SIMD level, bf16 route, CPU).
    last = [l for l in p.stdout.splitlines() if l.startswith("kernels: ")]
    assert last and "GEMMs" in last[-1] and "SIMD" in last[-1] and "cpu:" in last[-1], p.stdout[-2000:]
    # --only selects by regex.
    p = run([ARGS.bin, "bench", "kernels", "--scale", "small", "--only", "^attention_(forward|backward)$", "--repeats", "1",
             "--json", out])
    j = json.load(open(out))
    assert [r["kernel"] for r in j["kernels"]] == ["attention_forward", "attention_backward"], j["kernels"]
    assert all(r["status"] == "ok" and r["bound"] == "flops" for r in j["kernels"]), j["kernels"]
    print(f"bench kernels cpu small: {len(names)} entries x 2 dtypes, {timed} timed, {len(unsupported)} bf16 rows not "
          "supported by the contract")


def case_meta_and_bad(tmp):
    names = kernel_list()
    out = os.path.join(tmp, "m.json")
    p = run([ARGS.bin, "bench", "kernels", "--backend", "meta", "--json", out])
    j = json.load(open(out))
    assert j["backend"] == "meta" and "limits" not in j, j.keys()
    assert [r["kernel"] for r in j["kernels"]] == names, [r["kernel"] for r in j["kernels"]]
    for r in j["kernels"]:
        assert r["status"] == "not timed" and r["bytes"] > 0 and r["shape"] and "rate" not in r, r
    # the paper's scale: the first GEMM is tokens 2048 x hidden 4096 -> 4096
    assert j["kernels"][0]["flops"] == 2 * 2048 * 4096 * 4096, j["kernels"][0]
    assert "meta computes nothing" in p.stdout and "kernels: none ran" in p.stdout, p.stdout
    # An unknown backend: the registry's error, naming the registered ones; no table.
    p = run([ARGS.bin, "bench", "kernels", "--backend", "tpu"], expect_ok=False)
    assert p.returncode == 1 and "tpu" in p.stderr and "cpu" in p.stderr and "| kernel |" not in p.stdout, (p.stdout,
                                                                                                           p.stderr)
    # A bad regex and a bad dtype.
    p = run([ARGS.bin, "bench", "kernels", "--only", "(", "--scale", "small"], expect_ok=False)
    assert p.returncode == 1 and "regular expression" in p.stderr, p.stderr
    p = run([ARGS.bin, "bench", "kernels", "--only", "no_such_kernel", "--scale", "small"], expect_ok=False)
    assert p.returncode == 1 and "matches no entry" in p.stderr, p.stderr
    p = run([ARGS.bin, "bench", "kernels", "--dtype", "f16"], expect_ok=False)
    assert p.returncode == 1 and "f16" in p.stderr, p.stderr
    print("bench kernels: meta lists every entry untimed; unknown backend, bad regex and dtype refused")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("case", choices=["cpu_small", "meta_and_bad"])
    ARGS = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        globals()["case_" + ARGS.case](tmp)


if __name__ == "__main__":
    main()
