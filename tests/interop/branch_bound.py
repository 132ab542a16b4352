"""One training step computed in float64 with its branches: how far a correct
float32 implementation of the same step may be from it, element by element.

A float32 step differs from the exact one (float64 stands in for exact) in
two ways:
  - rounding: about 1e-7 relative, everywhere;
  - branches: a ReLU input that float64 puts at +1e-8 may come out -1e-8 in
    float32, and the element's whole upstream gradient is then dropped
    instead of kept (or the reverse); a max pool window whose two largest
    inputs are within rounding of each other sends its gradient to one or
    the other. Which way float32 goes depends on the order of the sums that
    made the input: the kernels of oneDNN and OpenBLAS, their instruction set
    and blocking, so it differs from machine to machine. ResNet-18 at batch
    8 has ~10^6 ReLU inputs a step, and a few dozen always sit that close.

The effect of a branch is not machine-dependent: once the forward is fixed
(a flip moves it by less than rounding), the backward is linear in the
upstream gradient, so flipping branch i changes the parameter gradients by
exactly e_i = J^T (u_i 1_i), the backward of the upstream gradient u_i of
that one element (for a pool window: u moved from one input to the other).
Step.explain() therefore accepts a float32 gradient g32 when some flips
explain it: weights d_i in [0, 1] with, for every parameter and element,

    |g32 - g64 - sum over the branches i in A of d_i * s_i * e_i| <= tol

where s_i is the only direction branch i can go (a ReLU input float64
passes can only be blocked), and A holds the branches within eps of deciding
the other way, eps per tapped layer being SAFETY times the largest
|x32 - x64| that PyTorch's own float32 forward shows at that layer, on this
machine, from the same state. The weights are fitted by least squares over
every tensor a flip reaches, in units of tol: a real flip shows its own
pattern in the convolution right below the ReLU as well as in conv1, so a
wrong kernel (a batch norm backward off by 0.1 %, one missing a term, a
convolution gradient of the wrong window) is not a combination of a few.

Branches are tried nearest-first (|x| / eps), 1, 2, 4, ... of them, until the
fit holds: a correct step needs a handful of partial backwards, not one per
branch, and a step whose gradients already match needs none (PyTorch's
float32 step is computed only then). The partial backwards run through
PyTorch's float32 graph of the same step (float64's decisions, float32's
graph: the difference is second order).
"""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

SAFETY = 4.0
# eps never below this fraction of the layer's largest input (about 8 float32
# ulps of it): a layer that float32 happens to compute almost exactly still
# has rounding of its own in another implementation.
EPS_FLOOR_REL = 2.0 ** -20


class _ReLUTap(nn.Module):
    """nn.ReLU, out of place, recording (input, output) per call (one module
    may be called twice, as torchvision's BasicBlock calls its relu)."""

    def __init__(self, log, name):
        super().__init__()
        self.log, self.name = log, name

    def forward(self, x):
        y = F.relu(x)
        y.retain_grad()
        self.log.append(("relu", self.name, x, y, None))
        return y


class _PoolTap(nn.Module):
    """nn.MaxPool2d recording (input, output, argmax indices)."""

    def __init__(self, log, name, pool):
        super().__init__()
        self.log, self.name = log, name
        self.k, self.s, self.p = pool.kernel_size, pool.stride, pool.padding
        if pool.dilation not in (1, (1, 1)) or pool.ceil_mode:
            raise ValueError("%s: only undilated floor-mode max pooling is tapped" % name)

    def forward(self, x):
        y, idx = F.max_pool2d(x, self.k, self.s, self.p, return_indices=True)
        y.retain_grad()
        self.log.append(("pool", self.name, x, y, idx))
        return y


def _tapped(model, dtype):
    """A copy of `model` in `dtype` whose ReLUs and max pools record."""
    m = copy.deepcopy(model).to(dtype)
    log = []
    for parent_name, parent in list(m.named_modules()):
        for name, child in list(parent.named_children()):
            full = (parent_name + "." if parent_name else "") + name
            if isinstance(child, nn.ReLU):
                setattr(parent, name, _ReLUTap(log, full))
            elif isinstance(child, nn.MaxPool2d):
                setattr(parent, name, _PoolTap(log, full, child))
    return m, log


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _pool_candidates(x, y, idx, k, s, p, eps):
    """Window elements within eps of the window's maximum other than the one
    taken, where the maximum is not itself within eps of 0 (a pool branch
    there is a ReLU branch of the taken element, which those count):
    [(gap, (n*c, taken flat index, other flat index, output flat index))]."""
    (kh, kw), (sh, sw), (ph, pw) = _pair(k), _pair(s), _pair(p)
    n, c, h, w = x.shape
    planes = x.reshape(n * c, 1, h, w)
    cols = F.unfold(F.pad(planes, (pw, pw, ph, ph), value=float("-inf")), (kh, kw),
                    stride=(sh, sw))                                  # [NC, kh*kw, L]
    where = torch.arange(h * w, dtype=x.dtype).reshape(1, 1, h, w)
    where = F.unfold(F.pad(where, (pw, pw, ph, ph), value=-1.0), (kh, kw),
                     stride=(sh, sw)).long()                          # [1, kh*kw, L]
    top = y.reshape(n * c, 1, -1)
    taken = idx.reshape(n * c, 1, -1)
    gap = top - cols
    near = (gap < eps) & (where != taken) & (where >= 0) & (top >= eps)
    out = []
    for nc, j, l in near.nonzero().tolist():
        out.append((gap[nc, j, l].item(),
                    (nc, taken[nc, 0, l].item(), where[0, j, l].item(), l)))
    return out


class Step:
    """PyTorch's forward and backward of `model` (train mode) on (x, y), in
    float64 and float32; `model` is not changed.

    loss, grads, buffers: float64 results (buffers after the step's forward:
    the batch norm running statistics). explain(): see the module docstring."""

    def __init__(self, model, x, y):
        m64, log64 = _tapped(model, torch.float64)
        m64.train()
        loss = F.cross_entropy(m64(x.double()), y)
        loss.backward()
        self.loss = loss.item()
        self.grads = {n: p.grad.detach() for n, p in m64.named_parameters()}
        self.buffers = {n: b.detach() for n, b in m64.named_buffers()}

        self._model, self._x, self._y = model, x, y
        self._log64 = log64
        self._m64 = m64
        self._candidates = None

    @property
    def candidates(self):
        """Every branch within eps of deciding the other way, nearest first:
        [(|x| / eps, tap, what to backward)]. Computed on first use (it needs
        PyTorch's float32 step): a step whose gradients match at rounding
        level never asks."""
        if self._candidates is None:
            self._find_branches()
        return self._candidates

    def _find_branches(self):
        log64, m64 = self._log64, self._m64
        m32, log32 = _tapped(self._model, torch.float32)
        m32.train()
        F.cross_entropy(m32(self._x.float()), self._y).backward(retain_graph=True)
        if [t[:2] for t in log32] != [t[:2] for t in log64]:
            raise AssertionError("float32 and float64 forwards tapped different layers")
        self._names = [n for n, _ in m32.named_parameters()]
        self._params = [p for _, p in m32.named_parameters()]
        self._log = log32
        candidates = []
        for t, ((kind, name, x64, y64, idx64), (_, _, x32, _, _)) in enumerate(zip(log64,
                                                                                log32)):
            x64 = x64.detach()
            err = (x32.detach().double() - x64).abs().max().item()
            eps = max(SAFETY * err, EPS_FLOOR_REL * x64.abs().max().item())
            if kind == "relu":
                u = log32[t][3].grad
                for i in (x64.abs() < eps).nonzero().tolist():
                    if u[tuple(i)].item() != 0.0:
                        candidates.append((abs(x64[tuple(i)].item()) / eps, t, ("relu", tuple(i))))
            else:
                pool = m64.get_submodule(name)
                for gap, where in _pool_candidates(x64, y64.detach(), idx64, pool.k, pool.s,
                                                   pool.p, eps):
                    candidates.append((gap / eps, t, ("pool", where)))
        self._candidates = sorted(candidates, key=lambda c: c[0])

    def _effect(self, t, what):
        """The signed change of every parameter gradient if branch i went the
        other way: {parameter: float32 tensor}, tensors it does not reach left
        out. A ReLU input float64 passes (x > 0) can only be blocked in
        float32 (the change is -e_i), one it blocks only passed (+e_i); a pool
        window's gradient moves from the input float64 took to the other."""
        _, _, x, y, _ = self._log[t]
        v = torch.zeros_like(x)
        if what[0] == "relu":
            v[what[1]] = y.grad[what[1]] * (-1.0 if self._log64[t][2][what[1]] > 0 else 1.0)
        else:
            nc, taken, other, l = what[1]
            u = y.grad.reshape(v.shape[0] * v.shape[1], -1)[nc, l]
            flat = v.view(v.shape[0] * v.shape[1], -1)
            flat[nc, other] += u
            flat[nc, taken] -= u
        gs = torch.autograd.grad(x, self._params, grad_outputs=v, retain_graph=True,
                                 allow_unused=True)
        return {n: g.detach() for n, g in zip(self._names, gs)
                if g is not None and bool(g.any())}

    def explain(self, diffs, tols):
        """diffs: {parameter: g32 - g64} (signed, float64); tols: {parameter:
        the rounding tolerance, absolute}. Looks for flips that explain every
        gradient: weights d_i in [0, 1] (1: branch i went the other way) such
        that, for every parameter and element,

            |g32 - g64 - sum_i d_i * change_i| <= tol,

        fitted by least squares in units of tol over every tensor a change
        reaches (so a flip must show its own pattern in the convolution right
        below it, not merely something of the right size in conv1), with the
        nearest branches first: 1, 2, 4, ... of them until the fit holds.
        Returns (unexplained, flips): unexplained is {parameter: largest
        excess over tol} for the gradients no fit explained (empty when all
        are right); flips is [(|x| / eps, layer name)] of the branches the fit
        gave a weight over 1/2."""
        if all(d.abs().max().item() <= tols[n] for n, d in diffs.items()):
            return {}, []
        changes = []            # per branch tried: {parameter: float32 change}
        gram = torch.zeros(0, 0, dtype=torch.float64)
        rhs = torch.zeros(0, dtype=torch.float64)
        size = 1
        while True:
            for _, t, what in self.candidates[len(changes):size]:
                c = self._effect(t, what)
                col = torch.tensor([sum((c[n].double() * o[n].double()).sum().item() / tols[n] ** 2
                                        for n in c if n in o) for o in changes],
                                   dtype=torch.float64)
                own = sum((e.double() ** 2).sum().item() / tols[n] ** 2 for n, e in c.items())
                gram = torch.cat([torch.cat([gram, col[:, None]], 1),
                                  torch.cat([col, torch.tensor([own], dtype=torch.float64)])[None]])
                rhs = torch.cat([rhs, torch.tensor(
                    [sum((e.double() * diffs[n]).sum().item() / tols[n] ** 2
                         for n, e in c.items())], dtype=torch.float64)])
                changes.append(c)
            weights = _box_least_squares(gram, rhs)
            residual = dict(diffs)
            for w, c in zip(weights.tolist(), changes):
                if w:
                    for n, e in c.items():
                        residual[n] = residual[n] - w * e.double()
            unexplained = {n: r.abs().max().item() - tols[n] for n, r in residual.items()}
            unexplained = {n: v for n, v in unexplained.items() if v > 0}
            if not unexplained or len(changes) == len(self.candidates):
                break
            size = min(2 * size, len(self.candidates))
        flips = [(self.candidates[i][0], self._log[self.candidates[i][1]][1])
                 for i, w in enumerate(weights.tolist()) if w > 0.5]
        return unexplained, flips


def _box_least_squares(gram, rhs, sweeps=500):
    """argmin 1/2 w'Gw - b'w over 0 <= w <= 1 (G positive semidefinite), by
    cyclic coordinate descent: each coordinate minimised exactly in turn, a
    convex problem, so it converges to the minimum."""
    w = torch.zeros_like(rhs)
    for _ in range(sweeps):
        before = w.clone()
        for j in range(len(w)):
            if gram[j, j] > 0:
                r = rhs[j] - gram[j] @ w + gram[j, j] * w[j]
                w[j] = min(1.0, max(0.0, (r / gram[j, j]).item()))
        if (w - before).abs().max().item() < 1e-9:
            break
    return w
