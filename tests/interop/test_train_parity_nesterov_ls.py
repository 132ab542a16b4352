"""`train --nesterov --label-smoothing 0.1` computes what PyTorch computes with
torch.optim.SGD(nesterov=True) and F.cross_entropy(label_smoothing=0.1): the
setting of test_train_parity.py (LeNet, same initial weights through --init,
unshuffled batches, lr 0.05, momentum 0.9, 20 steps of 64 Fashion-MNIST
samples, one process):
  1. free-running: train's 20 per-step (smoothed) losses within 1e-4 of
     PyTorch's;
  2. train's final weights (--save) within 1e-4 of PyTorch's final weights,
     and a run without the two flags lands elsewhere (the flags reach the
     arithmetic);
  3. PyTorch's test-set count with train's final weights is the count train
     reported (smoothing changes the loss, never the arg-max).
LeNet only: LeNet-BN is chaotic at this learning rate (test_train_parity.py).

PyTorch 1.13 on CPU (Debian's); skipped (77) without it or without the
Fashion-MNIST files."""
import json
import os
import shutil
import sys
import tempfile

from storeutil import SKIP, check

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import test_train_parity as tp  # noqa: E402  (adds examples/pytorch to sys.path)
import lenet  # noqa: E402

SMOOTHING = 0.1
FLAGS = ("--nesterov", "--label-smoothing", str(SMOOTHING))
WEIGHT_TOL = 1e-4


def reference(model_name, xy):
    """PyTorch's 20 steps with Nesterov and label smoothing: losses, module."""
    torch.manual_seed(0)
    model = lenet.build_model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=tp.LR, momentum=tp.MOMENTUM, nesterov=True)
    losses = []
    model.train()
    for s in range(1, tp.STEPS + 1):
        xb, yb = tp.batch(xy, s)
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb, label_smoothing=SMOOTHING)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def full_run(tmp, model_name, init, *extra):
    """20 steps: per-step losses, the result line, the --save file."""
    metrics = os.path.join(tmp, "m%d.jsonl" % len(extra))
    final = os.path.join(tmp, "final%d.safetensors" % len(extra))
    result = tp.run_train(tmp, model_name, init, "--log-interval", "1", "--metrics", metrics,
                          "--save", final, *extra)
    steps = [r for r in (json.loads(l) for l in open(metrics) if l.strip())
             if r.get("type") == "step"]
    check([r["global_step"] for r in steps] == list(range(1, tp.STEPS + 1)),
          "expected step lines 1..%d in --metrics" % tp.STEPS)
    return [r["loss"] for r in steps], result, final


def max_weight_diff(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k].double() - sb[k].double()).abs().max()) for k in sa
               if sa[k].is_floating_point())


def main():
    if not lenet.have_fashion_mnist():
        print("SKIPPED: Fashion-MNIST not found in %s (run scripts/setup.sh)" % lenet.DEFAULT_DATA)
        sys.exit(SKIP)
    check(os.access(os.path.join(tp.BIN, "train"), os.X_OK), "no train binary in " + tp.BIN)
    torch.set_num_threads(1)
    print("PyTorch", torch.__version__)
    model_name = "lenet"
    train_xy = lenet.load_fashion_mnist(lenet.DEFAULT_DATA, "train", tp.STEPS * tp.BATCH)
    test_xy = lenet.load_fashion_mnist(lenet.DEFAULT_DATA, "test")
    tmp = tempfile.mkdtemp(prefix="train_parity_nesterov_")
    try:
        torch.manual_seed(0)
        init = os.path.join(tmp, "init.safetensors")
        lenet.save_state_dict(init, lenet.build_model(model_name))
        ours, result, final = full_run(tmp, model_name, init, *FLAGS)
        theirs, ref_model = reference(model_name, train_xy)
        print("free-running with %s: step, train, PyTorch, |diff|" % " ".join(FLAGS))
        for s, (a, b) in enumerate(zip(ours, theirs), 1):
            print("  %2d  %.7f  %.7f  %.2e" % (s, a, b, abs(a - b)))
            check(abs(a - b) <= tp.LOSS_TOL, "step %d loss %.7f vs PyTorch %.7f: |diff| %.3g > %g"
                  % (s, a, b, abs(a - b), tp.LOSS_TOL))
        mine = tp.load_state(final, model_name)
        d = max_weight_diff(mine, ref_model)
        print("final weights: max |train - PyTorch| %.2e" % d)
        check(d <= WEIGHT_TOL, "final weights differ from PyTorch's by %.3g > %g" % (d, WEIGHT_TOL))
        _, _, plain_final = full_run(tmp, model_name, init)
        d_plain = max_weight_diff(tp.load_state(plain_final, model_name), ref_model)
        print("without the flags: max |train - PyTorch(nesterov, smoothing)| %.2e" % d_plain)
        check(d_plain > 10 * WEIGHT_TOL, "a run without --nesterov/--label-smoothing also "
              "matches (%.3g): the flags change nothing" % d_plain)
        tp.check_accuracy(model_name, result, final, test_xy)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("OK")


if __name__ == "__main__":
    main()
