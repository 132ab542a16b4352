#!/usr/bin/env python3
"""PyTorch DDP, the reference side of scripts/bench/resnet_bench.py (GPU or CPU).

    ddprun --standalone --nproc_per_node=N --no_python python examples/pytorch/ddp_bench.py \
        --model resnet18 --image-size 224 --batch-size 128 --precision tf32 \
        --warmup 8 --steps 30 --profile-steps 5 \
        --setting pytorch=nchw --setting pytorch_channels_last=channels_last
    (torchrun works as well; one rank runs without DDP, as a one-GPU script would)

What `train --device cuda` runs, in PyTorch, on the same samples in the same
order:
- data: --data synthetic-cifar (tests/interop/synthetic_cifar.py: train's
  set, 3x32x32) or synthetic (scripts/bench/benchutil.py: train's LeNet set,
  1x28x28); --train-samples samples (default: every step's batch on every
  rank once, as resnet_bench.py gives train), visited in train's
  DistributedSampler order (shuffled with --seed, epoch 0). Batches sit in
  pinned host memory, go up with non_blocking=True and are upsampled on the
  device (F.interpolate, bilinear, in the setting's memory format: a
  channels_last setting resizes channels_last) to --image-size, as train does;
- model: torchvision's resnet18 (this file's copy of its layout without
  torchvision) or LeNet with train's layer names; SGD lr 0.05 momentum 0.9;
- precision: fp32 (TF32 off), tf32 (cuDNN and matmul TF32 on), bf16/fp16
  (torch.autocast; fp16 with a GradScaler, whose step reads a flag back every
  step as PyTorch's recipe does); cudnn.benchmark on; --deterministic sets
  cudnn.deterministic.

Each --setting KEY=FORMAT (nchw or channels_last, either with +compile:
torch.compile of the (DDP) model, default mode, --compile-backend inductor
unless told otherwise; or +graph: the same in mode "reduce-overhead", whose
steps replay CUDA graphs; its compile time is the first warm-up step's, reported
as compile_s, and a compiled setting has no profile: module hooks would break
its graphs) runs in turn in this process
(a fresh model from the same seed each time; memory freed and the peak reset
in between): W warm-up steps, then torch.cuda.synchronize() and
reset_peak_memory_stats(), then S steps timed with nothing in between (no
synchronisation, no host read: the loss is summed on the device), then
synchronize. Peaks: max_memory_allocated and max_memory_reserved over the
timed window. Then, apart, P profiled steps inside
torch.cuda.profiler.start()/stop() (the CUPTI kernel tracer's window): CUDA
events around each top-level layer's forward (module pre/post hooks) and
backward (a tensor hook on its output fires when its backward starts, one on
its input when it ends; the first layer's end is its weight's gradient), the
data upload, the loss, backward's tail and the optimizer; read after the P
steps. The final loss: the mean over every step of the run and every rank,
what train reports when it reports once, at the end.

Loss parity (resnet_bench.py): --save-init FILE writes the model's initial
weights and exits; --init FILE starts every setting from them (train --init
reads the same file), and each setting records its first --record-losses
steps' losses (mean over ranks, read back during the warm-up) as
first_losses.

Ranks sharing a GPU: NCCL when torch's NCCL is 2.30 or newer (with
NCCL_MULTI_RANK_GPU_ENABLE=1), else gloo (--comm-backend forces one).
--device cpu: gloo, fp32, --threads intra-op threads per rank, wall clock.

Rank 0 prints one JSON line per setting as it ends ({"setting": KEY, ...})
and a last line with all of them ("settings").
"""
import argparse
import gc
import json
import os
import sys
import time

T_START = time.perf_counter()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

T_IMPORTED = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "../.."))
for p in (HERE, os.path.join(ROOT, "scripts/bench"), os.path.join(ROOT, "tests/interop")):
    sys.path.insert(0, p)
import benchutil  # noqa: E402
import lenet as lenet_ref  # noqa: E402  (examples/pytorch/lenet.py: safetensors I/O)

FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


# ----------------------------------------------------------------------------- models

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + idt)


class ResNet18(nn.Module):
    """torchvision.models.resnet18's layout and state_dict names."""

    def __init__(self, num_classes=10, stem="imagenet"):
        super().__init__()
        if stem == "cifar":
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        else:
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity() if stem == "cifar" else nn.MaxPool2d(3, 2, 1)
        chans, cin, layers = [64, 128, 256, 512], 64, []
        for i, c in enumerate(chans):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, c, stride), BasicBlock(c, c, 1)))
            cin = c
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def lenet(num_classes=10):
    """examples/pytorch/lenet.py's LeNet (same parameter names and math) with
    its activations and pools as modules named as train's layers, so that the
    profile has a row for each of train's layers."""
    from collections import OrderedDict
    return nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(1, 6, 5, padding=2)), ("relu1", nn.ReLU()), ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(6, 16, 5)), ("relu2", nn.ReLU()), ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()), ("fc1", nn.Linear(400, 120)), ("relu3", nn.ReLU()),
        ("fc2", nn.Linear(120, 84)), ("relu4", nn.ReLU()), ("fc3", nn.Linear(84, num_classes))]))


def build(args):
    if args.model == "lenet":
        return lenet(args.num_classes)
    if args.stem == "imagenet" and not args.own_resnet:
        try:
            import torchvision
            return torchvision.models.resnet18(num_classes=args.num_classes)
        except ImportError:
            pass
    return ResNet18(args.num_classes, args.stem)


def profiled_layers(model):
    """(name, module) of train's top-level layers, in forward order: the
    model's children, with ResNet's layer1..layer4 split into their blocks
    (train's layer1.0, layer1.1, ...)."""
    out = []
    for name, child in model.named_children():
        if name.startswith("layer") and isinstance(child, nn.Sequential):
            out += [("%s.%s" % (name, sub), block) for sub, block in child.named_children()]
        else:
            out.append((name, child))
    return out


# ----------------------------------------------------------------------------- profile

class WallEvent:
    """torch.cuda.Event's interface on the CPU, where every op is synchronous."""

    def __init__(self, **_):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class LayerProfiler:
    """Event marks around each layer's forward and backward, the data upload,
    the loss, backward's tail and the optimizer, for a few steps; nothing is
    read until summary(), after the steps (no synchronisation in between).

    Forward: module pre/post hooks. Backward: a tensor hook registered on a
    layer's output fires when the gradient for it is ready, i.e. when the
    layer's backward starts; one on its input when the layer's backward has
    produced it (its end). An in-place ReLU's input and output are one tensor:
    a hook registered on it before the in-place op sees the gradient of the
    value before it (the end of the ReLU's backward), one registered after it
    the gradient of its result (the start), as PyTorch documents for tensor
    hooks and in-place ops (PyTorch 2.x; 1.13 fires both where the gradient
    of the result is ready, which leaves a top-level in-place ReLU ~0 ms and
    its time in the layer before it). The first layer's input needs no
    gradient: its end is its weight's gradient (a hook on the parameter, kept
    for the phase).
    """

    def __init__(self, layers, cuda):
        self.layers = layers
        self.event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else WallEvent
        self.handles, self.steps, self.cur = [], [], None

    def mark(self, key):
        if self.cur is None or key in self.cur:
            return
        ev = self.event()
        ev.record()
        self.cur[key] = ev

    def _hook(self, key):
        def fn(_grad):
            self.mark(key)  # returns None: the gradient is unchanged
        return fn

    def _pre(self, name):
        def fn(_module, inputs):
            self.mark((name, "fwd_start"))
            x = inputs[0] if isinstance(inputs, tuple) and inputs else inputs
            if torch.is_tensor(x) and x.requires_grad and self.cur is not None:
                x.register_hook(self._hook((name, "bwd_end")))
        return fn

    def _post(self, name):
        def fn(_module, _inputs, output):
            self.mark((name, "fwd_end"))
            if torch.is_tensor(output) and output.requires_grad and self.cur is not None:
                output.register_hook(self._hook((name, "bwd_start")))
        return fn

    def attach(self):
        for name, m in self.layers:
            self.handles.append(m.register_forward_pre_hook(self._pre(name)))
            self.handles.append(m.register_forward_hook(self._post(name)))
        first_name, first = self.layers[0]
        weight = next(first.parameters(), None)
        if weight is not None:
            self.handles.append(weight.register_hook(self._hook((first_name, "weight_grad"))))

    def detach(self):
        for h in self.handles:
            h.remove()
        self.handles = []

    def begin_step(self):
        self.cur = {}
        self.steps.append(self.cur)

    def end_step(self):
        self.cur = None

    def summary(self):
        """The profile in train's shape (milliseconds, means over the steps)."""
        names = [n for n, _ in self.layers]
        if self.steps:  # forward order, as the first step ran them
            seen = [k[0] for k in self.steps[0] if isinstance(k, tuple) and k[1] == "fwd_start"]
            names = seen + [n for n in names if n not in seen]
        first, last = names[0], names[-1]
        acc, n = {}, len(self.steps)

        def add(key, d, a, b):
            if a in d and b in d:
                acc[key] = acc.get(key, 0.0) + d[a].elapsed_time(d[b])

        for d in self.steps:
            d.setdefault((first, "bwd_end"), d.get((first, "weight_grad")))
            if d[(first, "bwd_end")] is None:
                del d[(first, "bwd_end")]
            add("step_ms", d, "step_start", "step_end")
            add("data_ms", d, "step_start", "data_end")
            add("forward_ms", d, "data_end", "loss_start")
            add("loss_ms", d, "loss_start", (last, "bwd_start"))
            add("backward_ms", d, (last, "bwd_start"), (first, "bwd_end"))
            add("reducer_ms", d, (first, "bwd_end"), "backward_return")
            add("optimizer_ms", d, "backward_return", "step_end")
            add("backward_end_ms", d, "step_start", (first, "bwd_end"))
            for name in names:
                add(name + "/f", d, (name, "fwd_start"), (name, "fwd_end"))
                add(name + "/b", d, (name, "bwd_start"), (name, "bwd_end"))
        mean = {k: v / n for k, v in acc.items()} if n else {}
        out = {"steps": n}
        for k in ("step_ms", "data_ms", "forward_ms", "loss_ms", "backward_ms", "reducer_ms",
                  "optimizer_ms"):
            out[k] = mean.get(k)
        out["layers"] = [{"name": name, "forward_ms": mean.get(name + "/f"),
                          "backward_ms": mean.get(name + "/b")} for name in names]
        out["buckets"] = []
        out["backward_end_ms"] = mean.get("backward_end_ms")
        out["comm"] = None
        out["method"] = ("events from module forward hooks and tensor backward hooks; reducer_ms: "
                         "from the first layer's backward end to backward()'s return")
        return out


# ----------------------------------------------------------------------------- run

def nccl_version():
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # no NCCL in this build
        return None
    if isinstance(v, int):  # PyTorch 1.x: major * 1000 + minor * 100 + patch (or * 10000)
        major = v // 10000 if v >= 10000 else v // 1000
        minor = (v % 10000) // 100 if v >= 10000 else (v % 1000) // 100
        return (major, minor, v % 100)
    return tuple(v[:3])


def choose_backend(args, world, cuda):
    """(backend, note): gloo on the CPU; NCCL when each rank has its own GPU;
    ranks sharing a GPU: NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1, else
    gloo (NCCL up to 2.29 refuses two ranks on one device)."""
    if not cuda:
        return "gloo", None
    if world <= torch.cuda.device_count():
        return ("gloo", "forced") if args.comm_backend == "gloo" else ("nccl", None)
    v = nccl_version()
    if args.comm_backend == "gloo" or (args.comm_backend == "auto" and (v is None or v < (2, 30))):
        return "gloo", "ranks share a GPU; torch's NCCL %s is older than 2.30" % (v,)
    os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    return "nccl", "ranks share a GPU: NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL %s)" % (v,)


def load_batches(args, world, rank, steps, pin):
    """This rank's batches for `steps` steps: train's samples in its order."""
    count = args.train_samples or steps * args.batch_size * world
    idx = benchutil.sampler_indices(count, world, rank, seed=args.seed)
    if len(idx) < steps * args.batch_size:
        raise SystemExit("%d samples give rank %d %d, fewer than %d steps of %d" % (
            count, rank, len(idx), steps, args.batch_size))
    idx = idx[:steps * args.batch_size]
    if args.data == "synthetic-cifar":
        xn, yn = benchutil.synthetic_cifar_samples(idx, count)  # only this rank's samples
    else:
        xa, ya = benchutil.synthetic_mnist(count, args.seed)
        xn, yn = xa[idx], ya[idx]
    x, y = torch.from_numpy(xn), torch.from_numpy(yn)
    b = args.batch_size
    return ([pin(x[s * b:(s + 1) * b].contiguous()) for s in range(steps)],
            [pin(y[s * b:(s + 1) * b].contiguous()) for s in range(steps)])


def set_precision(args, cuda):
    tf32 = args.precision == "tf32"
    if cuda:
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = args.deterministic


class Sync:
    def __init__(self, cuda, dev):
        self.cuda, self.dev = cuda, dev

    def __call__(self):
        if self.cuda:
            torch.cuda.synchronize(self.dev)


def profiler_range(cuda, start, errors):
    if not cuda:
        return
    try:
        (torch.cuda.profiler.start if start else torch.cuda.profiler.stop)()
    except Exception as e:  # recorded: the profile itself does not need it
        errors.append("torch.cuda.profiler.%s: %s" % ("start" if start else "stop", e))


def run_setting(args, key, fmt, compiled, batches, env):
    """One setting: warm-up, the timed window, the profile phase."""
    dev, cuda, world, sync = env["dev"], env["cuda"], env["world"], env["sync"]
    t_setting = time.perf_counter()
    mf = FORMATS[fmt]
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    torch.manual_seed(args.seed)
    model = build(args)
    if args.init:
        lenet_ref.load_state_dict(args.init, model, strict=True)
    model = model.to(dev, memory_format=mf)
    ddp = model
    if world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    if compiled:  # after DDP, as PyTorch's DDP + compile recipe does
        # "graph": mode reduce-overhead, the step's kernels replayed from CUDA graphs.
        ddp = torch.compile(ddp, backend=args.compile_backend,
                            **({"mode": "reduce-overhead"} if compiled == "graph" else {}))
    scaler = None
    if args.precision == "fp16":
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch, "amp") and hasattr(
            torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()
    loss_fn = nn.CrossEntropyLoss()
    loss_sum = torch.zeros((), device=dev, dtype=torch.float32)
    xs, ys = batches
    native = xs[0].shape[-1]
    size = args.image_size or native
    prof = None

    def mark(k):
        if prof is not None:
            prof.mark(k)

    def step(i):
        mark("step_start")
        x = xs[i].to(dev, non_blocking=True)
        y = ys[i].to(dev, non_blocking=True)
        # In the setting's memory format before the resize, so a channels_last
        # setting interpolates channels_last (as its model then reads it).
        x = x.contiguous(memory_format=mf)
        if size != native:
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
            x = x.contiguous(memory_format=mf)
        mark("data_end")
        with torch.autocast(args.device, dtype=half or torch.bfloat16, enabled=half is not None):
            out = ddp(x)
            mark("loss_start")
            loss = loss_fn(out, y)
        loss_sum.add_(loss.detach().float())
        mark("backward_call")
        (scaler.scale(loss) if scaler else loss).backward()
        mark("backward_return")
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        mark("step_end")
        return loss

    w, s, p = args.warmup, args.steps, args.profile_steps
    first_losses = []

    def record(loss):
        """The step's loss over every rank (read back: warm-up steps only)."""
        v = loss.detach().float().clone()
        if world > 1:
            dist.all_reduce(v)
        first_losses.append(v.item() / world)

    t0 = time.perf_counter()
    loss = step(0)
    sync()
    first_step_s = time.perf_counter() - t0  # compiled: the compile time, in the main
    if args.record_losses > 0:
        record(loss)
    for i in range(1, w):
        loss = step(i)
        if i < args.record_losses:
            record(loss)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for i in range(w, w + s):
        loss = step(i)
    sync()
    secs = time.perf_counter() - t0
    res = {"setting": key, "memory_format": fmt, "compiled": bool(compiled),
           "compile_mode": "reduce-overhead" if compiled == "graph" else (
               "default" if compiled else None),
           "compile_backend": args.compile_backend if compiled else None,
           "compile_s": first_step_s if compiled else None, "first_step_s": first_step_s,
           "autocast": str(half).replace("torch.", "") if half else None,
           "steps": s, "warmup_steps": w, "train_seconds": secs,
           "samples_per_second": s * args.batch_size * world / secs,
           "peak_device_mb": torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else None,
           "peak_reserved_mb": torch.cuda.max_memory_reserved(dev) / 2**20 if cuda else None}
    errors = []
    if p > 0 and not compiled:
        prof = LayerProfiler(profiled_layers(model), cuda)
        prof.attach()
        sync()
        profiler_range(cuda, True, errors)
        t0 = time.perf_counter()
        for i in range(w + s, w + s + p):
            prof.begin_step()
            loss = step(i)
            prof.end_step()
        sync()
        wall = (time.perf_counter() - t0) / p
        profiler_range(cuda, False, errors)
        prof.detach()
        res["profile"] = prof.summary()
        res["profile"]["wall_step_ms"] = wall * 1e3
    else:
        res["profile"] = None
        if p > 0:
            res["profile_skipped"] = "a compiled model: module hooks would break its graphs"
    # After the window: the loss read back, averaged over every step and rank.
    if world > 1:
        dist.all_reduce(loss_sum)
    res["final_loss"] = loss_sum.item() / ((w + s + p) * world)
    res["first_losses"] = first_losses
    res["last_step_loss"] = loss.item()
    res["errors"] = errors
    res["setting_seconds"] = time.perf_counter() - t_setting
    del model, ddp, opt, scaler, prof, loss, loss_sum
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return res


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18", choices=("resnet18", "lenet"))
    ap.add_argument("--stem", default="imagenet", choices=("imagenet", "cifar"))
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--image-size", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16", "fp16"))
    ap.add_argument("--deterministic", action="store_true", help="cudnn.deterministic")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--profile-steps", type=int, default=0)
    ap.add_argument("--data", choices=("synthetic-cifar", "synthetic"), default=None,
                    help="default: synthetic-cifar for resnet18, synthetic for lenet")
    ap.add_argument("--train-samples", type=int, default=0,
                    help="the data set's size (default: the steps' batches on every rank)")
    ap.add_argument("--seed", type=int, default=0, help="train's --seed: shuffling (and LeNet's data)")
    ap.add_argument("--setting", action="append", default=[], metavar="KEY=FORMAT[+compile]",
                    help="a result key and a memory format (nchw, channels_last), +compile for "
                         "torch.compile; repeatable; default pytorch=nchw (bf16/fp16: "
                         "pytorch=channels_last)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile's backend for +compile settings (tests: eager)")
    ap.add_argument("--own-resnet", action="store_true", help="this file's module, not torchvision's")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--comm-backend", default="auto", choices=("auto", "nccl", "gloo"))
    ap.add_argument("--threads", type=int, default=1, help="CPU: intra-op threads per rank")
    ap.add_argument("--init", default=None, metavar="FILE",
                    help="initial weights (safetensors, PyTorch's state_dict names: what "
                         "--save-init writes and train --init reads)")
    ap.add_argument("--save-init", default=None, metavar="FILE",
                    help="write the model's initial weights (torch.manual_seed(--seed)) here "
                         "and exit")
    ap.add_argument("--record-losses", type=int, default=None, metavar="N",
                    help="record the first N steps' losses (mean over ranks; read back in the "
                         "warm-up, so N <= --warmup; default min(5, --warmup)) as first_losses")
    args = ap.parse_args(argv)
    if args.data is None:
        args.data = "synthetic" if args.model == "lenet" else "synthetic-cifar"
    if not args.setting:
        args.setting = ["pytorch=channels_last" if args.precision in ("bf16", "fp16") and
                        args.model == "resnet18" else "pytorch=nchw"]
    settings = []
    for s in args.setting:
        key, _, value = s.partition("=")
        fmt, plus, mode = value.partition("+")
        if not key.startswith("pytorch") or fmt not in FORMATS or (
                plus and mode not in ("compile", "graph")):
            ap.error("--setting %s: KEY must start with 'pytorch', FORMAT be nchw or "
                     "channels_last, optionally followed by +compile or +graph" % s)
        if plus and not hasattr(torch, "compile"):
            ap.error("--setting %s: torch.compile needs PyTorch 2 (this is %s)"
                     % (s, torch.__version__))
        settings.append((key, fmt, mode if plus else False))
    args.settings = settings
    if args.warmup < 1 or args.steps < 1 or args.profile_steps < 0:
        ap.error("--warmup and --steps must be at least 1, --profile-steps at least 0")
    if args.device == "cpu" and args.precision != "fp32":
        ap.error("--device cpu: fp32 only")
    if args.record_losses is None:
        args.record_losses = min(5, args.warmup)
    if not 0 <= args.record_losses <= args.warmup:
        ap.error("--record-losses %d: between 0 and --warmup (%d): losses are read back in the "
                 "warm-up only" % (args.record_losses, args.warmup))
    return args


def save_init(args):
    """--save-init: the initial weights every side then loads (--init)."""
    torch.manual_seed(args.seed)
    model = build(args)
    lenet_ref.save_state_dict(args.save_init, model, {"model": args.model, "seed": args.seed})
    print(json.dumps({"saved_init": args.save_init, "model": args.model,
                      "tensors": len(model.state_dict())}), flush=True)


def main():
    args = parse_args()
    if args.save_init:
        return save_init(args)
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = args.device == "cuda"
    if cuda:
        dev = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(args.threads)
        dev = torch.device("cpu")
    backend, backend_note = choose_backend(args, world, cuda)
    if world > 1:
        dist.init_process_group(backend)
    set_precision(args, cuda)
    steps = args.warmup + args.steps + args.profile_steps
    pin = (lambda t: t.pin_memory()) if cuda else (lambda t: t)
    batches = load_batches(args, world, rank, steps, pin)
    env = {"dev": dev, "cuda": cuda, "world": world, "sync": Sync(cuda, dev)}
    head = {
        "side": "pytorch", "torch": torch.__version__,
        "torch_cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, nccl_version() or ())) or None if cuda else None,
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "model": args.model, "precision": args.precision, "deterministic": args.deterministic,
        "world": world, "ddp": world > 1, "comm_backend": backend if world > 1 else None,
        "comm_backend_note": backend_note if world > 1 else None,
        "batch_size": args.batch_size, "image_size": args.image_size or None, "data": args.data,
        "train_samples": args.train_samples or steps * args.batch_size * world,
        "tf32": {"cudnn": torch.backends.cudnn.allow_tf32,
                 "matmul": torch.backends.cuda.matmul.allow_tf32} if cuda else None,
        "import_s": T_IMPORTED - T_START, "setup_s": time.perf_counter() - T_IMPORTED}
    results = {}
    for key, fmt, compiled in args.settings:
        r = run_setting(args, key, fmt, compiled, batches, env)
        results[key] = r
        if rank == 0:
            print(json.dumps(dict(head, **r)), flush=True)
    if world > 1:
        dist.barrier()
    if rank == 0:
        print(json.dumps(dict(head, settings=results, process_s=time.perf_counter() - T_START)),
              flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
