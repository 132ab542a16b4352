"""What the side-by-side benchmarks (resnet_bench.py) do to every figure:
repeated runs reduced to a median and a spread, the loss-parity check of two
sides started from the same weights on the same batches, and the state of
the machine and the tree a figure was measured in (GPU clocks, driver,
commit, dirty or not). Pure functions but gpu_state() and tree_state(), so
tests/bench/bench_tools_test.py checks them without a GPU.
"""
import json
import math
import os
import statistics
import subprocess

import benchutil

# The loss-parity bound: the largest |ours - PyTorch| allowed over the first
# PARITY_STEPS step losses (cross-entropy of 10 classes: about 2.3 at the
# start), per precision. Both sides start from the same weights (one
# safetensors file) on the same batches, so the losses differ only by
# rounding: the order of sums in fp32 (1e-6 at step 0, grown by SGD with
# momentum over the steps), TF32's 10-bit products (about 1e-3), bf16/fp16
# activations (about 1e-2). A case beyond its bound is marked failed.
PARITY_STEPS = 5
PARITY_BOUNDS = {"fp32": 1e-3, "tf32": 1e-2, "bf16": 5e-2, "fp16": 5e-2}


def finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def combine_runs(runs, key="samples_per_second"):
    """One side's repeated runs (result dicts in run order; a failed run has
    "error") as one result: the run whose `key` is the median (the lower
    middle one of an even count), with `key` set to the median, `runs` the
    figures in run order (None for a failed run), `spread` (max - min) /
    median, `repeats` the count and `failed_runs` the errors. None when no
    run has the figure; then the last error is returned as it is."""
    good = [r for r in runs if finite(r.get(key))]
    if not good:
        return runs[-1] if runs else None
    values = sorted(r[key] for r in good)
    median = statistics.median(values)
    pick = min(good, key=lambda r: (abs(r[key] - median), r[key]))
    out = dict(pick)
    out[key] = median
    out["runs"] = [r.get(key) if finite(r.get(key)) else None for r in runs]
    out["spread"] = (values[-1] - values[0]) / median if median else None
    out["repeats"] = len(runs)
    out["failed_runs"] = [r.get("error", "")[-500:] for r in runs if not finite(r.get(key))]
    return out


def losses_from_metrics(path, first):
    """From train's --metrics file written with --log-interval 1 while the
    losses are read (the warm-up; later records may cover several steps):
    (the first `first` step losses, in step order, or fewer when a step has
    no record of its own; the mean loss over every step the records cover,
    each record weighted by the steps it covers)."""
    records = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "step" and finite(r.get("loss")):
                records.append((int(r["global_step"]), float(r["loss"])))
    records.sort()
    losses, prev, total, steps = [], 0, 0.0, 0
    for step, loss in records:
        if step == prev + 1 and len(losses) < first and step == len(losses) + 1:
            losses.append(loss)
        total += loss * (step - prev)
        steps += step - prev
        prev = step
    return losses, (total / steps if steps else None)


def loss_parity(ours, torch_losses, precision, steps=PARITY_STEPS):
    """The parity of two sides' first step losses: {"steps", "max_abs_diff",
    "bound", "ok", "ours", "pytorch"}; ok None (not checked) when either
    side has fewer than `steps` losses."""
    bound = PARITY_BOUNDS.get(precision, PARITY_BOUNDS["fp16"])
    ours, torch_losses = list(ours or [])[:steps], list(torch_losses or [])[:steps]
    out = {"steps": steps, "bound": bound, "ours": ours, "pytorch": torch_losses}
    if len(ours) < steps or len(torch_losses) < steps:
        out.update(max_abs_diff=None, ok=None,
                   why="fewer than %d losses (ours %d, PyTorch %d)" % (
                       steps, len(ours), len(torch_losses)))
        return out
    diff = max(abs(a - b) for a, b in zip(ours, torch_losses))
    out.update(max_abs_diff=diff, ok=finite(diff) and diff <= bound)
    return out


GPU_FIELDS = ("name", "driver_version", "pstate", "clocks.sm", "clocks.mem", "clocks.max.sm",
              "clocks.max.mem", "clocks_throttle_reasons.active", "temperature.gpu",
              "power.draw", "power.limit", "persistence_mode", "compute_mode")


def parse_gpu_state(csv_line):
    """One nvidia-smi --format=csv,noheader,nounits line of GPU_FIELDS."""
    values = [v.strip() for v in csv_line.split(",")]
    out = {}
    for k, v in zip(GPU_FIELDS, values):
        try:
            out[k] = float(v) if k.startswith(("clocks.", "temperature", "power")) \
                and "reasons" not in k else v
        except ValueError:  # "[N/A]" and the like stay text
            out[k] = v
    return out


def gpu_state():
    """The first GPU's state now (clocks, throttle reasons, power,
    temperature, driver), or {"error": why}."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS),
                            "--format=csv,noheader,nounits"], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr or p.stdout).strip()[-300:] or "nvidia-smi printed nothing"}
    return parse_gpu_state(lines[0])


def tree_state(root, override=None):
    """{"commit", "dirty"} from benchutil.git_commit (`override`, e.g. what
    gpu_session.sh --prepare recorded, else $DDPRUN_COMMIT, else git's view of
    root; "<sha>-dirty" when tracked files differ); None for what is unknown."""
    c = benchutil.git_commit(root, override)
    if not c:
        return {"commit": None, "dirty": None}
    dirty = c.endswith("-dirty")
    return {"commit": c[:-len("-dirty")] if dirty else c, "dirty": dirty}


def stamp(path, root, commit=None):
    """Adds {"machine": {"gpu": gpu_state(), "tree": tree_state()}} to the
    JSON object in `path` (another tool's output, e.g. bn_kernel_bench's)."""
    with open(path) as f:
        d = json.load(f)
    d["machine"] = {"gpu": gpu_state(), "tree": tree_state(root, commit)}
    benchutil.write_json_atomic(path, d)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="stamp a benchmark's JSON with the GPU's state "
                                             "and the tree's commit")
    ap.add_argument("json")
    ap.add_argument("--commit", default=None, help="<sha> or <sha>-dirty (default: git's view)")
    a = ap.parse_args()
    stamp(a.json, os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")), a.commit)
