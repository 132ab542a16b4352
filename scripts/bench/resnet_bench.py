#!/usr/bin/env python3
"""`train` against PyTorch DDP on ResNet-18 (and LeNet on the GPU), in one run.

    python3 scripts/bench/resnet_bench.py --device cuda [--quick] [--out DIR] [--python PY]
    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/resnet_bench.py --device cpu

--device cuda, both sides alike (same model, batch, optimizer SGD lr 0.05
momentum 0.9, precision; the same samples in the same order: train's
synthetic-cifar set for ResNet-18, upsampled on the GPU to 224x224, its
synthetic set for LeNet, visited in train's DistributedSampler order; every
process under `ddprun --standalone`):
  - ours: `train --bench-warmup W --profile-steps P --log-interval <more than
    the steps>`: W warm-up steps, then S steps timed between two device
    drains with no host wait or read in between, then P profiled steps.
    Throughput, peaks (allocated and reserved, reset after warm-up), host
    synchronisations per step and the profile come from its final JSON
    ("bench", "profile").
  - PyTorch (examples/pytorch/ddp_bench.py): the same W / S / P phases with
    torch.cuda.synchronize() and reset_peak_memory_stats() around the timed
    window, max_memory_allocated / max_memory_reserved, and the profile from
    CUDA events on module and tensor hooks. fp32 and tf32 run eager NCHW
    (`pytorch`) and eager channels_last (`pytorch_channels_last`), bf16 and
    fp16 autocast + channels_last (`pytorch`); each ratio is taken against
    the faster PyTorch setting, which the table names.
  - cases: resnet18-224-{fp32,tf32,bf16,fp16}, resnet18-224-tf32-2ranks (two
    ranks sharing the GPU: ours through NCCL, DDPRUN_CUDA_TRANSPORT=nccl,
    and through CUDA IPC as `ours_ipc`; PyTorch through NCCL with
    NCCL_MULTI_RANK_GPU_ENABLE=1 when its NCCL is 2.30 or newer, else gloo),
    lenet-fp32, and extras: resnet18-224-fp32-nhwc and
    resnet18-224-{tf32,bf16}-nchw (ours in the layout train's --layout auto
    does not pick there: the A/B; PyTorch's figures are the base case's),
    resnet18-224-bf16-act32 (ours with DDPRUN_CUDA_ACT16=0: float activations
    around 16-bit convolutions, the default before 2026-11-27),
    resnet18-224-tf32-cudnnbn (ours with DDPRUN_CUDA_OUR_BN=0: cuDNN's batch
    norm instead of our NHWC kernels), resnet18-224-{tf32,bf16}-graph (ours
    with DDPRUN_CUDNN_GRAPH=1: convolutions through cuDNN's graph-API
    engines), resnet18-224-{tf32,bf16}-bnfusion (ours with cuDNN's fused batch
    norm + ReLU (+ add): DDPRUN_CUDNN_BN_FUSION=1 with our batch norm and, in
    bf16, 16-bit activations off), resnet18-224-tf32-asyncalloc (ours with
    DDPRUN_CUDA_ALLOCATOR=async; PyTorch's figures are the tf32 case's),
    resnet18-224-{tf32,bf16}-fusedstem (ours with DDPRUN_CUDA_FUSED_STEM=1:
    bn1 + ReLU + max pool as one layer), resnet18-224-{tf32,bf16}-ownpool (our
    vectorised NHWC max pool: DDPRUN_CUDA_OWN_POOL=1),
    resnet18-224-{tf32,bf16}-bnfold (DDPRUN_CUDA_BN_FOLD=1: our batch norm's
    sums with the chunk reduction and the finish or the parameter gradients
    in one launch), resnet18-224-{tf32,bf16}-bnfold-pdl (the same with
    DDPRUN_CUDA_PDL=1: its kernels under programmatic dependent launch),
    resnet18-224-{tf32,bf16}-cudagraph (DDPRUN_CUDA_GRAPH=1: the step's
    forward, loss, backward and optimizer as one CUDA graph; LeNet has it as
    the ours_graph column), resnet18-224-{tf32,bf16}-recompute
    (DDPRUN_CUDA_RECOMPUTE=1: each block's conv2 input recomputed for
    backward, not kept) and
    resnet18-224-fp32-deterministic
    (train --deterministic against PyTorch's cudnn.deterministic in its faster
    fp32 setting). --extra-case adds more.
  - then scripts/bench/comm_model.py on the results (a MODEL of 8 GPUs and
    of nodes on 400 Gb/s links, from ResNet-18 tf32's bucket ready times;
    its two-rank check takes --allreduce-jsonl): comm_model.json and .md.
  - a kernel phase (--kernel-trace, on when build/bin/libddprun_kernel_trace.so
    exists): ResNet-18 tf32, LeNet and ResNet-18 bf16 (when run) once more
    on both sides under the CUPTI
    tracer (CUDA_INJECTION64_PATH), which records the profiled steps
    (cudaProfilerStart/Stop): kernel time per step against the step's wall
    time, launches per step, the top kernels.
Writes resnet_bench_cuda.json to --out (default docs/) after every case (an
interrupted run leaves what it measured), resnet_bench_cuda.png (throughput
ratios; where the time goes in ResNet-18 tf32, layer by layer, both sides),
and prints markdown tables.

--device cpu: ResNet-18 with the CIFAR stem at 32x32, batch 32 per rank,
fp32, 1 and 2 workers, one thread each (OMP_NUM_THREADS=1; both sides on
oneDNN); ours timed between its step records (elapsed seconds), PyTorch
between two clock reads; resnet_bench_cpu.json.
"""
import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_harness as bh  # noqa: E402
import benchutil  # noqa: E402
from benchutil import cpu_model, last_json_line, write_json_atomic  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))
REF = os.path.join(ROOT, "examples/pytorch/ddp_bench.py")
TRACE_LIB_NAME = "libddprun_kernel_trace.so"
# The kernel phase: tf32 and LeNet, and bf16 (the bf16 goal's case; PyTorch's
# side is its autocast + channels_last).
TRACE_CASES = ("resnet18-224-tf32", "lenet-fp32", "resnet18-224-bf16")
BOTH = ["pytorch=nchw", "pytorch_channels_last=channels_last"]
# torch.compile (default mode, channels_last): a reported column, not the
# ratio's base (the ratio stays against the faster eager setting).
COMPILE_KEY = "pytorch_compile"
COMPILE = COMPILE_KEY + "=channels_last+compile"
# PyTorch's CUDA-graph column for LeNet (torch.compile mode="reduce-overhead":
# the step's kernels replayed from a CUDA graph); reported, not the ratio's
# base, like the compile column.
GRAPH_KEY = "pytorch_graph"
GRAPH = GRAPH_KEY + "=nchw+graph"
# The two-rank case's PyTorch through gloo: a second column beside NCCL's.
GLOO_SUFFIX = "_gloo"
COMPILE_TIMEOUT = 300  # seconds for a PyTorch process that also compiles (inductor, cold cache)
NCCL_TIMEOUT = 150  # seconds for a run through NCCL with two ranks on one GPU (~15 s when it works)


# ----------------------------------------------------------------------------- cases

def cuda_cases(quick, compile=True):
    """The GPU cases, the issue's goals first (tf32, fp32, LeNet, two ranks):
    a session cut short keeps those. `compile`: torch.compile's column in the
    tf32 and bf16 cases (never with `quick`)."""
    rw, rs, rp = (3, 8, 2) if quick else (8, 30, 5)
    lw, ls, lp = (10, 60, 5) if quick else (50, 300, 20)
    base = dict(model="resnet18", stem="imagenet", image=224, batch=128, world=1, device="cuda",
                warmup=rw, steps=rs, profile_steps=rp, ours=[{"key": "ours"}], pytorch_args=[])

    def resnet(prec):
        half = prec in ("bf16", "fp16")
        settings = ["pytorch=channels_last"] if half else list(BOTH)
        if prec in ("tf32", "bf16") and compile and not quick:
            settings.append(COMPILE)
        return dict(base, name="resnet18-224-" + prec, precision=prec, settings=settings)

    def variant(prec, suffix, **ours):
        """An extra: ours with other flags or environment; PyTorch's figures
        are resnet(prec)'s."""
        return dict(base, name="resnet18-224-%s-%s" % (prec, suffix), precision=prec, settings=[],
                    pytorch_same_as="resnet18-224-" + prec, extra=True,
                    ours=[dict(key="ours", **ours)])
    return [
        resnet("tf32"), resnet("fp32"),
        dict(base, name="lenet-fp32", model="lenet", image=0, batch=64, precision="fp32",
             warmup=lw, steps=ls, profile_steps=lp,
             settings=BOTH + ([GRAPH] if compile and not quick else []),
             # Ours with the step as a CUDA graph (DDPRUN_CUDA_GRAPH=1; opt-in
             # until measured) beside PyTorch's graphed column.
             ours=[{"key": "ours"}, {"key": "ours_graph", "env": {"DDPRUN_CUDA_GRAPH": "1"}}]),
        dict(base, name="resnet18-224-tf32-2ranks", precision="tf32", world=2, settings=BOTH,
             ours=[{"key": "ours", "env": {"DDPRUN_CUDA_TRANSPORT": "nccl"},
                    "timeout": NCCL_TIMEOUT},
                   {"key": "ours_ipc", "env": {"DDPRUN_CUDA_TRANSPORT": "ipc"}}]),
        resnet("bf16"), resnet("fp16"),
        # The A/Bs of train's defaults (H200, 2026-11-27): float activations
        # around the 16-bit convolutions, and cuDNN's batch norm.
        variant("bf16", "act32", env={"DDPRUN_CUDA_ACT16": "0"}),
        variant("tf32", "cudnnbn", env={"DDPRUN_CUDA_OUR_BN": "0"}),
        # Convolutions through cuDNN's graph-API engines (PyTorch's candidate
        # set) instead of the legacy search: opt-in (+2 % in bf16 for more
        # reserved memory in that run).
        variant("tf32", "graph", env={"DDPRUN_CUDNN_GRAPH": "1"}),
        variant("bf16", "graph", env={"DDPRUN_CUDNN_GRAPH": "1"}),
        # The layout A/B: ours in the layout --layout auto does not choose
        # (auto: NHWC in tf32/bf16/fp16, NCHW in fp32).
        variant("fp32", "nhwc", args=["--layout", "nhwc"]),
        variant("tf32", "nchw", args=["--layout", "nchw"]),
        variant("bf16", "nchw", args=["--layout", "nchw"]),
        # cuDNN's fused batch norm + ReLU (+ add) (it runs where cuDNN's
        # batch norm does: float activations, our kernels off).
        variant("tf32", "bnfusion", env={"DDPRUN_CUDNN_BN_FUSION": "1", "DDPRUN_CUDA_OUR_BN": "0"}),
        variant("bf16", "bnfusion", env={"DDPRUN_CUDNN_BN_FUSION": "1", "DDPRUN_CUDA_OUR_BN": "0",
                                         "DDPRUN_CUDA_ACT16": "0"}),
        variant("tf32", "asyncalloc", env={"DDPRUN_CUDA_ALLOCATOR": "async"}),
        # The fused stem (bn1 + ReLU + max pool as one layer, the activation
        # recomputed under each window): opt-in until measured.
        variant("tf32", "fusedstem", env={"DDPRUN_CUDA_FUSED_STEM": "1"}),
        variant("bf16", "fusedstem", env={"DDPRUN_CUDA_FUSED_STEM": "1"}),
        # Our vectorised NHWC max pool instead of cuDNN's (the default where faster).
        variant("tf32", "ownpool", env={"DDPRUN_CUDA_OWN_POOL": "1"}),
        variant("bf16", "ownpool", env={"DDPRUN_CUDA_OWN_POOL": "1"}),
        # Our batch norm's sums with their epilogue in one launch (2 launches
        # a direction instead of 4; bitwise the same): opt-in until measured.
        variant("tf32", "bnfold", env={"DDPRUN_CUDA_BN_FOLD": "1"}),
        variant("bf16", "bnfold", env={"DDPRUN_CUDA_BN_FOLD": "1"}),
        # Programmatic dependent launch of our batch norm's kernels, on the
        # folded launches (the launch gaps both attack): opt-in until measured.
        variant("tf32", "bnfold-pdl", env={"DDPRUN_CUDA_BN_FOLD": "1", "DDPRUN_CUDA_PDL": "1"}),
        variant("bf16", "bnfold-pdl", env={"DDPRUN_CUDA_BN_FOLD": "1", "DDPRUN_CUDA_PDL": "1"}),
        # The step as a CUDA graph (forward, loss, backward and the optimizer replayed).
        variant("tf32", "cudagraph", env={"DDPRUN_CUDA_GRAPH": "1"}),
        variant("bf16", "cudagraph", env={"DDPRUN_CUDA_GRAPH": "1"}),
        # conv2's input recomputed for backward instead of kept (memory).
        variant("tf32", "recompute", env={"DDPRUN_CUDA_RECOMPUTE": "1"}),
        variant("bf16", "recompute", env={"DDPRUN_CUDA_RECOMPUTE": "1"}),
        dict(base, name="resnet18-224-fp32-deterministic", precision="fp32",
             settings="faster:resnet18-224-fp32", pytorch_args=["--deterministic"],
             extra=True, ours=[{"key": "ours", "args": ["--deterministic"]}]),
    ]


def cpu_cases(quick):
    steps, warm = (4, 2) if quick else (20, 5)
    return [dict(name="resnet18-cifar32-cpu-%dw" % w, model="resnet18", stem="cifar", image=0,
                 batch=32, precision="fp32", world=w, steps=steps, warmup=warm, profile_steps=0,
                 device="cpu", settings=["pytorch=nchw"], ours=[{"key": "ours"}], pytorch_args=[])
            for w in (1, 2)]


def extra_case(spec, known):
    """--extra-case NAME BASE [KEY=VALUE | --train-flag ...]: ours with that
    environment and those train flags; PyTorch's figures are BASE's."""
    if len(spec) < 2 or spec[1] not in known:
        raise SystemExit("--extra-case NAME BASE [ENV=VALUE|--flag ...]: BASE must be one of "
                         + ", ".join(known))
    env = dict(s.split("=", 1) for s in spec[2:] if "=" in s and not s.startswith("-"))
    args = [s for s in spec[2:] if s.startswith("-") or "=" not in s]
    c = dict(known[spec[1]], name=spec[0], settings=[], pytorch_same_as=spec[1], extra=True,
             ours=[{"key": "ours", "env": env, "args": args}])
    return c


# ----------------------------------------------------------------------------- processes

class RunError(RuntimeError):
    def __init__(self, msg, stdout=""):
        super().__init__(msg)
        self.stdout = stdout


def _text(b):
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def run(cmd, timeout, env=None):
    """Runs cmd; returns (CompletedProcess, wall seconds). A failure or a
    timeout raises RunError carrying what it printed."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired as e:
        raise RunError("timed out after %.0f s: %s\n%s" % (timeout, " ".join(cmd),
                                                           _text(e.stderr)[-3000:]), _text(e.stdout))
    if p.returncode != 0:
        raise RunError("exit %d: %s\n%s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-2000:],
                                                p.stderr[-4000:]), p.stdout)
    return p, time.perf_counter() - t0


def launcher(world):
    return [os.path.join(BIN, "ddprun"), "--standalone", "--nproc_per_node=%d" % world, "--no_python"]


def train_args(c):
    total = c["warmup"] + c["steps"] + c["profile_steps"]
    args = [os.path.join(BIN, "train"), "--device", c["device"], "--model", c["model"],
            "--batch-size", str(c["batch"]), "--precision", c["precision"],
            "--lr", "0.05", "--momentum", "0.9", "--max-steps", str(total),
            "--train-samples", str(total * c["batch"] * c["world"]), "--test-samples", "256",
            "--quiet"]
    if c["model"] == "resnet18":
        args += ["--data", "synthetic-cifar", "--stem", c["stem"]]
        if c["image"]:
            args += ["--image-size", str(c["image"])]
    else:
        args += ["--data", "synthetic"]
    return args


def ours_cuda(c, variant, o, extra_env=None, init=None):
    """One `train` run with the bench/profile flags; its figures. With
    `init` (the case's initial weights): train --init, and the losses of the
    warm-up's steps read from its --metrics (--log-interval 1: each a host
    read, in the warm-up only; the timed window and the profile report
    nothing) for the parity check."""
    total = c["warmup"] + c["steps"] + c["profile_steps"]
    tmp = tempfile.mkdtemp(prefix="ours_bench_")
    metrics = os.path.join(tmp, "metrics.jsonl")
    try:
        if init:
            args = train_args(c) + ["--init", init, "--metrics", metrics, "--log-interval", "1"]
        else:
            args = train_args(c) + ["--log-interval", str(total + 1)]
        args += ["--bench-warmup", str(c["warmup"]), "--profile-steps", str(c["profile_steps"])]
        args += list(variant.get("args", [])) + list(o.ours_args)
        env = dict({"OMP_NUM_THREADS": "1"}, **o.ours_env)
        env.update(variant.get("env", {}))
        env.update(extra_env or {})
        cmd = launcher(c["world"]) + args
        p, wall = run(cmd, min(o.timeout, variant.get("timeout", o.timeout)), env)
        first, mean = (bh.losses_from_metrics(metrics, o.parity_steps)
                       if init and os.path.exists(metrics) else ([], None))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fin = last_json_line(p.stdout)
    if not fin or "bench" not in fin:
        raise RunError("train printed no final JSON with \"bench\" (a train without "
                       "--bench-warmup?): %s" % p.stdout[-1500:], p.stdout)
    b = fin["bench"]
    comm = (fin.get("profile") or {}).get("comm") or {}
    return {"side": "ours", "samples_per_second": b.get("samples_per_second"),
            "train_seconds": b.get("seconds"), "steps": b.get("steps"),
            "warmup_steps": b.get("warmup_steps"),
            "peak_device_mb": b.get("peak_allocated_mb"), "peak_reserved_mb": b.get("peak_reserved_mb"),
            "peak_device_mb_whole_run": fin.get("peak_device_mb"),
            "host_sync_calls_per_step": b.get("host_sync_calls_per_step"),
            "host_sync_waits_per_step": b.get("host_sync_waits_per_step"),
            # The mean over every step (with --init: from the step records,
            # as PyTorch's final_loss; else train's one report at the end).
            "final_loss": mean if bh.finite(mean) else fin.get("final_loss"),
            "first_losses": first, "init": init, "profile": fin.get("profile"),
            "comm_transport": fin.get("comm_transport"),
            # The profile's (device timestamps) where there is one, else the host breakdown's.
            "comm_hidden_fraction": comm.get("hidden_fraction", fin.get("comm_hidden_fraction")),
            "comm_hidden_fraction_breakdown": fin.get("comm_hidden_fraction"),
            "backend": fin.get("backend"), "bench": b,
            "env": variant.get("env", {}), "args": variant.get("args", []),
            "process_seconds": wall, "command": " ".join(cmd)}


def pytorch_cmd(c, settings, o, comm_backend, init=None):
    args = [o.python, "-u", REF, "--model", c["model"], "--stem", c["stem"],
            "--batch-size", str(c["batch"]), "--precision", c["precision"],
            "--warmup", str(c["warmup"]), "--steps", str(c["steps"]),
            "--profile-steps", str(c["profile_steps"]), "--device", c["device"],
            "--comm-backend", comm_backend, "--threads", "1"]
    if c["image"]:
        args += ["--image-size", str(c["image"])]
    for s in settings:
        args += ["--setting", s]
    if init:
        args += ["--init", init, "--record-losses", str(min(o.parity_steps, c["warmup"]))]
    return launcher(c["world"]) + args + list(c.get("pytorch_args", []))


def parse_pytorch(stdout):
    """ddp_bench.py's output: the last line with every setting, else the
    per-setting lines printed so far (a run cut short)."""
    head, settings = None, {}
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if "settings" in d:
            head, settings = d, dict(d["settings"])
        elif "setting" in d:
            settings[d["setting"]] = d
            head = head or d
    return head, settings


def pytorch_cuda(c, settings, o, extra_env=None, init=None, comm=None):
    """PyTorch's settings for case c in one process (two ranks: one process
    each); returns (meta, {key: result}). Ranks sharing the GPU try NCCL
    (auto; with --torch-nccl-preload, PyTorch runs on that libnccl.so.2, the
    one ours uses, LD_PRELOADed ahead of its own) and fall back to gloo,
    recording why; `comm` forces one."""
    env = dict({"OMP_NUM_THREADS": "1"}, **(extra_env or {}))
    notes = {}
    if c["world"] > 1 and o.torch_nccl_preload and comm != "gloo":
        env["LD_PRELOAD"] = o.torch_nccl_preload
        notes["nccl_preload"] = o.torch_nccl_preload
    backends = [comm] if comm else (["auto", "gloo"] if c["world"] > 1 else ["auto"])
    for i, backend in enumerate(backends):
        cmd = pytorch_cmd(c, settings, o, backend, init)
        try:
            # A first try through NCCL with ranks sharing the GPU gets less time: a hang there
            # must not eat the session.
            timeout = (max(o.timeout, COMPILE_TIMEOUT) if COMPILE in settings or GRAPH in settings
                       else o.timeout)
            p, wall = run(cmd, min(timeout, NCCL_TIMEOUT) if len(backends) > 1 and i == 0
                          else timeout, env)
            head, res = parse_pytorch(p.stdout)
            break
        except RunError as e:
            head, res = parse_pytorch(e.stdout)
            if res and all(k.split("=")[0] in res for k in settings):
                wall = float("nan")
                break
            if i + 1 == len(backends):
                raise
            notes["comm_backend_failure"] = str(e)[-2000:]
            print("%s: PyTorch with --comm-backend %s failed, trying gloo" % (c["name"], backend),
                  file=sys.stderr)
    meta = {k: v for k, v in (head or {}).items()
            if k not in ("settings", "profile", "setting") and not isinstance(v, dict)}
    meta.update(notes, process_seconds=wall, command=" ".join(cmd))
    for r in res.values():
        r["side"] = "pytorch"
        r["comm_backend"] = meta.get("comm_backend")
    return meta, res


def ours_cpu(c, o):
    """The CPU mode: train's step records bracket the timed steps."""
    with tempfile.TemporaryDirectory(prefix="cpu_bench_") as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        total = c["warmup"] + c["steps"]
        args = train_args(c) + ["--metrics", metrics, "--log-interval", str(c["warmup"])]
        p, wall = run(launcher(c["world"]) + args, o.timeout, {"OMP_NUM_THREADS": "1"})
        fin = last_json_line(p.stdout)
        steps = {}
        with open(metrics) as f:
            for line in f:
                r = json.loads(line)
                if r.get("type") == "step":
                    steps[r["global_step"]] = r["elapsed_s"]
        secs = steps[total] - steps[c["warmup"]]
        bd = fin.get("breakdown", {})
        return {"side": "ours", "samples_per_second": c["steps"] * c["batch"] * c["world"] / secs,
                "train_seconds": secs, "peak_device_mb": None,
                "breakdown_per_step": {k: v / total for k, v in bd.items()},
                "comm_hidden_fraction": fin.get("comm_hidden_fraction"),
                "final_loss": fin.get("final_loss"), "backend": fin.get("backend"),
                "process_seconds": wall}


# ----------------------------------------------------------------------------- results

def pytorch_keys(entry, compiled=False, gloo=False):
    """The PyTorch results of an entry: eager ones, and torch.compile's and
    the CUDA-graph one too with `compiled`, the gloo column's with `gloo`."""
    return [k for k in entry if k.startswith("pytorch") and k not in ("pytorch_meta",
                                                                      "pytorch_gloo_meta")
            and isinstance(entry[k], dict) and (compiled or k not in (COMPILE_KEY, GRAPH_KEY))
            and (gloo or not k.endswith(GLOO_SUFFIX))]


def ours_keys(entry):
    return [k for k in entry if k.startswith("ours") and isinstance(entry[k], dict)]


def ok(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def faster_pytorch(entry):
    """The key of the faster PyTorch setting of an entry (gloo's only when
    no other ran), or None."""
    best = None
    keys = pytorch_keys(entry)
    if not any(ok(entry[k].get("samples_per_second")) for k in keys):
        keys = pytorch_keys(entry, gloo=True)
    for k in keys:
        v = entry[k].get("samples_per_second")
        if ok(v) and (best is None or v > entry[best]["samples_per_second"]):
            best = k
    return best


def summarize(entry):
    """Adds faster_pytorch and each ours variant's ratio to an entry."""
    best = faster_pytorch(entry)
    entry["faster_pytorch"] = best
    entry["ratio"] = {}
    comp = (entry.get(COMPILE_KEY) or {}).get("samples_per_second")
    if ok(comp):
        entry["compile_ratio"] = {}
    for k in ours_keys(entry):
        o = entry[k].get("samples_per_second")
        if best and ok(o):
            entry["ratio"][k] = o / entry[best]["samples_per_second"]
        if ok(comp) and ok(o):
            entry["compile_ratio"][k] = o / comp
    parity(entry)
    return entry


def parity(entry):
    """The loss-parity check of each ours variant against each PyTorch
    setting that recorded its first losses (the same initial weights and
    batches: bench_harness.PARITY_BOUNDS); a case beyond its bound is
    marked failed ("failed": the reasons)."""
    prec = entry["case"].get("precision", "fp32")
    checks = {}
    for k in ours_keys(entry):
        for t in pytorch_keys(entry, compiled=True, gloo=True):
            if entry[k].get("first_losses") is None and entry[t].get("first_losses") is None:
                continue
            checks["%s~%s" % (k, t)] = bh.loss_parity(entry[k].get("first_losses"),
                                                      entry[t].get("first_losses"), prec)
    if not checks:
        return
    entry["loss_parity"] = checks
    bad = ["%s: |loss difference| %.2e over the first %d steps > %.0e" % (
        n, v["max_abs_diff"], v["steps"], v["bound"]) for n, v in checks.items() if v["ok"] is False]
    if bad:
        entry["failed"] = bad


def error_result(side, e):
    return {"side": side, "error": str(e)[-3000:], "samples_per_second": float("nan")}


def resolve_settings(c, results):
    """A case's PyTorch settings: a list, or "faster:CASE" (the faster
    setting of an earlier case, with the same format)."""
    s = c.get("settings") or []
    if isinstance(s, str) and s.startswith("faster:"):
        ref = next((r for r in results if r["case"]["name"] == s[7:]), None)
        best = faster_pytorch(ref) if ref else None
        if best:
            return ["%s=%s" % (best, ref[best].get("memory_format", "nchw"))]
        return list(BOTH)
    return list(s)


def init_file(c, o, tmp, cache):
    """The case's initial weights, one safetensors file per (model, stem)
    that both sides load (train --init, ddp_bench.py --init): PyTorch's
    initialisation from --seed 0, written by ddp_bench.py --save-init."""
    key = (c["model"], c["stem"])
    if key not in cache:
        path = os.path.join(tmp, "init_%s_%s.safetensors" % key)
        cmd = launcher(1) + [o.python, "-u", REF, "--model", c["model"], "--stem", c["stem"],
                             "--device", c["device"], "--save-init", path]
        try:
            run(cmd, o.timeout, {"OMP_NUM_THREADS": "1"})
            cache[key] = path if os.path.exists(path) else None
        except RunError as e:
            print("%s: no initial weights file (%s); no loss-parity check" % (
                c["name"], str(e)[-500:]), file=sys.stderr)
            cache[key] = None
    return cache[key]


def repeats_of(c, o):
    return o.repeats_extras if c.get("extra") else o.repeats


def run_cuda_case(c, o, earlier, init=None):
    """A case's sides, alternating (ours, PyTorch, ours, PyTorch, ...) for
    repeats_of(c) rounds; each side's figures the median run's, with the
    runs and their spread (bench_harness.combine_runs). torch.compile's and
    the CUDA-graph settings run in the first round only (a compile each)."""
    entry = {"case": {k: v for k, v in c.items() if k not in ("ours",)}}
    entry["case"]["repeats"] = n = repeats_of(c, o)
    runs = {}
    same = c.get("pytorch_same_as")
    settings = None if same else resolve_settings(c, earlier)
    for r in range(n):
        for variant in c["ours"]:
            try:
                got = ours_cuda(c, variant, o, init=init)
            except Exception as e:  # a failing side is recorded, the others still run
                got = error_result("ours", e)
                print("%s %s failed: %s" % (c["name"], variant["key"], str(e)[-1500:]),
                      file=sys.stderr)
            runs.setdefault(variant["key"], []).append(got)
        if settings:
            eager = [x for x in settings if x not in (COMPILE, GRAPH)]
            pytorch_round(c, settings if r == 0 else eager, o, init, entry, runs)
    for k, v in runs.items():
        entry[k] = bh.combine_runs(v)
    if same:
        ref = next((x for x in earlier if x["case"]["name"] == same), None)
        for k in pytorch_keys(ref or {}, compiled=True, gloo=True):
            entry[k] = dict(ref[k], same_as=same)
        if ref is None:
            entry["pytorch"] = error_result("pytorch", "case %s was not run" % same)
    else:
        entry["case"]["settings"] = settings
    return summarize(entry)


def pytorch_round(c, settings, o, init, entry, runs):
    """One round of PyTorch's settings into runs; two ranks: NCCL (or what
    it fell back to), then gloo as a column of its own (keys + GLOO_SUFFIX)
    unless the first already ran on gloo."""
    try:
        meta, got = pytorch_cuda(c, settings, o, init=init)
        entry.setdefault("pytorch_meta", meta)
        for x in settings:
            key = x.split("=")[0]
            runs.setdefault(key, []).append(got.get(key) or error_result("pytorch",
                                                                          "no result for " + key))
    except Exception as e:
        meta = {}
        for x in settings:
            runs.setdefault(x.split("=")[0], []).append(error_result("pytorch", e))
        print("%s PyTorch failed: %s" % (c["name"], str(e)[-1500:]), file=sys.stderr)
    if c["world"] < 2 or meta.get("comm_backend") == "gloo":
        return
    eager = [x for x in settings if x not in (COMPILE, GRAPH)]
    try:
        gmeta, got = pytorch_cuda(c, eager, o, init=init, comm="gloo")
        entry.setdefault("pytorch_gloo_meta", gmeta)
        for x in eager:
            key = x.split("=")[0]
            runs.setdefault(key + GLOO_SUFFIX, []).append(
                got.get(key) or error_result("pytorch", "no result for " + key))
    except Exception as e:
        for x in eager:
            runs.setdefault(x.split("=")[0] + GLOO_SUFFIX, []).append(error_result("pytorch", e))


def run_cpu_case(c, o):
    entry = {"case": {k: v for k, v in c.items() if k != "ours"}}
    try:
        entry["ours"] = ours_cpu(c, o)
    except Exception as e:
        entry["ours"] = error_result("ours", e)
        print("%s ours failed: %s" % (c["name"], str(e)[-1500:]), file=sys.stderr)
    try:
        meta, got = pytorch_cuda(c, c["settings"], o)  # the same script, --device cpu
        entry["pytorch_meta"] = meta
        entry["pytorch"] = got.get("pytorch") or error_result("pytorch", "no result")
    except Exception as e:
        entry["pytorch"] = error_result("pytorch", e)
        print("%s PyTorch failed: %s" % (c["name"], str(e)[-1500:]), file=sys.stderr)
    return summarize(entry)


def update_versions(res, entry):
    v = res.setdefault("versions", {})
    meta = entry.get("pytorch_meta") or {}
    for src, dst in (("torch", "torch"), ("torch_cuda", "torch_cuda"), ("cudnn", "torch_cudnn"),
                     ("nccl", "torch_nccl")):
        if meta.get(src) is not None:
            v.setdefault(dst, meta[src])
    for k in ours_keys(entry):
        if entry[k].get("backend"):
            v.setdefault("ours_backend", entry[k]["backend"])
        if entry[k].get("comm_transport"):
            v.setdefault("ours_comm_transport_" + k, entry[k]["comm_transport"])


def process_costs(res):
    """Each side's process cost outside its timed window, from the first
    case that has it (measured once, reported once)."""
    for r in res["results"]:
        o, m = r.get("ours") or {}, r.get("pytorch_meta") or {}
        if ok(o.get("process_seconds")) and ok(o.get("train_seconds")) and m:
            return {"case": r["case"]["name"], "ours_process_s": o["process_seconds"],
                    "ours_timed_s": o["train_seconds"], "pytorch_process_s": m.get("process_seconds"),
                    "pytorch_import_s": m.get("import_s"), "pytorch_setup_s": m.get("setup_s")}
    return None


# ----------------------------------------------------------------------------- kernel trace

def find_cupti_dirs(python):
    """Directories that hold a libcupti.so.*: $DDPRUN_CUPTI_DIRS (a colon
    list), the PyTorch interpreter's NVIDIA wheels, then the CUDA toolkit."""
    dirs = [d for d in os.environ.get("DDPRUN_CUPTI_DIRS", "").split(":")
            if d and glob.glob(os.path.join(d, "libcupti.so*"))]
    try:
        out = subprocess.run([python, "-c", "import site,sys; print('\\n'.join(site.getsitepackages()"
                              " + [site.getusersitepackages()]))"], capture_output=True, text=True,
                             timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    pats = [os.path.join(sp, "nvidia", "*", "lib") for sp in out]
    pats += ["/usr/local/cuda/extras/CUPTI/lib64", "/usr/local/cuda/lib64", "/usr/local/cuda/lib"]
    for pat in pats:
        for d in sorted(glob.glob(pat)):
            if glob.glob(os.path.join(d, "libcupti.so*")) and d not in dirs:
                dirs.append(d)
    return dirs


def trace_setup(o, tmp):
    """(environment for a traced run, None) or (None, why not). When the
    library's libcupti does not resolve here, the library is copied into tmp
    beside a link to the PyTorch wheels' (or the toolkit's) libcupti, which
    its RUNPATH ($ORIGIN) then finds: no LD_LIBRARY_PATH, which would also
    change which libraries the traced programs load."""
    lib = o.kernel_trace_lib
    if not os.path.isfile(lib):
        return None, "no %s (build the ddprun_kernel_trace target with CUDA)" % lib
    ldd = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
    missing = [line.split()[0] for line in ldd.splitlines() if "not found" in line]
    if missing:
        dirs = find_cupti_dirs(o.python)
        found = {}
        for name in missing:
            for d in dirs:
                if os.path.exists(os.path.join(d, name)):
                    found[name] = os.path.join(d, name)
                    break
        if len(found) != len(missing):
            return None, "%s cannot load %s (looked in: %s)" % (
                lib, ", ".join(n for n in missing if n not in found), ", ".join(dirs) or "nowhere")
        shutil.copy2(lib, os.path.join(tmp, TRACE_LIB_NAME))
        for name, path in found.items():
            os.symlink(path, os.path.join(tmp, name))
        lib = os.path.join(tmp, TRACE_LIB_NAME)
    return {"CUDA_INJECTION64_PATH": os.path.abspath(lib)}, None


def read_traces(pattern):
    """The tracer's files of one run: the one with the most kernels, and how many."""
    files = sorted(glob.glob(pattern))
    traces = []
    for f in files:
        try:
            with open(f) as fh:
                traces.append(json.load(fh))
        except (OSError, ValueError) as e:
            traces.append({"errors": ["%s: %s" % (f, e)], "kernels": -1})
    if not traces:
        return None, 0
    return max(traces, key=lambda t: t.get("kernels", 0)), len(files)


def trace_summary(trace, nfiles, result, c):
    """Per step: kernels, their time and the GPU's busy time against the
    profiled step's wall time and the timed window's step time."""
    p = c["profile_steps"]
    prof = result.get("profile") or {}
    wall = prof.get("wall_step_ms")
    sps = result.get("samples_per_second")
    timed = 1e3 * c["batch"] * c["world"] / sps if ok(sps) and sps > 0 else None
    out = {"steps": p, "files": nfiles, "range": trace.get("range"),
           "kernels_per_step": trace.get("kernels", 0) / p,
           "kernel_ms_per_step": trace.get("kernel_ms", 0) / p,
           "busy_ms_per_step": trace.get("busy_ms", 0) / p,
           "span_ms_per_step": trace.get("span_ms", 0) / p,
           "memcpy_per_step": trace.get("memcpy_count", 0) / p,
           "memcpy_ms_per_step": trace.get("memcpy_ms", 0) / p,
           "memset_per_step": trace.get("memset_count", 0) / p,
           "memset_ms_per_step": trace.get("memset_ms", 0) / p,
           "profiled_wall_step_ms": wall, "profiled_device_step_ms": prof.get("step_ms"),
           "timed_step_ms": timed,
           "top_kernels": [dict(k, ms_per_step=k.get("ms", 0) / p, per_step=k.get("count", 0) / p)
                           for k in trace.get("top_kernels", [])[:20]],
           "incomplete_records": trace.get("incomplete_records"),
           "dropped_records": trace.get("dropped_records"), "errors": trace.get("errors", [])}
    if ok(wall) and wall > 0:
        out["busy_fraction_of_wall"] = out["busy_ms_per_step"] / wall
    return out


def kernel_trace_phase(res, cases, o, save):
    libdir = tempfile.mkdtemp(prefix="kernel_trace_lib_")
    try:
        kernel_trace_cases(res, cases, o, save, libdir)
    finally:
        shutil.rmtree(libdir, ignore_errors=True)


def kernel_trace_cases(res, cases, o, save, libdir):
    env, why = trace_setup(o, libdir)
    if env is None:
        res["kernel_trace"] = {"skipped": why}
        print("kernel trace skipped: %s" % why, file=sys.stderr)
        return
    res["kernel_trace"] = {"library": o.kernel_trace_lib,
                           "loaded_as": env["CUDA_INJECTION64_PATH"]}
    for c in cases:
        entry = next((r for r in res["results"] if r["case"]["name"] == c["name"]), None)
        if c["name"] not in TRACE_CASES or entry is None or c["profile_steps"] < 1:
            continue
        tr = {}
        tmp = tempfile.mkdtemp(prefix="kernel_trace_")
        try:
            pat = os.path.join(tmp, "ours_%p.json")
            try:
                r = ours_cuda(c, c["ours"][0], o, dict(env, DDPRUN_KERNEL_TRACE_OUT=pat))
                t, n = read_traces(os.path.join(tmp, "ours_*.json"))
                tr["ours"] = trace_summary(t, n, r, c) if t else {"error": "no trace file written"}
            except Exception as e:
                tr["ours"] = {"error": str(e)[-2000:]}
            best = entry.get("faster_pytorch") or "pytorch"
            fmt = (entry.get(best) or {}).get("memory_format") or (
                "channels_last" if c["precision"] in ("bf16", "fp16") else "nchw")
            pat = os.path.join(tmp, "torch_%p.json")
            try:
                _, got = pytorch_cuda(c, ["%s=%s" % (best, fmt)], o,
                                      dict(env, DDPRUN_KERNEL_TRACE_OUT=pat))
                t, n = read_traces(os.path.join(tmp, "torch_*.json"))
                tr[best] = trace_summary(t, n, got[best], c) if t else {
                    "error": "no trace file written"}
            except Exception as e:
                tr[best] = {"error": str(e)[-2000:]}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        entry["kernel_trace"] = tr
        save()


# ----------------------------------------------------------------------------- comm model

def comm_model_phase(path, o):
    """comm_model.py on the results just written (a MODEL: projections for
    8 GPUs and for nodes on 400 Gb/s links from ResNet-18 tf32's bucket ready
    times, checked against the two-rank case): comm_model.json and .md in
    --out. Skipped, with the reason, without that case's profile."""
    import comm_model
    args = argparse.Namespace(bench_json=path, case="resnet18-224-tf32",
                              two_rank_case="resnet18-224-tf32-2ranks",
                              allreduce_jsonl=o.allreduce_jsonl, config=[])
    try:
        result = comm_model.run(args)
    except (SystemExit, ValueError, KeyError, OSError) as e:
        print("comm model skipped: %s" % e, file=sys.stderr)
        return None
    with open(os.path.join(o.out, "comm_model.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    md = comm_model.markdown(result)
    with open(os.path.join(o.out, "comm_model.md"), "w") as f:
        f.write(md + "\n")
    return md


# ----------------------------------------------------------------------------- output

def fmt_num(x, spec="%.0f"):
    return spec % x if ok(x) else "-"


def spread_note(result):
    """" (3 runs, spread 1.2%)" for a repeated result, else ""."""
    if (result.get("repeats") or 1) < 2 or not ok(result.get("spread")):
        return ""
    return " (%d runs, spread %.1f%%)" % (result["repeats"], 100 * result["spread"])


def table(res):
    """The markdown table of every case and ours variant."""
    cpu = res["device"] == "cpu"
    head = ("| case | ours samples/s | PyTorch samples/s (faster setting) | ours/PyTorch | "
            "PyTorch settings | peak alloc MiB ours / PyTorch | peak reserved MiB ours / PyTorch | "
            "host syncs/step calls / waits | final loss ours / PyTorch | comm hidden |")
    lines = [head, "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in res["results"]:
        best = r.get("faster_pytorch")
        t = r.get(best) or {}
        settings = ", ".join("%s %s" % (k[len("pytorch"):].lstrip("_") or
                                        r[k].get("memory_format", "nchw"),
                                        fmt_num(r[k].get("samples_per_second")))
                             for k in pytorch_keys(r))
        for k in ours_keys(r):
            o = r[k]
            name = r["case"]["name"] + ("" if k == "ours" else " (%s)" % k)
            if o.get("comm_transport"):
                name += " [%s]" % o["comm_transport"]
            hid = o.get("comm_hidden_fraction")
            lines.append("| %s | %s | %s | %s | %s | %s / %s | %s / %s | %s / %s | %s / %s | %s |" % (
                name, fmt_num(o.get("samples_per_second")) + spread_note(o),
                "%s (%s%s%s)" % (fmt_num(t.get("samples_per_second")), best or "-",
                                 ", same as " + t["same_as"] if t.get("same_as") else "",
                                 spread_note(t).replace(" (", ", ").rstrip(")")),
                fmt_num(r["ratio"].get(k), "%.2fx"), settings or "-",
                fmt_num(o.get("peak_device_mb")), fmt_num(t.get("peak_device_mb")),
                fmt_num(o.get("peak_reserved_mb")), fmt_num(t.get("peak_reserved_mb")),
                fmt_num(o.get("host_sync_calls_per_step"), "%.2f"),
                fmt_num(o.get("host_sync_waits_per_step"), "%.2f"),
                fmt_num(o.get("final_loss"), "%.4f"), fmt_num(t.get("final_loss"), "%.4f"),
                "%.0f%%" % (100 * hid) if ok(hid) else "-"))
    out = "\n".join(lines)
    if cpu:
        out = out.replace("peak alloc MiB", "peak device alloc MiB")
    out += "\n\nRatios are against the faster PyTorch setting of each case (named in the third column)."
    ct = compile_table(res)
    if ct:
        out += "\n\n" + ct
    pt = parity_table(res)
    if pt:
        out += "\n\n" + pt
    kt = kernel_table(res)
    return out + ("\n\n" + kt if kt else "")


def parity_table(res):
    """The loss-parity checks: each ours variant against each PyTorch
    setting, from the same initial weights on the same batches."""
    lines = []
    for r in res["results"]:
        for pair, v in sorted((r.get("loss_parity") or {}).items()):
            verdict = "ok" if v["ok"] else ("FAILED" if v["ok"] is False else
                                            "not checked: " + v.get("why", ""))
            lines.append("| %s | %s | %s | %.0e | %s |" % (
                r["case"]["name"], pair.replace("~", " vs "), fmt_num(v["max_abs_diff"], "%.1e"),
                v["bound"], verdict))
    if not lines:
        return ""
    steps = (res.get("parity") or {}).get("steps", bh.PARITY_STEPS)
    return "\n".join(["Loss parity: the first %d step losses from the same initial weights on "
                      "the same batches, max |ours - PyTorch| against the precision's bound." % steps,
                      "", "| case | sides | max abs diff | bound | verdict |",
                      "|---|---|---:|---:|---|"] + lines)


def compile_table(res):
    """torch.compile's column: ours against PyTorch compiled (default mode,
    channels_last), with its compile time (the first warm-up step)."""
    lines = []
    for r in res["results"]:
        t = r.get(COMPILE_KEY)
        if not isinstance(t, dict) or t.get("same_as"):
            continue
        for k in ours_keys(r):
            lines.append("| %s | %s | %s | %s | %s |" % (
                r["case"]["name"] + ("" if k == "ours" else " (%s)" % k),
                fmt_num(r[k].get("samples_per_second")), fmt_num(t.get("samples_per_second")),
                fmt_num((r.get("compile_ratio") or {}).get(k), "%.2fx"),
                fmt_num(t.get("compile_s"), "%.1f")))
    if not lines:
        return ""
    return "\n".join(["| case | ours samples/s | torch.compile samples/s | ours / compiled | "
                      "compile s |", "|---|---:|---:|---:|---:|"] + lines)


def kernel_table(res):
    rows = []
    for r in res["results"]:
        for side, t in (r.get("kernel_trace") or {}).items():
            if "error" in t:
                rows.append("| %s | %s | error: %s |||||||" % (
                    r["case"]["name"], side, t["error"].splitlines()[0][:120]))
                continue
            rows.append("| %s | %s | %.0f | %.2f | %.2f | %s | %s | %s | %s | %.0f |" % (
                r["case"]["name"], side, t["kernels_per_step"], t["kernel_ms_per_step"],
                t["busy_ms_per_step"], fmt_num(t.get("profiled_wall_step_ms"), "%.2f"),
                fmt_num(t.get("profiled_device_step_ms"), "%.2f"),
                fmt_num(t.get("timed_step_ms"), "%.2f"),
                fmt_num(t.get("busy_fraction_of_wall"), "%.2f"),
                t["memcpy_per_step"] + t["memset_per_step"]))
    if not rows:
        return ""
    return "\n".join(["| case | side | kernels/step | kernel ms/step | GPU busy ms/step | "
                      "profiled wall ms/step | profiled device ms/step | timed ms/step | "
                      "busy/wall | memcpy+memset/step |",
                      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"] + rows)


def plot(res, path):
    """Left: ours/PyTorch throughput per case (against the faster setting).
    Right: ResNet-18 tf32, where the time goes: each layer's forward and
    backward and the loss / reducer / optimizer / data, ours beside PyTorch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names, ratios = [], []
    for r in res["results"]:
        for k in ours_keys(r):
            if ok(r["ratio"].get(k)):
                names.append(r["case"]["name"] + ("" if k == "ours" else " " + k))
                ratios.append(r["ratio"][k])
    fig, axes = plt.subplots(1, 2, figsize=(15, 7), gridspec_kw={"width_ratios": [1, 1.4]})
    ax = axes[0]
    ax.barh(range(len(names)), ratios, 0.6, color=["tab:green" if v >= 1 else "tab:red" for v in ratios])
    ax.axvline(1.0, color="k", lw=1)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    for i, v in enumerate(ratios):
        ax.text(v, i, " %.2fx" % v, va="center", fontsize=8)
    ax.set_xlabel("ours / faster PyTorch setting (samples/s)")
    ax.set_title("Throughput on %s" % (res.get("gpu") or res.get("cpu")), fontsize=9)
    ref = next((r for r in res["results"] if r["case"]["name"] == "resnet18-224-tf32"), None)
    ax = axes[1]
    if ref is None or not (ref.get("ours") or {}).get("profile"):
        ax.text(0.5, 0.5, "no ResNet-18 tf32 profile", ha="center")
    else:
        plot_profile(ax, ref)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def profile_rows(ours, torch_):
    """(row name, ours (fwd, bwd), PyTorch (fwd, bwd)) in ours' layer order."""
    def layers(p):
        return {l["name"]: (l.get("forward_ms") or 0.0, l.get("backward_ms") or 0.0)
                for l in (p or {}).get("layers", [])}
    lo, lt = layers(ours), layers(torch_)
    order = [l["name"] for l in ours.get("layers", [])]
    order += [n for n in lt if n not in order]
    rows = [(n, lo.get(n, (0.0, 0.0)), lt.get(n, (0.0, 0.0))) for n in order]
    for part in ("loss_ms", "reducer_ms", "optimizer_ms", "data_ms"):
        rows.append((part[:-3], ((ours or {}).get(part) or 0.0, 0.0),
                     ((torch_ or {}).get(part) or 0.0, 0.0)))
    return rows


def plot_profile(ax, entry):
    best = entry.get("faster_pytorch")
    tp = (entry.get(best) or {}).get("profile") or {}
    op = entry["ours"]["profile"]
    rows = profile_rows(op, tp)
    y = list(range(len(rows)))
    h = 0.38
    of = [r[1][0] for r in rows]
    ob = [r[1][1] for r in rows]
    tf = [r[2][0] for r in rows]
    tb = [r[2][1] for r in rows]
    ax.barh([v - h / 2 for v in y], of, h, color="tab:blue", label="ours forward / part")
    ax.barh([v - h / 2 for v in y], ob, h, left=of, color="lightsteelblue", label="ours backward")
    ax.barh([v + h / 2 for v in y], tf, h, color="tab:orange", label="PyTorch forward / part")
    ax.barh([v + h / 2 for v in y], tb, h, left=tf, color="navajowhite", label="PyTorch backward")
    ax.set_yticks(y, [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (device time, mean over the profiled steps)")
    ax.set_title("ResNet-18 224 tf32: ours (step %s ms) vs PyTorch %s (step %s ms)" % (
        fmt_num(op.get("step_ms"), "%.1f"), best, fmt_num(tp.get("step_ms"), "%.1f")), fontsize=9)
    ax.legend(fontsize=7, loc="lower right")


# ----------------------------------------------------------------------------- main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke test)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--python", default=sys.executable, help="Python with PyTorch (CUDA)")
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--no-extras", action="store_true", help="skip the extra cases")
    ap.add_argument("--extras-only", action="store_true",
                    help="only the extra cases (with --merge: their base cases' PyTorch "
                         "figures from the JSON in --out)")
    ap.add_argument("--no-compile", action="store_true",
                    help="leave out torch.compile's column (its cold compile takes minutes)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per process")
    ap.add_argument("--ours-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment for every train run (repeatable)")
    ap.add_argument("--ours-args", default="", help="extra flags for every train run")
    ap.add_argument("--extra-case", action="append", default=[],
                    metavar="'NAME BASE [KEY=VALUE|--flag ...]'",
                    help="an extra ours-only case on BASE's configuration, one quoted string "
                         "(e.g. --extra-case='tf32-noasync resnet18-224-tf32 DDPRUN_X=1 "
                         "--deterministic'); PyTorch's figures are BASE's; repeatable")
    ap.add_argument("--kernel-trace", choices=("auto", "on", "off"), default="auto",
                    help="the CUPTI kernel phase (auto: when the library exists)")
    ap.add_argument("--kernel-trace-lib", default=os.path.join(BIN, TRACE_LIB_NAME))
    ap.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD, "
                                     "$DDPRUN_COMMIT)")
    ap.add_argument("--allreduce-jsonl", action="append", default=[], metavar="[TRANSPORT=]FILE",
                    help="allreduce_perf --json output (2 ranks, CUDA), labelled with its "
                         "DDPRUN_CUDA_TRANSPORT (nccl=FILE, ipc=FILE), for the comm model's "
                         "two-rank check (repeatable)")
    ap.add_argument("--replot", action="store_true",
                    help="run nothing: the table, the plot and the comm model from the JSON "
                         "already in --out (e.g. made on a machine without matplotlib)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other cases of an existing JSON (replace only those run)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds per goal case, the sides alternating; the median and the "
                         "spread are reported")
    ap.add_argument("--repeats-extras", type=int, default=1, help="rounds per extra case")
    ap.add_argument("--parity-steps", type=int, default=bh.PARITY_STEPS,
                    help="the loss-parity check over the first N steps, both sides from the "
                         "same initial weights (0: off)")
    ap.add_argument("--torch-nccl-preload", default=os.environ.get("DDPRUN_TORCH_NCCL_PRELOAD"),
                    metavar="LIBNCCL",
                    help="two ranks: PyTorch on this libnccl.so.2 (LD_PRELOAD), the one ours "
                         "uses (default $DDPRUN_TORCH_NCCL_PRELOAD)")
    o = ap.parse_args(argv)
    try:
        o.ours_env = dict(kv.split("=", 1) for kv in o.ours_env)
    except ValueError:
        ap.error("--ours-env takes KEY=VALUE")
    o.ours_args = o.ours_args.split()
    if o.repeats < 1 or o.repeats_extras < 1 or o.parity_steps < 0:
        ap.error("--repeats and --repeats-extras must be at least 1, --parity-steps at least 0")
    return o


def select_cases(o):
    cases = cuda_cases(o.quick, not o.no_compile) if o.device == "cuda" else cpu_cases(o.quick)
    known = {c["name"]: c for c in cases}
    cases += [extra_case(spec.split(), known) for spec in o.extra_case]
    if o.only:
        want = o.only.split(",")
        unknown = [w for w in want if w not in {c["name"] for c in cases}]
        if unknown:
            raise SystemExit("--only: unknown case(s) %s (cases: %s)" % (
                ", ".join(unknown), ", ".join(c["name"] for c in cases)))
        cases = [c for c in cases if c["name"] in want]
    elif o.no_extras:
        cases = [c for c in cases if not c.get("extra")]
    elif o.extras_only:
        cases = [c for c in cases if c.get("extra")]
    return cases


def gpu_info():
    """(GPU name, driver) from nvidia-smi (bench_harness.gpu_state), or Nones."""
    st = bh.gpu_state()
    return st.get("name"), st.get("driver_version")


def report(full, o, path):
    """The tables, the plot and the comm model of a finished (or replotted) run."""
    print(table(full))
    pc = full.get("process_costs")
    if pc:
        print("\nprocess cost (measured once, %s): ours %s s for a %s s timed window; PyTorch "
              "%s s in all, of which import %s s and data/setup %s s" % (
                  pc["case"], fmt_num(pc["ours_process_s"], "%.1f"),
                  fmt_num(pc["ours_timed_s"], "%.2f"), fmt_num(pc["pytorch_process_s"], "%.1f"),
                  fmt_num(pc["pytorch_import_s"], "%.1f"), fmt_num(pc["pytorch_setup_s"], "%.1f")))
    try:
        plot(full, os.path.join(o.out, "resnet_bench_%s.png" % o.device))
    except Exception as e:  # the figures are in the JSON already
        print("plot failed: %s" % e, file=sys.stderr)
    if o.device == "cuda":
        md = comm_model_phase(path, o)
        if md:
            print("\n" + md)


def main(argv=None):
    o = parse_args(argv)
    path = os.path.join(o.out, "resnet_bench_%s.json" % o.device)
    if o.replot:
        with open(path) as f:
            report(json.load(f), o, path)
        return
    cases = select_cases(o)
    gpu, driver = gpu_info() if o.device == "cuda" else (None, None)
    res = {"device": o.device, "gpu": gpu, "driver": driver, "cpu": cpu_model(),
           "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
           "commit": benchutil.git_commit(ROOT, o.commit), "versions": {},
           "machine": {"tree": bh.tree_state(ROOT, o.commit),
                       "gpu_start": bh.gpu_state() if o.device == "cuda" else None},
           "repeats": o.repeats, "repeats_extras": o.repeats_extras,
           "parity": {"steps": o.parity_steps, "bounds": bh.PARITY_BOUNDS},
           "ours_env": o.ours_env, "ours_args": o.ours_args, "results": []}
    os.makedirs(o.out, exist_ok=True)
    kept = []
    if o.merge and os.path.exists(path):
        with open(path) as f:
            names = {c["name"] for c in cases}
            kept = [r for r in json.load(f).get("results", []) if r["case"]["name"] not in names]

    def save():
        res["process_costs"] = process_costs(res)
        write_json_atomic(path, dict(res, results=kept + res["results"]))

    t_all = time.perf_counter()
    inits, init_dir = {}, tempfile.mkdtemp(prefix="bench_init_")
    for c in cases:
        t0 = time.perf_counter()
        if o.device == "cuda":
            init = init_file(c, o, init_dir, inits) if o.parity_steps > 0 else None
            entry = run_cuda_case(c, o, kept + res["results"], init)
        else:
            entry = run_cpu_case(c, o)
        entry["case_seconds"] = time.perf_counter() - t0
        res["results"].append(entry)
        update_versions(res, entry)
        save()
        print("%s: %.0f s, ratio %s" % (c["name"], entry["case_seconds"], json.dumps(entry["ratio"])),
              flush=True)
    if o.device == "cuda" and o.kernel_trace != "off":
        t0 = time.perf_counter()
        if o.kernel_trace == "on" or os.path.isfile(o.kernel_trace_lib):
            kernel_trace_phase(res, cases, o, save)
        else:
            res["kernel_trace"] = {"skipped": "no %s" % o.kernel_trace_lib}
        res["kernel_trace_seconds"] = time.perf_counter() - t0
    shutil.rmtree(init_dir, ignore_errors=True)
    res["total_seconds"] = time.perf_counter() - t_all
    if o.device == "cuda":
        res["machine"]["gpu_end"] = bh.gpu_state()
    save()
    report(dict(res, results=kept + res["results"]), o, path)


if __name__ == "__main__":
    main()
