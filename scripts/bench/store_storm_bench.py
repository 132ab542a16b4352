#!/usr/bin/env python3
"""Connection storm: ddprun-store against PyTorch's libuv TCPStore server, side by side.

Run with a PyTorch 2.x interpreter from the repository root after building
(targets ddprun-store and store_storm):
    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/store_storm_bench.py \
        [--sizes 1024,4096,16384] [--repeats 3] [--quick]

Each trial starts a fresh server (port 0) pinned to one core (--server-core,
default 0) and runs build/bin/store_storm pinned to another (--client-core,
default 1): N clients connect at once and each does what a rank does at
init_process_group (VALIDATE + PING, ADD a counter, SET its address, WAIT for
`go`, which the client whose ADD returned N sets, GET it). The figure is the
time from the first connect to the last client done; store_storm checks the
counter and every client's keys, and a trial that fails them is reported as
failed. Trials alternate between the servers (ddprun, torch, torch, ddprun,
...), so drift on a shared machine falls on both.

PyTorch's libuv server names each new peer with getnameinfo() without
NI_NUMERICHOST, a reverse DNS lookup on its only thread, per connection
(c10d::detail::formatSockAddr in LibUVStoreDaemon::onConnect). Where the
resolver does not answer at once (a sandbox whose DNS server drops the query:
5 s per connection), that, not the accept path, is what gets measured. By
default (--torch-dns numeric) its server runs with a small LD_PRELOAD shim,
built here with cc, that adds NI_NUMERICHOST; --torch-dns as-is measures it as
shipped. Each trial also records the server's CPU time (utime + stime from
/proc, a figure that load from other processes inflates less than wall time)
and the kernel's ListenOverflows count (connects that found the accept queue
full; other processes' overflows land in it too).

Memory per idle connection: RSS of a server holding N connections that have
done the handshake, minus its RSS before they connected, divided by N
(store_storm --idle holds them open). Kernel socket buffers are not in RSS.

Prints a markdown table and writes JSON (--out) with the medians and the
ratio torch / ddprun (above 1: ddprun-store faster).
"""
import argparse
import json
import os
import re
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))

TORCH_SERVER = r'''
import datetime, sys, torch, torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True,
                  timeout=datetime.timedelta(seconds=600))
print("port", s.port, torch.__version__, flush=True)
sys.stdin.read()
'''


NUMERIC_SHIM = r'''
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
int getnameinfo(const struct sockaddr* sa, socklen_t salen, char* host, socklen_t hostlen,
                char* serv, socklen_t servlen, int flags) {
  static int (*real)(const struct sockaddr*, socklen_t, char*, socklen_t, char*, socklen_t, int);
  if (!real) real = dlsym(RTLD_NEXT, "getnameinfo");
  return real(sa, salen, host, hostlen, serv, servlen, flags | NI_NUMERICHOST);
}
'''


def build_numeric_shim(tmpdir):
    """The getnameinfo shim (see the module's docstring), or exit naming why not."""
    src, lib = os.path.join(tmpdir, "numeric.c"), os.path.join(tmpdir, "numeric.so")
    with open(src, "w") as f:
        f.write(NUMERIC_SHIM)
    r = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src, "-ldl"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("cannot build the getnameinfo shim (cc): %s\nuse --torch-dns as-is" % r.stderr)
    return lib


def listen_overflows():
    """TcpExt ListenOverflows (system-wide), or None where /proc has no such line."""
    try:
        with open("/proc/net/netstat") as f:
            lines = [l.split() for l in f if l.startswith("TcpExt:")]
        return int(lines[1][lines[0].index("ListenOverflows")])
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(core):
    return lambda: os.sched_setaffinity(0, {core})


class Server:
    """A store server in its own process, pinned to `core`."""

    def __init__(self, kind, core, preload=None):
        self.kind = kind
        if kind == "ddprun":
            self.proc = subprocess.Popen(
                [os.path.join(BIN, "ddprun-store"), "--port", "0", "--host", "127.0.0.1",
                 "--log-level", "error"],
                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                preexec_fn=pin(core))
            line = self.proc.stdout.readline()
            m = re.search(r":(\d+)$", line.strip())
            if not m:
                raise RuntimeError("ddprun-store did not say where it listens: %r" % line)
            self.port = int(m.group(1))
            self.version = "ddprun"
        else:
            env = dict(os.environ)
            if preload:
                env["LD_PRELOAD"] = preload
            self.proc = subprocess.Popen([sys.executable, "-c", TORCH_SERVER],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, preexec_fn=pin(core), env=env)
            words = self.proc.stdout.readline().split()
            if len(words) < 3:
                raise RuntimeError("the PyTorch server did not start")
            self.port, self.version = int(words[1]), words[2]

    def rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.kind == "ddprun":
            self.proc.send_signal(signal.SIGTERM)
        else:
            self.proc.stdin.close()
            self.proc.kill()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def storm(srv, n, core, timeout_s):
    cmd = [os.path.join(BIN, "store_storm"), "--port", str(srv.port), "-n", str(n), "--json",
           "--timeout-s", str(timeout_s)]
    cpu0, ovf0 = cpu_seconds(srv.proc.pid), listen_overflows()
    r = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin(core),
                       timeout=timeout_s + 60)
    cpu1, ovf1 = cpu_seconds(srv.proc.pid), listen_overflows()
    res = benchutil.last_json_line(r.stdout) or {}
    res["server_cpu_s"] = round(cpu1 - cpu0, 3)
    res["listen_overflows"] = ovf1 - ovf0 if ovf0 is not None and ovf1 is not None else None
    res["ok"] = r.returncode == 0
    if not res["ok"]:
        res["stderr"] = r.stderr[-2000:]
    return res


def idle_memory(kind, n, server_core, client_core, preload):
    """Bytes of server RSS per idle, handshaken connection (N of them)."""
    srv = Server(kind, server_core, preload)
    try:
        time.sleep(0.5)  # the server's own start-up allocations settle
        before = srv.rss_kib()
        holder = subprocess.Popen([os.path.join(BIN, "store_storm"), "--port", str(srv.port),
                                   "-n", str(n), "--idle", "--json"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  preexec_fn=pin(client_core))
        line = holder.stdout.readline()
        res = json.loads(line) if line.startswith("{") else {}
        held = res.get("idle_connections", 0)
        after = srv.rss_kib()
        holder.stdin.close()
        holder.wait(60)
        if held != n:
            return {"kind": kind, "connections": n, "error": "only %s held" % held}
        return {"kind": kind, "connections": n, "rss_before_kib": before, "rss_after_kib": after,
                "bytes_per_connection": round((after - before) * 1024 / n)}
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=120)
    ap.add_argument("--idle", type=int, default=16000,
                    help="connections for the memory-per-idle-connection figure (0: skip)")
    ap.add_argument("--torch-dns", choices=["numeric", "as-is"], default="numeric",
                    help="numeric: PyTorch's server without its reverse DNS lookups (see above)")
    ap.add_argument("--quick", action="store_true", help="sizes 1024,4096, one repeat")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "store_storm_bench.json"))
    args = ap.parse_args()
    if args.quick:
        args.sizes, args.repeats, args.idle = "1024,4096", 1, 4096
    sizes = [int(s) for s in args.sizes.split(",")]
    tmpdir = tempfile.mkdtemp(prefix="ddprun_storm_")
    preload = build_numeric_shim(tmpdir) if args.torch_dns == "numeric" else None
    kinds = ["ddprun", "torch-libuv"]

    trials = {k: {n: [] for n in sizes} for k in kinds}
    versions = {}
    for rep in range(args.repeats):
        order = kinds if rep % 2 == 0 else kinds[::-1]
        for n in sizes:
            for kind in order:
                srv = Server(kind, args.server_core, preload)
                versions[kind] = srv.version
                try:
                    res = storm(srv, n, args.client_core, args.timeout_s)
                finally:
                    srv.stop()
                trials[kind][n].append(res)
                print("%-12s %6d clients: %s" % (kind, n, json.dumps(res)), flush=True)

    rows = []
    for n in sizes:
        row = {"clients": n}
        for kind in kinds:
            ok = [t["seconds"] for t in trials[kind][n] if t["ok"]]
            row[kind] = {"median_s": statistics.median(ok) if ok else None,
                         "min_s": min(ok) if ok else None,
                         "failed_trials": len(trials[kind][n]) - len(ok),
                         "p99_ms_median": statistics.median(
                             [t["p99_ms"] for t in trials[kind][n] if t["ok"]]) if ok else None,
                         "server_cpu_s_median": statistics.median(
                             [t["server_cpu_s"] for t in trials[kind][n] if t["ok"]]) if ok else None,
                         "retries": sum(t.get("retries", 0) for t in trials[kind][n])}
        d, t = row["ddprun"]["median_s"], row["torch-libuv"]["median_s"]
        row["ratio_torch_over_ddprun"] = (t / d) if d and t else None
        rows.append(row)

    memory = []
    if args.idle > 0:
        for kind in kinds:
            memory.append(idle_memory(kind, args.idle, args.server_core, args.client_core,
                                      preload))
    shutil.rmtree(tmpdir, ignore_errors=True)

    print("\n| clients | ddprun-store: s (server CPU s) | PyTorch %s libuv: s (server CPU s) "
          "| ratio torch/ddprun |" % versions.get("torch-libuv", "?"))
    print("|---:|---:|---:|---:|")
    for r in rows:
        def fmt(x):
            if x["median_s"] is None:
                return "failed"
            return "%.3f (%.2f)" % (x["median_s"], x["server_cpu_s_median"])
        ratio = "%.2fx" % r["ratio_torch_over_ddprun"] if r["ratio_torch_over_ddprun"] else "-"
        print("| %d | %s | %s | %s |" % (r["clients"], fmt(r["ddprun"]), fmt(r["torch-libuv"]),
                                         ratio))
    for m in memory:
        if "error" in m:
            print("memory per idle connection, %s: %s" % (m["kind"], m["error"]))
        else:
            print("memory per idle connection, %s: %d bytes (RSS %d -> %d KiB with %d)"
                  % (m["kind"], m["bytes_per_connection"], m["rss_before_kib"],
                     m["rss_after_kib"], m["connections"]))

    out = {"benchmark": "store_storm", "cpu": benchutil.cpu_model(), "cores": os.cpu_count(),
           "commit": benchutil.git_commit(ROOT), "server_core": args.server_core,
           "client_core": args.client_core, "repeats": args.repeats, "versions": versions,
           "torch_dns": args.torch_dns, "loadavg_at_end": os.getloadavg(),
           "somaxconn": open("/proc/sys/net/core/somaxconn").read().strip(),
           "rows": rows, "idle_memory": memory, "trials": trials}
    benchutil.write_json_atomic(args.out, out)
    print("wrote", args.out)
    failed = any(r[k]["failed_trials"] for r in rows for k in kinds if k == "ddprun")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
