#!/usr/bin/env python3
"""gpu_check's report: the gtest JSON of each binary it ran -> gpu_check.json and gpu_check.md in OUT.

Usage: gpu_check_report.py OUT REPORT.gtest.json...
One row per test case: its suite and name, passed / failed / skipped, the worst ratio to its error-model
bound (the properties test_cuda_matches_cpu.cpp records; 0 where bit for bit), and the first failure
message (gtest's JSON keeps no skip message: the first "no GPU: ..." line of the binaries' logs in OUT is
reported as the reason). Exit status: 1 when a case failed or a report is missing, 2 when no case compared a
cuda kernel with the cpu's (no GPU), else 0.
"""
import glob
import json
import os
import sys


def cases(path):
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        yield {"suite": os.path.basename(path), "name": "(no report)", "status": "missing", "worst": None,
               "message": str(e)}
        return
    for suite in report.get("testsuites", []):
        for t in suite.get("testsuite", []):
            failures = t.get("failures", [])
            skipped = t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN"
            worst = [float(v) for k, v in t.items() if k.endswith("worst/bound")]
            status = "failed" if failures else ("skipped" if skipped else "passed")
            message = failures[0].get("failure", "") if failures else ""
            if skipped and not message:
                message = t.get("skipped", {}).get("message", "") if isinstance(t.get("skipped"), dict) else ""
            yield {"suite": suite.get("name", ""), "name": t.get("name", ""), "status": status,
                   "worst": max(worst) if worst else None, "message": message.strip().splitlines()[0][:200]
                   if message.strip() else ""}


def main():
    out, reports = sys.argv[1], sys.argv[2:]
    rows = [c for r in reports for c in cases(r)]
    device = ""
    try:
        with open(os.path.join(out, "device.txt")) as f:
            device = f.read().strip()
    except OSError:
        pass
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("passed", "failed", "skipped", "missing")}
    skip_reason = ""
    for log in sorted(glob.glob(os.path.join(out, "*.log"))):
        with open(log, errors="replace") as f:
            for line in f:
                if "no GPU:" in line:
                    skip_reason = line.strip()[line.strip().index("no GPU:"):][:200]
                    break
        if skip_reason:
            break
    compared = sum(1 for r in rows if r["status"] == "passed" and "CudaMatchesCpu" in r["suite"])
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump({"device": device, "counts": counts, "compared_with_cpu": compared, "skip_reason": skip_reason,
                   "cases": rows}, f, indent=1)
    with open(os.path.join(out, "gpu_check.md"), "w") as f:
        f.write(f"# gpu_check: cuda kernels against cpu\n\nDevice: {device or 'unknown'}. ")
        f.write(", ".join(f"{n} {s}" for s, n in counts.items() if n) + ".")
        f.write(f" Skipped because: {skip_reason}.\n\n" if skip_reason else "\n\n")
        f.write("| suite | case | result | worst / bound | first message |\n| --- | --- | --- | --- | --- |\n")
        for r in rows:
            worst = "" if r["worst"] is None else f"{r['worst']:.3g}"
            msg = r["message"].replace("|", "/")
            f.write(f"| {r['suite']} | {r['name']} | {r['status']} | {worst} | {msg} |\n")
    print(f"[gpu_check] {counts} -> {out}/gpu_check.md", file=sys.stderr)
    if counts["failed"] or counts["missing"]:
        return 1
    return 0 if compared else 2


if __name__ == "__main__":
    sys.exit(main())
