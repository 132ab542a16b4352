#!/usr/bin/env python3
"""Loss and accuracy curves from `train --metrics` (or lenet_ddp.py --metrics) files.

    python scripts/bench/plot_metrics.py m.jsonl [other.jsonl ...] [-o curves.png] [--labels a,b]

Left: the step lines' loss (global mean over each log interval) against the
global step, with each epoch's mean train loss as markers. Right: test
accuracy after each epoch. Several files are drawn on the same axes (ours
against PyTorch, say). Needs matplotlib; without it the script exits 2 saying
how to get it (it never installs anything into the interpreter that runs it).
"""
import argparse
import json
import os
import sys


def read_metrics(path):
    steps, epochs, final = [], [], None
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                sys.exit("%s:%d: not JSON: %.80s" % (path, n, line))
            kind = row.get("type")
            if kind == "step":
                steps.append(row)
            elif kind == "epoch":
                epochs.append(row)
            elif kind == "final":
                final = row
    if not steps and not epochs:
        sys.exit("%s: no step or epoch lines" % path)
    return steps, epochs, final


MATPLOTLIB_MISSING = (
    "plot_metrics.py: matplotlib is not installed for %s; install it into a virtual "
    "environment and run this script with that environment's python, e.g.\n"
    "  python3 -m venv ~/.venvs/plot && ~/.venvs/plot/bin/pip install matplotlib\n"
    "  ~/.venvs/plot/bin/python scripts/bench/plot_metrics.py m.jsonl\n"
    "(or install Debian's python3-matplotlib)")


def import_pyplot():
    try:
        import matplotlib
    except ImportError:
        print(MATPLOTLIB_MISSING % sys.executable, file=sys.stderr)
        sys.exit(2)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def main():
    ap = argparse.ArgumentParser(description="metrics JSONL -> loss/accuracy curves PNG")
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--output", help="PNG path (default: first file's name + .png)")
    ap.add_argument("--labels", help="comma-separated legend labels (default: file names)")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    labels = a.labels.split(",") if a.labels else [os.path.basename(f) for f in a.files]
    if len(labels) != len(a.files):
        sys.exit("--labels: %d labels for %d files" % (len(labels), len(a.files)))
    runs = [read_metrics(f) for f in a.files]
    plt = import_pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (label, (steps, epochs, final)) in enumerate(zip(labels, runs)):
        color = "C%d" % i
        if steps:
            ax1.plot([r["global_step"] for r in steps], [r["loss"] for r in steps], "-",
                     color=color, lw=1, label="%s (interval loss)" % label)
        if epochs and steps:
            # each epoch's mean train loss at the epoch's last global step
            ends = {}
            for r in steps:
                ends[r["epoch"]] = max(ends.get(r["epoch"], 0), r["global_step"])
            pts = [(ends[e["epoch"]], e["train_loss"]) for e in epochs if e["epoch"] in ends]
            if pts:
                ax1.plot(*zip(*pts), "o", color=color, ms=6, label="%s (epoch mean)" % label)
        if epochs:
            ax2.plot([e["epoch"] + 1 for e in epochs], [e["test_accuracy"] for e in epochs], "o-",
                     color=color, label=label)
            last = epochs[-1]
            ax2.annotate("%.4f" % last["test_accuracy"], (last["epoch"] + 1, last["test_accuracy"]),
                         textcoords="offset points", xytext=(4, 4 + 10 * i), fontsize=8, color=color)
        if final:
            print("%s: world %s, %s steps, %.2f s, test accuracy %.4f (%s/%s), final loss %.4f" % (
                label, final.get("world"), final.get("steps"), final.get("train_seconds", 0),
                final.get("test_accuracy", 0), final.get("test_correct"), final.get("test_total"),
                final.get("final_loss") or 0))
    ax1.set_xlabel("global step")
    ax1.set_ylabel("cross-entropy loss")
    ax1.set_title("Training loss")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    from matplotlib.ticker import MaxNLocator
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy")
    ax2.set_title("Test accuracy (every test sample once)")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    out = a.output or os.path.splitext(a.files[0])[0] + ".png"
    fig.savefig(out, dpi=100)
    print("wrote " + out)


if __name__ == "__main__":
    main()
