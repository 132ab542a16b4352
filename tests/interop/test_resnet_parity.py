"""`train --model resnet18` computes what PyTorch computes, on the CPU.

Same initial weights (PyTorch's module saved as safetensors, passed with
--init), same batches (--no-shuffle, the first STEPS * BATCH samples of
--data synthetic-cifar, which tests/interop/synthetic_cifar.py reproduces in
numpy), same SGD with momentum. For each stem (cifar; imagenet at 32x32):

  1. replay: train checkpoints after every step (--checkpoint-every 1: weights,
     batch norm buffers, momentum buffers); PyTorch starts from train's state
     after step s-1 and computes step s in float64 (branch_bound.Step). Its
     loss equals train's step-s loss within 1e-4 for all STEPS steps, the
     running statistics within 1e-5 and num_batches_tracked exactly. The
     gradient train applied (its momentum buffer minus 0.9 times the previous
     one) equals float64's within 1e-4 (scaled by the tensor's largest
     gradient when that exceeds 1) once the branches train took the other way
     are accounted for: a ReLU input within float32 rounding of 0 (a few dozen
     of ~10^6 a step) goes either way depending on the order of the sums that
     made it, that is on the CPU's oneDNN and OpenBLAS kernels, and a flip
     moves the first layer's gradient by up to ~1e-2. So the decision is not
     "how often did train match" (that count is a property of the machine: an
     AMD EPYC gave 3 steps of 10 where an Intel Xeon gave 4, and every step
     of it is correct) but "is the difference exactly the effect of some
     flips": branch_bound.Step finds every branch within 4x PyTorch's own
     float32 error of 0, computes what flipping each does to every gradient
     (the backward of that element's upstream gradient alone: exact, since
     the backward is linear once the forward is fixed), and fits flip weights
     in [0, 1] over every tensor a flip reaches; what the fit leaves must be
     rounding. A flip leaves its own pattern in the convolution below it as
     well as in conv1, so no combination of a few fakes a wrong kernel: a
     batch norm backward whose x-hat term is 1 % off, one that drops the
     mean, a convolution's dL/dx 1 % off or a weight gradient with two taps
     of its window swapped all fail at step 1 (scripts/replay_fault_check.sh
     builds train with each; the self-test below fakes a 0.1 % one in every
     run). Nothing here depends on which machine computed it: the branch set
     and their effects come from float64, and any float32 rounding, this
     machine's or another's, flips only branches inside it (train's flips
     sat within 0.12 of the bound on an AVX-512 Xeon, natively and with
     oneDNN and OpenBLAS held to AVX2);
  2. free running (imagenet stem; the cifar stem costs 4x and adds nothing
     the replay does not check): train's per-step losses against PyTorch
     running the same STEPS steps from the same start, within 1e-4 or 10x
     PyTorch's own spread at that step (PyTorch against itself with the
     initial weights nudged by 1e-7), whichever is larger. ResNet-18 at batch
     8 is chaotic: a 1e-7 nudge moves PyTorch's own loss by ~1e-3 within 3 to
     6 steps (ReLU decisions at rounding level change the gradient), so no
     float32 implementation short of PyTorch's exact kernels holds 1e-4
     there; the replay is the exact check;
  3. train's final weights (--save) load into torchvision's resnet18 layout
     with load_state_dict(strict=True), and PyTorch's test accuracy with them
     equals the count train reported.

Then 2 ranks = 1 rank at twice the batch: `ddprun --nproc_per_node=2 train
--batch-size 4 --sync-bn` against one `train --batch-size 8 --sync-bn` (the
same samples each step, global batch norm statistics, imagenet stem): the
state after the first step (weights, gradients as momentum buffers, running
statistics) within 1e-5 relative (L2, per tensor), the losses of the first
IDENTITY_STEPS steps within 1e-4. Not further: the two differ in the order of
float32 gradient sums (~1e-7 relative), and the chaos above amplifies that as
it amplifies a nudge.

Works with PyTorch 1.13 and 2.x; uses torchvision's resnet18 when it is
installed, else a module with its structure and names (resnet_reference.py).
"""
import copy
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "../.."))
sys.path.insert(0, os.path.join(ROOT, "examples/pytorch"))
sys.path.insert(0, os.path.join(ROOT, "tests/pyutil"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import branch_bound  # noqa: E402
import lenet  # noqa: E402  (safetensors reader and writer)
import resnet_reference  # noqa: E402
import synthetic_cifar  # noqa: E402
from storeutil import BIN  # noqa: E402

STEPS, BATCH, LR, MOMENTUM = 10, 8, 0.01, 0.9
TEST_SAMPLES = 64
IDENTITY_STEPS = 2
IDENTITY_REL = 1e-5  # L2, relative: 1 rank against 2 after one step
LOSS_TOL = 1e-4
GRAD_TOL = 1e-4   # absolute, times max(1, the tensor's largest gradient)
STAT_TOL = 1e-5   # absolute, times max(1, the statistic)
CHAOS_FACTOR = 10.0
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
               "TORCHELASTIC_RUN_ID")


def clean_env():
    return {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}


def train_flags(stem, init, samples, batch):
    """One epoch over the first `samples` training samples, unshuffled."""
    return ["--model", "resnet18", "--data", "synthetic-cifar", "--stem", stem, "--init", init,
            "--no-shuffle", "--train-samples", str(samples), "--epochs", "1",
            "--batch-size", str(batch), "--lr", str(LR), "--momentum", str(MOMENTUM),
            "--log-interval", "1"]


def step_losses(metrics, steps):
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    losses = [r["loss"] for r in rows if r.get("type") == "step"]
    if len(losses) != steps:
        raise AssertionError("expected %d step records in %s, got %d" % (steps, metrics,
                                                                         len(losses)))
    return losses, [r for r in rows if r.get("type") == "final"][-1]


def run(cmd, cwd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=cwd,
                       env=dict(clean_env(), PYTHON_EXEC=sys.executable, GLOO_SOCKET_IFNAME="lo"))
    if p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s\n%s" % (" ".join(cmd), p.returncode,
                                                        p.stdout[-2000:], p.stderr[-4000:]))
    return p


def load_module(path, stem):
    model = resnet_reference.build(stem)
    lenet.load_state_dict(path, model, strict=True)
    return model


def module_at(stem, state):
    """PyTorch's module holding a train checkpoint's weights and buffers."""
    model = resnet_reference.build(stem)
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("optim.")},
                          strict=True)
    return model


def applied_gradient(state, prev, name, step):
    """The gradient train applied at `step` from its momentum buffers:
    buf_s = MOMENTUM * buf_{s-1} + g_s (buf_1 = g_1)."""
    buf = state["optim.%s.momentum_buffer" % name]
    return buf if step == 1 else buf - MOMENTUM * prev["optim.%s.momentum_buffer" % name]


def checkpoints(directory):
    """{global step: path} of train's checkpoints."""
    out = {}
    for path in glob.glob(os.path.join(directory, "ckpt-*.safetensors")):
        out[int(re.search(r"-(\d+)\.safetensors$", path).group(1))] = path
    return out


def reference_losses(model, xy, nudge=0.0, seed=0):
    """PyTorch's own STEPS steps from `model` (weights nudged by `nudge`)."""
    model = copy.deepcopy(model)
    if nudge:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + nudge * torch.randn(p.shape, generator=g))
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = xy
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = F.cross_entropy(model(x[s * BATCH:(s + 1) * BATCH]), y[s * BATCH:(s + 1) * BATCH])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _scaled_grad(inputs, k):
    """A forward pre-hook's inputs whose gradient is multiplied by k on its
    way back: a module whose dL/dx is k times the right one."""
    x = inputs[0] * 1.0
    x.register_hook(lambda g: g * k)
    return (x,) + tuple(inputs[1:])


class ResNetParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(os.path.join(BIN, "train"), os.X_OK):
            raise AssertionError("no train binary in " + BIN)
        torch.set_num_threads(1)
        print("PyTorch %s; reference: %s" % (torch.__version__,
                                             resnet_reference.implementation()))
        cls.tmp = tempfile.mkdtemp(prefix="resnet_parity_")
        cls.train_xy = synthetic_cifar.load("train", STEPS * BATCH)
        cls.test_xy = synthetic_cifar.load("test", TEST_SAMPLES)
        cls.runs = {}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def initial(self, stem):
        """PyTorch's freshly initialised module and its safetensors file."""
        torch.manual_seed(0)
        model = resnet_reference.build(stem)
        path = os.path.join(self.tmp, "init_%s.safetensors" % stem)
        lenet.save_state_dict(path, model)
        return model, path

    def full_run(self, stem):
        """train's STEPS steps of one stem (cached): losses, summary, files."""
        if stem in self.runs:
            return self.runs[stem]
        model, init = self.initial(stem)
        d = os.path.join(self.tmp, stem)
        os.makedirs(d)
        metrics = os.path.join(d, "m.jsonl")
        final = os.path.join(d, "final.safetensors")
        ckpt = os.path.join(d, "ckpt")
        run([os.path.join(BIN, "train"), *train_flags(stem, init, STEPS * BATCH, BATCH),
             "--test-samples", str(TEST_SAMPLES), "--metrics", metrics, "--save", final,
             "--checkpoint-dir", ckpt, "--checkpoint-every", "1", "--keep-checkpoints",
             str(STEPS + 1), "--quiet"], d)
        losses, summary = step_losses(metrics, STEPS)
        self.runs[stem] = (model, init, losses, summary, final, checkpoints(ckpt))
        return self.runs[stem]

    # ------------------------------------------------------------------ replay
    def replay(self, stem):
        model, init, losses, _, _, ckpts = self.full_run(stem)
        self.assertEqual(sorted(ckpts), list(range(1, STEPS + 1)), "checkpoints after each step")
        x, y = self.train_xy
        prev = lenet.load_safetensors(init)
        worst = {"loss": 0.0, "grad": 0.0, "stats": 0.0, "ratio": 0.0}
        flips = []  # per step: the branches train took the other way
        for s in range(1, STEPS + 1):
            ours = lenet.load_safetensors(ckpts[s])
            batch = x[(s - 1) * BATCH:s * BATCH], y[(s - 1) * BATCH:s * BATCH]
            ref = branch_bound.Step(module_at(stem, prev), *batch)
            d = abs(ref.loss - losses[s - 1])
            worst["loss"] = max(worst["loss"], d)
            self.assertLessEqual(d, LOSS_TOL, "%s step %d from train's state: PyTorch's loss "
                                 "%.7f (float64), train's %.7f" % (stem, s, ref.loss,
                                                                   losses[s - 1]))
            diffs, tols = {}, {}
            for n, g64 in ref.grads.items():
                diffs[n] = applied_gradient(ours, prev, n, s).double() - g64
                tols[n] = GRAD_TOL * max(1.0, g64.abs().max().item())
                worst["grad"] = max(worst["grad"],
                                    diffs[n].abs().max().item() / tols[n] * GRAD_TOL)
            unexplained, flipped = ref.explain(diffs, tols)
            for n, over in sorted(unexplained.items()):
                self.fail("%s step %d: train's gradient of %s is off PyTorch's (float64) by %.3g "
                          "more than rounding (%.3g) and any flips of the %d branches within "
                          "rounding of deciding the other way explain"
                          % (stem, s, n, over, tols[n], len(ref.candidates)))
            flips.append(len(flipped))
            worst["ratio"] = max([worst["ratio"]] + [r for r, _ in flipped])
            for n, b in ref.buffers.items():
                if b.dtype.is_floating_point:
                    scale = max(1.0, b.abs().max().item())
                    diff = (ours[n].double() - b).abs().max().item()
                    worst["stats"] = max(worst["stats"], diff / scale)
                    self.assertLessEqual(diff, STAT_TOL * scale, "%s step %d: %s differs by "
                                         "%.3g" % (stem, s, n, diff))
                else:
                    self.assertTrue(torch.equal(ours[n], b) and int(b) == s,
                                    "%s step %d: %s is %s in train's checkpoint, PyTorch "
                                    "has %s" % (stem, s, n, ours[n], b))
            prev = ours
        print("%s replay over %d steps: worst |loss diff| %.2e; worst gradient diff %.2e "
              "(relative to max(1, largest gradient), flips included); branches train took "
              "the other way per step %s, the farthest from 0 at %.2f eps; worst running "
              "statistic diff %.2e"
              % (stem, STEPS, worst["loss"], worst["grad"], flips, worst["ratio"],
                 worst["stats"]))

    def test_cifar_stem_replay(self):
        self.replay("cifar")

    def test_imagenet_stem_replay(self):
        self.replay("imagenet")

    def test_replay_rule_refuses_wrong_gradients_and_accepts_float32(self):
        """The replay's decision on PyTorch's own float32 step (accepted, its
        flips found) and on the same step with every batch norm's dL/dx
        0.1 % short (refused): the checker checked in every run, without a
        scratch build (scripts/replay_fault_check.sh does it with faults in
        train itself)."""
        torch.manual_seed(0)
        model = resnet_reference.build("cifar")
        x, y = self.train_xy[0][:BATCH], self.train_xy[1][:BATCH]
        ref = branch_bound.Step(model, x, y)
        for fault in (None, 0.999):
            m = copy.deepcopy(model)
            m.train()
            hooks = [mod.register_forward_pre_hook(lambda _m, inp, k=fault: _scaled_grad(inp, k))
                     for mod in m.modules() if fault and isinstance(mod, torch.nn.BatchNorm2d)]
            F.cross_entropy(m(x), y).backward()
            for h in hooks:
                h.remove()
            diffs = {n: p.grad.double() - ref.grads[n] for n, p in m.named_parameters()}
            tols = {n: GRAD_TOL * max(1.0, g.abs().max().item()) for n, g in ref.grads.items()}
            unexplained, flips = ref.explain(diffs, tols)
            print("float32 with batch norm's dL/dx times %s: %d gradients unexplained, %d flips "
                  "of %d branches" % (fault or 1, len(unexplained), len(flips),
                                      len(ref.candidates)))
            if fault:
                self.assertTrue(unexplained, "a batch norm dL/dx %g times the right one passed "
                                "the replay's rule" % fault)
            else:
                self.assertEqual(unexplained, {}, "PyTorch's own float32 step failed the rule")

    # ------------------------------------------------------------ free running
    def free_running(self, stem):
        model, _, ours, _, _, _ = self.full_run(stem)
        theirs = reference_losses(model, self.train_xy)
        spread = [0.0] * STEPS
        for seed in (1, 2):
            nudged = reference_losses(model, self.train_xy, 1e-7, seed)
            spread = [max(a, abs(b - c)) for a, b, c in zip(spread, nudged, theirs)]
        print("%s free running: step, train, PyTorch, |diff|, PyTorch's own spread" % stem)
        for s, (a, b, sp) in enumerate(zip(ours, theirs, spread), 1):
            print("  %2d  %.7f  %.7f  %.2e  %.2e" % (s, a, b, abs(a - b), sp))
        for s, (a, b, sp) in enumerate(zip(ours, theirs, spread), 1):
            bound = max(LOSS_TOL, CHAOS_FACTOR * sp)
            self.assertLessEqual(abs(a - b), bound, "%s step %d: train's loss %.7f, PyTorch's "
                                 "%.7f" % (stem, s, a, b))

    def test_imagenet_stem_free_running(self):
        self.free_running("imagenet")

    # ------------------------------------------------------ PyTorch loads ours
    def loads_and_counts(self, stem):
        _, _, _, summary, final, _ = self.full_run(stem)
        model = load_module(final, stem)  # strict=True
        if resnet_reference.torchvision is None:
            names = list(model.state_dict())
            self.assertEqual(len(names), 122)  # torchvision's resnet18 state_dict
            self.assertEqual(names[:3], ["conv1.weight", "bn1.weight", "bn1.bias"])
        model.eval()
        x, y = self.test_xy
        with torch.no_grad():
            correct = int((model(x).argmax(1) == y).sum())
        print("%s test: train counts %s/%s correct, PyTorch with train's weights %d/%d"
              % (stem, summary["test_correct"], summary["test_total"], correct, len(y)))
        self.assertEqual(summary["test_total"], len(y))
        self.assertEqual(summary["test_correct"], correct)

    def test_cifar_stem_checkpoint_loads_into_torchvision_layout(self):
        self.loads_and_counts("cifar")

    def test_imagenet_stem_checkpoint_loads_into_torchvision_layout(self):
        self.loads_and_counts("imagenet")

    # ------------------------------------------------- 2 ranks = 1 rank at 2B
    def test_two_ranks_equal_one_rank_at_twice_the_batch(self):
        _, init = self.initial("imagenet")
        d = tempfile.mkdtemp(dir=self.tmp)
        runs = {}
        for name, launcher, batch in (("one", [], BATCH),
                                      ("two", [os.path.join(BIN, "ddprun"), "--standalone",
                                               "--nproc_per_node=2", "--no_python"],
                                       BATCH // 2)):
            metrics = os.path.join(d, name + ".jsonl")
            ckpt = os.path.join(d, name)
            # The same samples either way: IDENTITY_STEPS * BATCH of them.
            run([*launcher, os.path.join(BIN, "train"),
                 *train_flags("imagenet", init, IDENTITY_STEPS * BATCH, batch), "--sync-bn",
                 "--test-samples", "16", "--metrics", metrics, "--checkpoint-dir", ckpt,
                 "--checkpoint-every", "1"], d)
            losses, summary = step_losses(metrics, IDENTITY_STEPS)
            runs[name] = (losses, summary, lenet.load_safetensors(checkpoints(ckpt)[1]))
        (l1, s1, c1), (l2, s2, c2) = runs["one"], runs["two"]
        self.assertEqual((s1["world"], s2["world"]), (1, 2))
        print("2 ranks x %d against 1 rank x %d: losses %s and %s"
              % (BATCH // 2, BATCH, ["%.7f" % v for v in l2], ["%.7f" % v for v in l1]))
        for s, (a, b) in enumerate(zip(l1, l2), 1):
            self.assertLessEqual(abs(a - b), LOSS_TOL, "step %d: 1 rank %.7f, 2 ranks %.7f"
                                 % (s, a, b))
        # After the first step: the gradients (momentum buffers) and running
        # statistics agree up to float32 summation order.
        self.assertEqual(sorted(c1), sorted(c2))
        worst = 0.0
        for n in c1:
            if c1[n].dtype.is_floating_point:
                rel = ((c1[n] - c2[n]).norm() / max(c1[n].norm(), 1e-30)).item()
                worst = max(worst, rel)
                self.assertLessEqual(rel, IDENTITY_REL, "after step 1, %s differs between 1 and "
                                     "2 ranks by %.3g relative" % (n, rel))
            else:
                self.assertTrue(torch.equal(c1[n], c2[n]), n)
        print("2 ranks against 1 rank after step 1: worst relative difference of a weight, "
              "gradient or running statistic %.2e" % worst)


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
