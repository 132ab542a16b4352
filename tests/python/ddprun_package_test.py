"""The Python package shipped in the wheel (python/ddprun), on files written
by a real `train` run: `python -m ddprun.checkpoint` and its loader into the
reference PyTorch LeNet (examples/pytorch/lenet.py), `python -m ddprun.plot`
and its data extraction, and the one-line messages when torch or matplotlib
is missing (each hidden by a module on PYTHONPATH that raises ImportError).

The PyTorch and real-plot cases run under the PyTorch 2.x test environment of
scripts/setup-test-deps.sh ($DDPRUN_TORCH2_VENV), which also gets matplotlib;
without it they are skipped, saying why.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
PACKAGE_ROOT = os.path.join(SOURCE, "python")
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))
sys.path.insert(0, PACKAGE_ROOT)
import testmain  # noqa: E402
from ddprun import checkpoint, plot  # noqa: E402

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(SOURCE, "build", "bin"))
TORCH2 = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
TORCH2_PYTHON = os.path.join(TORCH2, "bin", "python")
TIMEOUT = 600  # a bound against hangs on a loaded machine, not a speed check


def has_module(python, name):
    return os.access(python, os.X_OK) and subprocess.run(
        [python, "-c", "import " + name], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL).returncode == 0


class Package(unittest.TestCase):
    """One `train` run (2 epochs, synthetic data) writes the files all tests read."""

    @classmethod
    def setUpClass(cls):
        train = os.path.join(BIN, "train")
        if not os.access(train, os.X_OK):
            raise unittest.SkipTest("no train at %s (build it; DDPRUN_BIN_DIR names another)"
                                    % train)
        cls.tmp = tempfile.mkdtemp(prefix="ddprun_pkg_")
        cls.metrics = os.path.join(cls.tmp, "m.jsonl")
        cls.saved = os.path.join(cls.tmp, "final.safetensors")
        ckdir = os.path.join(cls.tmp, "ck")
        p = subprocess.run([train, "--data", "synthetic", "--train-samples", "256",
                            "--test-samples", "64", "--epochs", "2", "--log-interval", "1",
                            "--metrics", cls.metrics, "--checkpoint-dir", ckdir,
                            "--save", cls.saved, "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=cls.tmp, timeout=TIMEOUT)
        if p.returncode != 0:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise AssertionError("train failed (exit %d): %s" % (p.returncode, p.stderr[-3000:]))
        cls.final = json.loads(p.stdout.strip().splitlines()[-1])
        # 2 epochs of 4 steps: checkpoints at global steps 4 and 8.
        cls.ckpt = os.path.join(ckdir, sorted(os.listdir(ckdir))[-1])
        # Modules that cannot be imported, put first on PYTHONPATH.
        cls.hide = os.path.join(cls.tmp, "hide")
        os.mkdir(cls.hide)
        for name in ("torch", "matplotlib"):
            with open(os.path.join(cls.hide, name + ".py"), "w") as f:
                f.write("raise ImportError('hidden by the test')\n")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def module(self, name, *args, python=sys.executable, hide=False):
        path = ([self.hide] if hide else []) + [PACKAGE_ROOT]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        return subprocess.run([python, "-m", name] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=self.tmp,
                              timeout=TIMEOUT)

    def assert_one_line_exit_2(self, p, *needles):
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        for n in needles:
            self.assertIn(n, p.stderr)

    # ---------------------------------------------------------------- checkpoint

    def test_checkpoint_lists_metadata_and_tensors_without_torch(self):
        p = self.module("ddprun.checkpoint", self.ckpt, hide=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        # Metadata as aligned "key  value" rows (the column's width follows
        # the longest key), then the tensors.
        for key, value in (("format", "ddprun-train-1"), ("global_step", "8"), ("model", "lenet"),
                           ("run_samples", "512")):
            self.assertRegex(p.stdout, r"(?m)^  %s +%s$" % (key, re.escape(value)))
        for line in ("conv1.weight  F32  [6, 1, 5, 5]", "fc3.bias      F32  [10]",
                     "optim.fc1.weight.momentum_buffer    F32  [120, 400]", "20 tensors"):
            self.assertIn(line, p.stdout)
        p = self.module("ddprun.checkpoint", self.saved, hide=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("format  ddprun-train-model", p.stdout)
        self.assertNotIn("optimizer state", p.stdout)

    def test_loading_without_torch_exits_2_naming_the_fix(self):
        p = self.module("ddprun.checkpoint", "--load", self.saved, hide=True)
        self.assert_one_line_exit_2(p, "needs PyTorch", "pip install torch")

    def test_malformed_files_are_refused_naming_what_is_wrong(self):
        def write(name, header, data=b"", raw_header=None):
            text = raw_header if raw_header is not None else json.dumps(header).encode()
            path = os.path.join(self.tmp, name)
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(text)) + text + data)
            return path

        good = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "__metadata__": {"format": "x"}}
        entries, meta, start = checkpoint.read_header(write("good", good, b"\0" * 8))
        self.assertEqual(entries, [checkpoint.Entry("w", "F32", (2,), 0, 8)])
        self.assertEqual((meta, start), ({"format": "x"}, 8 + len(json.dumps(good))))
        short = os.path.join(self.tmp, "short")
        with open(short, "wb") as f:
            f.write(b"\1\2\3")
        cases = [
            (short, "shorter than 8 bytes"),
            (self.metrics, "header length"),  # JSON lines read as safetensors
            (write("notjson", None, raw_header=b"{nope"), "not JSON"),
            (write("past", good, b"\0" * 4), "lies outside the file"),
            (write("size", {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
                   b"\0" * 8), "8 bytes for shape [3] F32"),
            (write("dtype", {"w": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
             "dtype 'Q7'"),
            (write("meta", {"__metadata__": {"n": 1}}), "__metadata__"),
        ]
        for path, needle in cases:
            with self.subTest(path=os.path.basename(path)):
                with self.assertRaises(checkpoint.CheckpointError) as cm:
                    checkpoint.read_header(path)
                self.assertIn(needle, str(cm.exception))
                self.assertTrue(str(cm.exception).startswith(path + ": "))
        p = self.module("ddprun.checkpoint", os.path.join(self.tmp, "past"))
        self.assert_one_line_exit_2(p, "lies outside the file")
        p = self.module("ddprun.checkpoint", os.path.join(self.tmp, "missing"))
        self.assert_one_line_exit_2(p, "No such file")

    def test_loads_into_the_reference_lenet_strictly_in_pytorch(self):
        if not has_module(TORCH2_PYTHON, "torch"):
            self.skipTest("no PyTorch 2.x environment at %s (scripts/setup-test-deps.sh makes it; "
                          "DDPRUN_TORCH2_VENV names another)" % TORCH2)
        script = r"""
import json, os, sys, torch
sys.path.insert(0, sys.argv[1])
import lenet
from ddprun import checkpoint
saved, ckpt, out, tmp = sys.argv[2:6]
res = {}
# --save file -> strict load into the reference module: bitwise train's model.
model = lenet.LeNet()
result, meta = checkpoint.load_into(saved, model, strict=True)
res["missing"], res["unexpected"] = list(result.missing_keys), list(result.unexpected_keys)
res["save_meta"] = meta
res["sha"] = lenet.params_sha256(model)
# The checkpoint: the same parameters (it is the last step), and the SGD
# momentum buffers in torch.optim.SGD, equal to an independent reader's.
state, optim, meta = checkpoint.load(ckpt)
res["ckpt_meta"] = meta
res["same_as_saved"] = all(torch.equal(state[k], v) for k, v in model.state_dict().items())
model2 = lenet.LeNet()
sgd = torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9)
checkpoint.load_into(ckpt, model2, sgd)
ref = lenet.load_safetensors(ckpt)
named = dict(model2.named_parameters())
res["momentum_ok"] = len(sgd.state) == len(named) and all(
    torch.equal(sgd.state[p]["momentum_buffer"], ref["optim.%s.momentum_buffer" % n])
    for n, p in named.items())
# Every dtype train may write, an empty and a 0-d tensor, round trip.
t = {"f64": torch.randn(3, dtype=torch.float64), "bf16": torch.randn(2, 3).bfloat16(),
     "f16": torch.randn(5).half(), "i64": torch.arange(-3, 4), "i32": torch.arange(4).int(),
     "i16": torch.tensor([-2, 7], dtype=torch.int16), "i8": torch.tensor([-1], dtype=torch.int8),
     "u8": torch.tensor([255, 0], dtype=torch.uint8), "b": torch.tensor([True, False]),
     "empty": torch.zeros(0, 4), "scalar": torch.tensor(1.5), "optim.w.exp_avg": torch.ones(2)}
path = os.path.join(tmp, "dtypes.safetensors")
lenet.save_safetensors(path, t, {"k": "v"})
state, optim, meta = checkpoint.load(path)
state["optim.w.exp_avg"] = optim["w"]["exp_avg"]
res["dtypes_ok"] = meta == {"k": "v"} and set(state) == set(t) and all(
    state[k].dtype == v.dtype and state[k].shape == v.shape and torch.equal(state[k], v)
    for k, v in t.items())
json.dump(res, open(out, "w"))
"""
        out = os.path.join(self.tmp, "torch_result.json")
        env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
        p = subprocess.run([TORCH2_PYTHON, "-c", script, os.path.join(SOURCE, "examples", "pytorch"),
                            self.saved, self.ckpt, out, self.tmp], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env, timeout=TIMEOUT)
        self.assertEqual(p.returncode, 0, p.stdout[-4000:])
        with open(out) as f:
            res = json.load(f)
        self.assertEqual((res["missing"], res["unexpected"]), ([], []))
        self.assertEqual(res["save_meta"], {"format": "ddprun-train-model", "model": "lenet"})
        self.assertEqual(res["sha"], self.final["params_sha256"],
                         "the loaded module is not bitwise train's final model")
        self.assertEqual(res["ckpt_meta"]["format"], "ddprun-train-1")
        self.assertEqual(res["ckpt_meta"]["global_step"], str(self.final["steps"]))
        self.assertTrue(res["same_as_saved"])
        self.assertTrue(res["momentum_ok"])
        self.assertTrue(res["dtypes_ok"])
        p = self.module("ddprun.checkpoint", "--load", self.ckpt, python=TORCH2_PYTHON)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("loaded with torch: 20 tensors", p.stdout)

    # ---------------------------------------------------------------- plot

    def test_curves_of_a_real_run(self):
        steps, epochs, final = plot.read_metrics(self.metrics)
        self.assertEqual(len(steps), self.final["steps"])
        self.assertEqual(final["params_sha256"], self.final["params_sha256"])
        c = plot.curves(steps, epochs)
        self.assertEqual([x for x, _ in c["loss"]], list(range(1, 9)))
        self.assertEqual([x for x, _ in c["epoch_loss"]], [4, 8])  # each epoch's last step
        self.assertEqual([x for x, _ in c["accuracy"]], [1, 2])
        self.assertEqual(c["accuracy"][-1][1], self.final["test_accuracy"])
        self.assertIn("test accuracy %.4f" % self.final["test_accuracy"],
                      plot.summary("run", final))

    def test_plot_without_matplotlib_exits_2_naming_the_fix(self):
        png = os.path.join(self.tmp, "none.png")
        p = self.module("ddprun.plot", self.metrics, "-o", png, hide=True)
        self.assert_one_line_exit_2(p, "matplotlib is not installed", "pip install 'ddprun[plot]'",
                                    "pip install matplotlib")
        self.assertFalse(os.path.exists(png))
        # The clone's script is the same code.
        env = dict(os.environ, PYTHONPATH=self.hide)
        p = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "bench",
                                                         "plot_metrics.py"), self.metrics, "-o", png],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           timeout=TIMEOUT)
        self.assert_one_line_exit_2(p, "plot_metrics.py: matplotlib is not installed")

    def test_plot_of_a_file_without_records_exits_2(self):
        bad = os.path.join(self.tmp, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"type": "resume"}\n')
        self.assert_one_line_exit_2(self.module("ddprun.plot", bad, hide=True),
                                    "no step or epoch lines")
        with open(bad, "w") as f:
            f.write("{\n")
        self.assert_one_line_exit_2(self.module("ddprun.plot", bad, hide=True), "bad.jsonl:1: not JSON")

    def test_plot_draws_a_png(self):
        python = next((py for py in (sys.executable, TORCH2_PYTHON)
                       if has_module(py, "matplotlib")), None)
        if python is None:
            self.skipTest("matplotlib is in neither %s nor %s (scripts/setup-test-deps.sh puts it "
                          "into the latter)" % (sys.executable, TORCH2_PYTHON))
        png = os.path.join(self.tmp, "curves.png")
        p = self.module("ddprun.plot", self.metrics, self.metrics, "--labels", "a,b", "-o", png,
                        python=python)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("wrote " + png, p.stdout)
        self.assertIn("a: world 1, 8 steps", p.stdout)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    testmain.main()
