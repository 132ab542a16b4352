"""The recipe of the bundled `train` in plain PyTorch DDP (gloo, CPU): the
reference it is benchmarked and checked against.

    ddprun   --nproc_per_node=2 examples/pytorch/lenet_ddp.py [flags]
    torchrun --nproc_per_node=2 examples/pytorch/lenet_ddp.py [flags]
    python examples/pytorch/lenet_ddp.py [flags]          # one process, no DDP

Defaults as `train`'s: LeNet, Fashion-MNIST from /usr/share/datasets/fashion-mnist,
1 epoch, batch 64 per rank, SGD lr 0.05 momentum 0.9, one thread per process,
DistributedSampler (shuffled with --seed, set_epoch per epoch) and a DataLoader
with drop_last=False, cross entropy. The test set is split without padding
(rank r evaluates samples r, r+world, ...), so the accuracy counts every test
sample exactly once. Rank 0 prints progress to stderr and, as the last line of
stdout, one JSON object with the keys `train` prints: world, model, epochs,
steps (per rank), batch_size, train_seconds (as train measures it: from the
first step to the end, the per-epoch test evaluation included),
samples_per_second (global, over train_seconds), test_accuracy, test_correct,
test_total, final_loss (global mean of the last epoch's last log interval,
weighted by samples), params_sha256 (of this script's state_dict bytes; not
comparable with train's), breakdown {data_s, forward_backward_s, comm_wait_s,
optimizer_s} (rank 0's totals; DDP overlaps its all-reduce inside backward, so
the exposed wait is not separable: comm_wait_s is null and forward_backward_s
includes it), comm_hidden_fraction (null), peak_rss_mb (rank 0's ru_maxrss).
--metrics FILE writes the JSON lines `train --metrics` writes.
"""
import argparse
import json
import os
import resource
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lenet  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="lenet", choices=lenet.MODELS)
    ap.add_argument("--data", default=lenet.DEFAULT_DATA, help="IDX directory or 'synthetic'")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--scale-lr", action="store_true", help="lr *= world size")
    ap.add_argument("--sync-bn", action="store_true")
    ap.add_argument("--comm-hook", default="none", choices=("none", "fp16", "bf16"))
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--metrics", help="JSON lines file (rank 0)")
    ap.add_argument("--log-interval", type=int, default=50)
    ap.add_argument("--init", help="initial weights (.safetensors)")
    ap.add_argument("--save", help="final model (.safetensors)")
    ap.add_argument("--max-steps", type=int, default=0, help="per-epoch cap (0: none)")
    ap.add_argument("--train-samples", type=int, default=0, help="first N (0: all)")
    ap.add_argument("--test-samples", type=int, default=0, help="first N (0: all)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    for name in ("epochs", "batch_size", "log_interval", "threads"):
        if getattr(a, name) < 1:
            ap.error("--%s must be >= 1" % name.replace("_", "-"))
    return a


def load_data(a, rank):
    if a.data == "synthetic":
        return (lenet.synthetic(a.train_samples or 60000, a.seed, "train"),
                lenet.synthetic(a.test_samples or 10000, a.seed, "test"))
    if not lenet.have_fashion_mnist(a.data):
        sys.exit("error: Fashion-MNIST not found in %s (run scripts/setup.sh or pass "
                 "--data synthetic)" % a.data)
    return (lenet.load_fashion_mnist(a.data, "train", a.train_samples or None),
            lenet.load_fashion_mnist(a.data, "test", a.test_samples or None))


class Metrics:
    """JSON lines on rank 0 (a no-op elsewhere or without --metrics)."""

    def __init__(self, path, rank):
        self.f = open(path, "w") if path and rank == 0 else None

    def write(self, **row):
        if self.f:
            self.f.write(json.dumps(row) + "\n")
            self.f.flush()


def global_sum(values, world):
    t = torch.tensor(values, dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t)
    return t.tolist()


def evaluate(model, x, y, rank, world):
    """Correct predictions over the whole test set, each sample counted once."""
    net = getattr(model, "module", model)
    net.eval()
    correct = 0
    with torch.no_grad():
        xs, ys = x[rank::world], y[rank::world]
        for i in range(0, len(xs), 1000):
            correct += int((net(xs[i:i + 1000]).argmax(1) == ys[i:i + 1000]).sum())
    net.train()
    return int(global_sum([correct], world)[0])


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    log = (lambda *m: print("[lenet_ddp]", *m, file=sys.stderr, flush=True)) if rank == 0 else \
        (lambda *m: None)

    (xtr, ytr), (xte, yte) = load_data(a, rank)
    if len(xtr) < world:
        sys.exit("error: %d training samples for %d ranks" % (len(xtr), world))
    train_set = TensorDataset(xtr, ytr)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank,
                                 shuffle=not a.no_shuffle, seed=a.seed, drop_last=False)
    loader = DataLoader(train_set, batch_size=a.batch_size, sampler=sampler, drop_last=False)

    torch.manual_seed(a.seed)
    model = lenet.build_model(a.model, sync_bn=a.sync_bn)
    if a.init:
        lenet.load_state_dict(a.init, model)
    if distributed:
        model = DDP(model, bucket_cap_mb=a.bucket_cap_mb)
        if a.comm_hook != "none":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            hook = {"fp16": default_hooks.fp16_compress_hook,
                    "bf16": default_hooks.bf16_compress_hook}[a.comm_hook]
            model.register_comm_hook(None, hook)
    lr = a.lr * (world if a.scale_lr else 1)
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=a.momentum,
                              weight_decay=a.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=a.weight_decay)
    metrics = Metrics(a.metrics, rank)
    log("world %d, model %s, %d train / %d test samples, batch %d per rank, %d steps per epoch"
        % (world, a.model, len(xtr), len(xte), a.batch_size, len(loader)))

    times = {"data_s": 0.0, "forward_backward_s": 0.0, "optimizer_s": 0.0}
    steps = samples = 0
    final_loss = None
    if distributed:
        dist.barrier()
    start = time.perf_counter()
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        epoch_start = time.perf_counter()
        it = iter(loader)
        loss_sum, loss_n, epoch_loss, epoch_n, step = 0.0, 0, 0.0, 0, 0
        interval_start = time.perf_counter()
        while not a.max_steps or step < a.max_steps:
            t0 = time.perf_counter()
            try:
                xb, yb = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad()
            t3 = time.perf_counter()
            times["data_s"] += t1 - t0
            times["forward_backward_s"] += t2 - t1
            times["optimizer_s"] += t3 - t2
            step += 1
            steps += 1
            samples += len(yb)
            value = loss.item() * len(yb)  # sample-weighted, as train averages
            loss_sum, loss_n = loss_sum + value, loss_n + len(yb)
            epoch_loss, epoch_n = epoch_loss + value, epoch_n + len(yb)
            if step % a.log_interval == 0 or step == len(loader) or step == a.max_steps:
                total, count = global_sum([loss_sum, loss_n], world)
                final_loss = total / count
                now = time.perf_counter()
                metrics.write(type="step", epoch=epoch, step=step, global_step=steps,
                              loss=final_loss, lr=lr,
                              samples_per_second=count / max(now - interval_start, 1e-9),
                              elapsed_s=now - start)
                interval_start = now
                if step % (a.log_interval * 10) == 0:
                    log("epoch %d step %d/%d loss %.4f" % (epoch, step, len(loader), final_loss))
                loss_sum, loss_n = 0.0, 0
        epoch_seconds = time.perf_counter() - epoch_start
        total, count = global_sum([epoch_loss, epoch_n], world)
        correct = evaluate(model, xte, yte, rank, world)
        metrics.write(type="epoch", epoch=epoch, train_loss=total / max(count, 1),
                      test_accuracy=correct / len(xte), test_correct=correct,
                      test_total=len(xte), epoch_seconds=epoch_seconds)
        log("epoch %d: train loss %.4f, test accuracy %.4f (%d/%d), %.2f s"
            % (epoch, total / max(count, 1), correct / len(xte), correct, len(xte), epoch_seconds))
    train_seconds = time.perf_counter() - start

    if a.save and rank == 0:
        lenet.save_state_dict(a.save, model, {"format": "pt", "model": a.model})
    result = {
        "impl": "pytorch", "torch": torch.__version__, "world": world, "model": a.model,
        "epochs": a.epochs, "steps": steps, "batch_size": a.batch_size,
        "train_seconds": train_seconds, "samples_per_second": samples * world / train_seconds,
        "test_accuracy": correct / len(xte), "test_correct": correct, "test_total": len(xte),
        "final_loss": final_loss, "params_sha256": lenet.params_sha256(model),
        "breakdown": dict(times, comm_wait_s=None), "comm_hidden_fraction": None,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }
    metrics.write(type="final", **result)
    if rank == 0:
        print(json.dumps(result), flush=True)
    if distributed:
        dist.destroy_process_group()
    # Leave without interpreter finalisation (gloo teardown race, see ddp_train.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
