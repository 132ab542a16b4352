#!/usr/bin/env python3
"""1 worker against N: how far apart do ResNet-18 runs end when only the
world size changes (same global batch, synchronised batch norm), in train
and in PyTorch DDP?

    nice -n 10 python3 scripts/bench/one_vs_n.py --out-dir /tmp/one_vs_n
    python3 scripts/bench/one_vs_n.py --out-dir /tmp/one_vs_n --table-only
    /usr/bin/python3 scripts/bench/one_vs_n.py --out-dir /tmp/one_vs_n --diagnose 4  # needs torch

For each seed, PyTorch's torch.manual_seed(seed) ResNet-18 (imagenet stem,
torchvision's init) is saved as safetensors and both sides start from it.
For each world size W (default 1, 2, 4) at the same global batch
(--global-batch / W per rank), one configuration at a time, never in
parallel:
- ours:    ddprun --standalone --nproc_per_node=W train --model resnet18
           --stem imagenet --data synthetic-cifar --sync-bn --init INIT
           --seed S --batch-size G/W --epochs E --lr --momentum
           --train-samples --test-samples --metrics M --log-interval 1
- pytorch: ddprun --standalone --nproc_per_node=W one_vs_n_torch.py (the
           same data, sample order, init, SGD; gloo; a hand-written
           synchronised batch norm since nn.SyncBatchNorm refuses CPU
           tensors: see that file), run by --python (PYTHON_EXEC).
Each run appends one JSON line to OUT/runs.jsonl (impl, world, seed, final
test accuracy, per-step global mean losses, seconds); the Markdown table
goes to OUT/table.md and stdout:
- per (impl, world): mean, min, max of the final test accuracy over seeds;
- per (world, seed): ours against PyTorch;
- per (impl, seed, W > 1): the first step where the 1-worker and W-worker
  losses differ by more than --part-tol (1e-4), and the largest difference
  over the first 10 steps; also ours against PyTorch at each world size.
--diagnose K: the first K steps of the first seed (K x global batch samples,
one epoch), with the state after every step kept (train: --checkpoint-every
1; PyTorch: --dump-dir), for ours, PyTorch, and PyTorch with the hand-written
sync BN at world 1 too; OUT/diagnose.md gets, per step and pair, the losses'
difference and the relative L2 difference of the weights, of the momentum
buffers (the gradients summed with momentum) and of the running statistics.
A run already in runs.jsonl (same impl, world, seed and settings) is not
run again, so an interrupted study continues where it stopped.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "../.."))
BIN = os.path.join(ROOT, "build/bin")
sys.path.insert(0, HERE)
import benchutil  # noqa: E402

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
               "TORCHELASTIC_RUN_ID")
VENV_PY = "/opt/ddprun-test/venv-torch2/bin/python"


def env(python):
    e = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    e.update(PYTHON_EXEC=python, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    return e


def run(cmd, python, timeout):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(python))
    if p.returncode != 0:
        raise SystemExit("%s exited %d:\n%s\n%s" % (" ".join(cmd), p.returncode,
                                                   p.stdout[-2000:], p.stderr[-4000:]))
    return p, time.time() - t


def settings(args):
    return {"global_batch": args.global_batch, "epochs": args.epochs, "lr": args.lr,
            "momentum": args.momentum, "train_samples": args.train_samples,
            "test_samples": args.test_samples}


def ours(args, world, seed, init, tmp):
    metrics = os.path.join(tmp, "ours_w%d_s%d.jsonl" % (world, seed))
    if os.path.exists(metrics):
        os.remove(metrics)
    launcher = [] if world == 1 and args.ours_alone_at_1 else \
        [os.path.join(BIN, "ddprun"), "--standalone", "--nproc_per_node=%d" % world, "--no_python"]
    cmd = launcher + [os.path.join(BIN, "train"), "--model", "resnet18", "--stem", "imagenet",
                      "--data", "synthetic-cifar", "--sync-bn", "--init", init,
                      "--seed", str(seed), "--batch-size", str(args.global_batch // world),
                      "--epochs", str(args.epochs), "--lr", str(args.lr),
                      "--momentum", str(args.momentum),
                      "--train-samples", str(args.train_samples),
                      "--test-samples", str(args.test_samples),
                      "--metrics", metrics, "--log-interval", "1", "--log-seconds", "0",
                      "--quiet"]
    p, secs = run(cmd, args.python, args.timeout)
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    final = [r for r in rows if r.get("type") == "final"][-1]
    return {"losses": [r["loss"] for r in rows if r.get("type") == "step"],
            "epoch_accuracy": [r["test_accuracy"] for r in rows if r.get("type") == "epoch"],
            "test_accuracy": final["test_accuracy"], "seconds": secs,
            "command": " ".join(cmd)}


def pytorch(args, world, seed, init, tmp):
    out = os.path.join(tmp, "torch_w%d_s%d.json" % (world, seed))
    cmd = [os.path.join(BIN, "ddprun"), "--standalone", "--nproc_per_node=%d" % world,
           os.path.join(HERE, "one_vs_n_torch.py"), "--init", init, "--seed", str(seed),
           "--batch-size", str(args.global_batch // world), "--epochs", str(args.epochs),
           "--lr", str(args.lr), "--momentum", str(args.momentum),
           "--train-samples", str(args.train_samples), "--test-samples",
           str(args.test_samples), "--out", out]
    if args.hand_bn_at_1:
        cmd.append("--hand-bn-at-1")
    p, secs = run(cmd, args.python, args.timeout)
    r = json.load(open(out))
    return {"losses": r["losses"], "epoch_accuracy": [e["test_accuracy"] for e in r["epochs"]],
            "test_accuracy": r["test_accuracy"], "seconds": secs, "torch": r["torch"],
            "bn": r["bn"], "command": " ".join(cmd)}


def rel_diffs(a, b):
    """Relative L2 differences of two states: weights, momentum buffers,
    running statistics (every tensor of the kind concatenated)."""
    out = {}
    for kind, pick in (("weights", lambda n: not n.startswith("optim.") and "running" not in n
                        and "num_batches" not in n),
                       ("momentum", lambda n: n.startswith("optim.")),
                       ("running stats", lambda n: "running" in n)):
        num = den = 0.0
        for n in a:
            if pick(n):
                num += float((a[n].double() - b[n].double()).pow(2).sum())
                den += float(a[n].double().pow(2).sum())
        out[kind] = (num / den) ** 0.5 if den else 0.0
    return out


def diagnose(args, steps):
    sys.path.insert(0, os.path.join(ROOT, "examples/pytorch"))
    import glob
    import re
    import lenet  # noqa: F401  (safetensors reader; needs torch)
    seed = int(args.seeds.split(",")[0])
    worlds = [int(w) for w in args.worlds.split(",")]
    g = args.global_batch
    init = os.path.join(args.out_dir, "init_seed%d.safetensors" % seed)
    if not os.path.exists(init):
        run([args.python, os.path.join(HERE, "one_vs_n_torch.py"), "--write-init", init,
             "--seed", str(seed)], args.python, args.timeout)
    tmp = tempfile.mkdtemp(prefix="one_vs_n_diag_")
    common = ["--seed", str(seed), "--epochs", "1", "--lr", str(args.lr), "--momentum",
              str(args.momentum), "--train-samples", str(steps * g), "--test-samples", "100"]
    states, losses = {}, {}
    for impl in ("ours", "pytorch", "pytorch-hand-bn"):
        for w in worlds:
            if impl == "pytorch-hand-bn" and w != 1:
                continue
            d = os.path.join(tmp, "%s_w%d" % (impl, w))
            os.makedirs(d)
            launch = [os.path.join(BIN, "ddprun"), "--standalone", "--nproc_per_node=%d" % w]
            if impl == "ours":
                metrics = os.path.join(d, "m.jsonl")
                run(launch + ["--no_python", os.path.join(BIN, "train"), "--model", "resnet18",
                              "--stem", "imagenet", "--data", "synthetic-cifar", "--sync-bn",
                              "--init", init, "--batch-size", str(g // w), "--metrics", metrics,
                              "--log-interval", "1", "--log-seconds", "0", "--quiet",
                              "--checkpoint-dir", d, "--checkpoint-every", "1",
                              "--keep-checkpoints", str(steps + 1)] + common,
                    args.python, args.timeout)
                losses[(impl, w)] = [json.loads(l)["loss"] for l in open(metrics)
                                     if '"type":"step"' in l]
                files = {int(re.search(r"-(\d+)\.safetensors$", f).group(1)): f
                         for f in glob.glob(os.path.join(d, "ckpt-*.safetensors"))}
            else:
                out = os.path.join(d, "r.json")
                run(launch + [os.path.join(HERE, "one_vs_n_torch.py"), "--init", init,
                              "--batch-size", str(g // w), "--out", out, "--dump-dir", d]
                    + (["--hand-bn-at-1"] if impl == "pytorch-hand-bn" else []) + common,
                    args.python, args.timeout)
                losses[(impl, w)] = json.load(open(out))["losses"]
                files = {int(re.search(r"step-(\d+)", f).group(1)): f
                         for f in glob.glob(os.path.join(d, "step-*.safetensors"))}
            states[(impl, w)] = {s: lenet.load_safetensors(f) for s, f in files.items()}
    pairs = [(("ours", 1), ("ours", w)) for w in worlds if w != 1]
    pairs += [(("pytorch", 1), ("pytorch", w)) for w in worlds if w != 1]
    pairs += [(("pytorch-hand-bn", 1), ("pytorch", w)) for w in worlds if w != 1]
    pairs += [(("pytorch-hand-bn", 1), ("pytorch", 1)), (("ours", 1), ("pytorch", 1)),
              (("ours", 1), ("pytorch-hand-bn", 1))]
    pairs += [(("ours", w), ("pytorch", w)) for w in worlds if w != 1]
    lines = ["Seed %d, global batch %d, lr %g, momentum %g: per step, |loss difference| and "
             "the relative L2 difference of the state after the step" % (
                 seed, g, args.lr, args.momentum), "",
             "| pair | step | loss A | loss B | abs loss diff | weights | momentum buffers | "
             "running stats |", "|---|---|---|---|---|---|---|---|"]
    for a, b in pairs:
        for s in range(1, steps + 1):
            r = rel_diffs(states[a][s], states[b][s])
            la, lb = losses[a][s - 1], losses[b][s - 1]
            lines.append("| %s w%d vs %s w%d | %d | %.7f | %.7f | %.1e | %.1e | %.1e | %.1e |" % (
                a[0], a[1], b[0], b[1], s, la, lb, abs(la - lb), r["weights"], r["momentum"],
                r["running stats"]))
    text = "\n".join(lines)
    with open(os.path.join(args.out_dir, "diagnose.md"), "w") as f:
        f.write(text + "\n")
    print(text)


def first_part(a, b, tol):
    """1-based first step where |a - b| > tol (None: never), max |a - b| over
    the first 10 steps."""
    d = [abs(x - y) for x, y in zip(a, b)]
    first = next((i + 1 for i, v in enumerate(d) if v > tol), None)
    return first, max(d[:10]) if d else None


def table(records, args):
    lines = []
    key = lambda r: (r["impl"], r["world"], r["seed"])  # noqa: E731
    by = {key(r): r for r in records}
    impls = [i for i in ("ours", "pytorch") if any(r["impl"] == i for r in records)]
    worlds = sorted({r["world"] for r in records})
    seeds = sorted({r["seed"] for r in records})
    lines.append("Final test accuracy over seeds %s:" % ", ".join(map(str, seeds)))
    lines.append("")
    lines.append("| impl | world | per-rank batch | mean | min | max | mean s/run |")
    lines.append("|---|---|---|---|---|---|---|")
    for i in impls:
        for w in worlds:
            rs = [by[(i, w, s)] for s in seeds if (i, w, s) in by]
            if not rs:
                continue
            acc = [r["test_accuracy"] for r in rs]
            lines.append("| %s | %d | %d | %.3f | %.3f | %.3f | %.0f |" % (
                i, w, args.global_batch // w, statistics.mean(acc), min(acc), max(acc),
                statistics.mean(r["seconds"] for r in rs)))
    lines.append("")
    lines.append("Per run: final test accuracy (after each epoch), ours | PyTorch:")
    lines.append("")
    lines.append("| world | seed | ours | PyTorch |")
    lines.append("|---|---|---|---|")
    for w in worlds:
        for s in seeds:
            cells = []
            for i in ("ours", "pytorch"):
                r = by.get((i, w, s))
                cells.append("-" if r is None else "%.3f (%s)" % (
                    r["test_accuracy"], ", ".join("%.3f" % a for a in r["epoch_accuracy"])))
            lines.append("| %d | %d | %s | %s |" % (w, s, cells[0], cells[1]))
    lines.append("")
    lines.append("Where the losses part: first step with |loss difference| > %g (of %s), "
                 "and the largest difference in steps 1-10:" % (
                     args.part_tol, "/".join(str(len(r["losses"])) for r in records[:1])))
    lines.append("")
    lines.append("| pair | seed | first step > %g | max diff, steps 1-10 |" % args.part_tol)
    lines.append("|---|---|---|---|")
    pairs = []
    for i in impls:
        for w in worlds:
            if w != 1:
                pairs.append(("%s 1 vs %d" % (i, w), (i, 1), (i, w)))
    for w in worlds:
        if len(impls) == 2:
            pairs.append(("ours vs PyTorch, world %d" % w, ("ours", w), ("pytorch", w)))
    for name, a, b in pairs:
        for s in seeds:
            ra, rb = by.get(a + (s,)), by.get(b + (s,))
            if ra is None or rb is None:
                continue
            first, worst = first_part(ra["losses"], rb["losses"], args.part_tol)
            lines.append("| %s | %d | %s | %.1e |" % (name, s, first or "never", worst))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="/tmp/one_vs_n")
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--impls", default="ours,pytorch")
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--train-samples", type=int, default=2048)
    ap.add_argument("--test-samples", type=int, default=1000)
    ap.add_argument("--part-tol", type=float, default=1e-4)
    ap.add_argument("--python", default=VENV_PY if os.path.exists(VENV_PY) else sys.executable,
                    help="PyTorch's interpreter (PYTHON_EXEC of the ranks)")
    ap.add_argument("--hand-bn-at-1", action="store_true",
                    help="PyTorch at world 1 also runs the hand-written sync BN")
    ap.add_argument("--ours-alone-at-1", action="store_true",
                    help="train at world 1 without ddprun (the same math)")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--diagnose", type=int, metavar="K",
                    help="only the step-by-step comparison of the first K steps (first seed)")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.diagnose:
        diagnose(args, args.diagnose)
        return
    path = os.path.join(args.out_dir, "runs.jsonl")
    records = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    records = [r for r in records if r.get("settings") == settings(args)
               and r.get("hand_bn_at_1", False) == args.hand_bn_at_1]
    if not args.table_only:
        worlds = [int(w) for w in args.worlds.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
        if any(args.global_batch % w for w in worlds):
            raise SystemExit("--global-batch %d does not split over worlds %s"
                             % (args.global_batch, worlds))
        tmp = tempfile.mkdtemp(prefix="one_vs_n_")
        done = {(r["impl"], r["world"], r["seed"]) for r in records}
        head = {"cpu": benchutil.cpu_model(), "commit": benchutil.git_commit(ROOT),
                "settings": settings(args), "hand_bn_at_1": args.hand_bn_at_1}
        for seed in seeds:
            init = os.path.join(args.out_dir, "init_seed%d.safetensors" % seed)
            if not os.path.exists(init):
                run([args.python, os.path.join(HERE, "one_vs_n_torch.py"), "--write-init", init,
                     "--seed", str(seed)], args.python, args.timeout)
            for impl in args.impls.split(","):
                for w in worlds:
                    if (impl, w, seed) in done:
                        continue
                    r = (ours if impl == "ours" else pytorch)(args, w, seed, init, tmp)
                    rec = dict(head, impl=impl, world=w, seed=seed, **r)
                    records.append(rec)
                    with open(path, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                    print(json.dumps({k: rec[k] for k in ("impl", "world", "seed",
                                                          "test_accuracy", "seconds")}),
                          flush=True)
    text = table(records, args)
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
