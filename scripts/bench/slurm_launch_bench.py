#!/usr/bin/env python3
"""srun launch benchmark: ddprun with no flag against the torchrun idiom, on
the same local 3-node Slurm cluster (tests/pyutil/slurm_cluster.py), in one
run. Needs root and Slurm's Debian packages (scripts/setup-test-deps.sh).

    sudo python3 scripts/bench/slurm_launch_bench.py [--reps 5] [--out FILE]

Each rep is one `srun -N3 --ntasks-per-node=1 -c 2 ...` (6 workers, 2 per
node); the figure is the time from srun's start to the last worker running:
every worker stamps CLOCK_REALTIME as its first statement, and the figure is
the largest stamp minus the time taken just before srun started. Variants,
interleaved rep by rep:
  ddprun          srun ddprun worker.py (zero flags: the layout, the static
                  rendezvous on the first node and the workers per node from
                  SLURM_CPUS_PER_TASK)
  ddprun-sh       the same with --no-python and a /bin/sh worker
  torchrun-2.x    srun bash -c 'MASTER_ADDR=$(scontrol show hostnames
                  "$SLURM_JOB_NODELIST" | head -n1); torchrun --nnodes
                  $SLURM_NNODES --node_rank $SLURM_NODEID --nproc_per_node 2
                  --rdzv_id $SLURM_JOB_ID --rdzv_backend c10d --rdzv_endpoint
                  $MASTER_ADDR:PORT worker.py' (the PyTorch 2 venv's torchrun)
  torchrun-1.13   the same idiom with Debian's `python3 -m torch.distributed.run`
                  (and --redirects 1 --tee 1, see variants())
  srun-direct     srun python worker.py, 3 tasks and no launcher: what Slurm
                  and the interpreter cost by themselves (a floor, not 6 workers)
Python workers run under the same interpreter (the venv's python, ddprun's
PYTHON_EXEC; Debian's python3 for torchrun 1.13, the same binary). PORT is
15000 + job id % 10000, the convention ddprun follows. Writes JSON (--out,
default docs/slurm_launch_bench.json) and prints a markdown table.
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
sys.path.insert(0, os.path.join(ROOT, "tests", "pyutil"))
import slurm_cluster  # noqa: E402

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))
VENV = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
VENV_PYTHON = os.path.join(VENV, "bin", "python")
TORCHRUN2 = os.path.join(VENV, "bin", "torchrun")
DEBIAN_PYTHON = "/usr/bin/python3"

JOB_TIMEOUT = 300  # a bound against hangs, not an expectation

WORKER_PY = """import time; t = time.time()
import os
with open(os.path.join(os.environ["STAMPS"], "%s_%d" % (os.environ.get("RANK", "x"),
          os.getpid())), "w") as f:
    f.write(repr(t))
"""
WORKER_SH = """#!/bin/sh
t=$(date +%s.%N)
echo "$t" > "$STAMPS/${RANK}_$$"
"""
IDIOM = ('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1); '
         'exec {launcher}{extra} --nnodes $SLURM_NNODES --node_rank $SLURM_NODEID '
         '--nproc_per_node 2 --rdzv_id $SLURM_JOB_ID --rdzv_backend c10d '
         '--rdzv_endpoint $MASTER_ADDR:$((15000 + SLURM_JOB_ID % 10000)) {worker}')
SRUN = ["-N3", "--ntasks-per-node=1", "--cpus-per-task=2"]


def variants(ddprun, work):
    """{name: (srun arguments after SRUN's, workers expected, env extra)}"""
    py = os.path.join(work, "worker.py")
    sh = os.path.join(work, "worker.sh")
    out = {
        "ddprun": ([ddprun, py], 6, {"PYTHON_EXEC": VENV_PYTHON}),
        "ddprun-sh": ([ddprun, "--no-python", sh], 6, {}),
        "srun-direct": ([VENV_PYTHON, py], 3, {}),
    }
    if os.access(TORCHRUN2, os.X_OK):
        out["torchrun-2.x"] = (["bash", "-c", IDIOM.format(launcher=TORCHRUN2, extra="",
                                                           worker=py)], 6, {})
    probe = subprocess.run([DEBIAN_PYTHON, "-c", "import torch.distributed.run"],
                           capture_output=True)
    if probe.returncode == 0:
        # Debian's 1.13 on Python 3.11 turns the default "0" of --redirects
        # and --tee into None and fails; 1 (stdout) is harmless here: the
        # worker prints nothing.
        launcher = DEBIAN_PYTHON + " -m torch.distributed.run"
        out["torchrun-1.13"] = (["bash", "-c", IDIOM.format(
            launcher=launcher, extra=" --redirects 1 --tee 1", worker=py)], 6, {})
    return out


def one(cluster, args, nworkers, extra, work):
    """Seconds from srun's start to the last worker's first statement, and
    to srun's end."""
    stamps = tempfile.mkdtemp(dir=work)
    env = dict(extra, STAMPS=stamps, TMPDIR=work)
    t0 = time.time()
    r = cluster.srun([*SRUN, *args], timeout=JOB_TIMEOUT, env=env)
    end = time.time()
    if r.returncode != 0:
        raise RuntimeError("srun %s exited %d:\n%s%s" % (" ".join(args), r.returncode, r.stdout,
                                                         r.stderr))
    names = os.listdir(stamps)
    if len(names) != nworkers:
        raise RuntimeError("%d worker stamps, not %d: %s" % (len(names), nworkers, names))
    last = max(float(open(os.path.join(stamps, n)).read()) for n in names)
    return last - t0, end - t0


def versions():
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
        except OSError:
            return None
    return {"slurm": out(["slurmd", "-V"]),
            "torch2": out([VENV_PYTHON, "-c", "import torch; print(torch.__version__)"]),
            "torch1": out([DEBIAN_PYTHON, "-c", "import torch; print(torch.__version__)"]),
            "python": out([VENV_PYTHON, "--version"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ddprun", default=os.path.join(BIN, "ddprun"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "slurm_launch_bench.json"))
    args = ap.parse_args()
    args.loadavg = os.getloadavg()[0]  # other work on the machine, recorded beside the figures
    missing = slurm_cluster.missing_programs()
    if missing:
        sys.exit("slurm_launch_bench: not found: %s (install the Debian packages %s)"
                 % (" ".join(missing), slurm_cluster.PACKAGES))
    why = slurm_cluster.cannot_run()
    if why:
        sys.exit("slurm_launch_bench: " + why)
    work = tempfile.mkdtemp(prefix="ddprun_slurm_bench_")
    os.chmod(work, 0o755)
    with open(os.path.join(work, "worker.py"), "w") as f:
        f.write(WORKER_PY)
    with open(os.path.join(work, "worker.sh"), "w") as f:
        f.write(WORKER_SH)
    os.chmod(os.path.join(work, "worker.sh"), 0o755)
    runs = variants(os.path.abspath(args.ddprun), work)
    samples = {k: [] for k in runs}
    try:
        with slurm_cluster.SlurmCluster(nodes=3, cpus=2,
                                        jobs=(args.reps + 1) * len(runs) + 1) as cluster:
            for rep in range(args.reps + 1):  # rep 0 warms the caches, not counted
                for name, (argv, n, extra) in runs.items():
                    started, ended = one(cluster, argv, n, extra, work)
                    if rep:
                        samples[name].append((started, ended))
                    print("rep %d %-14s %.3f s to all workers, %.3f s to srun's end"
                          % (rep, name, started, ended), file=sys.stderr)
    finally:
        subprocess.run(["rm", "-rf", work])
    report(args, samples)


def report(args, samples):
    res = {}
    for name, s in samples.items():
        starts = [a for a, _ in s]
        ends = [b for _, b in s]
        res[name] = {"median_s": statistics.median(starts), "min_s": min(starts),
                     "samples_s": starts, "end_median_s": statistics.median(ends)}
    base = res["ddprun"]["median_s"]
    for r in res.values():
        r["ratio_to_ddprun"] = r["median_s"] / base
    rows = ["| launcher | srun start -> all workers running, median (s) | min (s) | "
            "x ddprun | srun start -> srun end, median (s) |",
            "|---|---|---|---|---|"]
    for name, r in res.items():
        rows.append("| %s | %.3f | %.3f | %.2f | %.3f |" % (name, r["median_s"], r["min_s"],
                                                           r["ratio_to_ddprun"],
                                                           r["end_median_s"]))
    table = "\n".join(rows)
    print(table)
    doc = {"cpu": cpu_model(), "loadavg_at_start": args.loadavg, "nodes": 3, "workers_per_node": 2, "reps": args.reps,
           "srun": SRUN, "versions": versions(), "results": res, "table": table,
           "command": "python3 scripts/bench/slurm_launch_bench.py --reps %d" % args.reps}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote " + args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
