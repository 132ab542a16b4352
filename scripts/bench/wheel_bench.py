#!/usr/bin/env python3
"""The wheel's figures: its size, and the time `pip install` takes to put it
into a fresh virtual environment (median of N; the environment's creation is
not timed).

    python3 scripts/bench/wheel_bench.py --wheel dist/ddprun-*.whl [--reps 3]
    python3 scripts/bench/wheel_bench.py --build [--reps 3]   # pip wheel . first

The launch overhead of the installed ddprun against torchrun comes from
launch_bench.py --ddprun <venv>/bin/ddprun (docs/benchmarks.md, Installation);
--keep-venv DIR leaves one installed environment there for it.
Writes docs/wheel_bench.json (or --json FILE) and prints a markdown table.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import cpu_model  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))


def sh(cmd, **kw):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel", help="the wheel to measure")
    ap.add_argument("--build", action="store_true", help="build it first: pip wheel " + ROOT)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="the interpreter of the fresh environments")
    ap.add_argument("--keep-venv", help="leave one environment with the wheel installed here")
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "wheel_bench.json"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="wheel_bench_")
    try:
        if args.build:
            tools = os.path.join(tmp, "tools")
            sh([args.python, "-m", "venv", tools])
            cmd = [os.path.join(tools, "bin", "pip"), "wheel", "--no-deps", "-w", tmp, ROOT]
            if shutil.which("ccache"):
                cmd.append("--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache")
            sh(cmd)
            args.wheel = glob.glob(os.path.join(tmp, "ddprun-*.whl"))[0]
        if not args.wheel:
            sys.exit("name a wheel with --wheel, or --build one")
        size = os.path.getsize(args.wheel)
        times = []
        for i in range(args.reps):
            venv = os.path.join(tmp, "venv%d" % i)
            sh([args.python, "-m", "venv", venv])
            t0 = time.perf_counter()
            sh([os.path.join(venv, "bin", "pip"), "install", "--no-deps", "--no-index",
                "--disable-pip-version-check", args.wheel])
            times.append(time.perf_counter() - t0)
        installed = sum(os.path.getsize(p) for p in
                        glob.glob(os.path.join(venv, "bin", "*")) + glob.glob(
                            os.path.join(venv, "lib", "ddprun", "*"))
                        if os.path.isfile(p) and not os.path.islink(p)
                        and not os.path.basename(p).startswith(("activate", "Activate", "pip")))
        if args.keep_venv:
            shutil.rmtree(args.keep_venv, ignore_errors=True)
            sh([args.python, "-m", "venv", args.keep_venv])
            sh([os.path.join(args.keep_venv, "bin", "pip"), "install", "--no-deps", "--no-index",
                "--disable-pip-version-check", args.wheel])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res = {"wheel": os.path.basename(args.wheel), "wheel_bytes": size,
           "installed_bytes": installed, "install_s": times,
           "install_s_median": statistics.median(times), "cpu": cpu_model(),
           "cores": os.cpu_count(), "load_average": os.getloadavg()}
    table = "\n".join([
        "%s; CPU: %s, %d cores; load average %.1f:" % (res["wheel"], res["cpu"], res["cores"],
                                                       res["load_average"][0]), "",
        "| metric | value |", "|---|---|",
        "| wheel size | %d bytes (%.1f MiB) |" % (size, size / 2**20),
        "| installed (programs + bundled libraries) | %.1f MiB |" % (installed / 2**20),
        "| pip install into a fresh venv (s, median of %d) | %.2f |" % (args.reps,
                                                                      res["install_s_median"]),
    ])
    print(table)
    res["table"] = table
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
