#!/usr/bin/env python3
"""Store benchmark: ddprun-store against PyTorch's own TCPStore server, side by side.

Run with a PyTorch 2.x interpreter from the repository root after building:
    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/store_bench.py [--quick]

(a) PyTorch's Python TCPStore client doing set/get/add against each server
    (1 client process and 4 concurrent client processes).
(b) build/bin/store_loadgen (C++, one request in flight per connection) doing
    ADDs at 1, 64 and 1000 concurrent connections: ops/s, p50/p99 latency.
Servers: ddprun-store, PyTorch libuv backend (the default since 2.4), PyTorch
legacy backend (use_libuv=False). Each runs in its own process.
Writes docs/store_bench.json, docs/store_bench.png and prints markdown tables.
"""
import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))

TORCH_SERVER = r'''
import datetime, sys, time, torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                  use_libuv=(sys.argv[1] == "1"), timeout=datetime.timedelta(seconds=600))
print("port", s.port, flush=True)
sys.stdin.read()
'''


class Server:
    def __init__(self, kind):
        self.kind = kind
        if kind.startswith("ddprun"):
            spin = "0" if kind == "ddprun-nospin" else "100"
            self.proc = subprocess.Popen([os.path.join(BIN, "ddprun-store"), "--port", "0",
                                          "--log-level", "error", "--busy-poll-us", spin],
                                         stdout=subprocess.PIPE, text=True)
            line = self.proc.stdout.readline()
            self.port = int(re.search(r":(\d+)$", line.strip()).group(1))
        else:
            libuv = "1" if kind == "torch-libuv" else "0"
            self.proc = subprocess.Popen([sys.executable, "-c", TORCH_SERVER, libuv],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self.port = int(self.proc.stdout.readline().split()[1])

    def stop(self):
        if self.kind.startswith("ddprun"):
            self.proc.send_signal(signal.SIGTERM)
        else:
            self.proc.stdin.close()
            self.proc.kill()
        self.proc.wait(10)


def client_worker(port, op, n, idx, barrier, out):
    import datetime
    import torch.distributed as dist
    s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    key = "bench_%d" % idx
    s.set(key, "1")
    barrier.wait()
    t0 = time.perf_counter()
    if op == "set":
        for i in range(n):
            s.set(key, "v")
        s.add("sync", 0)  # set has no reply: one round trip to make sure all were applied
    elif op == "get":
        for i in range(n):
            s.get(key)
    else:
        for i in range(n):
            s.add(key, 1)
    out.put(time.perf_counter() - t0)


def python_client_ops(port, op, n, procs):
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=client_worker, args=(port, op, n, i, barrier, out)) for i in range(procs)]
    for p in ps:
        p.start()
    times = [out.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    return procs * n / max(times)


def cpu_seconds(pid):
    """User + system CPU time of a process, from /proc."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadgen(port, conns, ops, max_seconds=15, pid=None):
    cpu0 = cpu_seconds(pid) if pid else 0
    r = subprocess.run([os.path.join(BIN, "store_loadgen"), "--port", str(port), "-c", str(conns),
                        "-n", str(ops), "--op", "add", "--keys", "16", "--json",
                        "--max-seconds", str(max_seconds)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("store_loadgen failed: " + r.stderr)
    res = json.loads(r.stdout)
    if pid:
        res["server_cpu_us_per_op"] = (cpu_seconds(pid) - cpu0) * 1e6 / max(1, res["ops"])
    return res


def copy_bandwidth_note():
    return "%d cores, %s" % (os.cpu_count(), os.uname().release)


def plot(results, path):
    try:
        import matplotlib
    except ImportError:
        print("no plot: matplotlib is not installed for %s; install it into a virtual "
              "environment (python3 -m venv DIR && DIR/bin/pip install matplotlib) or "
              "Debian's python3-matplotlib, and run this script with that python"
              % sys.executable, file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    servers = [s for s in ("ddprun", "torch-libuv", "torch-legacy", "ddprun-nospin")
               if s in results["servers"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    colors = {"ddprun": "#2b8a3e", "torch-libuv": "#1c7ed6", "torch-legacy": "#868e96",
              "ddprun-nospin": "#94d82d"}
    # Python client ops/s
    results["python_cases"] = [tuple(c) for c in results["python_cases"]]
    labels = ["%s x%d" % (op, p) for (op, p) in results["python_cases"]]
    w = 0.8 / len(servers)
    for i, s in enumerate(servers):
        vals = [results["python"][s]["%s_%d" % c] for c in results["python_cases"]]
        axes[0].bar([x + i * w for x in range(len(labels))], vals, w, label=s, color=colors[s])
    axes[0].set_xticks([x + w for x in range(len(labels))], labels, rotation=30)
    axes[0].set_ylabel("ops/s")
    axes[0].set_yscale("log")
    axes[0].set_title("PyTorch Python client (ops/s, higher is better)")
    axes[0].legend()
    conns = results["loadgen_conns"]
    for s in servers:
        lg = results["loadgen"][s]
        axes[1].plot(conns, [lg[str(c)]["ops_per_s"] for c in conns], "o-", label=s, color=colors[s])
        axes[2].plot(conns, [lg[str(c)]["p99_us"] for c in conns], "o-", label=s + " p99",
                     color=colors[s])
        axes[2].plot(conns, [lg[str(c)]["p50_us"] for c in conns], "o--", label=s + " p50",
                     color=colors[s], alpha=0.6)
    for ax in axes[1:]:
        ax.set_xscale("log")
        ax.set_xlabel("concurrent connections")
        ax.legend(fontsize=8)
    axes[1].set_title("C++ loadgen ADD throughput (ops/s)")
    axes[2].set_yscale("log")
    axes[2].set_title("C++ loadgen ADD latency (us, lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer ops (smoke run)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the saved JSON")
    args = ap.parse_args()
    if args.replot:
        with open(os.path.join(args.out, "store_bench.json")) as f:
            plot(json.load(f), os.path.join(args.out, "store_bench.png"))
        return
    import torch
    n_py = 500 if args.quick else 5000
    cases = [("set", 1), ("get", 1), ("add", 1), ("get", 4), ("add", 4)]
    conns = [1, 64, 1000]
    results = {"torch": torch.__version__, "machine": copy_bandwidth_note(),
               "servers": ["ddprun", "torch-libuv", "torch-legacy", "ddprun-nospin"], "python_cases": cases,
               "loadgen_conns": conns, "python": {}, "loadgen": {}}
    servers = {kind: Server(kind) for kind in results["servers"]}
    rounds = 1 if args.quick else 3
    try:
        # Warm every server and client path once, unmeasured.
        for srv in servers.values():
            python_client_ops(srv.port, "add", 200, 1)
            loadgen(srv.port, 4, 200)
        # Interleave servers round by round so drift on this shared machine
        # hits all of them alike; report the median of the rounds.
        samples = {k: {} for k in servers}
        for _ in range(rounds):
            for op, procs in cases:
                for kind, srv in servers.items():
                    samples[kind].setdefault("%s_%d" % (op, procs), []).append(
                        python_client_ops(srv.port, op, n_py, procs))
            for c in conns:
                total = 20000 if args.quick else 100000
                for kind, srv in servers.items():
                    samples[kind].setdefault("lg_%d" % c, []).append(
                        loadgen(srv.port, c, max(10, total // c), pid=srv.proc.pid))
            print("round done", file=sys.stderr)
    finally:
        for srv in servers.values():
            srv.stop()
    for kind in servers:
        results["python"][kind] = {k: sorted(v)[len(v) // 2] for k, v in samples[kind].items()
                                   if not k.startswith("lg_")}
        results["loadgen"][kind] = {
            str(c): sorted(samples[kind]["lg_%d" % c], key=lambda r: r["ops_per_s"])[rounds // 2]
            for c in conns}

    lines = ["PyTorch %s Python client, %d ops per client process:" % (torch.__version__, n_py), "",
             "| op x clients | ddprun ops/s | torch libuv ops/s | torch legacy ops/s | ddprun / libuv | ddprun / legacy | ddprun --busy-poll-us 0 ops/s |",
             "|---|---|---|---|---|---|---|"]
    for op, procs in cases:
        k = "%s_%d" % (op, procs)
        d, u, l, n = (results["python"][s][k] for s in results["servers"])
        lines.append("| %s x%d | %.0f | %.0f | %.0f | %.2fx | %.2fx | %.0f |" % (
            op, procs, d, u, l, d / u, d / l, n))
    lines += ["", "store_loadgen (C++), ADD, one request in flight per connection:", "",
              "| connections | ddprun ops/s | p50 / p99 us | torch libuv ops/s | p50 / p99 us | torch legacy ops/s | p50 / p99 us | ddprun / libuv | ddprun / legacy | ddprun --busy-poll-us 0 ops/s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    cpu_lines = ["", "Server CPU per ADD (user+system, from /proc, us/op):", "",
                 "| connections | ddprun | torch libuv | torch legacy | ddprun --busy-poll-us 0 |",
                 "|---|---|---|---|---|"]
    for c in conns:
        r = [results["loadgen"][s][str(c)] for s in results["servers"]]
        lines.append("| %d | %.0f | %.0f / %.0f | %.0f | %.0f / %.0f | %.0f | %.0f / %.0f | %.2fx | %.2fx | %.0f |" % (
            c, r[0]["ops_per_s"], r[0]["p50_us"], r[0]["p99_us"], r[1]["ops_per_s"], r[1]["p50_us"],
            r[1]["p99_us"], r[2]["ops_per_s"], r[2]["p50_us"], r[2]["p99_us"],
            r[0]["ops_per_s"] / r[1]["ops_per_s"], r[0]["ops_per_s"] / r[2]["ops_per_s"],
            r[3]["ops_per_s"]))
        cpu_lines.append("| %d | %s |" % (c, " | ".join(
            "%.1f" % x.get("server_cpu_us_per_op", float("nan")) for x in r)))
    table = "\n".join(lines + cpu_lines)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    results["table"] = table
    with open(os.path.join(args.out, "store_bench.json"), "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.join(args.out, "store_bench.png"))


if __name__ == "__main__":
    main()
