"""The CUDA wheel without a GPU: `pip wheel . -C ddprun.cuda=true` builds the
CUDA variant (<version>+cu13), a fresh virtual environment gets it with
`pip install --no-deps`, and NVIDIA's PyPI packages come from the PyTorch 2.x
test environment instead of being downloaded again: its site-packages through
a .pth file (Python), its site-packages/nvidia through a symbolic link in the
fresh one (the layout `pip install` of the dependencies gives, which the
plugins' $ORIGIN-relative RPATHs point into).

Checked: the metadata requires NVIDIA's CUDA 13 packages; the plugins carry only
$ORIGIN-relative RPATHs and every CUDA library they need resolves inside the
environment (ldd; the dynamic loader finds each through the RPATH, so no system
directory is consulted); `train --device cuda` exits 2 with the "no GPU"
message (no loader error, no crash without libcuda); `--device auto` trains on
the CPU after one notice line; `--device cpu` loads no CUDA library at all
(LD_DEBUG=files lists every object the process maps, dlopen'ed ones too).

Shares the CPU wheel's CMake build directory (install_wheel): the C++ objects
are the same, only the CUDA plugins are added. Skipped without nvcc, PyPI (pip's
build isolation fetches scikit-build-core) or the PyTorch 2.x environment with
NVIDIA's packages, each with its reason.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))
import testmain  # noqa: E402
from wheel_test import (JOB_TIMEOUT, SOURCE, TORCH2, WORK, build_venv,  # noqa: E402
                        project_version, purelib, pypi_unreachable, run)

PLUGINS = ("libddprun_runtime_cuda.so", "libddprun_train_cuda.so")
# The libraries the plugins need and the NVIDIA package directory that has each.
CUDA_LIBS = {"libcudart.so.13": "cu13", "libcublasLt.so.13": "cu13", "libcudnn.so.9": "cudnn",
             "libnccl.so.2": "nccl"}
REQUIRED = ("nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13")
CUDA_LIB_PATTERN = re.compile(r"lib(cuda|cudart|cublas|cublasLt|cudnn\w*|nccl)\.so")


class CudaWheel(unittest.TestCase):
    _prepared = None

    def setUp(self):
        cls = type(self)
        if cls._prepared is None:
            try:
                cls.prepare()
                cls._prepared = (None, None)
            except unittest.SkipTest as e:
                cls._prepared = ("skip", str(e))
            except Exception as e:  # noqa: BLE001 - reported by every test
                cls._prepared = ("error", "%s: %s" % (type(e).__name__, e))
        outcome, why = cls._prepared
        if outcome == "skip":
            raise unittest.SkipTest(why)
        if outcome == "error":
            self.fail("building or installing the CUDA wheel failed: " + why)

    @classmethod
    def prepare(cls):
        torch2_python = os.path.join(TORCH2, "bin", "python")
        if not os.access(torch2_python, os.X_OK):
            raise unittest.SkipTest("no PyTorch 2.x environment at %s (scripts/setup-test-deps.sh "
                                    "makes it; DDPRUN_TORCH2_VENV names another)" % TORCH2)
        nvidia = os.path.join(purelib(torch2_python), "nvidia")
        missing = [d for d in set(CUDA_LIBS.values()) if not os.path.isdir(os.path.join(nvidia, d))]
        if missing:
            raise unittest.SkipTest("the PyTorch environment has no NVIDIA CUDA 13 packages (%s "
                                    "missing under %s)" % (", ".join(sorted(missing)), nvidia))
        if not shutil.which("nvcc") and not os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
            raise unittest.SkipTest("no nvcc: the CUDA wheel cannot be built here")
        cls.tmp = tempfile.mkdtemp(prefix="ddprun_cuda_wheel_")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        pip = build_venv()
        reason = pypi_unreachable(pip, cls.tmp)
        if reason:
            raise unittest.SkipTest("PyPI cannot be reached, so pip cannot fetch scikit-build-core "
                                    "to build the wheel: " + reason)
        wheelhouse = os.path.join(cls.tmp, "wheelhouse")
        cmd = [pip, "wheel", "--no-deps", "--disable-pip-version-check", "-w", wheelhouse, SOURCE,
               "--config-settings=build-dir=" + os.path.join(WORK, "build"),
               "--config-settings=ddprun.cuda=true"]
        if shutil.which("ccache"):
            cmd += ["--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache",
                    "--config-settings=cmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache"]
        env = dict(os.environ)
        if not shutil.which("nvcc"):
            env["PATH"] = "/usr/local/cuda/bin:" + env.get("PATH", "")
        t0 = time.monotonic()
        run(cmd, "pip wheel -C ddprun.cuda=true", timeout=3000, env=env)
        wheels = os.listdir(wheelhouse)
        assert len(wheels) == 1, wheels
        cls.wheel = os.path.join(wheelhouse, wheels[0])
        print("CUDA wheel %s: %d bytes, built in %.0f s" % (
            wheels[0], os.path.getsize(cls.wheel), time.monotonic() - t0), file=sys.stderr)

        cls.venv = os.path.join(cls.tmp, "fresh")
        run([torch2_python, "-m", "venv", cls.venv], "creating the fresh venv")
        cls.venv_python = os.path.join(cls.venv, "bin", "python")
        cls.site = purelib(cls.venv_python)
        with open(os.path.join(cls.site, "ddprun_test_torch2.pth"), "w") as f:
            f.write(purelib(torch2_python) + "\n")
        os.symlink(nvidia, os.path.join(cls.site, "nvidia"))
        run([os.path.join(cls.venv, "bin", "pip"), "install", "--no-deps", "--no-index",
             "--disable-pip-version-check", cls.wheel], "pip install --no-deps of the CUDA wheel")
        cls.env = {k: v for k, v in os.environ.items()
                   if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME",
                                "LD_LIBRARY_PATH", "DDPRUN_PLUGIN_PATH", "CUDA_VISIBLE_DEVICES")}
        cls.env["TMPDIR"] = cls.tmp

    def train(self, *args, env=None):
        return subprocess.run([os.path.join(self.venv, "bin", "train")] + list(args),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env or self.env, cwd=self.tmp, timeout=JOB_TIMEOUT)

    def test_metadata_names_the_variant_and_requires_nvidias_packages(self):
        self.assertEqual(os.path.basename(self.wheel), "ddprun-%s+cu13-py3-none-linux_%s.whl"
                         % (project_version(), os.uname().machine))
        with zipfile.ZipFile(self.wheel) as z:
            meta = z.read("ddprun-%s+cu13.dist-info/METADATA" % project_version()).decode()
            names = z.namelist()
        requires = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)([^;\n]*)$", meta, re.M)
        self.assertEqual(sorted(n for n, _ in requires), sorted(REQUIRED), meta[:2000])
        self.assertIn(">=2.30", dict(requires)["nvidia-nccl-cu13"])
        for p in PLUGINS:
            self.assertIn("ddprun/lib/" + p, names)
        # Never bundled: the environment's packages provide them.
        self.assertFalse([n for n in names if CUDA_LIB_PATTERN.search(os.path.basename(n))],
                         names)

    def test_plugins_find_every_cuda_library_in_the_environment(self):
        lib = os.path.join(self.site, "ddprun", "lib")
        for p in PLUGINS:
            path = os.path.join(lib, p)
            dyn = run(["readelf", "-d", path], "readelf -d " + p)
            rpath = re.search(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dyn)
            self.assertTrue(rpath, dyn)
            for entry in rpath.group(1).split(":"):
                self.assertTrue(entry.startswith("$ORIGIN/"), "%s has RPATH entry %s" % (p, entry))
            self.assertIn("(RPATH)", dyn, "RUNPATH would not cover the libraries' own dependencies")
            resolved = dict(re.findall(r"^\s*(\S+) => (\S+)",
                                       run(["ldd", path], "ldd " + p, env=self.env), re.M))
            needed = [k for k in resolved if k in CUDA_LIBS]
            self.assertTrue(needed, "%s needs no CUDA library? %s" % (p, resolved))
            for name in needed:
                # The path the loader used (RPATH-expanded), not the link's
                # target: it must be the environment's package directory.
                want = os.path.join(self.site, "nvidia", CUDA_LIBS[name], "lib", name)
                self.assertEqual(os.path.normpath(resolved[name]), os.path.normpath(want),
                                 "%s: %s resolved to %s" % (p, name, resolved[name]))

    def test_device_cuda_without_a_gpu_exits_2_naming_why(self):
        p = self.train("--device", "cuda", "--data", "synthetic")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--device cuda: no CUDA GPU is visible", p.stderr)
        self.assertNotIn("cannot open shared object", p.stderr)
        self.assertNotIn("undefined symbol", p.stderr)

    def test_device_auto_trains_on_the_cpu_after_one_notice_line(self):
        p = self.train("--device", "auto", "--data", "synthetic", "--train-samples", "128",
                       "--test-samples", "64", "--quiet")
        self.assertEqual(p.returncode, 0, p.stderr)
        notices = [line for line in p.stderr.splitlines() if "--device auto" in line]
        self.assertEqual(len(notices), 1, p.stderr)
        self.assertIn("training on the CPU (no CUDA GPU is visible", notices[0])
        summary = json.loads(p.stdout.strip().splitlines()[-1])
        self.assertEqual(summary["device"], "cpu")
        self.assertTrue(summary["device_choice"].startswith("cpu (--device auto: no CUDA GPU"),
                        summary["device_choice"])

    def test_device_cpu_loads_no_cuda_library(self):
        p = self.train("--device", "cpu", "--data", "synthetic", "--train-samples", "128",
                       "--test-samples", "64", "--quiet", env=dict(self.env, LD_DEBUG="files"))
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        loaded = re.findall(r"file=(\S+) \[0\];  (?:needed|dynamically loaded) by", p.stderr)
        self.assertTrue(loaded, "LD_DEBUG=files listed nothing: " + p.stderr[-2000:])
        cuda = [f for f in loaded if CUDA_LIB_PATTERN.search(os.path.basename(f))
                or "libddprun_" in f]
        self.assertEqual(cuda, [], "--device cpu mapped CUDA code")


if __name__ == "__main__":
    testmain.main()
