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
(LD_DEBUG=files lists every object the process maps, dlopen'ed ones too);
`ddprun --version` names the variant and the GPU code built (CUDAARCHS, else
80 90); pip wheel -v and pip install -v print no warning (wheel_test.py's filter).

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
import unittest
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))
import testmain  # noqa: E402
from wheel_test import (JOB_TIMEOUT, NVIDIA_LIB, PreparedOnce, build_wheel,  # noqa: E402
                        fresh_venv, mapped_cuda_code, pip_install, project_version, purelib, run,
                        torch2_python, warning_lines)

PLUGINS = ("libddprun_runtime_cuda.so", "libddprun_train_cuda.so")
# The libraries the plugins need and the NVIDIA package directory that has each.
CUDA_LIBS = {"libcudart.so.13": "cu13", "libcublasLt.so.13": "cu13", "libcudnn.so.9": "cudnn",
             "libnccl.so.2": "nccl"}
REQUIRED = ("nvidia-cuda-runtime", "nvidia-cublas", "nvidia-cudnn-cu13", "nvidia-nccl-cu13")


def expected_gpu_code(archs):
    """What --version says was compiled for CMAKE_CUDA_ARCHITECTURES `archs`
    (CUDAARCHS, else CMakeLists.txt's default "80 90"): "sm_80 sm_90 + PTX
    compute_80 compute_90"; None for a spelling this test does not model."""
    sass, ptx = [], []
    for a in archs.replace(";", " ").split():
        m = re.fullmatch(r"([0-9]+[a-z]?)(-real|-virtual)?", a)
        if not m:
            return None
        if m.group(2) != "-virtual":
            sass.append("sm_" + m.group(1))
        if m.group(2) != "-real":
            ptx.append("compute_" + m.group(1))
    return " ".join(sass) + (" + PTX " + " ".join(ptx) if ptx else "")


class CudaWheel(PreparedOnce):
    what = "building or installing the CUDA wheel"

    @classmethod
    def prepare(cls):
        torch2 = torch2_python()
        nvidia = os.path.join(purelib(torch2), "nvidia")
        missing = [d for d in set(CUDA_LIBS.values()) if not os.path.isdir(os.path.join(nvidia, d))]
        if missing:
            raise unittest.SkipTest("the PyTorch environment has no NVIDIA CUDA 13 packages (%s "
                                    "missing under %s)" % (", ".join(sorted(missing)), nvidia))
        if not shutil.which("nvcc") and not os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
            raise unittest.SkipTest("no nvcc: the CUDA wheel cannot be built here")
        cls.tmp = tempfile.mkdtemp(prefix="ddprun_cuda_wheel_")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        env = dict(os.environ)
        if not shutil.which("nvcc"):
            env["PATH"] = "/usr/local/cuda/bin:" + env.get("PATH", "")
        cls.wheel, cls.build_output = build_wheel(cls.tmp, "pip wheel -C ddprun.cuda=true",
                                                  ["ddprun.cuda=true"], env=env)
        cls.venv, cls.venv_python = fresh_venv(cls.tmp, torch2)
        cls.site = purelib(cls.venv_python)
        os.symlink(nvidia, os.path.join(cls.site, "nvidia"))
        cls.install_output = pip_install(cls.venv, cls.wheel,
                                         "pip install --no-deps of the CUDA wheel")
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
        # PyTorch 2.11 pins nvidia-nccl-cu13==2.28.9: the floor must admit it.
        self.assertIn(">=2.28", dict(requires)["nvidia-nccl-cu13"])
        for p in PLUGINS:
            self.assertIn("ddprun/lib/" + p, names)
        # Never bundled: the environment's packages provide them.
        self.assertFalse([n for n in names if NVIDIA_LIB.search(os.path.basename(n))], names)

    def test_build_and_install_print_no_warning(self):
        self.assertEqual(warning_lines(self.build_output), [],
                         "pip wheel -v printed warnings; its output:\n" + self.build_output[-8000:])
        self.assertEqual(warning_lines(self.install_output), [], self.install_output[-4000:])

    def test_version_names_the_variant_and_the_gpu_code(self):
        out = run([os.path.join(self.venv, "bin", "ddprun"), "--version"], "ddprun --version",
                  env=self.env)
        m = re.fullmatch(r"ddprun (\S+) \(CUDA (13\.[0-9]+); GPU code: (.+)\)\n", out)
        self.assertTrue(m, out)
        self.assertEqual(m.group(1), project_version() + "+cu13")
        want = expected_gpu_code(os.environ.get("CUDAARCHS") or "80 90")
        if want is not None:
            self.assertEqual(m.group(3), want)

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
        self.assertEqual(mapped_cuda_code(p.stderr), [], "--device cpu mapped CUDA code")


if __name__ == "__main__":
    testmain.main()
