"""The wheel end to end: `pip wheel` builds ddprun from the source tree, a fresh
virtual environment gets it with `pip install`, and an ordinary PyTorch DDP
script (ddp_worker.py) runs under that environment's bin/ddprun without the
environment being activated (and the wheel's Python package, python -m
ddprun.checkpoint / ddprun.plot, reads a train run's files), while the first `python3` on PATH is a stand-in
for a pyenv shim without PyTorch. ddprun must run the workers with the
environment's own interpreter (the one beside it), and PYTHON_EXEC must still
win over that.

Needs PyPI (pip's build isolation fetches scikit-build-core): skipped with a
message when PyPI cannot be reached. Needs the PyTorch 2.x test environment of
scripts/setup-test-deps.sh ($DDPRUN_TORCH2_VENV): the fresh environment sees
its PyTorch through a .pth file instead of downloading it again; skipped with a
message when it is missing.

The CMake build is kept in $DDPRUN_WHEEL_BUILD_DIR (ctest: <build>/wheel-build)
so that a second run only relinks; ccache is used when it is installed.

The build runs with pip -v, as the README's install command does, and its output
must hold no warning (compiler, CMake, build backend, pip deprecations); pip's
notes about itself (a newer pip, running as root) are not the build's. A kept
build directory compiles only what changed, so a clean one (CI's) is the full check.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))
import testmain  # noqa: E402

SOURCE = os.environ.get("DDPRUN_SOURCE_DIR", os.path.abspath(os.path.join(HERE, "..", "..")))
WORK = os.environ.get("DDPRUN_WHEEL_BUILD_DIR", os.path.join(SOURCE, "build", "wheel-build"))
TORCH2 = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
PROGRAMS = ("ddprun", "ddprun-store", "train")
# A long bound against hangs (a loaded 2-core machine imports torch slowly),
# never an assertion on speed.
JOB_TIMEOUT = 600


def project_version():
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        return re.search(r"project\(ddprun\s+VERSION\s+([0-9.]+)", f.read()).group(1)


def run(cmd, what, timeout=None, **kw):
    """Runs cmd; a non-zero exit fails the test with its output."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, **kw)
    if p.returncode != 0:
        raise AssertionError("%s failed (exit %d): %s\n%s" % (what, p.returncode, " ".join(cmd),
                                                              p.stdout[-6000:]))
    return p.stdout


def purelib(python):
    return run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               "site-packages of " + python).strip()


def build_venv():
    """A persistent environment whose pip builds the wheel (a venv always has
    pip; the system's python3 may not)."""
    venv = os.path.join(WORK, "venv")
    pip = os.path.join(venv, "bin", "pip")
    if not os.access(pip, os.X_OK):
        os.makedirs(WORK, exist_ok=True)
        run([sys.executable, "-m", "venv", "--clear", venv], "creating the build venv")
    return pip


# A warning of the build or install: the compilers' "warning:", CMake's "CMake
# Warning", the build backend's and pip's "WARNING:", pip's "DEPRECATION:".
WARNING = re.compile(r"\bwarning\b|^\s*DEPRECATION:", re.I)
# pip's notes about itself, not about what it builds or installs.
PIP_NOTICES = re.compile(r"^\s*\[notice\]|A new release of pip|Running pip as the 'root' user|"
                         r"is not owned or is not writable by the current user")


def warning_lines(output):
    """The lines of a pip run's output that warn about the build or install."""
    return [line for line in output.splitlines()
            if WARNING.search(line) and not PIP_NOTICES.search(line)]


def pypi_unreachable(pip, tmp):
    """None when pip can fetch scikit-build-core, else pip's reason."""
    p = subprocess.run([pip, "download", "--no-deps", "--disable-pip-version-check",
                        "--timeout", "15", "--retries", "1", "-d", os.path.join(tmp, "probe"),
                        "scikit-build-core"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if p.returncode == 0:
        return None
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else "pip download exited %d" % p.returncode



def torch2_python():
    """The PyTorch 2.x environment's interpreter, or SkipTest saying why."""
    python = os.path.join(TORCH2, "bin", "python")
    if not os.access(python, os.X_OK):
        raise unittest.SkipTest("no PyTorch 2.x environment at %s (scripts/setup-test-deps.sh "
                                "makes it; DDPRUN_TORCH2_VENV names another)" % TORCH2)
    return python


def build_wheel(tmp, what, settings=(), env=None):
    """pip wheel -v of the source tree into tmp/wheelhouse with the CMake build
    kept in WORK/build (ccache when installed), plus the --config-settings
    `settings`: (the wheel's path, pip's output). SkipTest when PyPI cannot be
    reached."""
    pip = build_venv()
    reason = pypi_unreachable(pip, tmp)
    if reason:
        raise unittest.SkipTest("PyPI cannot be reached, so pip cannot fetch scikit-build-core "
                                "to build the wheel: " + reason)
    wheelhouse = os.path.join(tmp, "wheelhouse")
    cmd = [pip, "wheel", "-v", "--no-deps", "--disable-pip-version-check", "-w", wheelhouse, SOURCE,
           "--config-settings=build-dir=" + os.path.join(WORK, "build")]
    cmd += ["--config-settings=" + s for s in settings]
    if shutil.which("ccache"):
        cmd += ["--config-settings=cmake.define.CMAKE_%s_COMPILER_LAUNCHER=ccache" % lang
                for lang in ("CXX", "CUDA")]
    t0 = time.monotonic()
    output = run(cmd, what, timeout=3000, env=env)
    wheels = os.listdir(wheelhouse)
    assert len(wheels) == 1, wheels
    wheel = os.path.join(wheelhouse, wheels[0])
    print("%s: %s, %d bytes, built in %.0f s" % (what, wheels[0], os.path.getsize(wheel),
                                                 time.monotonic() - t0), file=sys.stderr)
    return wheel, output


def fresh_venv(tmp, torch2):
    """A fresh environment in tmp/fresh, with the same Python as the PyTorch
    one, whose site-packages it sees through a .pth file: (venv, python)."""
    venv = os.path.join(tmp, "fresh")
    run([torch2, "-m", "venv", venv], "creating the fresh venv")
    python = os.path.join(venv, "bin", "python")
    with open(os.path.join(purelib(python), "ddprun_test_torch2.pth"), "w") as f:
        f.write(purelib(torch2) + "\n")
    return venv, python


def pip_install(venv, wheel, what):
    """pip install -v --no-deps of the wheel into venv: pip's output."""
    t0 = time.monotonic()
    output = run([os.path.join(venv, "bin", "pip"), "install", "-v", "--no-deps", "--no-index",
                  "--disable-pip-version-check", wheel], what)
    print("%s: %.1f s" % (what, time.monotonic() - t0), file=sys.stderr)
    return output


# NVIDIA's CUDA libraries, and ddprun's own CUDA plugins.
NVIDIA_LIB = re.compile(r"lib(cuda|cudart|cublas\w*|cudnn\w*|nccl)\.so")
CUDA_PLUGIN = re.compile(r"libddprun_\w+_cuda\.so")


def mapped_cuda_code(ld_debug_files):
    """The CUDA libraries and plugins a process mapped, from its LD_DEBUG=files
    output (which lists dlopen'ed objects too); AssertionError when that
    output lists nothing at all."""
    mapped = re.findall(r"file=(\S+) \[0\];  (?:needed|dynamically loaded) by", ld_debug_files)
    if not mapped:
        raise AssertionError("LD_DEBUG=files listed nothing: " + ld_debug_files[-2000:])
    return [f for f in mapped
            if NVIDIA_LIB.search(os.path.basename(f)) or CUDA_PLUGIN.search(f)]


class PreparedOnce(unittest.TestCase):
    """A test class whose classmethod prepare() (building and installing a
    wheel) runs once, in the first test's setUp: a skip or failure there is
    every test's (a skip raised in setUpClass would count as no test run at
    all). `what` names it in the failure."""
    _prepared = None
    what = "building or installing the wheel"

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
            self.fail("%s failed: %s" % (self.what, why))


class Wheel(PreparedOnce):
    @classmethod
    def prepare(cls):
        torch2 = torch2_python()
        cls.tmp = tempfile.mkdtemp(prefix="ddprun_wheel_")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.wheel, cls.build_output = build_wheel(cls.tmp, "pip wheel")
        cls.venv, cls.venv_python = fresh_venv(cls.tmp, torch2)
        cls.install_output = pip_install(cls.venv, cls.wheel, "pip install of the wheel")
        cls.torch_version = run([torch2, "-c", "import torch; print(torch.__version__)"],
                                "importing torch").strip()

        # PATH's first python3 (and python) is a shim without PyTorch.
        fake = os.path.join(cls.tmp, "fakebin")
        os.mkdir(fake)
        for name in ("python3", "python"):
            path = os.path.join(fake, name)
            with open(path, "w") as f:
                f.write("#!/bin/sh\necho 'wrong interpreter' >&2\nexit 1\n")
            os.chmod(path, 0o755)
        cls.env = {k: v for k, v in os.environ.items()
                   if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME",
                                "PYTHON_EXEC", "LD_LIBRARY_PATH")}
        cls.env["PATH"] = fake + ":/usr/local/bin:/usr/bin:/bin"
        cls.env["TMPDIR"] = cls.tmp  # ddprun's log directory, removed with it
        cls.runs = 0

    def test_wheel_name_says_version_and_platform(self):
        # Native code, no Python extension: any Python 3, this platform only.
        self.assertEqual(os.path.basename(self.wheel), "ddprun-%s-py3-none-linux_%s.whl"
                         % (project_version(), os.uname().machine))

    def test_build_and_install_print_no_warning(self):
        self.assertEqual(warning_lines(self.build_output), [],
                         "pip wheel -v printed warnings; its output:\n" + self.build_output[-8000:])
        self.assertEqual(warning_lines(self.install_output), [], self.install_output[-4000:])

    def test_warning_filter_counts_the_builds_warnings_not_pips_notices(self):
        # The filter of the test above, on lines of real pip -v runs (a method
        # here, not a class of its own, so that a skipped build still skips all).
        ours = ["  WARNING: tool.scikit-build.metadata is deprecated; use the standard "
                "top-level [[tool.dynamic-metadata]] instead",
                "  /usr/include/c++/12/bits/char_traits.h:431:56: warning: 'void* "
                "__builtin_memcpy(...)' may overlap [-Wrestrict]",
                "  CMake Warning (dev) at CMakeLists.txt:5 (find_package):",
                "  kernels.cu(12): warning #177-D: variable \"x\" was declared but never "
                "referenced",
                "DEPRECATION: Building 'ddprun' using the legacy setup.py bdist_wheel mechanism"]
        pips = ["[notice] A new release of pip is available: 23.0.1 -> 25.0",
                "[notice] To update, run: python -m pip install --upgrade pip",
                "WARNING: Running pip as the 'root' user can result in broken permissions",
                "  [12/54] Building CXX object src/CMakeFiles/ddprun_cli.dir/cli/warnings.cc.o",
                "  -- Performing Test CMAKE_HAVE_LIBC_PTHREAD - Success"]
        self.assertEqual(warning_lines("\n".join(ours + pips)), ours)

    def test_programs_are_native_executables_in_the_venv_bin(self):
        for name in PROGRAMS:
            path = os.path.join(self.venv, "bin", name)
            self.assertTrue(os.path.isfile(path) and not os.path.islink(path), path)
            self.assertTrue(os.access(path, os.X_OK), path + " is not executable")
            with open(path, "rb") as f:
                self.assertEqual(f.read(4), b"\x7fELF", path + " is not a native executable")
        # The version and the variant: this wheel has no CUDA backend.
        out = run([os.path.join(self.venv, "bin", "ddprun"), "--version"], "ddprun --version",
                  env=self.env)
        self.assertEqual(out, "ddprun %s (cpu)\n" % project_version())

    def test_bundled_libraries_are_the_ones_loaded(self):
        train = os.path.join(self.venv, "bin", "train")
        bundled = os.path.realpath(os.path.join(self.venv, "lib", "ddprun"))
        libs = dict(re.findall(r"^\s*(\S+) => (\S+)", run(["ldd", train], "ldd train"), re.M))
        for lib in ("libdnnl", "libopenblas", "libgomp", "libgfortran"):
            found = [(k, v) for k, v in libs.items() if k.startswith(lib + ".so")]
            self.assertTrue(found, "train does not load %s: %s" % (lib, libs))
            for k, v in found:
                self.assertEqual(os.path.dirname(os.path.realpath(v)), bundled,
                                 "%s comes from %s, not from the wheel" % (k, v))
        out = run([train, "--help"], "train --help", env=self.env)
        self.assertIn("Usage: train", out)

    def test_cpu_wheel_maps_no_cuda_library_and_says_so(self):
        # The plain wheel has no CUDA part: --device auto trains on the CPU
        # after one line saying so, and nothing CUDA is ever mapped (LD_DEBUG=files
        # lists every object the process maps, dlopen'ed ones too).
        train = os.path.join(self.venv, "bin", "train")
        p = subprocess.run([train, "--device", "auto", "--data", "synthetic", "--train-samples",
                            "128", "--test-samples", "64", "--quiet"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=dict(self.env, LD_DEBUG="files"),
                           cwd=self.tmp, timeout=JOB_TIMEOUT)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertEqual(mapped_cuda_code(p.stderr), [], "the CPU wheel mapped CUDA code")
        notices = [line for line in p.stderr.splitlines() if "--device auto" in line]
        self.assertEqual(notices, ["train: --device auto: training on the CPU (this ddprun has no "
                                   "CUDA backend installed)"], p.stderr[-3000:])
        p = subprocess.run([train, "--device", "cuda"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=self.env, timeout=JOB_TIMEOUT)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("CPU-only ddprun", p.stderr)
        self.assertIn("-C ddprun.cuda=true", p.stderr)

    def python_module(self, *args, env=None):
        """python -m ... with the fresh environment's interpreter, from outside
        the source tree (so the wheel's ddprun package is the one imported)."""
        return subprocess.run([self.venv_python, "-m"] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=self.tmp,
                              env=env or self.env, timeout=JOB_TIMEOUT)

    def test_python_package_reads_trains_files(self):
        # train writes a --save file and metrics; the wheel's Python package
        # lists and loads the one and plots the other.
        out = os.path.join(self.tmp, "pkg")
        os.mkdir(out)
        saved, metrics = os.path.join(out, "final.safetensors"), os.path.join(out, "m.jsonl")
        run([os.path.join(self.venv, "bin", "train"), "--data", "synthetic", "--train-samples",
             "128", "--test-samples", "64", "--log-interval", "1", "--save", saved,
             "--metrics", metrics, "--quiet"], "train", env=self.env, timeout=JOB_TIMEOUT)
        p = self.python_module("ddprun.checkpoint", "--load", saved)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("format  ddprun-train-model", p.stdout)
        self.assertIn("conv1.weight  F32  [6, 1, 5, 5]", p.stdout)
        self.assertIn("loaded with torch: 10 tensors", p.stdout)
        self.assertIn(os.path.realpath(purelib(self.venv_python)),
                      os.path.realpath(run([self.venv_python, "-c", "import ddprun; "
                                            "print(ddprun.__file__)"], "import ddprun",
                                           env=self.env, cwd=self.tmp)))
        png = os.path.join(out, "curves.png")
        has_mpl = subprocess.run([self.venv_python, "-c", "import matplotlib"], env=self.env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        p = self.python_module("ddprun.plot", metrics, "-o", png)
        if has_mpl:
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        else:
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("pip install 'ddprun[plot]'", p.stderr)
            self.assertNotIn("Traceback", p.stderr)

    def ddp_job(self, env):
        type(self).runs += 1
        outdir = os.path.join(self.tmp, "job%d" % self.runs)
        os.mkdir(outdir)
        p = subprocess.run([os.path.join(self.venv, "bin", "ddprun"), "--nproc-per-node=2",
                            os.path.join(HERE, "ddp_worker.py"), outdir],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                           cwd=self.tmp, timeout=JOB_TIMEOUT)
        if "wrong interpreter" in p.stdout:
            self.fail("ddprun ran the workers with the first python3 on PATH, not with the "
                      "environment's interpreter:\n" + p.stdout[-4000:])
        self.assertEqual(p.returncode, 0, p.stdout[-4000:])
        ranks = []
        for r in range(2):
            with open(os.path.join(outdir, "rank_%d.json" % r)) as f:
                ranks.append(json.load(f))
        # DDP trained: the all-reduced losses and the parameters agree across
        # ranks, and the loss fell.
        self.assertEqual([r["world"] for r in ranks], [2, 2])
        self.assertEqual(ranks[0]["losses"], ranks[1]["losses"])
        self.assertEqual(ranks[0]["param_checksum"], ranks[1]["param_checksum"])
        self.assertLess(ranks[0]["losses"][-1], ranks[0]["losses"][0])
        for r in ranks:
            self.assertEqual(r["torch"], self.torch_version)
        return ranks

    def assert_interpreter(self, ranks, venv):
        for r in ranks:
            self.assertEqual(os.path.realpath(r["prefix"]), os.path.realpath(venv), r)
            self.assertEqual(os.path.realpath(os.path.dirname(r["executable"])),
                             os.path.realpath(os.path.join(venv, "bin")), r)

    def test_ddp_script_runs_with_the_venv_interpreter_without_activation(self):
        ranks = self.ddp_job(self.env)
        self.assert_interpreter(ranks, self.venv)

    def test_python_exec_wins_over_the_venv_interpreter(self):
        ranks = self.ddp_job(dict(self.env, PYTHON_EXEC=os.path.join(TORCH2, "bin", "python")))
        self.assert_interpreter(ranks, TORCH2)


if __name__ == "__main__":
    testmain.main()
