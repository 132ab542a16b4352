"""A plain PyTorch DDP training script, unmodified for ddprun: it runs the same
under `torchrun` and `ddprun`. gloo on CPU, DistributedSampler, all_reduce of
the loss, all_gather for evaluation. Rank 0 prints one JSON line of results.

    ddprun --nproc_per_node=2 examples/pytorch/ddp_train.py --epochs 2
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = (x @ torch.arange(1.0, 9.0) > 0).long()
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(yb), float(len(yb))])
        dist.all_reduce(total)
        losses.append(round((total[0] / total[1]).item(), 6))
    with torch.no_grad():
        correct = (model(x[rank::world]).argmax(1) == y[rank::world]).sum().reshape(1)
    gathered = [torch.zeros(1, dtype=correct.dtype) for _ in range(world)]
    dist.all_gather(gathered, correct)
    accuracy = sum(int(g.item()) for g in gathered) / len(x)
    checksum = round(sum(p.double().sum().item() for p in model.parameters()), 6)
    if rank == 0:
        print(json.dumps({"world": world, "losses": losses, "accuracy": accuracy,
                          "param_checksum": checksum,
                          "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT")}), flush=True)
    dist.destroy_process_group()
    # Leave without interpreter finalisation: a gloo worker thread may still be
    # dropping the last collective's tensors, which needs the GIL; during
    # finalisation that thread is killed and PyTorch aborts ("terminate called
    # without an active exception", backtrace in AsyncAllgatherWork's
    # destructor). A PyTorch teardown race, seen under torchrun as well.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
