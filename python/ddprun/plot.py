"""Loss and accuracy curves from `train --metrics` (or lenet_ddp.py --metrics) files.

    python -m ddprun.plot m.jsonl [other.jsonl ...] [-o curves.png] [--labels a,b] [--title T]

Left: the step lines' loss (global mean over each log interval) against the
global step, with each epoch's mean train loss as markers. Right: test
accuracy after each epoch. Several files are drawn on the same axes (ours
against PyTorch, say). Needs matplotlib (`pip install 'ddprun[plot]'`);
without it the command exits 2 saying so, and never installs anything.
Exit 2 too for a file that cannot be read or holds no step or epoch lines.
"""
import argparse
import json
import os
import sys

MATPLOTLIB_MISSING = ("%s: matplotlib is not installed for %s: pip install 'ddprun[plot]' "
                      "(or pip install matplotlib) into that environment, then run this again")


class MetricsError(ValueError):
    """A metrics file that cannot be plotted; the message names it and why."""


class MatplotlibMissing(ImportError):
    """matplotlib is not importable; the message says how to get it."""


def read_metrics(path):
    """(steps, epochs, final) of a metrics JSONL file: the "step" and "epoch"
    records in file order and the last "final" record (or None); other
    records are ignored. Raises MetricsError."""
    steps, epochs, final = [], [], None
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise MetricsError("%s:%d: not JSON: %.80s" % (path, n, line)) from None
            if not isinstance(row, dict):
                raise MetricsError("%s:%d: not a JSON object: %.80s" % (path, n, line))
            kind = row.get("type")
            if kind == "step":
                steps.append(row)
            elif kind == "epoch":
                epochs.append(row)
            elif kind == "final":
                final = row
    if not steps and not epochs:
        raise MetricsError("%s: no step or epoch lines" % path)
    return steps, epochs, final


def curves(steps, epochs):
    """The points drawn for one run, as lists:
    loss: [(global_step, loss)] of the step lines;
    epoch_loss: [(the epoch's last global step, mean train loss)];
    accuracy: [(epoch + 1, test accuracy)]."""
    loss = [(r["global_step"], r["loss"]) for r in steps]
    ends = {}
    for r in steps:
        ends[r["epoch"]] = max(ends.get(r["epoch"], 0), r["global_step"])
    epoch_loss = [(ends[e["epoch"]], e["train_loss"]) for e in epochs if e["epoch"] in ends]
    accuracy = [(e["epoch"] + 1, e["test_accuracy"]) for e in epochs]
    return {"loss": loss, "epoch_loss": epoch_loss, "accuracy": accuracy}


def summary(label, final):
    """One line from a run's final record."""
    return "%s: world %s, %s steps, %.2f s, test accuracy %.4f (%s/%s), final loss %.4f" % (
        label, final.get("world"), final.get("steps"), final.get("train_seconds", 0),
        final.get("test_accuracy", 0), final.get("test_correct"), final.get("test_total"),
        final.get("final_loss") or 0)


def import_pyplot(prog="python -m ddprun.plot"):
    """matplotlib.pyplot on the Agg backend; MatplotlibMissing without it."""
    try:
        import matplotlib
    except ImportError:
        raise MatplotlibMissing(MATPLOTLIB_MISSING % (prog, sys.executable)) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def draw(runs, labels, output, title="", plt=None):
    """Writes the PNG of runs [(steps, epochs, final)] to `output`."""
    plt = plt or import_pyplot()
    from matplotlib.ticker import MaxNLocator
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (label, (steps, epochs, _)) in enumerate(zip(labels, runs)):
        color = "C%d" % i
        c = curves(steps, epochs)
        if c["loss"]:
            ax1.plot(*zip(*c["loss"]), "-", color=color, lw=1, label="%s (interval loss)" % label)
        if c["epoch_loss"]:
            ax1.plot(*zip(*c["epoch_loss"]), "o", color=color, ms=6,
                     label="%s (epoch mean)" % label)
        if c["accuracy"]:
            ax2.plot(*zip(*c["accuracy"]), "o-", color=color, label=label)
            x, y = c["accuracy"][-1]
            ax2.annotate("%.4f" % y, (x, y), textcoords="offset points", xytext=(4, 4 + 10 * i),
                         fontsize=8, color=color)
    ax1.set_xlabel("global step")
    ax1.set_ylabel("cross-entropy loss")
    ax1.set_title("Training loss")
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("test accuracy")
    ax2.set_title("Test accuracy (every test sample once)")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)


def main(argv=None, prog="python -m ddprun.plot"):
    ap = argparse.ArgumentParser(prog=prog,
                                 description="metrics JSONL (train --metrics) -> loss/accuracy "
                                 "curves PNG. Needs matplotlib: pip install 'ddprun[plot]'.")
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--output", help="PNG path (default: first file's name + .png)")
    ap.add_argument("--labels", help="comma-separated legend labels (default: file names)")
    ap.add_argument("--title", default="")
    a = ap.parse_args(argv)
    labels = a.labels.split(",") if a.labels else [os.path.basename(f) for f in a.files]
    if len(labels) != len(a.files):
        ap.error("--labels: %d labels for %d files" % (len(labels), len(a.files)))
    try:
        runs = [read_metrics(f) for f in a.files]
        plt = import_pyplot(prog)
    except (MetricsError, MatplotlibMissing) as e:
        print(e, file=sys.stderr)
        return 2
    except OSError as e:
        print("%s: %s: %s" % (prog, e.filename, e.strerror), file=sys.stderr)
        return 2
    for label, (_, _, final) in zip(labels, runs):
        if final:
            print(summary(label, final))
    out = a.output or os.path.splitext(a.files[0])[0] + ".png"
    draw(runs, labels, out, a.title, plt)
    print("wrote " + out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
