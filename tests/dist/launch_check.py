#!/usr/bin/env python3
"""flatpeak launch, the supervisor, and the step watchdog (issue 51, items 2 and 3; docs/cluster.md, "The supervisor").

usage: launch_check.py --bin-dir BUILD --configs CONFIGS CASE
  launch         on this machine: a step over train.step_timeout ends the run with exit 124 and an error naming
                 the step; a rank that fails at the same step every time stops launch after one restart (no
                 progress), each decision in launch.jsonl; a launch into another run's folder is not restarted
                 from that run's checkpoint; bad input refused by name
  launch_faults  2 hosts of network namespaces (netns_hosts --up), 4 ranks dp2 x cp2: once step 3 is done, rank 3
                 killed with SIGKILL; host 1's processes frozen with SIGSTOP; host 1's link taken down (--elastic).
                 Each time every rank of the failed attempt ends within the bound, launch resumes from the newest
                 checkpoint and the final weights equal, bit for bit, a run resumed by hand from that checkpoint on
                 the same layout (with the link down: on host 0 alone, dp1 x cp2 reading 4 sequences a step);
                 exits 77 (skipped) where namespaces cannot be made
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_check as dc  # noqa: E402

A = None
ENV = dict(dc.ENV)
STEPS = 6
BOUND = 60  # seconds: every rank of a failed attempt has ended within this of the fault (docs/cluster.md)
STEP_TIMEOUT = 10


def flatpeak():
    return os.path.join(A.bin_dir, "flatpeak")


def train_cmd(out, extra=()):
    return (["train", "--config", os.path.join(A.configs, "tiny.toml"), "--steps", str(STEPS), "--out", out, "--quiet",
             "--set", "train.seq_len=128", "--set", "train.checkpoint_every=2", "--set", "train.keep_checkpoints=8"]
            + list(extra))


def decisions(out):
    path = os.path.join(out, "launch.jsonl")
    return [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []


def metrics_steps(out):
    path = os.path.join(out, "metrics.jsonl")
    return sum(1 for l in open(path) if l.strip()) if os.path.exists(path) else 0


def checkpoint_dir(out, step):
    return os.path.join(out, f"step-{step:08d}")


def same_weights(a, b):
    """Bit for bit: every tensor of the two model.safetensors (names, shapes, dtypes and bytes)."""
    wa = dc.safetensors_io.load(os.path.join(a, "model.safetensors"))[0]
    wb = dc.safetensors_io.load(os.path.join(b, "model.safetensors"))[0]
    assert sorted(wa) == sorted(wb), "other tensor names"
    differ = [n for n in wa if wa[n].dtype != wb[n].dtype or wa[n].shape != wb[n].shape or not (wa[n] == wb[n]).all()]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:3]}"
    return len(wa)


def case_launch(tmp):
    # The watchdog: a bound no step can meet (1 ms) ends one process with its error and exit 124.
    p = subprocess.run([flatpeak()] + train_cmd(os.path.join(tmp, "wd"), ["--set", "train.step_timeout=0.001"]),
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert p.returncode == 124, (p.returncode, p.stderr[-2000:])
    assert "error: step 1 did not finish in 0.001 s (in the batch, forward, backward and update" in p.stderr, p.stderr
    print("a step over train.step_timeout: exit 124,", [l for l in p.stderr.splitlines() if "did not finish" in l][0])
    # A rank that fails at step 3 every time: attempt 1 fails after step 2 (checkpoint of step 2), attempt 2 fails
    # the same way from it: launch stops with an error, without a third attempt.
    d = os.path.join(tmp, "fail")
    t0 = time.time()
    p = subprocess.run([flatpeak(), "launch", "--np", "2", "--max-restarts", "5", "--mpirun-args",
                        "--oversubscribe -x OMP_NUM_THREADS -x FLATPEAK_FAIL_RANK", "--"] + train_cmd(d),
                       capture_output=True, text=True, env=dict(ENV, FLATPEAK_FAIL_RANK="1:3"), timeout=300)
    events = [e["event"] for e in decisions(d)]
    print(f"a rank failing at step 3 each time: launch exit {p.returncode} after {time.time() - t0:.1f} s; decisions "
          f"{events}")
    assert p.returncode == 1, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert events == ["start", "failed", "restart", "start", "failed", "give_up"], events
    assert "fails again at step 3 with no progress since the checkpoint of step 2" in p.stderr, p.stderr[-2000:]
    assert "[flatpeak launch] restart 1 of at most 5: from the checkpoint of step 2, redoing 0 steps" in p.stdout
    # The folder now holds a run: a launch that neither resumes nor overwrites it fails at the start, and is not
    # restarted from that run's checkpoint.
    p = subprocess.run([flatpeak(), "launch", "--np", "2", "--mpirun-args", "--oversubscribe", "--"] + train_cmd(d),
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode == 1 and "holds an earlier run" in p.stderr and "restart 1" not in p.stdout, (
        p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    print("a launch into another run's folder: not restarted,", p.stderr.strip().splitlines()[-2])
    # Bad input, refused by name.
    for args, says in (
            (["--np", "2", "--"] + train_cmd(d, ["--stop-after", "2"]), "does not take train's --stop-after"),
            (["--np", "2", "--", "eval", "--checkpoint", d], "supervises 'train' runs; got 'eval'"),
            (["--np", "2", "--elastic", "--"] + train_cmd(d), "--elastic needs --hostfile"),
            (["--np", "2", "--mpirun-args", "-np 4", "--"] + train_cmd(d), "--mpirun-args holds '-np'"),
            (["--np", "2", "--restarts", "2", "--"] + train_cmd(d), "--restarts"),
            (["--np", "2", "--", "train", "--config", "x.toml"], "the train command has no --out")):
        p = subprocess.run([flatpeak(), "launch"] + args, capture_output=True, text=True, env=ENV, timeout=60)
        assert p.returncode != 0 and says in p.stderr, (args, p.returncode, p.stderr[-1000:])
    print("bad launch commands refused by name")


def run_pids(out):
    """The ranks of the run writing to out: (pid, rank) of each flatpeak process started by mpirun."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and out in dc.proc_cmdline(pid) and " train " in dc.proc_cmdline(pid):
            rank = dc.proc_env(pid).get("OMPI_COMM_WORLD_RANK")
            if rank is not None:
                found.append((pid, int(rank)))
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def supervised(tmp, hd, name, fault, elastic=False):
    """flatpeak launch of 4 ranks (dp2 x cp2, ep = fsdp = 2) on the 2 hosts of hd; once step 3 is done,
    fault(prefix, out) does something to host 1 and returns the pids that cannot end before it is undone (frozen),
    or []. Returns (launch's decisions, seconds from the fault until every other rank of attempt 1 ended)."""
    d = os.path.join(tmp, name)
    prefix = open(os.path.join(hd, "prefix")).read().strip()
    cmd = [dc.NETNS_HOSTS, "--run", hd, "--", flatpeak(), "launch", "--np", "4", "--hostfile",
           os.path.join(hd, "hostfile"), "--mpirun-args", "-x OMP_NUM_THREADS --bind-to none --map-by slot",
           "--step-timeout", str(STEP_TIMEOUT), "--hang-after", str(STEP_TIMEOUT + 5), "--probe-timeout", "10"]
    cmd += (["--elastic"] if elastic else []) + ["--"] + train_cmd(d, ["--set", "parallel.dp=2", "--set",
                                                                       "train.batch_size=2", "--set", "parallel.ep=2",
                                                                       "--set", "parallel.fsdp=2"])
    # Output to files, not pipes: a lost host's Open MPI daemon (a link cut) outlives the run and would hold a pipe.
    os.makedirs(d)
    out_f, err_f = open(os.path.join(tmp, name + ".out"), "w+"), open(os.path.join(tmp, name + ".err"), "w+")
    p = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, text=True, env=ENV)
    deadline = time.time() + 120
    while p.poll() is None and time.time() < deadline and metrics_steps(d) < 3:
        time.sleep(0.1)
    assert p.poll() is None, f"{name}: launch ended before the fault"
    first = run_pids(d)
    assert len(first) == 4, f"{name}: ranks {first}"
    frozen = fault(prefix, d)
    t0 = time.time()
    while time.time() - t0 < BOUND and any(alive(pid) for pid, _ in first if pid not in frozen):
        time.sleep(0.1)
    gone = time.time() - t0
    left = [pid for pid, _ in first if pid not in frozen and alive(pid)]
    read = lambda f: (f.seek(0), f.read())[1]
    try:
        p.wait(timeout=240)
        out, err = read(out_f), read(err_f)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = read(out_f), read(err_f)
        sys.exit(f"FAILED: {name}: launch still running 240 s after the fault\n{out[-3000:]}\n{err[-3000:]}")
    ended_frozen = [pid for pid in frozen if not alive(pid)]  # ended while stopped (SIGKILL)
    for pid in frozen:  # thawed: each finds its step's deadline long past and ends at once
        try:
            os.kill(int(pid), signal.SIGCONT)
        except ProcessLookupError:
            pass
    t1 = time.time()
    while time.time() - t1 < BOUND and any(alive(pid) for pid in frozen):
        time.sleep(0.1)
    thawed = time.time() - t1
    still = [pid for pid in frozen if alive(pid)]
    for pid in still:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"{name}: ranks of the failed attempt still running {BOUND} s after the fault: {left}"
    assert not still, f"{name}: frozen ranks still running {BOUND} s after SIGCONT: {still}"
    assert p.returncode == 0, f"{name}: launch exit {p.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    ev = decisions(d)
    failed = [e for e in ev if e["event"] == "failed"]
    restart = [e for e in ev if e["event"] == "restart"]
    finished = [e for e in ev if e["event"] == "finished"]
    assert len(failed) == 1 and len(restart) == 1 and len(finished) == 1, [e["message"] for e in ev]
    assert finished[0]["last_step"] == STEPS and finished[0]["restarts"] == 1
    assert finished[0]["steps_redone"] == failed[0]["last_step"] - failed[0]["checkpoint_step"]
    said = " / ".join(l.strip() for l in err.splitlines() if "did not finish" in l or "noticed" in l)
    print(f"{name}: every rank of attempt 1 ended {gone:.1f} s after the fault"
          f"{f'; of the {len(frozen)} frozen processes of host 1, {len(ended_frozen)} ended while stopped (SIGKILL), the others {thawed:.1f} s after SIGCONT' if frozen else ''}; attempt 1: {failed[0]['status']} "
          f"after {failed[0]['seconds']:.1f} s; {restart[0]['message']}; {finished[0]['message']}; ranks: {said[:300]!r}")
    return d, ev, failed[0], gone


def resumed_by_hand(tmp, name, d, ck_step, np_, sets):
    """The same run resumed by hand from a copy of d's checkpoint of ck_step, with mpirun on np_ ranks of this machine
    (shared memory: a 4-rank run over the namespace hosts' TCP gives the same bits, measured); its final weights
    against launch's, bit for bit."""
    r = os.path.join(tmp, name + "_by_hand")
    os.makedirs(r)
    shutil.copytree(checkpoint_dir(d, ck_step), checkpoint_dir(r, ck_step))
    args = [flatpeak()] + train_cmd(r, [x for s in sets for x in ("--set", s)] + [
        "--resume", checkpoint_dir(r, ck_step)])
    p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_)] + args,
                       capture_output=True, text=True, env=ENV, timeout=300)
    dc.ok(p, f"{name}: resumed by hand")
    n = same_weights(os.path.join(d, "checkpoint"), os.path.join(r, "checkpoint"))
    print(f"{name}: final weights equal, bit for bit ({n} tensors), those of a run resumed by hand from step {ck_step} "
          f"on {np_} ranks")


def case_launch_faults(tmp):
    dc.hosts_or_skip(2)
    hd = os.path.join(tmp, "hosts")
    dc.ok(subprocess.run([dc.NETNS_HOSTS, "--hosts", "2", "--slots", "2", "--up", hd], capture_output=True,
                         text=True), "netns_hosts --up")
    prefix = open(os.path.join(hd, "prefix")).read().strip()
    layout = ["parallel.dp=2", "train.batch_size=2", "parallel.ep=2", "parallel.fsdp=2"]

    def on_host1(pid):
        return dc.in_netns(pid, f"{prefix}-h1")

    def kill_rank3(prefix_, out):
        pids = [pid for pid, rank in run_pids(out) if rank == 3]
        assert len(pids) == 1 and on_host1(pids[0]), f"rank 3: {pids}"
        os.kill(int(pids[0]), signal.SIGKILL)
        return []

    def freeze_host1(prefix_, out):  # every process of host 1: its Open MPI daemon and both ranks
        pids = [pid for pid in os.listdir("/proc") if pid.isdigit() and on_host1(pid)]
        assert len(pids) >= 3, f"host 1 runs {pids}"
        for pid in pids:
            os.kill(int(pid), signal.SIGSTOP)
        return pids

    def cut_host1(prefix_, out):  # its link to the switch down, for good: the host is gone
        subprocess.run(["ip", "-n", f"{prefix}-sw", "link", "set", "h1", "down"], check=True)
        return []

    try:
        if "rank3" in A.only:
            d, ev, failed, _ = supervised(tmp, hd, "rank3_killed", kill_rank3)
            resumed_by_hand(tmp, "rank3_killed", d, failed["checkpoint_step"], 4, layout)
        if "frozen" in A.only:
            d, ev, failed, _ = supervised(tmp, hd, "host1_frozen", freeze_host1)
            assert "timed out" in failed["status"] or any(e["event"] == "hung" for e in ev), [e["message"] for e in ev]
            resumed_by_hand(tmp, "host1_frozen", d, failed["checkpoint_step"], 4, layout)
        if "cut" in A.only:
            d, ev, failed, _ = supervised(tmp, hd, "host1_cut_elastic", cut_host1, elastic=True)
            probe = [e for e in ev if e["event"] == "probe"]
            lay = [e for e in ev if e["event"] == "layout"]
            assert probe and probe[0]["gone"] == "10.231.0.2" and lay, [e["message"] for e in ev]
            assert lay[0]["to"] == "2 ranks, parallel.dp = 1, train.batch_size = 4, parallel.ep = 2, parallel.fsdp = 2", lay
            resumed_by_hand(tmp, "host1_cut_elastic", d, failed["checkpoint_step"], 2,
                            layout + ["parallel.dp=1", "train.batch_size=4"])
    finally:
        for pid in os.listdir("/proc"):  # anything of the case left (a frozen host's daemon): thawed and ended
            if pid.isdigit() and (dc.in_netns(pid, f"{prefix}-h0") or on_host1(pid)):
                for sig in (signal.SIGKILL, signal.SIGCONT):
                    try:
                        os.kill(int(pid), sig)
                    except ProcessLookupError:
                        pass
        subprocess.run([dc.NETNS_HOSTS, "--down", hd])


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--configs", required=True)
    ap.add_argument("--only", default="rank3,frozen,cut", help="launch_faults: the faults to run")
    ap.add_argument("case")
    A = ap.parse_args()
    dc.A = A
    tmp = tempfile.mkdtemp(prefix="flatpeak_launch_")
    t0 = time.time()
    try:
        globals()["case_" + A.case](tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"1 passed, 0 failed ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
