#!/usr/bin/env python3
"""Launcher benchmark: ddprun against torchrun on the same machine, in one run.

    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/launch_bench.py [--reps N]
        [--ddprun PATH] [--json FILE]

--ddprun measures another ddprun executable (default build/bin/ddprun, or
$DDPRUN_BIN_DIR/ddprun), e.g. the one a wheel installed into a venv:
    --ddprun /path/to/venv/bin/ddprun --json /tmp/launch_bench_wheel.json

Measures, for both launchers (--standalone, --no-python, a tiny C worker):
  1. wall time to launch and reap 4 trivial workers (median of N runs);
  2. time from a worker's death to all 4 replacement workers running (each
     worker stamps CLOCK_REALTIME as its first action; max restart stamp minus
     the dying worker's last stamp), median of N runs, with --max-restarts=1;
  3. agent CPU use while 4 workers sleep (utime+stime over 5 s, from /proc),
     and the agent process's own peak RSS (VmHWM) after that.
Writes docs/launch_bench.json (or --json FILE) and prints a markdown table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import cpu_model  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))

WORKER_C = r'''
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char** argv) {
  struct timespec t; clock_gettime(CLOCK_REALTIME, &t);
  if (argc < 2 || strcmp(argv[1], "true") == 0) return 0;
  const char* rc = getenv("TORCHELASTIC_RESTART_COUNT");
  const char* lr = getenv("LOCAL_RANK");
  char path[4096];
  snprintf(path, sizeof path, "%s/ts_%s_%s", argv[2], rc, lr);
  FILE* f = fopen(path, "w");
  if (strcmp(argv[1], "sleep") == 0) { fclose(f); sleep(atoi(argv[3])); return 0; }
  if (strcmp(rc, "0") == 0 && strcmp(lr, "0") == 0) {
    usleep(200000);  /* let the others start */
    clock_gettime(CLOCK_REALTIME, &t);
    fprintf(f, "%ld.%09ld\n", (long)t.tv_sec, t.tv_nsec); fclose(f); return 1;
  }
  fprintf(f, "%ld.%09ld\n", (long)t.tv_sec, t.tv_nsec); fclose(f);
  if (strcmp(rc, "0") == 0) pause();
  return 0;
}
'''


def launchers(ddprun):
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    return {
        "ddprun": [ddprun],
        "torchrun": torchrun,
    }


def run(cmd, env=None):
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, _ = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (cmd[0], p.returncode, err[-2000:]))
    return wall


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_hwm_kib(pid):
    """Peak resident set of the agent process itself (not its workers)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--ddprun", default=os.path.join(BIN, "ddprun"),
                    help="the ddprun executable to measure (e.g. a wheel's, in a venv's bin/)")
    ap.add_argument("--json", help="write the results here (default: OUT/launch_bench.json)")
    args = ap.parse_args()
    args.ddprun = os.path.abspath(args.ddprun)
    if not os.access(args.ddprun, os.X_OK):
        sys.exit("no ddprun executable at %s (build it, or name one with --ddprun)" % args.ddprun)
    tmp = tempfile.mkdtemp(prefix="launch_bench_")
    worker = os.path.join(tmp, "worker")
    subprocess.run(["cc", "-O2", "-x", "c", "-", "-o", worker], input=WORKER_C.encode(), check=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", LOGLEVEL="ERROR")
    common = ["--standalone", "--nproc-per-node=4", "--no-python"]
    res = {}
    for name, cmd in launchers(args.ddprun).items():
        r = {}
        runs = [run(cmd + common + [worker, "true"], env) for _ in range(args.reps)]
        r["launch_reap_s"] = statistics.median(runs)
        gaps = []
        for i in range(args.reps):
            d = tempfile.mkdtemp(dir=tmp)
            run(cmd + common + ["--max-restarts=1", worker, "restart", d], env)
            death = float(open(os.path.join(d, "ts_0_0")).read())
            starts = [float(open(os.path.join(d, "ts_1_%d" % lr)).read() or 0) for lr in range(4)]
            gaps.append(max(starts) - death)
        r["death_to_replacements_ms"] = statistics.median(gaps) * 1000
        d = tempfile.mkdtemp(dir=tmp)
        p = subprocess.Popen(cmd + common + [worker, "sleep", d, "7"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=env)
        time.sleep(1.5)
        c0 = cpu_seconds(p.pid)
        time.sleep(5)
        c1 = cpu_seconds(p.pid)
        r["peak_rss_mib"] = vm_hwm_kib(p.pid) / 1024
        p.wait(30)
        r["idle_cpu_percent"] = (c1 - c0) / 5 * 100
        res[name] = r
        print("measured", name, r, file=sys.stderr)
    d, t = res["ddprun"], res["torchrun"]
    rows = [("launch + reap 4 trivial workers (s, median)", "launch_reap_s", "%.4f"),
            ("agent peak RSS (MiB)", "peak_rss_mib", "%.1f"),
            ("worker death -> 4 replacements running (ms, median)", "death_to_replacements_ms", "%.1f"),
            ("agent CPU while 4 workers sleep (%)", "idle_cpu_percent", "%.2f")]
    import torch
    lines = ["ddprun (%s) vs torchrun (PyTorch %s), %d reps, 4 workers, --standalone --no-python;"
             " CPU: %s, %d cores:" % (args.ddprun, torch.__version__, args.reps, cpu_model(),
                                     os.cpu_count()), "",
             "| metric | ddprun | torchrun | torchrun / ddprun |", "|---|---|---|---|"]
    for label, key, fmt in rows:
        ratio = "%.1fx" % (t[key] / d[key]) if d[key] > 0 else "n/a (ddprun below resolution)"
        lines.append("| %s | %s | %s | %s |" % (label, fmt % d[key], fmt % t[key], ratio))
    table = "\n".join(lines)
    print(table)
    path = args.json or os.path.join(args.out, "launch_bench.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"ddprun": args.ddprun, "cpu": cpu_model(), "results": res, "table": table},
                  f, indent=1)


if __name__ == "__main__":
    main()
