"""An ordinary PyTorch DDP script (gloo on CPU, nothing ddprun-specific) for the
wheel test: trains a small model for a few steps and writes, per rank, which
interpreter ran it and what it computed to <outdir>/rank_<RANK>.json.

    ddprun --nproc-per-node=2 ddp_worker.py OUTDIR
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    outdir = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = (x @ torch.arange(1.0, 9.0) > 0).long()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    losses = []
    for step in range(8):
        xb, yb = x[rank::world][step * 16:(step + 1) * 16], y[rank::world][step * 16:(step + 1) * 16]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    with open(os.path.join(outdir, "rank_%d.json" % rank), "w") as f:
        json.dump({"rank": rank, "world": world, "executable": sys.executable,
                   "prefix": sys.prefix, "torch": torch.__version__, "losses": losses,
                   "param_checksum": checksum}, f)
    dist.destroy_process_group()
    sys.stdout.flush()
    # As examples/pytorch/ddp_train.py: leave without interpreter finalisation,
    # which can abort while a gloo thread still drops the last tensors.
    os._exit(0)


if __name__ == "__main__":
    main()
