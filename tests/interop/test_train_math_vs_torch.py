"""train's label-smoothed cross-entropy and Nesterov SGD against PyTorch on the
same numbers, without the trainer: tests/interop/train_math_probe (the CPU
backend through Backend::setLabelSmoothing/crossEntropy and
Optimizer::create(nesterov)/step) against
torch.nn.functional.cross_entropy(label_smoothing=eps) with autograd, and
torch.optim.SGD(momentum, weight_decay, nesterov=True).

Tolerances (float32 rounding):
  - loss: ours is computed in double, so it equals PyTorch's float64 result
    within 1e-8 relative (the only difference left is eps passed as a float)
    and PyTorch's float32 result within 2e-6 relative (float32's log-softmax
    and mean: a few units of 2^-24 per row, summed);
  - gradient: ours is the float64 value rounded once (2^-24 relative; plus
    2^-24 |z_j - max| relative in softmax_j, whose argument is rounded to
    float, and eps's float rounding), and PyTorch's float32 gradient within
    16 * 2^-24 / N absolute (PyTorch's softmax from a float log-softmax,
    relative error up to about |log p_j| units of 2^-24 in p_j <= 1, the
    difference to the target and the division by N in float);
  - SGD: 6 steps of one float rounding per op on weights ~1 and buffers ~10
    (seen: 1.2e-7 relative): ours and PyTorch's float32 within
    1e-6 * (1 + |value|) (PyTorch's CPU kernels fuse add-with-alpha into an
    FMA, ours rounds the product first), ours and PyTorch's float64 alike.
Nesterov with momentum 0 is refused by both.
"""
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

from storeutil import BIN, check

PROBE = os.path.join(BIN, "train_math_probe")
U = 2.0 ** -24


def probe(args, values):
    p = subprocess.run([PROBE, *map(str, args)], input=" ".join(map(repr, values)),
                       capture_output=True, text=True, timeout=60)
    return p.returncode, [float(t) for t in p.stdout.split()], p.stderr


def check_cross_entropy(rng):
    for eps in (0.0, 0.1, 0.3, 1.0):
        n, k = 64, 10
        z = rng.uniform(-6, 6, (n, k)).astype(np.float32)
        y = rng.integers(0, k, n)
        rc, out, err = probe(["ce", n, k, eps], [float(v) for v in z.ravel()] + list(map(int, y)))
        check(rc == 0, "probe ce exited %d: %s" % (rc, err))
        loss, grad = out[0], np.array(out[1:]).reshape(n, k)
        results = {}
        for dtype in (torch.float32, torch.float64):
            zt = torch.tensor(z, dtype=dtype, requires_grad=True)
            l = F.cross_entropy(zt, torch.tensor(y), label_smoothing=eps)
            l.backward()
            results[dtype] = (l.item(), zt.grad.double().numpy())
        l32, g32 = results[torch.float32]
        l64, g64 = results[torch.float64]
        dl64, dl32 = abs(loss - l64), abs(loss - l32)
        # One rounding of the result, and the softmax's argument z_j - max
        # rounded to float (relative U |z_j - max| in p_j).
        zd = z.astype(np.float64)
        p64 = torch.softmax(torch.tensor(zd), 1).numpy()
        shift = np.abs(zd - zd.max(1, keepdims=True))
        dg64 = np.abs(grad - g64) - (U * np.abs(g64) + U * (shift + 1) * p64 / n + 1e-9 * eps / n)
        dg32 = np.abs(grad - g32)
        print("eps %.2f: loss %.9f, |vs torch64| %.2e, |vs torch32| %.2e; grad max |vs torch32| "
              "%.2e (bound %.2e)" % (eps, loss, dl64, dl32, dg32.max(), 16 * U / n))
        check(dl64 <= 1e-8 * abs(l64), "eps %g: loss %.17g vs PyTorch float64 %.17g"
              % (eps, loss, l64))
        check(dl32 <= 2e-6 * abs(l32), "eps %g: loss %.17g vs PyTorch float32 %.17g"
              % (eps, loss, l32))
        check(dg64.max() <= 0, "eps %g: gradient off PyTorch's float64 one by more than a "
              "float rounding (worst excess %.3g)" % (eps, dg64.max()))
        check(dg32.max() <= 16 * U / n, "eps %g: gradient vs PyTorch float32: %.3g > %.3g"
              % (eps, dg32.max(), 16 * U / n))


def torch_sgd(w0, grads, lr, momentum, wd, nesterov, dtype):
    w = torch.nn.Parameter(torch.tensor(w0, dtype=dtype))
    opt = torch.optim.SGD([w], lr=lr, momentum=momentum, weight_decay=wd, nesterov=nesterov)
    for g in grads:
        w.grad = torch.tensor(g, dtype=dtype)
        opt.step()
    buf = opt.state[w].get("momentum_buffer") if momentum else None
    return (w.detach().double().numpy(),
            buf.double().numpy() if buf is not None else np.zeros(len(w0)))


def check_sgd(rng):
    n, steps = 1000, 6
    for nesterov in (True, False):
        for lr, momentum, wd in ((0.1, 0.9, 1e-2), (0.05, 0.5, 0.0)):
            # The hyperparameters as float32, as train parses them.
            lr, momentum, wd = (float(np.float32(v)) for v in (lr, momentum, wd))
            w0 = rng.uniform(-1, 1, n).astype(np.float32)
            grads = [rng.uniform(-1, 1, n).astype(np.float32) for _ in range(steps)]
            values = [float(v) for v in w0] + [float(v) for g in grads for v in g]
            rc, out, err = probe(["sgd", n, steps, repr(lr), repr(momentum), repr(wd),
                                  int(nesterov)], values)
            check(rc == 0, "probe sgd exited %d: %s" % (rc, err))
            w, buf = np.array(out[:n]), np.array(out[n:])
            w32, b32 = torch_sgd(w0, grads, lr, momentum, wd, nesterov, torch.float32)
            w64, b64 = torch_sgd(w0, grads, lr, momentum, wd, nesterov, torch.float64)
            worst32 = max((np.abs(w - w32) / (1 + np.abs(w32))).max(),
                          (np.abs(buf - b32) / (1 + np.abs(b32))).max())
            worst64 = max((np.abs(w - w64) / (1 + np.abs(w64))).max(),
                          (np.abs(buf - b64) / (1 + np.abs(b64))).max())
            print("sgd nesterov=%s lr %g momentum %g wd %g: worst relative |vs torch32| %.2e, "
                  "|vs torch64| %.2e" % (nesterov, lr, momentum, wd, worst32, worst64))
            check(worst32 <= 1e-6, "SGD nesterov=%s: off PyTorch float32 by %.3g"
                  % (nesterov, worst32))
            check(worst64 <= 1e-6, "SGD nesterov=%s: off PyTorch float64 by %.3g"
                  % (nesterov, worst64))
    # Nesterov without momentum: refused by PyTorch and by train.
    rc, _, err = probe(["sgd", 1, 1, 0.1, 0.0, 0.0, 1], [1.0, 0.5])
    check(rc != 0 and "momentum" in err, "nesterov with momentum 0 was accepted: %d %s"
          % (rc, err))
    try:
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.0,
                        nesterov=True)
        check(False, "PyTorch accepted nesterov with momentum 0")
    except ValueError:
        pass


def main():
    check(os.access(PROBE, os.X_OK), "no train_math_probe in " + BIN)
    torch.set_num_threads(1)
    print("PyTorch", torch.__version__)
    rng = np.random.default_rng(20240611)
    check_cross_entropy(rng)
    check_sgd(rng)
    print("OK")


if __name__ == "__main__":
    main()
