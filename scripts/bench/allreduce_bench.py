#!/usr/bin/env python3
"""All-reduce: ddprun_runtime against PyTorch's gloo, side by side in one run.

    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/allreduce_bench.py [--quick]

For 2 and 4 ranks on this machine and sizes 8 B .. 256 MiB (float32 sum) it
runs, interleaved per world size:
  - ours: `ddprun --nproc_per_node=N --no_python allreduce_perf --json`, with
    buffers in the shared heap (the in-place path) and with private buffers
    (staged through shared memory);
  - ours with DDPRUN_TRANSPORT=tcp (the TCP ring over loopback, gloo's
    transport, for a like-for-like comparison);
  - gloo: torch.distributed all_reduce on CPU tensors (torchrun of the same
    PyTorch), timed the same way (n back-to-back ops; p50 of single ops;
    slowest rank).
It measures this machine's memcpy bandwidth in the same run and reports the
memory-bandwidth floor t >= max(2nS / B_sys, S / M_core) of
shared/reference/collectives.md, with B_sys = 2 x all-thread copy rate
(read + write traffic) and M_core = one thread's copy rate.
Writes docs/allreduce_bench.json and docs/allreduce_bench.png; prints a
markdown table for docs/benchmarks.md. --replot redraws from the JSON.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))
DOCS = os.path.join(ROOT, "docs")

GLOO_SCRIPT = r'''
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, n = dist.get_rank(), dist.get_world_size()
for nbytes in [int(x) for x in sys.argv[1].split(",")]:
    count = max(1, nbytes // 4)
    t = torch.zeros(count, dtype=torch.float32)
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else max(3, min(100, (1 << 27) // max(nbytes, 1)))
    for _ in range(3):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    works = [dist.all_reduce(t, async_op=True) for _ in range(iters)]
    for w in works:
        w.wait()
    dt = (time.perf_counter() - t0) / iters
    lat = []
    for _ in range(min(iters, 50)):
        s = time.perf_counter(); dist.all_reduce(t); lat.append(time.perf_counter() - s)
    lat.sort()
    stats = torch.tensor([dt, lat[len(lat) // 2]], dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank == 0:
        algbw = count * 4 / stats[0].item() / 1e9
        print(json.dumps({"bytes": count * 4, "time_us": stats[0].item() * 1e6,
                          "lat_p50_us": stats[1].item() * 1e6, "algbw_gbps": algbw,
                          "busbw_gbps": algbw * 2 * (n - 1) / n}), flush=True)
dist.destroy_process_group()
'''


def parse_json_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def run_ours(n, sizes, shared, transport="auto"):
    rows = []
    env = dict(os.environ, DDPRUN_TRANSPORT=transport)
    for lo, hi, f in sizes:
        args = [os.path.join(BIN, "ddprun"), "--nproc-per-node=%d" % n,
                "--no-python", os.path.join(BIN, "allreduce_perf"), "-b", str(lo), "-e", str(hi),
                "-f", str(f), "-n", "20", "-w", "5", "--shared", "1" if shared else "0", "--json"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
        if p.returncode != 0:
            sys.exit("allreduce_perf failed:\n" + p.stdout + p.stderr)
        rows += parse_json_lines(p.stdout)
    return rows


def run_gloo(n, sizes_list):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(GLOO_SCRIPT)
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=%d" % n,
            f.name, ",".join(str(s) for s in sizes_list)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(args, capture_output=True, text=True, timeout=1800, env=env)
    os.unlink(f.name)
    if p.returncode != 0:
        sys.exit("gloo run failed:\n" + p.stdout + p.stderr)
    return parse_json_lines(p.stdout)


def membw():
    p = subprocess.run([os.path.join(BIN, "allreduce_perf"), "--membw"], capture_output=True,
                       text=True, check=True)
    return json.loads(p.stdout)


def floor_us(n, nbytes, bw):
    b_sys = 2 * bw["copy_allthreads_gbps"] * 1e9
    m_core = bw["copy_1thread_gbps"] * 1e9
    return max(2 * n * nbytes / b_sys, nbytes / m_core) * 1e6


def table(res):
    lines = []
    bw = res["membw"]
    for n in res["ranks"]:
        ours = {r["bytes"]: r for r in res["ours_shared"][str(n)]}
        priv = {r["bytes"]: r for r in res["ours_private"][str(n)]}
        gloo = {r["bytes"]: r for r in res["gloo"][str(n)]}
        tcp = {r["bytes"]: r for r in res.get("ours_tcp", {}).get(str(n), [])}
        lines.append("\n**%d ranks** (float32 sum; time = mean of back-to-back ops, p50 = single op)\n" % n)
        lines.append("| bytes | ours busbw GB/s | ours p50 us | ours private busbw | ours TCP ring busbw "
                     "| gloo busbw GB/s | gloo p50 us | busbw ours/gloo | p50 gloo/ours | % of mem floor |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for b in sorted(ours):
            o, g, p = ours[b], gloo.get(b), priv.get(b)
            fl = floor_us(n, b, bw)
            t = tcp.get(b)
            lines.append("| %d | %.3f | %.1f | %s | %s | %s | %s | %s | %s | %.0f%% |" % (
                b, o["busbw_gbps"], o["lat_p50_us"], "%.3f" % p["busbw_gbps"] if p else "-",
                "%.3f" % t["busbw_gbps"] if t else "-",
                "%.3f" % g["busbw_gbps"] if g else "-", "%.1f" % g["lat_p50_us"] if g else "-",
                "%.1fx" % (o["busbw_gbps"] / g["busbw_gbps"]) if g and g["busbw_gbps"] > 0 else "-",
                "%.1fx" % (g["lat_p50_us"] / o["lat_p50_us"]) if g else "-",
                100 * fl / o["time_us"]))
    return "\n".join(lines)


def plot(res, path):
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
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for n, style in zip(res["ranks"], ["-", "--"]):
        for key, label, color in [("ours_shared", "ddprun (shared heap)", "C0"),
                                  ("ours_private", "ddprun (private buffers)", "C2"),
                                  ("ours_tcp", "ddprun (TCP ring, forced)", "C1"),
                                  ("gloo", "PyTorch gloo", "C3")]:
            if str(n) not in res.get(key, {}):
                continue
            rows = sorted(res[key][str(n)], key=lambda r: r["bytes"])
            xs = [r["bytes"] for r in rows]
            ax1.plot(xs, [r["busbw_gbps"] for r in rows], style, color=color, marker="o", ms=3,
                     label="%s, %d ranks" % (label, n))
            ax2.plot(xs, [r["lat_p50_us"] for r in rows], style, color=color, marker="o", ms=3,
                     label="%s, %d ranks" % (label, n))
    for ax, yl in [(ax1, "bus bandwidth (GB/s)"), (ax2, "single all-reduce p50 (us)")]:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel(yl)
        ax.grid(True, alpha=0.3)
    ax2.set_yscale("log")
    ax1.legend(fontsize=7)
    ax1.set_title("All-reduce bus bandwidth (higher is better)")
    ax2.set_title("All-reduce latency (lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="sizes up to 16 MiB only")
    ap.add_argument("--replot", nargs="?", const=os.path.join(DOCS, "allreduce_bench.json"),
                    help="redraw the plot and table from a saved JSON (default docs/allreduce_bench.json)")
    a = ap.parse_args()
    jpath = a.replot or os.path.join(DOCS, "allreduce_bench.json")
    if a.replot:
        res = json.load(open(jpath))
    else:
        ranges = [(8, 16 << 20, 8)] + ([] if a.quick else [(64 << 20, 256 << 20, 4)])
        sizes = [8 * 8 ** k for k in range(9)] + ([] if a.quick else [64 << 20, 256 << 20])
        res = {"ranks": [2, 4], "membw": membw(), "ours_shared": {}, "ours_private": {}, "ours_tcp": {}, "gloo": {},
               "host": socket.gethostname(), "cpus": os.cpu_count()}
        for n in res["ranks"]:
            print("world size %d ..." % n, file=sys.stderr)
            res["ours_shared"][str(n)] = run_ours(n, ranges, True)
            res["gloo"][str(n)] = run_gloo(n, sizes)
            res["ours_private"][str(n)] = run_ours(n, ranges, False)
            res["ours_tcp"][str(n)] = run_ours(n, ranges, False, "tcp")
        res["membw_after"] = membw()
        os.makedirs(DOCS, exist_ok=True)
        json.dump(res, open(jpath, "w"), indent=1)
    plot(res, os.path.splitext(jpath)[0] + ".png")
    print("memcpy: 1 thread %.2f GB/s, all threads %.2f GB/s" % (
        res["membw"]["copy_1thread_gbps"], res["membw"]["copy_allthreads_gbps"]))
    print(table(res))


if __name__ == "__main__":
    main()
