#!/usr/bin/env python3
"""PyTorch DDP side of scripts/bench/one_vs_n.py: ResNet-18 (imagenet stem)
on `train --data synthetic-cifar`, synchronised batch norm, gloo on the CPU.

    ddprun --standalone --nproc_per_node=N one_vs_n_torch.py --init INIT \
        --seed S --batch-size B --epochs E --out run.json
    python3 one_vs_n_torch.py --write-init INIT --seed S   # PyTorch's init

What `train --model resnet18 --stem imagenet --data synthetic-cifar --sync-bn
--init INIT --seed S` computes, in PyTorch:
- data: the first --train-samples / --test-samples samples of train's
  synthetic-cifar set (scripts/bench/benchutil.py, bytes equal to
  tests/interop/synthetic_cifar.py's);
- order: a DistributedSampler with PyTorch's rules (seed + epoch, padding,
  rank r reads order[r::world]) whose permutation is train's
  (runtime::samplerPermutation: mt19937_64 Fisher-Yates), not torch.randperm's:
  torch's DistributedSampler(shuffle=True, seed=S) would visit another order
  than train's, so the two launchers would not see the same global batches;
- model: torchvision's resnet18 (tests/interop/resnet_reference.py), weights
  from --init; SGD(lr, momentum); DDP(broadcast_buffers=True) on gloo;
- synchronised batch norm: nn.SyncBatchNorm refuses CPU tensors in both
  PyTorch 1.13 ("SyncBatchNorm expected input tensor to be on GPU") and 2.x
  ("... on GPU or XPU or privateuseone"), so with world > 1 every
  BatchNorm2d runs HandSyncBN below: forward all-reduces (sum, sum of
  squares, count) per channel (float64), backward all-reduces (sum dy,
  sum dy * (x - mean)), as SyncBatchNorm does (its weight and bias gradients
  are local, DDP averages them). With world 1 it is nn.BatchNorm2d, as
  SyncBatchNorm itself falls back to plain batch norm with one process
  (--hand-bn-at-1 uses HandSyncBN there too).
Per step, the global mean loss (all-reduced, as train's --log-interval 1
records); at the end, the global test accuracy (each rank evaluates
test[rank::world] with its own module, counts summed). Rank 0 writes --out.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "../.."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests/interop"))
sys.path.insert(0, os.path.join(ROOT, "examples/pytorch"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import benchutil  # noqa: E402
import lenet  # noqa: E402  (safetensors reader and writer)
import resnet_reference  # noqa: E402


class _SyncBNFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        dims = (0, 2, 3)
        xd = x.double()
        stats = torch.cat([xd.sum(dims), (xd * xd).sum(dims),
                           torch.tensor([float(x.numel() // x.shape[1])], dtype=torch.float64)])
        dist.all_reduce(stats)
        c = x.shape[1]
        count = stats[2 * c].item()
        mean64 = stats[:c] / count
        var64 = (stats[c:2 * c] / count - mean64 * mean64).clamp_min(0)
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean64.float())
            running_var.mul_(1 - momentum).add_(momentum * (var64 * count / (count - 1)).float())
        mean = mean64.float().view(1, c, 1, 1)
        invstd = (1.0 / torch.sqrt(var64 + eps)).float().view(1, c, 1, 1)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count = count
        return (x - mean) * invstd * weight.view(1, c, 1, 1) + bias.view(1, c, 1, 1)

    @staticmethod
    def backward(ctx, g):
        x, weight, mean, invstd = ctx.saved_tensors
        dims = (0, 2, 3)
        c = x.shape[1]
        xmu = x - mean
        sum_dy = g.sum(dims)
        sum_dy_xmu = (g * xmu).sum(dims)
        grad_weight = sum_dy_xmu * invstd.view(c)  # local: DDP averages it
        grad_bias = sum_dy.clone()
        both = torch.cat([sum_dy, sum_dy_xmu])
        dist.all_reduce(both)
        mean_dy = (both[:c] / ctx.count).view(1, c, 1, 1)
        mean_dy_xmu = (both[c:] / ctx.count).view(1, c, 1, 1)
        grad_x = (g - mean_dy - xmu * invstd * invstd * mean_dy_xmu) * invstd * weight.view(1, c, 1, 1)
        return grad_x, grad_weight, grad_bias, None, None, None, None


class HandSyncBN(nn.BatchNorm2d):
    """BatchNorm2d whose training forward uses the global batch's statistics."""

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        self.num_batches_tracked += 1
        return _SyncBNFunction.apply(x, self.weight, self.bias, self.running_mean,
                                     self.running_var, self.eps, self.momentum)


def to_hand_sync_bn(module):
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            bn = HandSyncBN(child.num_features, child.eps, child.momentum)
            bn.load_state_dict(child.state_dict())
            setattr(module, name, bn)
        else:
            to_hand_sync_bn(child)
    return module


def write_init(path, seed):
    torch.manual_seed(seed)
    model = resnet_reference.build("imagenet")
    lenet.save_state_dict(path, model)
    print(json.dumps({"init": path, "seed": seed, "torch": torch.__version__,
                      "model": resnet_reference.implementation()}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-init")
    ap.add_argument("--init")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--train-samples", type=int, default=2048)
    ap.add_argument("--test-samples", type=int, default=1000)
    ap.add_argument("--hand-bn-at-1", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--dump-dir", help="rank 0 saves the state after each step here (named as "
                    "train's checkpoints: weights, buffers, optim.<name>.momentum_buffer)")
    args = ap.parse_args()
    if args.write_init:
        write_init(args.write_init, args.seed)
        return
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = args.train_samples
    xs, ys = benchutil.synthetic_cifar_samples(range(n), n, "train")
    x_train, y_train = torch.from_numpy(xs), torch.from_numpy(ys)
    xt, yt = benchutil.synthetic_cifar_samples(range(args.test_samples), args.test_samples, "test")
    x_test, y_test = torch.from_numpy(xt), torch.from_numpy(yt)

    model = resnet_reference.build("imagenet")
    lenet.load_state_dict(args.init, model, strict=True)
    if world > 1 or args.hand_bn_at_1:
        to_hand_sync_bn(model)
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum)
    b = args.batch_size
    losses, epochs = [], []
    t0 = time.time()
    for epoch in range(args.epochs):
        idx = benchutil.sampler_indices(n, world, rank, seed=args.seed, epoch=epoch)
        ddp.train()
        steps = (len(idx) + b - 1) // b  # DataLoader, drop_last=False
        for s in range(steps):
            part = torch.tensor(idx[s * b:(s + 1) * b])
            xb, yb = x_train[part], y_train[part]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(xb), yb)
            loss.backward()
            opt.step()
            tot = torch.tensor([loss.item() * len(yb), float(len(yb))], dtype=torch.float64)
            dist.all_reduce(tot)
            losses.append((tot[0] / tot[1]).item())
            if args.dump_dir and rank == 0:
                state = dict(model.state_dict())
                for name, p in model.named_parameters():
                    state["optim.%s.momentum_buffer" % name] = opt.state[p]["momentum_buffer"]
                lenet.save_safetensors(os.path.join(args.dump_dir, "step-%d.safetensors"
                                                    % len(losses)), state)
        model.eval()
        with torch.no_grad():
            correct = (model(x_test[rank::world]).argmax(1) == y_test[rank::world]).sum()
        c = torch.tensor([int(correct)], dtype=torch.int64)
        dist.all_reduce(c)
        epochs.append({"epoch": epoch, "test_accuracy": int(c) / args.test_samples})
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world": world, "torch": torch.__version__,
                       "bn": "HandSyncBN" if (world > 1 or args.hand_bn_at_1) else "BatchNorm2d",
                       "losses": losses, "epochs": epochs,
                       "test_accuracy": epochs[-1]["test_accuracy"],
                       "train_seconds": time.time() - t0}, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # see examples/pytorch/ddp_train.py: gloo teardown race


if __name__ == "__main__":
    main()
