#!/usr/bin/env python3
"""The dynamic rendezvous at scale, simulated (issue 43): build/bin/rdzv_sim
(src/bench/rdzv_sim.cc) for N = 1,000, 4,000 and 10,000 agents, each with its
own connections, against one ddprun-store, with 100 us injected before every
store request; then one node lost at the largest N that formed.

    python3 scripts/bench/rdzv_sim_bench.py [--nodes 1000,4000,10000]
        [--latency-us 100] [--form-timeout-s 300] [--keepalive-window-s 10]
        [--max-rss-gib 12] [--kill-at max] [--out docs/rdzv_sim_bench.json]

Per N: the time until every agent holds its round info, store requests and
payload bytes per join (p50 / max over the agents: on the rendezvous's
connections, and on all of them, heartbeats included), connections per
agent, and the formed round's upkeep per node and second. The lost node
(--kill-one: its sockets shut without a goodbye, as kill -9 against a
separate ddprun-store) is measured with the default heartbeat (5 s x 3): the
time until every survivor was told the round ended, and until all of them
formed the next round.

Every run is bounded: forming by --form-timeout-s (the harness reports how
far it got: "did not form within X s, J of N joined"), the whole process by
that plus a margin, and its memory by --max-rss-gib (the run is stopped and
the table says so: the agents share this machine's memory). A machine that
cannot hold N agents' threads (kernel.pid_max, threads-max, max_map_count)
is reported as such by the harness without starting.
Writes --out (JSON) and prints a markdown table."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import cpu_model, git_commit, write_json_atomic  # noqa: E402

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))


def rss_bytes(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def run_sim(args, n, kill=False):
    """One rdzv_sim run; returns its JSON result, with "outcome" added."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        cmd = [os.path.join(BIN, "rdzv_sim"), "--nodes", str(n),
               "--latency-us", str(args.latency_us),
               "--form-timeout-s", str(args.form_timeout_s),
               "--reform-timeout-s", str(args.reform_timeout_s),
               "--keepalive-window-s", str(0 if kill else args.keepalive_window_s),
               "--json", out_path]
        if kill:
            cmd.append("--kill-one")
        bound = args.form_timeout_s + args.keepalive_window_s + \
            (args.reform_timeout_s if kill else 0) + 300
        print("$ " + " ".join(cmd), flush=True)
        t0 = time.monotonic()
        # Files, not pipes: a pipe nobody reads while the run goes on would
        # block the agents' log writes once full (and hang the run).
        out_f = open(os.path.join(tmp, "stdout"), "w+")
        err_f = open(os.path.join(tmp, "stderr"), "w+")
        p = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, text=True)
        peak, stopped = 0, None
        # A monitor, not a synchronisation: the run's memory and wall bound.
        while p.poll() is None:
            peak = max(peak, rss_bytes(p.pid))
            if peak > args.max_rss_gib * (1 << 30):
                stopped = "stopped at %.1f GiB of memory (--max-rss-gib %g)" % (
                    peak / (1 << 30), args.max_rss_gib)
            elif time.monotonic() - t0 > bound:
                stopped = "stopped after %d s (no result)" % bound
            if stopped:
                p.kill()
                break
            time.sleep(0.5)
        p.wait()
        out_f.seek(0)
        stdout = out_f.read()
        err_f.seek(0)
        stderr = err_f.read()[-100000:]
        out_f.close()
        err_f.close()
        wall = time.monotonic() - t0
        result = None
        if os.path.exists(out_path):
            with open(out_path) as f:
                result = json.load(f)
        else:
            lines = [l for l in stdout.splitlines() if l.startswith("{")]
            if lines:
                result = json.loads(lines[-1])
    result = result or {"nodes": n}
    result["wall_s"] = wall
    result["peak_rss_gib"] = peak / (1 << 30)
    if stopped and "formed" not in result:
        result["outcome"] = stopped
    elif "error" in result:
        result["outcome"] = "cannot run here: " + result["error"]
    elif not result.get("formed"):
        result["outcome"] = "did not form within %g s (%s of %d joined%s)" % (
            args.form_timeout_s, result.get("joined", "?"), n,
            "; " + result["first_error"][:200] if result.get("first_error") else "")
    elif kill and not (result.get("kill") or {}).get("reformed"):
        result["outcome"] = "formed; did not re-form within %g s after the loss" % \
            args.reform_timeout_s
    else:
        result["outcome"] = "ok"
    if stopped and result["outcome"] == "ok":
        result["outcome"] = stopped
    if result["outcome"] != "ok" and stderr.strip():
        result["stderr_tail"] = stderr.strip().splitlines()[-5:]
    print("  -> %s (%.0f s, peak %.2f GiB)" % (result["outcome"], wall, result["peak_rss_gib"]),
          flush=True)
    return result


def fmt(v, spec="%.2f"):
    return "-" if v is None else spec % v


def table(runs, kills):
    rows = ["| N | form (s) | requests / join p50 (max) | bytes / join p50 (max) | "
            "all connections: requests, bytes / join p50 | connections / agent | "
            "upkeep / node / s: requests, bytes | outcome |",
            "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        j = r.get("join", {})
        rr, rb = j.get("rdzv_requests", {}), j.get("rdzv_bytes", {})
        ka = r.get("keepalive", {})
        up = "-"
        if ka:
            up = "%.2f, %.0f" % (ka["rdzv_requests_per_node_s"] + ka["hb_requests_per_node_s"],
                                 ka["rdzv_bytes_per_node_s"] + ka["hb_bytes_per_node_s"])
        rows.append("| %d | %s | %s | %s | %s | %s | %s | %s |" % (
            r["nodes"], fmt(r.get("form_s")) if r.get("formed") else "-",
            "%d (%d)" % (rr["p50"], rr["max"]) if rr else "-",
            "%d (%d)" % (rb["p50"], rb["max"]) if rb else "-",
            "%d, %d" % (j["requests"]["p50"], j["bytes"]["p50"]) if j.get("requests") else "-",
            "%d" % j["connects"]["max"] if j.get("connects") else "-",
            up, r["outcome"]))
    if kills:
        rows += ["", "| lost node, N | heartbeat timeout (s) | every survivor told (s) | "
                 "next round formed (s) | per survivor since the loss: requests, bytes "
                 "(rendezvous) | outcome |", "|---|---|---|---|---|---|"]
    for kill in kills:
        k = kill.get("kill") or {}
        rows.append("| %d | %s | %s | %s | %s | %s |" % (
            kill["nodes"], fmt(k.get("heartbeat_timeout_s"), "%g"), fmt(k.get("detect_s")),
            fmt(k.get("reform_s")) if k.get("reformed") else "-",
            "%.0f, %.0f" % (k["rdzv_requests_per_survivor"], k["rdzv_bytes_per_survivor"])
            if "rdzv_requests_per_survivor" in k else "-", kill["outcome"]))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1000,4000,10000")
    ap.add_argument("--latency-us", type=int, default=100)
    ap.add_argument("--form-timeout-s", type=float, default=300)
    ap.add_argument("--reform-timeout-s", type=float, default=120)
    ap.add_argument("--keepalive-window-s", type=float, default=10)
    ap.add_argument("--max-rss-gib", type=float, default=12)
    ap.add_argument("--kill-at", default="max",
                    help="N of the lost-node runs, comma-separated; max: the largest that "
                         "formed; none: no such run")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "rdzv_sim_bench.json"))
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()

    runs = [run_sim(args, int(n)) for n in args.nodes.split(",")]
    formed = [r["nodes"] for r in runs if r.get("formed")]
    kills = []
    for k in args.kill_at.split(","):
        if k == "none" or not formed:
            continue
        n = max(formed) if k == "max" else int(k)
        if n not in [r["nodes"] for r in kills]:
            kills.append(run_sim(args, n, kill=True))
    doc = {"machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "network": "loopback"},
           "commit": git_commit(ROOT, args.commit),
           "latency_us": args.latency_us, "form_timeout_s": args.form_timeout_s,
           "runs": runs, "kills": kills}
    write_json_atomic(args.out, doc)
    print()
    print(table(runs, kills))
    print("\nwrote " + args.out)
    return 0 if formed else 1


if __name__ == "__main__":
    sys.exit(main())
