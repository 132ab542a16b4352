#!/usr/bin/env python3
"""`train` against PyTorch DDP on ResNet-18 (and LeNet on the GPU), in one run.

    python3 scripts/bench/resnet_bench.py --device cuda [--quick] [--out DIR]
    (also: scripts/bench/train_bench.py --device cuda ...)
    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/resnet_bench.py --device cpu

Cases (each ours then PyTorch's, same model, batch, optimizer, precision):
  - ResNet-18, CIFAR-sized synthetic batches upsampled on the GPU to 224x224,
    batch 128 per rank, SGD momentum 0.9: fp32, tf32 and bf16 (PyTorch with
    autocast and channels_last), 1 rank; and 2 ranks sharing the GPU in tf32
    (the DDP tutorial's 1 vs 2 processes; on one GPU they time-slice it).
  - LeNet, 1x28x28 synthetic, batch 64, fp32, 1 rank.
--device cpu: ResNet-18 with the CIFAR stem at 32x32, batch 32 per rank, fp32,
1 and 2 workers, one thread each (OMP_NUM_THREADS=1; both sides on oneDNN).
Ours: ddprun --standalone --nproc_per_node=N --no_python train --device cuda
... with --metrics; throughput = the samples of the steps after --warmup over
the time between the step records that bracket them (step records carry
elapsed seconds). PyTorch: examples/pytorch/ddp_bench.py under the same
ddprun (gloo across ranks sharing a GPU, where NCCL refuses). Peak device
memory: ours from the caching allocator's high-water mark, PyTorch's
torch.cuda.max_memory_allocated. Writes resnet_bench_<device>.json and
resnet_bench_<device>.png to --out (default docs/) and prints a markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import cpu_model  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))
REF = os.path.join(ROOT, "examples/pytorch/ddp_bench.py")


def cases(quick, device):
    if device == "cpu":
        steps, warm = (4, 2) if quick else (20, 5)
        return [dict(name="resnet18-cifar32-cpu-%dw" % w, model="resnet18", stem="cifar", image=0,
                     batch=32, precision="fp32", world=w, steps=steps, warmup=warm, device="cpu")
                for w in (1, 2)]
    steps, warm = (10, 5) if quick else (40, 10)
    out = []
    for prec in ("fp32", "tf32", "bf16"):
        out.append(dict(name="resnet18-224-%s" % prec, model="resnet18", image=224, batch=128,
                        precision=prec, world=1, steps=steps, warmup=warm))
    out.append(dict(name="resnet18-224-tf32-2ranks", model="resnet18", image=224, batch=128,
                    precision="tf32", world=2, steps=steps, warmup=warm))
    out.append(dict(name="lenet-fp32", model="lenet", image=0, batch=64, precision="fp32",
                    world=1, steps=steps * 10, warmup=warm * 5))
    for c in out:
        c.update(device="cuda", stem="imagenet")
    return out


def last_json(text):
    for line in reversed(text.splitlines()):
        if line.strip().startswith("{"):
            return json.loads(line)
    return None


def run(cmd, timeout, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    if p.returncode != 0:
        raise RuntimeError("exit %d: %s\n%s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-2000:],
                                                    p.stderr[-4000:]))
    return p


def ours(c, timeout):
    with tempfile.TemporaryDirectory(prefix="gpu_bench_") as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        total = c["warmup"] + c["steps"]
        args = [os.path.join(BIN, "train"), "--device", c["device"], "--model", c["model"],
                "--batch-size", str(c["batch"]), "--precision", c["precision"],
                "--lr", "0.05", "--momentum", "0.9", "--max-steps", str(total),
                "--train-samples", str(total * c["batch"] * c["world"]),
                "--test-samples", "256", "--metrics", metrics,
                "--log-interval", str(c["warmup"]), "--quiet"]
        if c["model"] == "resnet18":
            args += ["--data", "synthetic-cifar", "--stem", c["stem"]]
            if c["image"]:
                args += ["--image-size", str(c["image"])]
        else:
            args += ["--data", "synthetic"]
        cmd = [os.path.join(BIN, "ddprun"), "--standalone", "--nproc_per_node=%d" % c["world"],
               "--no_python"] + args
        p = run(cmd, timeout, {"OMP_NUM_THREADS": "1"})
        fin = last_json(p.stdout)
        steps = {}
        with open(metrics) as f:
            for line in f:
                r = json.loads(line)
                if r.get("type") == "step":
                    steps[r["global_step"]] = r["elapsed_s"]
        t0, t1 = steps[c["warmup"]], steps[total]
        secs = t1 - t0
        bd = fin.get("breakdown", {})
        return {"side": "ours", "samples_per_second": c["steps"] * c["batch"] * c["world"] / secs,
                "train_seconds": secs, "peak_device_mb": fin.get("peak_device_mb"),
                "breakdown_per_step": {k: v / total for k, v in bd.items()},
                "comm_hidden_fraction": fin.get("comm_hidden_fraction"),
                "final_loss": fin.get("final_loss"), "backend": fin.get("backend")}


def pytorch(c, py, timeout):
    args = [py, "-u", REF, "--model", c["model"], "--batch-size", str(c["batch"]),
            "--precision", c["precision"], "--steps", str(c["steps"]), "--warmup", str(c["warmup"]),
            "--device", c["device"], "--stem", c["stem"], "--threads", "1"]
    if c["image"]:
        args += ["--image-size", str(c["image"])]
    cmd = [os.path.join(BIN, "ddprun"), "--standalone", "--nproc_per_node=%d" % c["world"],
           "--no_python"] + args
    return last_json(run(cmd, timeout, {"OMP_NUM_THREADS": "1"}).stdout)


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["case"]["name"] for r in res["results"]]
    o = [r["ours"]["samples_per_second"] for r in res["results"]]
    t = [r["pytorch"]["samples_per_second"] for r in res["results"]]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    x = range(len(names))
    axes[0].bar([i - 0.2 for i in x], o, 0.4, label="ddprun train")
    axes[0].bar([i + 0.2 for i in x], t, 0.4, label="PyTorch DDP")
    axes[0].set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
    axes[0].set_ylabel("samples/s")
    axes[0].set_yscale("log")
    axes[0].legend()
    axes[0].set_title("Throughput on %s" % (res["gpu"] if res["device"] == "cuda" else res["cpu"]),
                      fontsize=9)
    parts = ["data_s", "forward_backward_s", "comm_wait_s", "optimizer_s"]
    rn = [r for r in res["results"] if r["case"]["model"] == "resnet18"]
    cut = len("resnet18-")
    bottoms = [0.0] * (2 * len(rn))
    labels = []
    for r in rn:
        labels += ["ours\n" + r["case"]["name"][cut:], "torch\n" + r["case"]["name"][cut:]]
    for p in parts:
        vals = []
        for r in rn:
            vals.append(1e3 * (r["ours"]["breakdown_per_step"] or {}).get(p, 0.0))
            vals.append(1e3 * (r["pytorch"]["breakdown_per_step"] or {}).get(p, 0.0))
        axes[1].bar(range(len(vals)), vals, bottom=bottoms, label=p[:-2])
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    axes[1].set_xticks(range(len(labels)), labels, fontsize=7)
    axes[1].set_ylabel("ms per step")
    axes[1].set_title("ResNet-18 step breakdown")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(res):
    lines = ["| case | ours samples/s | PyTorch samples/s | ours/PyTorch | ours peak MiB | "
             "PyTorch peak MiB | comm hidden |", "|---|---:|---:|---:|---:|---:|---:|"]
    if res["device"] == "cpu":
        lines[0] = lines[0].replace("peak MiB", "peak device MiB")
    for r in res["results"]:
        o, t = r["ours"], r["pytorch"]
        hid = o.get("comm_hidden_fraction")
        lines.append("| %s | %.0f | %.0f | %.2fx | %s | %s | %s |" % (
            r["case"]["name"], o["samples_per_second"], t["samples_per_second"],
            o["samples_per_second"] / t["samples_per_second"],
            "%.0f" % o["peak_device_mb"] if o.get("peak_device_mb") else "-",
            "%.0f" % t["peak_device_mb"] if t.get("peak_device_mb") else "-",
            "%.0f%%" % (100 * hid) if hid is not None else "-"))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--python", default=sys.executable, help="Python with PyTorch (CUDA)")
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--timeout", type=float, default=600)
    o = ap.parse_args()
    gpu = []
    if o.device == "cuda":
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().splitlines()
    cpu = cpu_model()
    res = {"device": o.device, "gpu": gpu[0] if gpu else None, "cpu": cpu,
           "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "results": []}
    for c in cases(o.quick, o.device):
        if o.only and c["name"] not in o.only.split(","):
            continue
        entry = {"case": c}
        for side, fn in (("ours", lambda: ours(c, o.timeout)),
                         ("pytorch", lambda: pytorch(c, o.python, o.timeout))):
            try:
                entry[side] = fn()
            except Exception as e:  # a failing side is recorded, the others still run
                entry[side] = {"error": str(e)[-3000:], "samples_per_second": float("nan"),
                               "peak_device_mb": float("nan"), "breakdown_per_step": {}}
                print("%s %s failed: %s" % (c["name"], side, str(e)[-1500:]), file=sys.stderr)
        res["results"].append(entry)
        print(json.dumps(entry), flush=True)
    os.makedirs(o.out, exist_ok=True)
    with open(os.path.join(o.out, "resnet_bench_%s.json" % o.device), "w") as f:
        json.dump(res, f, indent=1)
    print(table(res))
    try:
        plot(res, os.path.join(o.out, "resnet_bench_%s.png" % o.device))
    except Exception as e:
        print("plot failed: %s" % e, file=sys.stderr)


if __name__ == "__main__":
    main()
