"""`train --device auto` checks for a driver and a GPU before it loads any CUDA
library (backend_choice.h, CudaProbes): run the real binary with the dynamic
loader's own trace (LD_DEBUG=files, one "generating link map" line per object
actually mapped) and check which libraries it mapped, and that the message
names the one cause found. Deterministic: no timing, no sampling of
/proc/<pid>/maps while the process runs. This machine as it is, then with a
stand-in driver (fake_libcuda.cc on LD_LIBRARY_PATH) for the causes a
driverless machine cannot show."""
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "pyutil"))

BIN = os.environ.get("DDPRUN_BIN_DIR",
                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../build/bin"))
TRAIN = os.path.join(BIN, "train")
SMALL = ["--data", "synthetic", "--train-samples", "64", "--test-samples", "16", "--max-steps", "1"]
# What the CUDA plugins bring in: the plugins themselves, cudart, cuBLAS(Lt), cuDNN, NCCL.
HEAVY = ("libddprun_runtime_cuda", "libddprun_train_cuda", "libcudart", "libcublas", "libcudnn",
         "libnccl")
FAKE_DRIVER = os.environ.get("DDPRUN_FAKE_DRIVER_DIR", os.path.join(BIN, "../tests/fake_driver"))
TRAIN_PLUGIN = os.path.join(BIN, "..", "lib", "ddprun", "libddprun_train_cuda.so")
MAPPED = re.compile(r"file=(\S+) \[\d+\];\s+generating link map")
NOTICE = re.compile(r"--device auto: training on the CPU \((.*)\)$", re.M)


def run_train(device, **env_extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_VISIBLE_DEVICES", "LD_DEBUG", "LD_DEBUG_OUTPUT", "RANK",
                        "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(env_extra)
    env["LD_DEBUG"] = "files"
    p = subprocess.run([TRAIN, "--device", device, *SMALL], capture_output=True, text=True,
                       timeout=300, env=env)
    mapped = {os.path.basename(m) for m in MAPPED.findall(p.stderr)}
    messages = "\n".join(l for l in p.stderr.splitlines() if not re.match(r"\s*\d+:", l))
    return p, mapped, messages


def symbol_offset(path, symbol):
    """The file offset of data symbol `symbol` of a 64-bit little-endian ELF
    shared object (from .dynsym and its section), or None."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for sec in secs:
        if sec[1] != 11:  # SHT_DYNSYM
            continue
        strings = secs[sec[6]][4]
        for at in range(sec[4], sec[4] + sec[5], 24):
            name, _, _, shndx, value, _ = struct.unpack_from("<IBBHQQ", data, at)
            start = strings + name
            if data[start:data.index(b"\0", start)].decode() == symbol:
                return secs[shndx][4] + value - secs[shndx][3]
    return None


class ProbeCase(unittest.TestCase):
    def assert_traced(self, mapped):
        # The trace itself works: train's own CPU libraries are in it.
        self.assertTrue(any(m.startswith("libdnnl") for m in mapped),
                        "LD_DEBUG=files traced nothing: %s" % sorted(mapped))

    def heavy(self, mapped, with_driver=False):
        names = HEAVY + (("libcuda.so",) if with_driver else ())
        return sorted(m for m in mapped if m.startswith(names))


class DeviceProbe(ProbeCase):
    """This machine as it is."""

    def test_auto_without_a_driver_or_gpu_maps_no_cuda_library(self):
        p, mapped, messages = run_train("auto")
        self.assertEqual(p.returncode, 0, messages)
        self.assert_traced(mapped)
        notice = NOTICE.search(messages)
        if not notice:
            self.skipTest("this machine trains on a GPU (no --device auto notice)")
        cause = notice.group(1)
        if "present but" in cause or "CUDA runtime none" in cause:
            self.skipTest("this machine has a driver that finds a GPU: loading the backend is "
                          "right here (%s)" % cause)
        no_driver = "no NVIDIA driver" in cause
        self.assertEqual(self.heavy(mapped, with_driver=no_driver), [],
                         "CUDA libraries mapped although: " + cause)
        # The one cause found, never the old list of three possible ones.
        self.assertNotIn("no device, no driver, or", cause)
        if "libddprun_train_cuda.so is not installed" not in messages:
            self.assertNotIn("no CUDA backend installed", cause)

    def test_hidden_devices_map_not_even_libcuda(self):
        p, mapped, messages = run_train("auto", CUDA_VISIBLE_DEVICES="")
        self.assertEqual(p.returncode, 0, messages)
        self.assert_traced(mapped)
        self.assertEqual(self.heavy(mapped, with_driver=True), [], messages)
        notice = NOTICE.search(messages)
        self.assertIsNotNone(notice, messages)
        if "no CUDA backend installed" not in notice.group(1):
            self.assertEqual(notice.group(1),
                             'no CUDA GPU is visible: CUDA_VISIBLE_DEVICES="" hides every GPU')

    def test_device_cuda_refuses_with_the_same_cause(self):
        auto, _, auto_messages = run_train("auto")
        notice = NOTICE.search(auto_messages)
        if not notice:
            self.skipTest("this machine trains on a GPU (no --device auto notice)")
        p, mapped, messages = run_train("cuda")
        self.assertEqual(p.returncode, 2, messages)
        self.assertIn("train: error: --device cuda: ", messages)
        cause = notice.group(1)
        if "present but" not in cause:  # auto adds the fix there; cuda has it after the cause
            self.assertIn("--device cuda: " + cause + "; ", messages)
        self.assertIn("or use --device cpu", messages)

    def test_device_cpu_probes_nothing(self):
        p, mapped, messages = run_train("cpu")
        self.assertEqual(p.returncode, 0, messages)
        self.assert_traced(mapped)
        self.assertEqual(self.heavy(mapped, with_driver=True), [], messages)
        self.assertNotIn("--device auto", messages)


class WithAStandInDriver(ProbeCase):
    def setUp(self):
        if not os.path.isfile(os.path.join(FAKE_DRIVER, "libcuda.so.1")):
            self.skipTest("the stand-in driver is not built (%s/libcuda.so.1)" % FAKE_DRIVER)
        if not os.path.isfile(TRAIN_PLUGIN):
            self.skipTest("this build has no CUDA plugin (DDPRUN_CUDA off): nothing to probe")

    def run_with_driver(self, device, **env):
        return run_train(device, LD_LIBRARY_PATH=FAKE_DRIVER, **env)

    def test_a_driver_without_a_gpu_maps_only_libcuda(self):
        p, mapped, messages = self.run_with_driver("auto", FAKE_CUDA_COUNT="0")
        self.assertEqual(p.returncode, 0, messages)
        self.assertIn("libcuda.so.1", mapped, "the stand-in driver was not loaded")
        self.assertEqual(self.heavy(mapped), [], messages)
        self.assertEqual(NOTICE.search(messages).group(1),
                         "no CUDA GPU is visible: the NVIDIA driver finds none")

    def test_a_driver_that_does_not_start_is_named_by_its_error(self):
        cause = ("no CUDA GPU is visible: the NVIDIA driver does not start "
                 "(cuInit: CUDA_ERROR_STUB_LIBRARY (fake driver))")
        p, mapped, messages = self.run_with_driver("auto", FAKE_CUDA_INIT="34")
        self.assertEqual(p.returncode, 0, messages)
        self.assertEqual(self.heavy(mapped), [], messages)
        self.assertEqual(NOTICE.search(messages).group(1), cause)
        p, mapped, messages = self.run_with_driver("cuda", FAKE_CUDA_INIT="34")
        self.assertEqual(p.returncode, 2, messages)
        self.assertIn("train: error: --device cuda: " + cause + "; see what nvidia-smi says", messages)

    def test_a_plugin_of_another_build_is_refused_before_it_is_mapped(self):
        marker = symbol_offset(TRAIN_PLUGIN, "ddprun_train_cuda_plugin_build_id")
        self.assertIsNotNone(marker, TRAIN_PLUGIN + " has no build id marker")
        tmp = tempfile.mkdtemp(prefix="device_probe_")
        self.addCleanup(shutil.rmtree, tmp, True)
        other = os.path.join(tmp, "libddprun_train_cuda.so")
        shutil.copyfile(TRAIN_PLUGIN, other)
        with open(other, "r+b") as f:
            f.seek(marker)
            f.write(b"f" * 32)  # another build's id (32 hex digits)
        p, mapped, messages = self.run_with_driver("auto", FAKE_CUDA_COUNT="1",
                                                   DDPRUN_PLUGIN_PATH=tmp)
        self.assertEqual(p.returncode, 0, messages)
        cause = NOTICE.search(messages).group(1)
        self.assertRegex(cause, r"^1 NVIDIA GPU is present but the CUDA backend does not load: " +
                         re.escape(os.path.realpath(other)) +
                         r" is from another ddprun build \(plugin build id f{32}, "
                         r"this program's is [0-9a-f]{32}\): ")
        # Refused from the file: neither it nor what it links was mapped.
        self.assertEqual([m for m in mapped if m.startswith(("libddprun_train_cuda", "libcudnn",
                                                             "libcublas"))], [], messages)


if __name__ == "__main__":
    if not os.access(TRAIN, os.X_OK):
        # The sanitizer pass (scripts/test.sh) builds no trainer: skipped, saying so.
        print("SKIPPED: train is not built in %s (a build without the trainer, as the "
              "sanitizer pass's)" % BIN)
        sys.exit(77)
    from testmain import main  # noqa: E402
    main()
