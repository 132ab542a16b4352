"""`train --data <path>` on CIFAR-10/100 directories as torchvision leaves them.

Small sets written by tests/pyutil/cifar_files.py (64 images per train file,
32 test images) in the python (pickle) and binary layouts:
- the real `train` trains 2 steps of resnet18 on each and reports the set in
  its final JSON's "data";
- damaged files make it exit 2 with one stderr line naming the file;
- the trainer's reader (through the cifar_dump test tool) returns exactly the
  generator's pixels and labels, for pickles of protocols 2 to 5, and, where
  torchvision is installed (/opt/ddprun-test/venv-torch2, or
  DDPRUN_TORCH2_VENV), exactly what torchvision.datasets.CIFAR10/100 reads
  from the same files (skipped, with the reason, where it is absent).
Needs numpy (the generator); skips (77) without it."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))

import testmain  # noqa: E402

VENV = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
VENV_PY = os.path.join(VENV, "bin", "python")


def _reexec_with_numpy(why):
    """ctest's Python may lack numpy: run this file again with the first
    interpreter that has it (Debian's python3-numpy, the torch venv)."""
    if os.environ.get("DDPRUN_CIFAR_REEXEC"):
        return
    for py in ("/usr/bin/python3", VENV_PY):
        if not os.access(py, os.X_OK) or os.path.realpath(py) == os.path.realpath(sys.executable):
            continue
        if subprocess.run([py, "-c", "import numpy"], capture_output=True).returncode == 0:
            sys.stdout.flush()
            os.environ["DDPRUN_CIFAR_REEXEC"] = why
            os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


try:
    import numpy as np
    import cifar_files
    NUMPY = None
except ImportError as e:  # pragma: no cover - depends on the machine
    NUMPY = "numpy is not installed for %s (%s): the CIFAR generator needs it" % (
        sys.executable, e)
    _reexec_with_numpy(NUMPY)

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(HERE, "../../build/bin"))
TRAIN = os.path.join(BIN, "train")
DUMP = os.path.join(BIN, "cifar_dump")
LAYOUTS = ["cifar10", "cifar100", "cifar10-bin", "cifar100-bin"]
SET_NAME = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "cifar10-bin": "CIFAR-10",
            "cifar100-bin": "CIFAR-100"}
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE",
               "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")

# Reads a generated root with torchvision (its md5 table replaced by the
# generated files' own, the only difference from the real downloads) and
# writes the pixels back in the files' NCHW order.
TORCHVISION_READ = r"""
import hashlib, json, os, sys
import numpy as np
from torchvision.datasets import CIFAR10, CIFAR100
root, which, out = sys.argv[1:4]
base = CIFAR10 if which == "cifar10" else CIFAR100
folder = os.path.join(root, base.base_folder)
def md5(name):
    with open(os.path.join(folder, name), "rb") as f:
        return hashlib.md5(f.read()).hexdigest()
class Generated(base):
    train_list = [[n, md5(n)] for n, _ in base.train_list]
    test_list = [[n, md5(n)] for n, _ in base.test_list]
    meta = dict(base.meta, md5=md5(base.meta["filename"]))
res = {}
for split in ("train", "test"):
    ds = Generated(root, train=split == "train", download=False)
    nchw = np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2))
    with open(os.path.join(out, "tv_" + split), "wb") as f:
        f.write(nchw.tobytes())
    res[split] = [int(t) for t in ds.targets]
print(json.dumps(res))
"""


def clean_env():
    return {k: v for k, v in os.environ.items()
            if k not in LAUNCH_VARS and not k.startswith("PET_")}


def final_json(stdout):
    lines = [l for l in stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def torchvision_problem():
    """Why torchvision cannot be used here, or None."""
    if not os.access(VENV_PY, os.X_OK):
        return "no Python at %s (set DDPRUN_TORCH2_VENV)" % VENV_PY
    p = subprocess.run([VENV_PY, "-c", "import torchvision, numpy"], capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        return "torchvision is not importable by %s: %s" % (
            VENV_PY, (p.stderr.strip().splitlines() or ["?"])[-1])
    return None


class CifarCase(unittest.TestCase):
    def setUp(self):
        if NUMPY:
            self.skipTest(NUMPY)
        self.tmp = tempfile.mkdtemp(prefix="ddprun-cifar-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def root(self, layout, name=None, **kw):
        root = os.path.join(self.tmp, name or layout)
        os.makedirs(root, exist_ok=True)
        arrays = cifar_files.write(root, layout, **kw)
        return root, arrays

    def train(self, data, *extra):
        if not os.access(TRAIN, os.X_OK):
            self.skipTest("%s is not built" % TRAIN)
        cmd = [TRAIN, "--device", "cpu", "--model", "resnet18", "--stem", "cifar",
               "--data", data, "--epochs", "1", "--max-steps", "2", "--batch-size", "8",
               "--train-samples", "64", "--test-samples", "32", "--quiet"] + list(extra)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=clean_env())

    def dump(self, path, fmt="auto", *caps):
        if not os.access(DUMP, os.X_OK):
            self.skipTest("%s is not built (the cifar_dump target)" % DUMP)
        out = tempfile.mkdtemp(dir=self.tmp)
        p = subprocess.run([DUMP, path, fmt, out] + [str(c) for c in caps],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr)
        got = json.loads(p.stdout)
        for split in ("train", "test"):
            with open(os.path.join(out, split + "_pixels"), "rb") as f:
                got[split]["pixels"] = f.read()
        return got

    def assertSame(self, got, arrays, split, n=None):
        data, labels = arrays[split]
        n = len(labels) if n is None else n
        self.assertEqual(got[split]["size"], n)
        self.assertEqual(got[split]["labels"], list(labels[:n]))
        self.assertTrue(got[split]["pixels"] == data[:n].tobytes(),
                        "%s pixels differ from the generator's" % split)


class TrainOnCifar(CifarCase):
    """The real trainer on each layout: exit 0, "data" names the set."""

    def check_layout(self, layout):
        root, _ = self.root(layout)
        p = self.train(root)
        self.assertEqual(p.returncode, 0, "stdout:\n%s\nstderr:\n%s" % (p.stdout, p.stderr))
        summary = final_json(p.stdout)
        self.assertIsNotNone(summary, p.stdout)
        d = os.path.join(root, cifar_files.LAYOUT_DIRS[layout])
        self.assertEqual(summary["data"], "%s (%s)" % (SET_NAME[layout], d))
        # The batches directory itself works as well as torchvision's root.
        p = self.train(d)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(final_json(p.stdout)["data"], "%s (%s)" % (SET_NAME[layout], d))

    def test_cifar10_python(self):
        self.check_layout("cifar10")

    def test_cifar100_python(self):
        self.check_layout("cifar100")

    def test_cifar10_binary(self):
        self.check_layout("cifar10-bin")

    def test_cifar100_binary(self):
        self.check_layout("cifar100-bin")


class DamagedCifar(CifarCase):
    """Bad files: exit 2, one stderr line naming the file, never a crash."""

    def expect_refused(self, root, path, *words):
        p = self.train(root)
        self.assertEqual(p.returncode, 2, "stdout:\n%s\nstderr:\n%s" % (p.stdout, p.stderr))
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn(path, lines[0])
        for w in words:
            self.assertIn(w, lines[0])
        for sign in ("Traceback", "terminate called", "Segmentation", "AddressSanitizer",
                     "runtime error:"):
            self.assertNotIn(sign, p.stderr)

    def test_truncated_pickle(self):
        root, _ = self.root("cifar10")
        path = os.path.join(root, cifar_files.CIFAR10_PY, "data_batch_1")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        self.expect_refused(root, path, "truncated")

    def test_pickle_with_code(self):
        root, _ = self.root("cifar100")
        path = os.path.join(root, cifar_files.CIFAR100_PY, "test")
        with open(path, "wb") as f:
            f.write(b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.")
        self.expect_refused(root, path, "refused global os.system")

    def test_binary_record_size(self):
        root, _ = self.root("cifar10-bin")
        path = os.path.join(root, cifar_files.CIFAR10_BIN, "data_batch_1.bin")
        with open(path, "ab") as f:
            f.write(b"\x00" * 100)
        self.expect_refused(root, path, "3073-byte records")

    def test_binary_label_out_of_range(self):
        root, _ = self.root("cifar100-bin")
        path = os.path.join(root, cifar_files.CIFAR100_BIN, "train.bin")
        with open(path, "r+b") as f:
            f.seek(3074 + 1)
            f.write(b"\xc8")
        self.expect_refused(root, path, "record 1 has label 200")

    def test_missing_batch(self):
        root, _ = self.root("cifar10")
        path = os.path.join(root, cifar_files.CIFAR10_PY, "data_batch_4")
        os.unlink(path)
        self.expect_refused(root, path, "no such file")


class ReaderMatchesGenerator(CifarCase):
    """cifar_dump (the trainer's reader) returns the generator's arrays."""

    def test_every_layout_and_protocol(self):
        for layout in LAYOUTS:
            protocols = [2, 3, 4, 5] if not layout.endswith("-bin") else [None]
            for proto in protocols:
                with self.subTest(layout=layout, protocol=proto):
                    kw = {"protocol": proto} if proto else {}
                    root, arrays = self.root(layout, "%s-%s" % (layout, proto), per_batch=20,
                                             test=7, **kw)
                    got = self.dump(root)
                    self.assertEqual(got["format"], layout)
                    self.assertSame(got, arrays, "train")
                    self.assertSame(got, arrays, "test")
                    self.assertEqual(got["train"]["classes"], 100 if "100" in layout else 10)

    def test_caps_take_the_first_samples(self):
        root, arrays = self.root("cifar10", per_batch=20, test=7)
        got = self.dump(root, "cifar10", 45, 3)
        self.assertSame(got, arrays, "train", 45)
        self.assertSame(got, arrays, "test", 3)


class ReaderMatchesTorchvision(CifarCase):
    """torchvision.datasets.CIFAR10/100 reads our generated files, and reads
    exactly what the trainer's reader does."""

    def test_same_pixels_and_labels_as_torchvision(self):
        why = torchvision_problem()
        if why:
            self.skipTest(why)
        for layout in ("cifar10", "cifar100"):
            with self.subTest(layout=layout):
                root, arrays = self.root(layout, per_batch=20, test=7)
                out = tempfile.mkdtemp(dir=self.tmp)
                p = subprocess.run([VENV_PY, "-c", TORCHVISION_READ, root, layout, out],
                                   capture_output=True, text=True, timeout=300)
                self.assertEqual(p.returncode, 0, p.stderr)
                tv = json.loads(p.stdout.strip().splitlines()[-1])
                ours = self.dump(root)
                for split in ("train", "test"):
                    with open(os.path.join(out, "tv_" + split), "rb") as f:
                        tv_pixels = f.read()
                    self.assertEqual(ours[split]["labels"], tv[split])
                    self.assertTrue(ours[split]["pixels"] == tv_pixels,
                                    "%s %s pixels differ from torchvision's" % (layout, split))
                    self.assertSame(ours, arrays, split)


if __name__ == "__main__":
    testmain.main()
