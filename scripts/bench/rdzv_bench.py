#!/usr/bin/env python3
"""Rendezvous benchmark: ddprun's dynamic (c10d) rendezvous against torchrun's,
with real agent processes on this machine (loopback), in one run.

    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/rdzv_bench.py [--reps N]

Measures, for both launchers (--rdzv-backend=c10d, --nproc-per-node=1,
--no-python, a tiny C worker that stamps CLOCK_REALTIME as its first action):
  1. formation: N agents (--nnodes=N:N). N-1 agents are started and left to
     settle (their CPU time stops growing: imported, joined, waiting), then
     the last one is started; the figure is the time from its start to the
     last worker's stamp. Settling first stands in for N machines: on 2 cores
     N agents starting at once would measure their start-up contending for
     the CPU, not the rendezvous. Median of --reps.
  2. failure: 3 agents (--nnodes=2:3) running; `kill -9` of a node that does
     not host the endpoint (its agent and its worker, as when the machine
     dies); the figure is the time from the kill to the last survivor's new
     worker stamp, with the default keep-alive (5 s x 3) and a tight one
     (0.1 s x 3). torchrun is watched for --torchrun-watch seconds instead:
     whether it re-forms at all, and whether its survivors' workers still run.
torchrun runs for the N its memory allows here (about 0.5 GiB per agent: the
N that would take more than half the available memory are skipped, and the
output says so). Writes docs/rdzv_bench.json and prints markdown tables.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))
sys.path.insert(0, os.path.join(ROOT, "tests", "pyutil"))
from procs import alive, kill_all, listening, wait_for  # noqa: E402
from reserved_port import ReservedPort  # noqa: E402

GiB = 1 << 30
TORCHRUN_AGENT_BYTES = 0.55 * GiB  # measured peak RSS of one torchrun agent (~530 MiB)

# argv: DIR MODE; MODE "exit" returns at once, "hold" waits to be killed.
# Writes DIR/ts_<pid> = "<stamp> <node> <group rank> <world size> <pid>".
WORKER_C = r'''
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static const char* env(const char* k) { const char* v = getenv(k); return v ? v : "-"; }
int main(int argc, char** argv) {
  struct timespec t; clock_gettime(CLOCK_REALTIME, &t);
  char path[4096], tmp[4096];
  snprintf(path, sizeof path, "%s/ts_%d", argv[1], (int)getpid());
  snprintf(tmp, sizeof tmp, "%s/.ts_%d", argv[1], (int)getpid());
  FILE* f = fopen(tmp, "w");
  fprintf(f, "%ld.%09ld %s %s %s %d\n", (long)t.tv_sec, t.tv_nsec, env("BENCH_NODE"),
          env("GROUP_RANK"), env("WORLD_SIZE"), (int)getpid());
  fclose(f); rename(tmp, path);
  if (strcmp(argv[2], "hold") == 0) for (;;) pause();
  return 0;
}
'''


def launcher(name):
    if name == "ddprun":
        return [os.path.join(BIN, "ddprun")]
    return [sys.executable, "-m", "torch.distributed.run"]


def cpu_seconds(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def settle(pids, window=0.5, limit=300.0):
    """Waits until the processes together used under 10 % of one core over
    `window` seconds (done starting up, waiting in the rendezvous)."""
    end = time.monotonic() + limit
    before = sum(cpu_seconds(p) for p in pids)
    while time.monotonic() < end:
        time.sleep(window)
        now = sum(cpu_seconds(p) for p in pids)
        if now - before < 0.1 * window:
            return
        before = now
    raise RuntimeError("agents still busy after %.0f s" % limit)


def stamps(d):
    """[(stamp, node, group rank, world size, pid)] of the workers so far."""
    out = []
    for name in os.listdir(d):
        if name.startswith("ts_"):
            with open(os.path.join(d, name)) as f:
                s, node, gr, ws, pid = f.read().split()
            out.append((float(s), node, gr, int(ws), int(pid)))
    return out


class Job:
    """N agents of one launcher on one rendezvous, each with BENCH_NODE=i."""

    def __init__(self, name, worker, tmp, nnodes, mode, conf=None, max_restarts=0):
        self.name, self.worker, self.mode = name, worker, mode
        self.dir = tempfile.mkdtemp(dir=tmp)
        self.port = ReservedPort()  # the first agent to start binds it
        self.args = ["--nnodes=" + nnodes, "--nproc-per-node=1", "--rdzv-backend=c10d",
                     "--rdzv-endpoint=127.0.0.1:%d" % self.port.port,
                     "--rdzv-id=bench", "--max-restarts=%d" % max_restarts, "--no-python"]
        if conf:
            self.args.append("--rdzv-conf=" + conf)
        self.procs = []
        self.logs = []

    def start_host(self):
        """Node 0, waited for until it listens: with a loopback endpoint every
        agent may host, and the first to bind does. Node 0 must, so that the
        node killed later (2) is never the store's host."""
        p = self.start(0)
        if not wait_for(lambda: listening(self.port.port) or p.poll() is not None, 60):
            raise RuntimeError("%s: node 0 does not listen after 60 s%s" % (self.name,
                                                                              self.tail()))
        return p

    def start(self, node):
        log = open(os.path.join(self.dir, "agent_%d.log" % node), "w+")
        env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="ERROR", BENCH_NODE=str(node))
        p = subprocess.Popen(launcher(self.name) + self.args + [self.worker, self.dir, self.mode],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             env=env)
        self.procs.append(p)
        self.logs.append(log)
        return p

    def wait_workers(self, pred, count, timeout, killed=()):
        """The stamps matching `pred` once there are `count`; raises if an
        agent (not one of `killed`) fails first or `timeout` passes."""
        def failed():
            return any(p.poll() not in (None, 0) for p in self.procs if p not in killed)
        if not wait_for(lambda: len([s for s in stamps(self.dir) if pred(s)]) >= count
                        or failed(), timeout):
            raise RuntimeError("%s: %d workers not running after %.0f s%s"
                               % (self.name, count, timeout, self.tail()))
        got = [s for s in stamps(self.dir) if pred(s)]
        if len(got) < count:
            raise RuntimeError("%s: an agent failed%s" % (self.name, self.tail()))
        return got

    def tail(self):
        """Each agent's exit code and the end of its output."""
        out = ""
        for i, (p, log) in enumerate(zip(self.procs, self.logs)):
            log.seek(0)
            text = log.read()
            out += "\n--- agent %d (%s): %s" % (i, "running" if p.poll() is None else
                                              "exit %d" % p.returncode, text[-1500:])
        return out

    def close(self):
        """Kills every agent and worker still there, reaps, frees the port."""
        kill_all([p.pid for p in self.procs])
        kill_all([s[4] for s in stamps(self.dir)])
        for p in self.procs:
            p.wait()
        for log in self.logs:
            log.close()
        self.port.close()


def formation(name, worker, tmp, n, timeout):
    job = Job(name, worker, tmp, "%d:%d" % (n, n), "exit")
    try:
        job.start_host()
        for node in range(1, n - 1):
            job.start(node)
        settle([p.pid for p in job.procs])
        t0 = time.time()
        job.start(n - 1)
        got = job.wait_workers(lambda s: True, n, timeout)
        gap = (max(s[0] for s in got) - t0, min(s[0] for s in got) - t0)
        for p in job.procs:
            rc = p.wait(timeout)
            if rc != 0:
                raise RuntimeError("%s: an agent exited %d%s" % (name, rc, job.tail()))
        return gap
    finally:
        job.close()


def failure(name, worker, tmp, conf, watch):
    """Seconds from kill -9 of node 2 to both survivors' new workers
    running; for torchrun, (None, survivors' workers alive) after `watch`."""
    job = Job(name, worker, tmp, "2:3", "hold", conf, max_restarts=3)
    try:
        job.start_host()
        for node in (1, 2):
            job.start(node)
        three = job.wait_workers(lambda s: s[3] == 3, 3, 120)
        settle([p.pid for p in job.procs])
        victim = [s[4] for s in three if s[1] == "2"]
        kill_all([job.procs[2].pid] + victim)
        killed = time.time()
        if name == "torchrun":
            time.sleep(watch)  # the claim is "nothing happens for this long"
            reformed = [s for s in stamps(job.dir) if s[3] == 2]
            survivors = [s[4] for s in three if s[1] != "2"]
            return (None if not reformed else max(s[0] for s in reformed) - killed,
                    all(alive(p) for p in survivors))
        two = job.wait_workers(lambda s: s[3] == 2, 2, 120, killed=[job.procs[2]])
        return max(s[0] for s in two) - killed, True
    finally:
        job.close()


def torchrun_sizes(sizes):
    avail = status_meminfo("MemAvailable")
    ok = [n for n in sizes if n * TORCHRUN_AGENT_BYTES < avail / 2]
    return ok, avail


def status_meminfo(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="3,16,64,256")
    ap.add_argument("--failure-reps", type=int, default=3)
    ap.add_argument("--torchrun-watch", type=float, default=30.0)
    ap.add_argument("--launchers", default="ddprun,torchrun")
    ap.add_argument("--merge", action="store_true",
                    help="keep the figures of launchers not run from the existing JSON")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--report-only", action="store_true",
                    help="print the tables and redraw the plot from the existing JSON")
    args = ap.parse_args()
    if args.report_only:
        out_json = os.path.join(args.out, "rdzv_bench.json")
        with open(out_json) as f:
            res = json.load(f)["results"]
        table = report(res, args)
        print(table)
        save(res, out_json, table)
        plot(res, os.path.join(args.out, "rdzv_bench.png"))
        return
    tmp = tempfile.mkdtemp(prefix="rdzv_bench_")
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, tmp):
    sizes = [int(x) for x in args.sizes.split(",") if x]
    worker = os.path.join(tmp, "worker")
    subprocess.run(["cc", "-O2", "-x", "c", "-", "-o", worker], input=WORKER_C.encode(),
                   check=True)
    which = args.launchers.split(",")
    theirs, avail = torchrun_sizes(sizes)
    out_json = os.path.join(args.out, "rdzv_bench.json")
    res = {"formation": {}, "failure": {}}
    if args.merge and os.path.exists(out_json):
        with open(out_json) as f:
            res = json.load(f)["results"]
    if "torchrun" in which and sizes:
        res.update(torchrun_skipped=[n for n in sizes if n not in theirs],
                   mem_available_gib=avail / GiB)
    res["cpus"] = os.cpu_count()
    load = res.setdefault("load_average_1min", {})
    for name in which:
        load[name] = {"start": os.getloadavg()[0]}
    for n in sizes:
        for name in [w for w in which if w == "ddprun" or n in theirs]:
            reps = args.reps if n <= 16 else max(1, min(args.reps, 3))
            both = [formation(name, worker, tmp, n, 600) for _ in range(reps)]
            runs, firsts = [b[0] for b in both], [b[1] for b in both]
            res["formation"].setdefault(str(n), {})[name] = {
                "median_s": statistics.median(runs), "runs_s": runs,
                "first_worker_median_s": statistics.median(firsts)}
            print("formation", n, name, ["%.4f" % r for r in runs], "first worker",
                  ["%.4f" % r for r in firsts], file=sys.stderr)
            save(res, out_json)
    # torchrun reads keep_alive_interval as whole seconds: its tightest is 1 s.
    keep = {"default (5 s x 3)": (None, None),
            "tight (0.1 s x 3; torchrun 1 s x 3)": (
                "keep_alive_interval=0.1,keep_alive_max_attempt=3",
                "keep_alive_interval=1,keep_alive_max_attempt=3")}
    for label, (conf, their_conf) in keep.items() if args.failure_reps > 0 else ():
        if "ddprun" in which:
            runs = [failure("ddprun", worker, tmp, conf, 0)[0]
                    for _ in range(args.failure_reps)]
            res["failure"].setdefault(label, {})["ddprun"] = {
                "median_s": statistics.median(runs), "max_s": max(runs), "runs_s": runs}
            print("failure", label, "ddprun", ["%.4f" % r for r in runs], file=sys.stderr)
            save(res, out_json)
        if "torchrun" in which:
            gap, kept = failure("torchrun", worker, tmp, their_conf, args.torchrun_watch)
            res["failure"].setdefault(label, {})["torchrun"] = {"reformed_after_s": gap,
                                                 "watched_s": args.torchrun_watch,
                                                 "survivor_workers_running": kept}
            print("failure", label, "torchrun", gap, kept, file=sys.stderr)
    for name in which:
        load[name]["end"] = os.getloadavg()[0]
    table = report(res, args)
    print(table)
    save(res, out_json, table)
    plot(res, os.path.join(args.out, "rdzv_bench.png"))


def save(res, path, table=None):
    """Writes what was measured so far (a later failure keeps it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"results": res, "table": table}, f, indent=1)


def plot(res, path):
    """Formation time against N, both launchers, log-log (skipped without
    matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("ddprun", "torchrun"):
        pts = sorted((int(n), r[name]["median_s"]) for n, r in res["formation"].items()
                     if name in r)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("agents (N)")
    ax.set_ylabel("last agent start -> all workers running (s)")
    ax.set_title("c10d rendezvous formation, one 2-core machine")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def report(res, args):
    lines = ["Formation: last agent's start -> all N workers running (s, median of %d; 3 for "
             "N > 16):" % args.reps, "",
             "| N agents | ddprun | torchrun | torchrun / ddprun |", "|---|---|---|---|"]
    for n, r in sorted(res["formation"].items(), key=lambda kv: int(kv[0])):
        d = r.get("ddprun", {}).get("median_s")
        t = r.get("torchrun", {}).get("median_s")
        if t:
            theirs = "%.3f" % t
        elif int(n) in res.get("torchrun_skipped", []):
            theirs = "skipped (memory)"
        else:
            theirs = "not run"
        lines.append("| %s | %s | %s | %s |" % (n, "%.4f" % d if d else "not run", theirs,
                                                "%.0fx" % (t / d) if t and d else "-"))
    lines += ["", "Failure: kill -9 of a non-host node of 3 (--nnodes=2:3) -> the survivors' "
              "new workers running (s):", "",
              "| keep-alive | heartbeat timeout | ddprun median | ddprun max | torchrun |",
              "|---|---|---|---|---|"]
    for label, r in res["failure"].items():
        timeout = 15.0 if label.startswith("default") else 0.3
        d = r.get("ddprun", {"median_s": float("nan"), "max_s": float("nan")})
        t = r.get("torchrun")
        if t is None:
            ts = "not run"
        elif t["reformed_after_s"] is None:
            ts = "no new round in %.0f s; survivors' workers %s" % (
                t["watched_s"], "still running" if t["survivor_workers_running"] else "gone")
        else:
            ts = "%.3f" % t["reformed_after_s"]
        lines.append("| %s | %.1f | %.3f | %.3f | %s |" % (label, timeout, d["median_s"],
                                                          d["max_s"], ts))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
