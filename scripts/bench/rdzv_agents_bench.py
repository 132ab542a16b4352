#!/usr/bin/env python3
"""N real ddprun agents on this host against one ddprun-store (issue 43's
"1,024 real agent processes" goal): the store pinned to one core, the agents
to the other, all started at once (--rdzv-backend=c10d --nnodes=N:N
--nproc-per-node=1 --no-python true). Reports the time from the last agent's
start to the last agent's exit, every agent's exit code, and how many joined
(from their logs) when some did not finish within --bound; and, read from
the store every 50 ms, when every agent had arrived, when round 0 completed
and when it ended (seconds after the last start).

    python3 scripts/bench/rdzv_agents_bench.py --nodes 1024 [--bound 120] [--json F]
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))
sys.path.insert(0, os.path.join(ROOT, "tests", "pyutil"))
from procs import kill_all  # noqa: E402
from storewire import RawClient  # noqa: E402


def start_store(tmp, core):
    """ddprun-store on port 0 pinned to `core`; (process, port) from its
    "listening on ...:PORT" line."""
    log_path = os.path.join(tmp, "store.log")
    log = open(log_path, "w")
    p = subprocess.Popen(["taskset", "-c", str(core), os.path.join(BIN, "ddprun-store"),
                          "--port", "0", "--max-connections", "65536"],
                         stdout=log, stderr=subprocess.STDOUT)
    log.close()
    rx = re.compile(r"listening on .*:(\d+)")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = rx.search(open(log_path).read())
        if m:
            return p, int(m.group(1))
        if p.poll() is not None:
            raise SystemExit("ddprun-store exited: %s" % open(log_path).read())
        time.sleep(0.02)
    raise SystemExit("ddprun-store did not say where it listens")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--bound", type=float, default=120.0, help="seconds after the last start")
    ap.add_argument("--json")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = tempfile.mkdtemp(prefix="rdzv_agents_")
    cores = sorted(os.sched_getaffinity(0))
    store_core, agent_core = cores[0], cores[-1]
    store, port = start_store(tmp, store_core)
    env = dict(os.environ, LOGLEVEL="warning")
    agents = []
    try:
        t0 = time.monotonic()
        for i in range(a.nodes):
            err = open(os.path.join(tmp, "agent_%d.err" % i), "w")
            agents.append(subprocess.Popen(
                ["taskset", "-c", str(agent_core), os.path.join(BIN, "ddprun"),
                 "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:%d" % port,
                 "--rdzv-id=bench", "--nnodes=%d:%d" % (a.nodes, a.nodes),
                 "--nproc-per-node=1", "--max-restarts=0", "--no-python", "true"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env))
            err.close()
        last_start = time.monotonic()
        codes = {}
        watch = RawClient(port)
        marks = {}
        while len(codes) < len(agents) and time.monotonic() - last_start < a.bound:
            for i, p in enumerate(agents):
                if i not in codes and p.poll() is not None:
                    codes[i] = p.returncode
            now = round(time.monotonic() - last_start, 3)
            if "all_arrived_s" not in marks and \
                    watch.check(["/ddprun/bench/arrivals"]) and \
                    watch.add("/ddprun/bench/arrivals", 0) >= a.nodes:
                marks["all_arrived_s"] = now
            for name in ("complete", "end"):
                if "round0_%s_s" % name not in marks and \
                        watch.check(["/ddprun/bench/round/0/%s" % name]):
                    marks["round0_%s_s" % name] = now
            time.sleep(0.05)
        watch.close()
        done = time.monotonic()
        result = {"nodes": a.nodes, "start_span_s": round(last_start - t0, 3),
                  "finished": len(codes), "exit_0": sum(1 for c in codes.values() if c == 0),
                  "other_exits": sorted({c for c in codes.values() if c != 0}),
                  "last_start_to_last_exit_s": round(done - last_start, 3)
                  if len(codes) == len(agents) else None,
                  "bound_s": a.bound}
        result.update(marks)
        if len(codes) < len(agents):
            waiting = [open(os.path.join(tmp, "agent_%d.err" % i)).read().strip().splitlines()
                       for i in range(len(agents)) if i not in codes]
            result["last_words_of_one_waiting"] = waiting[0][-1:] if waiting else []
        print(json.dumps(result))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
        return 0 if result["exit_0"] == a.nodes else 1
    finally:
        kill_all([p.pid for p in agents if p.poll() is None])
        for p in agents:
            p.wait()
        store.kill()
        store.wait()
        # CPU of every agent and of the store (children reaped above): what
        # one core gave the agents' own work.
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(json.dumps({"children_cpu_s": round(r.ru_utime + r.ru_stime, 2),
                          "per_agent_ms": round(1000 * (r.ru_utime + r.ru_stime) /
                                                max(1, len(agents)), 1)}))


if __name__ == "__main__":
    sys.exit(main())
