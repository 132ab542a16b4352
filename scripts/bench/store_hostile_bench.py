#!/usr/bin/env python3
"""ddprun-store before vs after issue 10 (one memory budget, backpressure,
incremental parser), side by side in one run.

    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/store_hostile_bench.py \
        --before /work/wt-before/build/bin/ddprun-store [--after build/bin/ddprun-store]

1. store_loadgen ADDs at 1, 64 and 1000 connections: ops/s, p50/p99, median of
   3 short runs, before and after alternating run by run.
2. Peak RSS (VmHWM, sampled every 10 ms while the server lives) under each
   attack of issue 10 (the code of tests/integration/store_hostile_test.py),
   both servers with --max-memory 32M and an address space capped at 2 GiB
   (prlimit --as=2147483648), so an unbounded server dies of bad_alloc.
3. Parser cost: server CPU (utime+stime from /proc) for one 32 MiB MULTI_SET
   (131,072 keys, 230-byte values) sent in 1-byte sends, 2 KiB sends and one
   piece. The before server is only run with 2 KiB and one piece (capped at
   60 s). 1-byte sends from Python are slow: that split sends a smaller
   MULTI_SET and its CPU is scaled by bytes (the JSON says so).
Writes docs/store_hostile_bench.json and prints markdown tables.
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(ROOT, "tests", "pyutil"))
from procs import status_kib  # noqa: E402
from storewire import LEGACY, V2, RawClient, pump, round_trip  # noqa: E402

MiB = 1 << 20
AS_CAP = 2147483648
ONE_MIB = b"v" * MiB
LOADGEN = os.path.join(ROOT, "build/bin/store_loadgen")


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A ddprun-store on port 0 under prlimit --as=2 GiB; a thread samples its
    VmHWM every 10 ms so the peak is known even if it dies."""

    def __init__(self, binary, tmp, *args):
        self.err_path = os.path.join(tmp, "store_%d.err" % time.monotonic_ns())
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            ["prlimit", "--as=%d" % AS_CAP, "--", binary, "--port", "0", "--log-level", "error",
             *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.err)
        self.pid = self.proc.pid  # prlimit execs the server: same pid
        line = self.proc.stdout.readline().decode(errors="replace").strip()
        m = re.search(r":(\d+)$", line)
        if not m:
            self.stop()
            raise RuntimeError("%s did not print its port: %r" % (binary, line))
        self.port = int(m.group(1))
        self.peak_kib = 0
        self._done = threading.Event()
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()

    def _sample(self):
        while not self._done.is_set():
            kib = status_kib(self.pid, "VmHWM")
            if kib is None or self.proc.poll() is not None:
                return
            self.peak_kib = max(self.peak_kib, kib)
            self._done.wait(0.01)

    def alive(self):
        return self.proc.poll() is None

    def stderr(self):
        with open(self.err_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self):
        self._done.set()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.err.close()


# 1. Throughput and latency.

def loadgen(port, conns, total):
    r = subprocess.run([LOADGEN, "--port", str(port), "-c", str(conns), "-n",
                        str(max(10, total // conns)), "--op", "add", "--keys", "16", "--json",
                        "--max-seconds", "10"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("store_loadgen failed: " + r.stderr)
    return json.loads(r.stdout)


def throughput(bins, tmp, rounds, total):
    servers = {k: Server(b, tmp) for k, b in bins.items()}
    samples = {k: {} for k in bins}
    try:
        for srv in servers.values():
            loadgen(srv.port, 4, 2000)  # warm-up, unmeasured
        for c in (1, 64, 1000):
            for _ in range(rounds):
                for k, srv in servers.items():  # alternate before/after run by run
                    samples[k].setdefault(str(c), []).append(loadgen(srv.port, c, total))
    finally:
        for srv in servers.values():
            srv.stop()
    out = {}
    for k in bins:
        out[k] = {}
        for c, runs in samples[k].items():
            med = sorted(runs, key=lambda r: r["ops_per_s"])[len(runs) // 2]
            out[k][c] = {"ops_per_s": med["ops_per_s"], "p50_us": med["p50_us"],
                         "p99_us": med["p99_us"], "runs_ops_per_s": [r["ops_per_s"] for r in runs]}
    return out


# 2. Attacks (from tests/integration/store_hostile_test.py), each bounded.

def client(srv, dialect=V2, conns=None):
    c = RawClient(srv.port, dialect, timeout=20)
    conns.append(c)
    return c


def atk_get_flood(srv, conns):
    round_trip(srv.port, "big", ONE_MIB, timeout=20)
    a = client(srv, conns=conns)
    a.send(a.wire.get("big") * 1000)


def atk_multi_get(srv, conns):
    round_trip(srv.port, "big", ONE_MIB, timeout=20)
    a = client(srv, conns=conns)
    a.send(a.wire.multi_get(["big"] * 5000))


def atk_slow_readers(srv, conns):
    round_trip(srv.port, "big", ONE_MIB, timeout=20)
    for _ in range(200):
        r = client(srv, conns=conns)
        r.send(r.wire.get("big") * 8)


def atk_watch(srv, conns):
    w = client(srv, LEGACY, conns=conns)
    w.send(w.wire.watch_key("hot") * 3000)
    try:
        w.recv_exact(3000)
    except OSError:
        pass
    for _ in range(2):
        round_trip(srv.port, "hot", ONE_MIB, timeout=20)


def atk_waits(srv, conns):
    a = client(srv, conns=conns)
    keys = ["/missing/%06d/%s" % (i, "k" * 32) for i in range(20000)]
    pump([(a.sock, a.wire.wait(keys) * 40)], deadline=20.0, then_timeout=20)


def atk_partial_sets(srv, conns):
    streams = []
    body = b"p" * (60 * MiB - 1)
    for _ in range(30):
        c = client(srv, conns=conns)
        try:
            c.send(c.wire.set_header("partial", 60 * MiB))
        except OSError:
            continue
        streams.append((c.sock, body))
    pump(streams, deadline=20.0, then_timeout=20)


ATTACKS = [
    ("1,000 GETs of a 1 MiB value, never read", atk_get_flood),
    ("MULTI_GET of one 1 MiB key x5,000", atk_multi_get),
    ("200 slow readers (8 GETs of 1 MiB each)", atk_slow_readers),
    ("legacy WATCH_KEY x3,000, then 1 MiB SETs", atk_watch),
    ("40 WAITs of 20,000 missing keys", atk_waits),
    ("30 partial 60 MiB SETs", atk_partial_sets),
]


def run_attack(binary, tmp, fn):
    srv = Server(binary, tmp, "--max-memory", "32M")
    conns = []
    res = {}
    try:
        round_trip(srv.port, "warmup", b"1", timeout=20)
        time.sleep(0.05)
        res["baseline_mib"] = status_kib(srv.pid, "VmHWM") / 1024
        t0 = time.monotonic()
        try:
            fn(srv, conns)
        except OSError as e:
            res["attacker_error"] = repr(e)
        # The attack has developed once a fresh client is served (the server
        # is single-threaded: it has processed what came before) or it died.
        served = False
        while time.monotonic() - t0 < 20 and srv.alive():
            try:
                served = round_trip(srv.port, "innocent", b"ok", timeout=5) == b"ok"
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.3)
        res["seconds"] = round(time.monotonic() - t0, 2)
        res["innocent_served"] = served
        alive = srv.alive()
        res["survived"] = alive
        if alive:
            res["peak_rss_mib"] = round(max(srv.peak_kib, status_kib(srv.pid, "VmHWM")) / 1024, 1)
            res["result"] = "survived"
        else:
            rc = srv.proc.returncode
            err = srv.stderr()
            res["exit"] = rc
            res["peak_rss_mib"] = round(srv.peak_kib / 1024, 1)  # last sample before death
            res["result"] = ("aborted (bad_alloc) at cap" if "bad_alloc" in err or rc in (-6, 134)
                             else "died (%s)" % rc)
            res["stderr_tail"] = err[-300:]
    finally:
        for c in conns:
            c.close()
        srv.stop()
    return res


def attacks(bins, tmp):
    out = {}
    for name, fn in ATTACKS:
        out[name] = {}
        for k, b in bins.items():
            out[name][k] = run_attack(b, tmp, fn)
            print("attack %-45s %-6s %s" % (name, k, out[name][k]), file=sys.stderr)
    return out


# 3. Parser cost.

def multi_set_request(n_keys):
    """MULTI_SET of n_keys, each pair 256 bytes: 10-byte key, 230-byte value."""
    from storewire import Wire
    val = b"x" * 230
    return Wire(V2).multi_set([("/ms/%06d" % i, val) for i in range(n_keys)]), "/ms/%06d" % (n_keys - 1)


def send_split(sock, data, split, deadline):
    mv = memoryview(data)
    n = len(mv)
    off = 0
    if split == 0:
        sock.sendall(mv)
        return True
    send = sock.send
    if split == 1:
        while off < n:
            off += send(mv[off:off + 1])
            if (off & 0xFFFF) == 0 and time.monotonic() > deadline:
                return False
        return True
    while off < n:
        off += send(mv[off:off + split])
        if time.monotonic() > deadline:
            return False
    return True


def parse_cost(binary, tmp, n_keys, split, cap_s):
    srv = Server(binary, tmp, "--max-memory", "512M", "--busy-poll-us", "0")
    try:
        req, last = multi_set_request(n_keys)
        c = RawClient(srv.port, V2, timeout=cap_s + 30)
        c.num_keys()  # handshake processed
        cpu0 = cpu_seconds(srv.pid)
        t0 = time.monotonic()
        ok = send_split(c.sock, req, split, t0 + cap_s)
        if ok:
            c.sock.settimeout(max(1.0, cap_s - (time.monotonic() - t0)))
            try:
                ok = c.check([last])  # answered after the MULTI_SET is applied
            except OSError:
                ok = False
        wall = time.monotonic() - t0
        cpu = cpu_seconds(srv.pid) - cpu0
        c.close()
        r = {"bytes": len(req), "finished": bool(ok), "server_cpu_s": round(cpu, 3),
             "wall_s": round(wall, 2)}
        return r
    finally:
        srv.stop()


def parser(bins, tmp, small_keys):
    full = 131072
    out = {}
    for k, b in bins.items():
        out[k] = {}
        for split, name in ((2048, "2 KiB"), (0, "one piece")):
            out[k][name] = parse_cost(b, tmp, full, split, 60)
            print("parse %s %s %s" % (k, name, out[k][name]), file=sys.stderr)
    # Same small request, 1-byte sends, before and after: like for like.
    # Two sizes, 4x apart: linear cost grows 4x, a re-parse from the first
    # byte on every read (before) about 16x.
    for keys, label in ((1024, "1 byte, 256 KiB request"), (4096, "1 byte, 1 MiB request")):
        for k, b in bins.items():
            out[k][label] = parse_cost(b, tmp, keys, 1, 60)
            print("parse %s %s %s" % (k, label, out[k][label]), file=sys.stderr)
    r = parse_cost(bins["after"], tmp, small_keys, 1, 120)
    full_bytes = out["after"]["one piece"]["bytes"]
    r["scaled_to_bytes"] = full_bytes
    r["server_cpu_s_scaled"] = round(r["server_cpu_s"] * full_bytes / r["bytes"], 3)
    r["note"] = ("1-byte sends from Python: a %d-key (%.1f MiB) MULTI_SET was sent, its CPU scaled "
                 "by bytes to the 32 MiB request" % (small_keys, r["bytes"] / MiB))
    out["after"]["1 byte"] = r
    print("parse after 1 byte %s" % r, file=sys.stderr)
    return out


def fmt_parse(r):
    if r is None:
        return "not run (quadratic)"
    if not r["finished"]:
        return "> 60 s (not finished; %.1f s CPU by then)" % r["server_cpu_s"]
    return "%.2f s" % r.get("server_cpu_s_scaled", r["server_cpu_s"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="/work/wt-before/build/bin/ddprun-store")
    ap.add_argument("--after", default=os.path.join(ROOT, "build/bin/ddprun-store"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", type=int, default=60000, help="ADDs per loadgen run, all connections")
    ap.add_argument("--small-keys", type=int, default=16384,
                    help="keys of the MULTI_SET sent in 1-byte sends (scaled to 32 MiB)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "store_hostile_bench.json"))
    ap.add_argument("--only", default="tap", help="t: throughput, a: attacks, p: parser")
    args = ap.parse_args()
    bins = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    tmp = os.environ.get("TMPDIR", "/tmp")
    res = {"machine": "%d cores, %s" % (os.cpu_count(), os.uname().release),
           "binaries": bins, "address_space_cap": AS_CAP, "max_memory_attacks": "32M"}
    if "t" in args.only:
        res["throughput"] = throughput(bins, tmp, args.rounds, args.ops)
    if "a" in args.only:
        res["attacks"] = attacks(bins, tmp)
    if "p" in args.only:
        res["parser"] = parser(bins, tmp, args.small_keys)

    lines = []
    if "throughput" in res:
        t = res["throughput"]
        lines += ["store_loadgen ADD (median of %d runs, %d ADDs per run):" % (args.rounds, args.ops),
                  "", "| connections | before ops/s | after ops/s | after / before | before p50 / p99 us | after p50 / p99 us |",
                  "|---|---|---|---|---|---|"]
        for c in ("1", "64", "1000"):
            b, a = t["before"][c], t["after"][c]
            lines.append("| %s | %.0f | %.0f | %.2fx | %.0f / %.0f | %.0f / %.0f |" % (
                c, b["ops_per_s"], a["ops_per_s"], a["ops_per_s"] / b["ops_per_s"],
                b["p50_us"], b["p99_us"], a["p50_us"], a["p99_us"]))
        lines.append("")
    if "attacks" in res:
        lines += ["Peak RSS (VmHWM) under each attack, --max-memory 32M, address space capped at 2 GiB:",
                  "", "| attack | before peak RSS | before | after peak RSS | after |", "|---|---|---|---|---|"]
        for name, _ in ATTACKS:
            b, a = res["attacks"][name]["before"], res["attacks"][name]["after"]

            def cell(r):
                return ("%.1f MiB" if r["survived"] else ">= %.1f MiB") % r["peak_rss_mib"]

            def verdict(r):
                return r["result"] + ("" if not r["survived"] else
                                      (", others served" if r["innocent_served"] else ", others NOT served"))
            lines.append("| %s | %s | %s | %s | %s |" % (name, cell(b), verdict(b), cell(a), verdict(a)))
        lines.append("")
    if "parser" in res:
        p = res["parser"]
        lines += ["Server CPU (user+system) for one 32 MiB MULTI_SET (131,072 keys), by send size:", "",
                  "| sends | before | after |", "|---|---|---|"]
        for name in ("1 byte", "2 KiB", "one piece"):
            lines.append("| %s | %s | %s |" % (name, fmt_parse(p["before"].get(name)),
                                               fmt_parse(p["after"].get(name))))
        for label, keys in (("1 byte, 256 KiB request", "1,024"), ("1 byte, 1 MiB request", "4,096")):
            lines.append("| %s (%s keys), not scaled | %s | %s |" % (
                label, keys, fmt_parse(p["before"][label]), fmt_parse(p["after"][label])))
        vals = [p["after"][n].get("server_cpu_s_scaled", p["after"][n]["server_cpu_s"])
                for n in ("1 byte", "2 KiB", "one piece")]
        res["parser_after_ratio_max_min"] = round(max(vals) / max(min(vals), 1e-3), 2)
        lines += ["", "after: max / min over the splits = %.2fx (%s)" % (
            res["parser_after_ratio_max_min"], p["after"]["1 byte"]["note"])]
    table = "\n".join(lines)
    res["table"] = table
    print(table)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
