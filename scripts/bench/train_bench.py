#!/usr/bin/env python3
"""Training: the bundled `train` against the same recipe in PyTorch DDP, in one run.

    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/train_bench.py [--quick]
    python3 scripts/bench/train_bench.py --device cuda [--quick]   # the GPU comparison
                                                          # (resnet_bench.py)

Recipe: LeNet, batch 64 per rank, SGD lr 0.05 momentum 0.9, 1 epoch of
Fashion-MNIST (60000 train / 10000 test), OMP_NUM_THREADS=1 and one thread per
worker. For 1, 2 and 4 workers on this machine, interleaved per world size:
  - ours:    ddprun --standalone --nproc_per_node=N --no_python build/bin/train <recipe>
  - PyTorch: ddprun --standalone --nproc_per_node=N examples/pytorch/lenet_ddp.py <recipe>
             with the PyTorch 2.x venv's python (--torch-launcher torchrun runs
             it under that PyTorch's torchrun instead). Same launcher for both by
             default, so the difference is the trainer, not the launcher.
Each worker is wrapped in GNU time (/usr/bin/time -f %M, the kernel's
ru_maxrss of that process at exit), so both sides' per-worker peak RSS is
measured the same way; ours also reports rank 0's in its JSON.
Collected: launcher wall time (start-up, data load, test included),
train_seconds (first step to the end, per-epoch test evaluation included, on
both sides) and global samples/s from the final JSON, speedup vs 1 worker
(throughput ratio) and scaling efficiency (speedup / N), rank 0's step-time
breakdown (data / forward+backward / exposed comm wait / optimizer), test
accuracy, peak RSS per worker.
Comm overlap: the recipe's LeNet for N > 1 with small buckets
(--bucket-cap-mb 0.05 --first-bucket-mb 0.01: the fc layers' gradients, ready
first, are all-reduced while conv2's and conv1's backward still run) against
one bucket (the default for LeNet's 0.24 MB), reporting the bucket count, the
exposed comm wait and comm_hidden_fraction (1 - wait / all-reduce time).
Accuracy: one epoch's test accuracy moves by about 0.01-0.02 with the seed
(initial weights and shuffle), so the 2-worker accuracy is also compared over
--seeds (default 0-4) on both sides: mean and spread.
Writes docs/train_bench.json, docs/train_bench.png (time, throughput,
speedup, RSS) and docs/train_bench_breakdown.png (stacked per-step times),
and prints markdown tables. --quick: a few hundred samples, results in a temp
dir unless --out is given. --replot [JSON] redraws plots and tables.
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))
DOCS = os.path.join(ROOT, "docs")
VENV = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
LENET_DDP = os.path.join(ROOT, "examples/pytorch/lenet_ddp.py")
GNU_TIME = "/usr/bin/time"
RECIPE = ["--model", "lenet", "--batch-size", "64", "--lr", "0.05", "--momentum", "0.9",
          "--epochs", "1", "--threads", "1"]
QUICK = ["--train-samples", "512", "--test-samples", "256"]
STEP_PARTS = [("data_s", "data"), ("forward_backward_s", "forward+backward"),
              ("comm_wait_s", "exposed comm wait"), ("optimizer_s", "optimizer")]
SIDES = [("ours", "ddprun train"), ("pytorch", "PyTorch DDP")]


def final_json(stdout):
    lines = [l for l in stdout.splitlines() if l.strip().startswith("{")]
    return json.loads(lines[-1]) if lines else None


def launch_cmd(side, n, args, torch_python, torch_launcher, rss_dir):
    """The launcher command line; every worker runs under GNU time, writing
    its ru_maxrss (KiB) to rss_dir/rss_<LOCAL_RANK>."""
    wrap = ["/bin/sh", "-c", 'exec %s -f "%%M" -o "$0/rss_$LOCAL_RANK" "$@"' % GNU_TIME, rss_dir]
    if side == "ours":
        worker = [os.path.join(BIN, "train")] + args
    else:
        worker = [torch_python, "-u", LENET_DDP] + args
    if side == "pytorch" and torch_launcher == "torchrun":
        launcher = [torch_python, "-m", "torch.distributed.run"]
    else:
        launcher = [os.path.join(BIN, "ddprun")]
    return launcher + ["--standalone", "--nproc_per_node=%d" % n, "--no_python"] + wrap + worker


def run_job(side, n, args, opts):
    rss_dir = tempfile.mkdtemp(prefix="train_bench_rss_")
    try:
        cmd = launch_cmd(side, n, args, opts.torch_python, opts.torch_launcher, rss_dir)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout, env=env,
                           cwd=rss_dir)
        wall = time.perf_counter() - t0
        res = final_json(p.stdout)
        if p.returncode != 0 or res is None:
            sys.exit("%s with %d workers failed (exit %d):\n%s\n%s\ncommand: %s" % (
                side, n, p.returncode, p.stdout[-3000:], p.stderr[-6000:], " ".join(cmd)))
        rss = []
        for r in range(n):
            with open(os.path.join(rss_dir, "rss_%d" % r)) as f:
                rss.append(int(f.read().split()[-1]) / 1024.0)
        return {"wall_s": wall, "result": res, "worker_peak_rss_mb": rss}
    finally:
        shutil.rmtree(rss_dir, ignore_errors=True)


def median_run(runs):
    """The run with the median train_seconds, with every repeat's times kept."""
    runs = sorted(runs, key=lambda r: r["result"]["train_seconds"])
    pick = dict(runs[len(runs) // 2])
    pick["repeats_train_s"] = [r["result"]["train_seconds"] for r in runs]
    pick["repeats_wall_s"] = [r["wall_s"] for r in runs]
    return pick


def measure(opts):
    sample_args = QUICK if opts.quick else []
    data_args = ["--data", opts.data] if opts.data else []
    args = RECIPE + sample_args + data_args
    res = {"recipe": "LeNet, batch 64/rank, SGD lr 0.05 m 0.9, 1 epoch Fashion-MNIST, "
                     "OMP_NUM_THREADS=1" + (" (quick: 512 train / 256 test samples)"
                                           if opts.quick else ""),
           "args": args, "workers": opts.workers, "quick": opts.quick,
           "host": socket.gethostname(), "cpus": os.cpu_count(), "loadavg_before": os.getloadavg(),
           "torch_version": subprocess.run([opts.torch_python, "-c",
                                            "import torch; print(torch.__version__)"],
                                           capture_output=True, text=True).stdout.strip(),
           "pytorch_launcher": "torchrun" if opts.torch_launcher == "torchrun" else "ddprun",
           "rss_method": "GNU time %M (ru_maxrss at exit) around every worker, both sides",
           "runs": {"ours": {}, "pytorch": {}}, "overlap": {}}
    for n in opts.workers:
        reps = {"ours": [], "pytorch": []}
        for rep in range(opts.repeat):
            order = ["ours", "pytorch"] if rep % 2 == 0 else ["pytorch", "ours"]
            for side in order:
                if side == "pytorch" and opts.skip_torch:
                    continue
                print("%d worker(s), %s, repeat %d ..." % (n, side, rep + 1), file=sys.stderr)
                r = run_job(side, n, args, opts)
                print("  %.1f s wall, %.1f s training, accuracy %.4f" % (
                    r["wall_s"], r["result"]["train_seconds"], r["result"]["test_accuracy"]),
                    file=sys.stderr)
                reps[side].append(r)
        for side, runs in reps.items():
            if runs:
                res["runs"][side][str(n)] = median_run(runs)
    res["accuracy_seeds"] = {"workers": 2, "seeds": opts.seeds, "ours": [], "pytorch": []}
    for seed in opts.seeds if 2 in opts.workers else []:
        for side in ("ours", "pytorch"):
            if side == "pytorch" and opts.skip_torch:
                continue
            print("accuracy: 2 workers, %s, seed %d ..." % (side, seed), file=sys.stderr)
            r = run_job(side, 2, args + ["--seed", str(seed)], opts)
            res["accuracy_seeds"][side].append(r["result"]["test_accuracy"])
    for n in [w for w in opts.workers if w > 1]:
        for conf in opts.overlap:
            cap, _, first = conf.partition(":")
            key = "%d_workers_bucket_%smb" % (n, cap) + ("_first_%smb" % first if first else "")
            margs = RECIPE + sample_args + data_args + ["--bucket-cap-mb", cap]
            print("overlap: lenet, %d workers, bucket cap %s MB%s ..." % (
                n, cap, ", first bucket %s MB" % first if first else ""), file=sys.stderr)
            entry = {"workers": n, "bucket_cap_mb": cap, "first_bucket_mb": first or None,
                     "ours": run_job("ours", n, margs + (["--first-bucket-mb", first] if first
                                                         else []), opts)}
            if not opts.skip_torch and not first:  # DDP has no public first-bucket knob
                entry["pytorch"] = run_job("pytorch", n, margs, opts)
            res["overlap"][key] = entry
    res["loadavg_after"] = os.getloadavg()
    return res


# ---------------------------------------------------------------------- derived figures

def series(res, side):
    runs = res["runs"].get(side, {})
    ns = [n for n in res["workers"] if str(n) in runs]
    base = runs.get(str(ns[0])) if ns else None
    out = []
    for n in ns:
        r = runs[str(n)]
        j = r["result"]
        speedup = j["samples_per_second"] / base["result"]["samples_per_second"] * ns[0]
        per_step = {k: (j["breakdown"].get(k) / j["steps"] * 1e3
                        if j["breakdown"].get(k) is not None else None) for k, _ in STEP_PARTS}
        known = sum(v for v in per_step.values() if v is not None)
        per_step["other"] = max(0.0, j["train_seconds"] / j["steps"] * 1e3 - known)
        out.append({"n": n, "wall_s": r["wall_s"], "train_s": j["train_seconds"],
                    "sps": j["samples_per_second"], "speedup": speedup, "efficiency": speedup / n,
                    "acc": j["test_accuracy"], "correct": j["test_correct"],
                    "total": j["test_total"], "steps": j["steps"], "step_ms": per_step,
                    "rss_workers": r["worker_peak_rss_mb"], "rss_json": j.get("peak_rss_mb"),
                    "hidden": j.get("comm_hidden_fraction")})
    return out


def fmt(v, f="%.2f"):
    return "-" if v is None else f % v


def tables(res):
    ours = {s["n"]: s for s in series(res, "ours")}
    theirs = {s["n"]: s for s in series(res, "pytorch")}
    L = ["**%s**; %s, %d CPUs; PyTorch %s launched by %s; RSS: %s.\n" % (
        res["recipe"], res["host"], res["cpus"], res["torch_version"], res["pytorch_launcher"],
        res["rss_method"])]
    L.append("| workers | ours train s | PyTorch train s | time ratio PyTorch/ours | ours samples/s "
             "| PyTorch samples/s | ours speedup | PyTorch speedup | ours efficiency "
             "| PyTorch efficiency | ours wall s | PyTorch wall s |")
    L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in res["workers"]:
        o, t = ours.get(n), theirs.get(n)
        if not o:
            continue
        L.append("| %d | %.2f | %s | %s | %.0f | %s | %.2fx | %s | %.0f%% | %s | %.2f | %s |" % (
            n, o["train_s"], fmt(t and t["train_s"]),
            "%.2fx" % (t["train_s"] / o["train_s"]) if t else "-", o["sps"],
            fmt(t and t["sps"], "%.0f"), o["speedup"], fmt(t and t["speedup"], "%.2fx"),
            100 * o["efficiency"], fmt(t and 100 * t["efficiency"], "%.0f%%"), o["wall_s"],
            fmt(t and t["wall_s"])))
    L.append("\n| workers | ours ms/step data / fwd+bwd / comm wait / optim | PyTorch ms/step data / "
             "fwd+bwd(+comm) / optim | ours hidden comm | ours test acc | PyTorch test acc "
             "| ours peak RSS/worker MB (JSON rank 0) | PyTorch peak RSS/worker MB | RSS ratio PyTorch/ours |")
    L.append("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for n in res["workers"]:
        o, t = ours.get(n), theirs.get(n)
        if not o:
            continue
        om, tm = o["step_ms"], t["step_ms"] if t else None
        orss = max(o["rss_workers"])
        trss = max(t["rss_workers"]) if t else None
        L.append("| %d | %s / %s / %s / %s | %s | %s | %.4f | %s | %.0f (%s) | %s | %s |" % (
            n, fmt(om["data_s"]), fmt(om["forward_backward_s"]), fmt(om["comm_wait_s"]),
            fmt(om["optimizer_s"]),
            "%s / %s / %s" % (fmt(tm["data_s"]), fmt(tm["forward_backward_s"]),
                              fmt(tm["optimizer_s"])) if tm else "-",
            fmt(o["hidden"]), o["acc"],
            fmt(t and t["acc"], "%.4f"), orss, fmt(o["rss_json"], "%.0f"), fmt(trss, "%.0f"),
            "%.1fx" % (trss / orss) if trss else "-"))
    acc = res.get("accuracy_seeds")
    if acc and acc.get("ours"):
        def ms(v):
            m = sum(v) / len(v)
            sd = (sum((x - m) ** 2 for x in v) / max(1, len(v) - 1)) ** 0.5
            return "%.4f +- %.4f (min %.4f, max %.4f)" % (m, sd, min(v), max(v))
        L.append("\nTest accuracy, 2 workers, seeds %s: ours %s; PyTorch %s\n" % (
            ",".join(map(str, acc["seeds"])), ms(acc["ours"]),
            ms(acc["pytorch"]) if acc.get("pytorch") else "-"))
    if res.get("overlap"):
        L.append("\nComm overlap, the recipe's LeNet with these buckets:\n")
        L.append("| workers | bucket cap MB (first) | ours buckets | ours train s "
                 "| ours exposed comm wait s | ours comm_hidden_fraction | PyTorch train s |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|")
        for key, e in res["overlap"].items():
            j = e["ours"]["result"]
            L.append("| %d | %s (%s) | %s | %.2f | %s | %s | %s |" % (
                e["workers"], e["bucket_cap_mb"], e.get("first_bucket_mb") or 1,
                j.get("gradient_buckets", "-"), j["train_seconds"],
                fmt(j["breakdown"].get("comm_wait_s"), "%.3f"),
                fmt(j.get("comm_hidden_fraction"), "%.2f"),
                fmt(e.get("pytorch", {}).get("result", {}).get("train_seconds"))))
    return "\n".join(L)


# ---------------------------------------------------------------------- plots

def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def plot(res, stem):
    if not have_matplotlib():
        venv_py = os.path.join(VENV, "bin/python")
        if os.path.exists(venv_py) and os.path.realpath(venv_py) != os.path.realpath(sys.executable):
            subprocess.run([venv_py, os.path.abspath(__file__), "--replot", stem + ".json",
                            "--no-table"], check=True)
        else:
            print("no plot: matplotlib is not installed for %s; install it into a virtual "
                  "environment (python3 -m venv DIR && DIR/bin/pip install matplotlib) or "
                  "Debian's python3-matplotlib, and run this script with that python"
                  % sys.executable, file=sys.stderr)
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = {side: series(res, side) for side, _ in SIDES}
    colors = {"ours": "C0", "pytorch": "C3"}
    ns = res["workers"]
    width = 0.38
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    panels = [(axes[0][0], "train_s", "training time (s)", "Time for 1 epoch (lower is better)"),
              (axes[0][1], "sps", "samples/s (global)", "Throughput (higher is better)"),
              (axes[1][1], "rss", "peak RSS per worker (MB)", "Peak RSS per worker (lower is better)")]
    for ax, key, ylabel, title in panels:
        for i, (side, label) in enumerate(SIDES):
            rows = {s["n"]: s for s in data[side]}
            xs = [k + (i - 0.5) * width for k in range(len(ns)) if ns[k] in rows]
            vals = [max(rows[n]["rss_workers"]) if key == "rss" else rows[n][key]
                    for n in ns if n in rows]
            bars = ax.bar(xs, vals, width, label=label, color=colors[side])
            ax.bar_label(bars, fmt="%.0f" if key != "train_s" else "%.1f", fontsize=7)
        ax.set_xticks(range(len(ns)), ["%d" % n for n in ns])
        ax.set_xlabel("workers")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    ax = axes[1][0]
    ax.plot(ns, ns, "k--", lw=1, label="ideal")
    ax.axhline(res["cpus"], color="grey", lw=0.8, ls=":", label="CPUs on this host (%d)" % res["cpus"])
    for side, label in SIDES:
        rows = data[side]
        if rows:
            ax.plot([s["n"] for s in rows], [s["speedup"] for s in rows], "o-", color=colors[side],
                    label=label)
    ax.set_xticks(ns)
    ax.set_xlabel("workers")
    ax.set_ylabel("speedup vs 1 worker (throughput)")
    ax.set_title("Scaling")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.suptitle(res["recipe"] + " - %s, %d CPUs" % (res["host"], res["cpus"]), fontsize=10)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 5))
    parts = [("data_s", "data", "C2"), ("forward_backward_s", "forward+backward", "C0"),
             ("comm_wait_s", "exposed comm wait", "C1"), ("optimizer_s", "optimizer", "C4"),
             ("other", "other (test evaluation, loop, logging)", "C7")]
    ticks, labels = [], []
    for k, n in enumerate(ns):
        for i, (side, label) in enumerate(SIDES):
            rows = {s["n"]: s for s in data[side]}
            if n not in rows:
                continue
            x = k + (i - 0.5) * width
            bottom = 0.0
            for key, name, color in parts:
                v = rows[n]["step_ms"].get(key)
                if v is None:
                    continue
                ax.bar(x, v, width, bottom=bottom, color=color, hatch="//" if side == "pytorch" else None,
                       edgecolor="white", label=name if k == 0 and i == 0 else None)
                bottom += v
            ticks.append(x)
            labels.append("%d\n%s" % (n, "ours" if side == "ours" else "PyTorch"))
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylabel("ms per step (rank 0)")
    ax.set_title("Step time breakdown (PyTorch hatched; its comm wait is inside forward+backward)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(stem + "_breakdown.png", dpi=100)
    plt.close(fig)


def main():
    if "--device" in sys.argv:  # --device cuda: the GPU comparison (resnet_bench.py)
        i = sys.argv.index("--device")
        dev = sys.argv[i + 1] if i + 1 < len(sys.argv) else ""
        if dev == "cuda":
            gpu = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resnet_bench.py")
            os.execv(sys.executable, [sys.executable, gpu] + sys.argv[1:])
        if dev != "cpu":
            sys.exit("--device: choose cpu or cuda")
        del sys.argv[i:i + 2]
    ap = argparse.ArgumentParser(description="ddprun train vs PyTorch DDP (see the module doc)")
    ap.add_argument("--quick", action="store_true", help="512 train / 256 test samples")
    ap.add_argument("--workers", default="1,2,4", help="comma-separated world sizes")
    ap.add_argument("--repeat", type=int, default=1, help="runs per point (median kept)")
    ap.add_argument("--torch-python", default=os.path.join(VENV, "bin/python"))
    ap.add_argument("--torch-launcher", choices=("ddprun", "torchrun"), default="ddprun")
    ap.add_argument("--skip-torch", action="store_true", help="ours only")
    ap.add_argument("--overlap", default="0.05:0.01,25",
                    help="LeNet runs, comma-separated CAP[:FIRST] in MB: --bucket-cap-mb CAP and "
                         "train's --first-bucket-mb FIRST (default 1 as in DDP)")
    ap.add_argument("--seeds", default="0,1,2,3,4",
                    help="seeds for the 2-worker accuracy comparison ('' skips it)")
    ap.add_argument("--data", help="dataset directory (default: train's)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per launcher run")
    ap.add_argument("--out", help="output directory (default docs/, a temp dir with --quick)")
    ap.add_argument("--replot", nargs="?", const=os.path.join(DOCS, "train_bench.json"),
                    help="redraw plots and tables from a saved JSON")
    ap.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.replot:
        res = json.load(open(opts.replot))
        stem = os.path.splitext(opts.replot)[0]
    else:
        opts.workers = [int(w) for w in opts.workers.split(",")]
        opts.overlap = [c for c in opts.overlap.split(",") if c]
        opts.seeds = [int(x) for x in opts.seeds.split(",") if x]
        for path in (os.path.join(BIN, "ddprun"), os.path.join(BIN, "train"), GNU_TIME):
            if not os.access(path, os.X_OK):
                sys.exit("missing %s (build first; GNU time: apt-get install time)" % path)
        if not opts.skip_torch and not os.access(opts.torch_python, os.X_OK):
            sys.exit("no PyTorch 2.x python at %s (scripts/setup-test-deps.sh, or --skip-torch)"
                     % opts.torch_python)
        out = opts.out or (tempfile.mkdtemp(prefix="train_bench_") if opts.quick else DOCS)
        os.makedirs(out, exist_ok=True)
        res = measure(opts)
        stem = os.path.join(out, "train_bench")
        with open(stem + ".json", "w") as f:
            json.dump(res, f, indent=1)
        print("wrote %s.json" % stem, file=sys.stderr)
    plot(res, stem)
    if not opts.no_table:
        print(tables(res))
        print("\nplots: %s.png, %s_breakdown.png" % (stem, stem), file=sys.stderr)


if __name__ == "__main__":
    main()
