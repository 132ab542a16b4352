#!/usr/bin/env python3
"""PyTorch DDP, the reference side of scripts/bench/resnet_bench.py (GPU or CPU).

    torchrun --nproc_per_node=N examples/pytorch/ddp_bench.py --model resnet18 \
        --image-size 224 --batch-size 128 --precision bf16 --steps 40 --warmup 10
    torchrun --nproc_per_node=2 examples/pytorch/ddp_bench.py --device cpu \
        --stem cifar --batch-size 32 --threads 1

The recipe `train --device cuda` runs: torchvision's ResNet-18 layout (the
module is defined here when torchvision is missing) or LeNet, SGD with
momentum 0.9, CIFAR-sized 3x32x32 batches (or 1x28x28 for LeNet) in pinned
host memory copied to the GPU with non_blocking=True and upsampled there with
F.interpolate(mode="bilinear") to --image-size, as the DDP tutorial does.
Precision: fp32 (TF32 off everywhere), tf32 (cuDNN and matmul TF32 on), bf16
and fp16 (torch.autocast, channels_last: PyTorch's fast path; fp16 with a
GradScaler). NCCL when each rank has its own GPU, gloo when ranks share one
(NCCL refuses duplicate GPUs). Timed: --steps after --warmup, between
torch.cuda.synchronize() calls; the step-time breakdown (data, forward+
backward, optimizer) from CUDA events. --device cpu: gloo, fp32, --threads
intra-op threads per rank (oneDNN convolutions), wall-clock breakdown. Rank 0
prints one JSON line.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
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


def build(args):
    if args.model == "lenet":
        import lenet  # examples/pytorch/lenet.py: the reference LeNet
        return lenet.LeNet()
    if args.stem == "imagenet" and not args.own_resnet:
        try:
            import torchvision
            return torchvision.models.resnet18(num_classes=args.num_classes)
        except ImportError:
            pass
    return ResNet18(args.num_classes, args.stem)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18", choices=("resnet18", "lenet"))
    ap.add_argument("--stem", default="imagenet", choices=("imagenet", "cifar"))
    ap.add_argument("--num-classes", type=int, default=10)
    ap.add_argument("--image-size", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16", "fp16"))
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--own-resnet", action="store_true", help="this file's module, not torchvision's")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--threads", type=int, default=1, help="CPU: intra-op threads per rank")
    args = ap.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = args.device == "cuda"
    if cuda:
        ngpu = torch.cuda.device_count()
        dev = torch.device("cuda", local % ngpu)
        torch.cuda.set_device(dev)
        backend = "gloo" if world > ngpu else "nccl"
    else:
        if args.precision != "fp32":
            raise SystemExit("--device cpu: fp32 only")
        torch.set_num_threads(args.threads)
        dev = torch.device("cpu")
        backend = "gloo"
    if world > 1:
        dist.init_process_group(backend)
    tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = cuda
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    fmt = torch.channels_last if half is not None and args.model == "resnet18" else torch.contiguous_format

    torch.manual_seed(0)
    model = build(args).to(dev, memory_format=fmt)
    ddp = model
    if world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    scaler = torch.amp.GradScaler("cuda") if args.precision == "fp16" else None
    loss_fn = nn.CrossEntropyLoss()

    shape = (1, 28, 28) if args.model == "lenet" else (3, 32, 32)
    size = args.image_size or shape[1]
    g = torch.Generator().manual_seed(local)
    nbatch = 8
    pin = (lambda t: t.pin_memory()) if cuda else (lambda t: t)
    xs = [pin(torch.randn((args.batch_size,) + shape, generator=g)) for _ in range(nbatch)]
    ys = [pin(torch.randint(0, args.num_classes, (args.batch_size,), generator=g))
          for _ in range(nbatch)]

    class WallEvent:  # torch.cuda.Event's interface on the CPU
        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    ev = [torch.cuda.Event(enable_timing=True) if cuda else WallEvent() for _ in range(4)]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    parts = {"data_s": 0.0, "forward_backward_s": 0.0, "optimizer_s": 0.0}

    def step(i, timed):
        ev[0].record()
        x = xs[i % nbatch].to(dev, non_blocking=True)
        y = ys[i % nbatch].to(dev, non_blocking=True)
        if size != shape[1]:
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        x = x.contiguous(memory_format=fmt)
        ev[1].record()
        with torch.autocast(args.device, dtype=half, enabled=half is not None):
            loss = loss_fn(ddp(x), y)
        if scaler:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        ev[2].record()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        ev[3].record()
        if timed:
            ev[3].synchronize()
            parts["data_s"] += ev[0].elapsed_time(ev[1]) / 1e3
            parts["forward_backward_s"] += ev[1].elapsed_time(ev[2]) / 1e3
            parts["optimizer_s"] += ev[2].elapsed_time(ev[3]) / 1e3
        return loss

    for i in range(args.warmup):
        step(i, False)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    # Throughput run (no per-step synchronisation), then a breakdown run.
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(i, False)
    sync()
    secs = time.perf_counter() - t0
    for i in range(min(args.steps, 10)):
        step(i, True)
    n_breakdown = min(args.steps, 10)
    if world > 1:
        dist.barrier()
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({
            "side": "pytorch", "torch": torch.__version__, "model": args.model,
            "precision": args.precision, "world": world, "comm_backend": backend if world > 1 else None,
            "batch_size": args.batch_size, "image_size": size, "steps": args.steps,
            "train_seconds": secs, "samples_per_second": args.steps * args.batch_size * world / secs,
            "peak_device_mb": torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else None,
            "breakdown_per_step": {k: v / n_breakdown for k, v in parts.items()},
            "final_loss": loss.item(),
            "device": torch.cuda.get_device_name(dev) if cuda else "cpu"}), flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
