"""The benchmark tooling of issue 27, without a GPU.

- SamplerPort: scripts/bench/benchutil.py's mt19937_64 and DistributedSampler
  order against values of the C++ (std::mt19937_64, runtime::samplerPermutation).
- SyntheticData: benchutil's port of `train --data synthetic` against
  checksums of the C++ makeSynthetic / gatherBatch output, and its vectorised
  synthetic-cifar against tests/interop/synthetic_cifar.py (numpy).
- CommModel: scripts/bench/comm_model.py's arithmetic (pure Python).
- ResnetBenchFake: scripts/bench/resnet_bench.py --device cuda end to end with
  a fake ddprun (fabricated train and PyTorch output): the JSON after every
  case, the faster setting, errors recorded, the kernel phase, the table, the
  plot (when matplotlib is there).
- KernelTraceLib: the built CUPTI tracer loaded by hand without a GPU: it
  never crashes the process and writes its JSON at exit.
- DdpBenchCpu: examples/pytorch/ddp_bench.py on the CPU (PyTorch): its profile
  has train's layer names, two settings, the loss read after the window.

Runs under an interpreter with numpy (and PyTorch) when the one ctest gave it
lacks them: /usr/bin/python3 (Debian's python3-numpy, python3-torch) or the
PyTorch 2 test venv.
"""
import importlib.util
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "../.."))
BENCH = os.path.join(ROOT, "scripts/bench")
sys.path.insert(0, os.path.join(ROOT, "tests/pyutil"))
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.join(ROOT, "tests/interop"))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))


def _has(python, modules):
    code = "import " + ", ".join(modules)
    try:
        return subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _reexec_with_numpy():
    """Re-runs this file under an interpreter with numpy (and torch) if this one lacks them."""
    if os.environ.get("BENCH_TOOLS_TEST_REEXEC") or importlib.util.find_spec("numpy"):
        return
    venv = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
    for py in ("/usr/bin/python3", os.path.join(venv, "bin/python")):
        if os.access(py, os.X_OK) and _has(py, ["numpy"]):
            os.environ["BENCH_TOOLS_TEST_REEXEC"] = "1"
            os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


if __name__ == "__main__":
    _reexec_with_numpy()

import benchutil  # noqa: E402
import comm_model  # noqa: E402

HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


def fnv(values):
    h = 1469598103934665603
    for v in values:
        h = ((h ^ int(v)) * 1099511628211) & benchutil.MASK64
    return h


# ----------------------------------------------------------------------------- fabricated results

RESNET_LAYERS = (["conv1", "bn1", "relu", "maxpool"] +
                 ["layer%d.%d" % (i, j) for i in range(1, 5) for j in range(2)] + ["avgpool", "fc"])
LENET_LAYERS = ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten", "fc1", "relu3",
                "fc2", "relu4", "fc3"]


def fake_profile(layers, scale=1.0, buckets=None, comm=None):
    return {"steps": 5, "step_ms": 30.0 * scale, "wall_step_ms": 31.0 * scale, "data_ms": 0.5,
            "forward_ms": 10.0 * scale, "loss_ms": 0.2, "backward_ms": 18.0 * scale,
            "reducer_ms": 0.3, "optimizer_ms": 1.0,
            "layers": [{"name": n, "forward_ms": 0.5 * scale, "backward_ms": 1.0 * scale}
                       for n in layers],
            "buckets": buckets if buckets is not None else [
                {"bytes": 1 << 20, "params": 2, "ready_ms": 20.0},
                {"bytes": 25 << 20, "params": 20, "ready_ms": 25.0},
                {"bytes": 20 << 20, "params": 40, "ready_ms": 28.5}],
            "backward_end_ms": 28.5, "comm": comm}


def fake_train_json(sps, world=1, layers=RESNET_LAYERS, transport=None):
    comm = None
    if world > 1:
        comm = {"hidden_fraction": 0.8, "buckets": [
            {"bytes": 1 << 20, "ready_ms": 20.0, "start_ms": 20.0, "end_ms": 20.5},
            {"bytes": 25 << 20, "ready_ms": 25.0, "start_ms": 25.0, "end_ms": 27.0},
            {"bytes": 20 << 20, "ready_ms": 28.5, "start_ms": 28.5, "end_ms": 30.0}]}
    return {"world": world, "final_loss": 1.25, "samples_per_second": sps * 0.9,
            "peak_device_mb": 3000.0, "backend": "cuda:0 (fake GPU, cuDNN 9.14, tf32)",
            "comm_transport": transport, "comm_hidden_fraction": 0.7 if world > 1 else None,
            "bench": {"warmup_steps": 8, "steps": 30, "seconds": 1.0, "samples_per_second": sps,
                      "host_sync_calls": 0, "host_sync_waits": 0, "host_sync_calls_per_step": 0.0,
                      "host_sync_waits_per_step": 0.0, "peak_allocated_mb": 2500.0,
                      "peak_reserved_mb": 2800.0},
            "profile": fake_profile(layers, comm=comm)}


FAKE_DDPRUN = r'''#!PYTHON
"""A fake ddprun for bench_tools_test: prints what train / ddp_bench.py would."""
import json, os, sys
sys.path.insert(0, HERE)
import bench_tools_test as t
args = sys.argv[1:]
while args and args[0].startswith("--"):
    args.pop(0)
world = int([a for a in sys.argv if a.startswith("--nproc_per_node=")][0].split("=")[1])
out = os.environ["FAKE_OUT_JSON"]
with open(os.environ["FAKE_LOG"], "a") as log:
    n = len(json.load(open(out))["results"]) if os.path.exists(out) else 0
    log.write(json.dumps({"argv": args, "results_in_json": n, "env_transport":
                          os.environ.get("DDPRUN_CUDA_TRANSPORT"),
                          "injection": os.environ.get("CUDA_INJECTION64_PATH")}) + "\n")
def value(flag, default=None):
    return args[args.index(flag) + 1] if flag in args else default
model = value("--model")
layers = t.LENET_LAYERS if model == "lenet" else t.RESNET_LAYERS
if value("--save-init"):  # ddp_bench.py --save-init: the initial weights
    open(value("--save-init"), "w").close()
    print(json.dumps({"saved_init": value("--save-init")}))
    sys.exit(0)
def losses(n, shift=0.0):  # the fake's first step losses
    return [2.3 - 0.01 * i + shift for i in range(n)]
trace_out = os.environ.get("DDPRUN_KERNEL_TRACE_OUT")
if trace_out:
    with open(trace_out.replace("%p", str(os.getpid())), "w") as f:
        json.dump({"tool": "ddprun_kernel_trace", "range": "stop", "kernels": 1000, "kernel_ms": 100.0,
                   "busy_ms": 90.0, "span_ms": 120.0, "memcpy_count": 10, "memcpy_ms": 1.0,
                   "memset_count": 5, "memset_ms": 0.1, "top_kernels": [
                       {"name": "k()", "count": 500, "ms": 60.0}], "errors": []}, f)
if any(a.endswith("train") for a in args):
    if os.environ.get("DDPRUN_CUDA_TRANSPORT") == "nccl":
        sys.exit("train: error: NCCL refuses two ranks on one GPU (fake)")
    sps = 4000.0 if value("--precision") == "tf32" else 2000.0
    if model == "lenet":
        sps = 60000.0
    if value("--metrics"):  # --log-interval 1 through the warm-up, then one record at the end
        warm = int(value("--bench-warmup"))
        with open(value("--metrics"), "w") as f:
            for i, loss in enumerate(losses(warm)):
                f.write(json.dumps({"type": "step", "global_step": i + 1, "loss": loss}) + "\n")
            f.write(json.dumps({"type": "step", "global_step": int(value("--max-steps")),
                                "loss": 1.0}) + "\n")
    print(json.dumps(t.fake_train_json(sps, world, layers, os.environ.get("DDPRUN_CUDA_TRANSPORT"))))
    sys.exit(0)
settings = [args[i + 1] for i, a in enumerate(args) if a == "--setting"]
head = {"side": "pytorch", "torch": "2.11.0+fake", "cudnn": 91400, "nccl": "2.30.7",
        "world": world, "comm_backend": value("--comm-backend") if world > 1 else None,
        "import_s": 2.0, "setup_s": 1.0}
res = {}
for s in settings:
    key, value_ = s.split("=")
    fmt, plus, _ = value_.partition("+")
    sps = (4500.0 if fmt == "channels_last" else 4200.0) * (15 if model == "lenet" else 1)
    if plus:
        sps = 6000.0
    # fp16's PyTorch drifts beyond the parity bound: a case marked failed.
    shift = 0.2 if value("--precision") == "fp16" else 0.0
    first = losses(int(value("--record-losses", "0")), shift)
    r = dict(head, setting=key, memory_format=fmt, samples_per_second=sps, peak_device_mb=2900.0,
             first_losses=first,
             peak_reserved_mb=3100.0, final_loss=1.3, last_step_loss=1.1, compiled=bool(plus),
             compile_s=42.0 if plus else None,
             profile=None if plus else t.fake_profile(layers, 1.1, buckets=[]))
    res[key] = r
    print(json.dumps(r))
print(json.dumps(dict(head, settings=res, process_s=9.0)))
'''


class SamplerPort(unittest.TestCase):
    def test_mt19937_64_matches_the_standard(self):
        g = benchutil.Mt19937_64(5489)
        first = [g() for _ in range(3)]
        self.assertEqual(first, [14514284786278117030, 4620546740167642908, 13109570281517897720])
        for _ in range(9996):
            g()
        self.assertEqual(g(), 9981545732273789042)  # the standard's 10000th output check

    def test_permutation_matches_the_cpp(self):
        # tests/unit/runtime/sampler_test.cc pins samplerPermutation(10, 0).
        self.assertEqual(benchutil.sampler_permutation(10, 0), [7, 2, 0, 8, 3, 9, 6, 1, 5, 4])
        p = benchutil.sampler_permutation(11008, 0)  # the 2-rank ResNet case's size
        self.assertEqual((p[0], p[1], p[-1]), (9342, 8098, 7486))
        self.assertEqual(fnv(p), 15237838723159961469)  # FNV-1a of the C++ result

    def test_padding_and_striding_as_pytorch(self):
        # include/ddprun/runtime/sampler.h's example, unshuffled: N=10, R=3.
        got = [benchutil.sampler_indices(10, 3, r, shuffle=False) for r in range(3)]
        self.assertEqual(got, [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]])

    def test_ranks_split_the_shuffled_order(self):
        a = benchutil.sampler_indices(256, 2, 0, seed=0)
        b = benchutil.sampler_indices(256, 2, 1, seed=0)
        self.assertEqual(sorted(a + b), list(range(256)))
        self.assertEqual(a[:3], benchutil.sampler_permutation(256, 0)[0:6:2])
        self.assertNotEqual(benchutil.sampler_indices(256, 1, 0, seed=0, epoch=1),
                            benchutil.sampler_indices(256, 1, 0, seed=0))

    def test_bad_arguments(self):
        for n, w, r in ((0, 1, 0), (4, 0, 0), (4, 2, 2), (4, 2, -1)):
            with self.assertRaises(ValueError):
                benchutil.sampler_indices(n, w, r)


@unittest.skipUnless(HAVE_NUMPY, "numpy is not installed (scripts/setup-test-deps.sh)")
class SyntheticData(unittest.TestCase):
    def test_mnist_bytes_match_the_cpp(self):
        # FNV-1a of makeSynthetic(...).train's pixels then labels, from the C++
        # (tests/unit/train/data_test.cc, SyntheticIsTheDocumentedRecipe).
        px, lab = benchutil.synthetic_mnist_raw(37, 0)
        self.assertEqual(lab[:12].tolist(), [0, 4, 6, 2, 0, 9, 2, 4, 3, 3, 4, 8])
        self.assertEqual(px[5].ravel()[300:310].tolist(), [255, 177, 167, 255, 116, 163, 47, 104, 0, 0])
        self.assertEqual(fnv(list(px.ravel()) + list(lab)), 5549098087609738546)
        px, lab = benchutil.synthetic_mnist_raw(1003, 7)
        self.assertEqual(fnv(list(px.ravel()) + list(lab)), 3364982578054311191)

    def test_mnist_normalised_floats_match_gather_batch(self):
        import numpy as np
        x, y = benchutil.synthetic_mnist(37, 0)
        self.assertEqual(x.shape, (37, 1, 28, 28))
        self.assertEqual(x.dtype, np.float32)
        # FNV-1a of the float32 bits gatherBatch writes for samples 0..36.
        self.assertEqual(fnv(x.ravel().view(np.uint32)), 5381015650702143524)

    def test_mnist_edge_sizes(self):
        self.assertEqual(benchutil.synthetic_mnist_raw(0)[0].shape, (0, 28, 28))
        self.assertEqual(benchutil.synthetic_mnist_raw(1)[1].tolist(), [0])

    def test_cifar_samples_match_the_reference_port(self):
        import numpy as np
        import synthetic_cifar
        px, y = synthetic_cifar.raw_images(70)
        ref = synthetic_cifar.normalize(px)
        idx = [69, 0, 13, 13, 40]
        x, yy = benchutil.synthetic_cifar_samples(idx, 70)
        self.assertTrue(np.array_equal(x, ref[idx]))
        self.assertEqual(yy.tolist(), y[idx].tolist())
        with self.assertRaises(ValueError):
            benchutil.synthetic_cifar_samples([70], 70)


class CommModel(unittest.TestCase):
    def test_split_last_keeps_bytes_and_readiness_order(self):
        b = [{"bytes": 100, "ready_ms": 2.0}, {"bytes": 400, "ready_ms": 10.0}]
        s = comm_model.split_last(b, 100)
        self.assertEqual([x["bytes"] for x in s], [100, 300, 100])
        # Even readiness between 2 and 10 ms: 300 of 400 bytes ready at 8 ms.
        self.assertAlmostEqual(s[1]["ready_ms"], 8.0)
        self.assertEqual(s[2]["ready_ms"], 10.0)
        self.assertEqual(comm_model.split_last(b, 400), b)  # not smaller: unchanged
        self.assertEqual(comm_model.split_last(b, 0), b)

    def test_a_tiny_last_bucket_hides_more_where_the_last_is_large(self):
        # Backward ends at 10 ms with one large last bucket (1 ms a MB): all of
        # it is exposed; a tail leaves only the tail's time exposed.
        prof = {"step_ms": 12.0, "reducer_ms": 0.0, "backward_end_ms": 10.0,
                "buckets": [{"bytes": 1 << 20, "ready_ms": 2.0},
                            {"bytes": 8 << 20, "ready_ms": 10.0}]}
        fn = lambda b: b / (1 << 20)  # noqa: E731
        self.assertAlmostEqual(comm_model.project(prof, fn)["exposed_ms"], 8.0)
        best = comm_model.best_tail(prof, fn)
        self.assertIsNotNone(best)
        self.assertLess(best["exposed_ms"], 8.0)
        self.assertIn(best["tail_bytes"], comm_model.TAIL_CANDIDATES)
        # Nothing exposed already: no gain to report.
        self.assertIsNone(comm_model.best_tail(prof, lambda b: 0.0))

    def test_jitter_and_the_slowest_of_n(self):
        self.assertEqual(comm_model.expected_max_normal(1), 0.0)
        # Blom: about 1.42 for 8 samples, growing slowly with n.
        self.assertAlmostEqual(comm_model.expected_max_normal(8), 1.4342, places=3)
        self.assertGreater(comm_model.expected_max_normal(64), comm_model.expected_max_normal(8))
        j = comm_model.jitter({"step_ms_each": [10.0, 10.2, 9.8, 10.0]})
        self.assertEqual(j["steps"], 4)
        self.assertAlmostEqual(j["mean_ms"], 10.0)
        self.assertAlmostEqual(j["stdev_ms"], 0.16329931618554525)
        self.assertIsNone(comm_model.jitter({"step_ms_each": [10.0]}))
        self.assertIsNone(comm_model.jitter({}))
        prof = {"step_ms": 10.0, "reducer_ms": 0.0, "backward_end_ms": 9.0,
                "step_ms_each": [10.0, 10.2, 9.8, 10.0],
                "buckets": [{"bytes": 1 << 20, "ready_ms": 5.0}]}
        rows = comm_model.model_table_rows(prof, 32)
        for r in rows:
            self.assertAlmostEqual(r["straggler_ms"],
                                   j["stdev_ms"] * comm_model.expected_max_normal(r["ranks"]))
            self.assertAlmostEqual(r["projected_step_with_jitter_ms"],
                                   r["projected_step_ms"] + r["straggler_ms"])

    def test_ring_time(self):
        # 2(n-1)/n * bytes / busbw + alpha: 8 ranks, 100 MB at 350 GB/s, 10 us.
        t = comm_model.ring_ms(100e6, 8, 350.0, 10.0)
        self.assertAlmostEqual(t, 0.010 + 1.75 * 100e6 / 350e9 * 1e3, places=9)
        self.assertEqual(comm_model.ring_ms(1e6, 1, 100.0, 10.0), 0.0)

    def test_hierarchical_time(self):
        # intra 2(g-1)/g * S / nvl, inter 2(m-1)/m * S/g / nic.
        t = comm_model.hier_ms(80e6, 8, 2, 400.0, 40.0, 0.0)
        self.assertAlmostEqual(t, (1.75 * 80e6 / 400e9 + 1.0 * 10e6 / 40e9) * 1e3, places=9)
        self.assertAlmostEqual(comm_model.hier_ms(80e6, 8, 1, 400.0, 40.0, 0.0),
                               comm_model.ring_ms(80e6, 8, 400.0, 0.0), places=12)

    def test_replay_waits_for_ready_and_for_the_channel(self):
        tl = comm_model.replay([{"bytes": 1, "ready_ms": 1.0}, {"bytes": 1, "ready_ms": 1.5},
                                {"bytes": 1, "ready_ms": 10.0}], lambda b: 2.0)
        self.assertEqual([(b["start_ms"], b["end_ms"]) for b in tl],
                         [(1.0, 3.0), (3.0, 5.0), (10.0, 12.0)])

    def test_projection(self):
        prof = {"step_ms": 30.0, "reducer_ms": 0.5, "backward_end_ms": 20.0,
                "buckets": [{"bytes": 1, "ready_ms": 10.0}, {"bytes": 1, "ready_ms": 19.0}]}
        r = comm_model.project(prof, lambda b: 3.0)
        # 10-13, 19-22: 2 ms after backward's end out of 6 ms.
        self.assertAlmostEqual(r["exposed_ms"], 2.0)
        self.assertAlmostEqual(r["hidden_fraction"], 1 - 2.0 / 6.0)
        self.assertAlmostEqual(r["projected_step_ms"], 29.5 + 2.0)
        self.assertAlmostEqual(r["scaling_efficiency"], 29.5 / 31.5)
        fast = comm_model.project(prof, lambda b: 0.5)
        self.assertEqual(fast["exposed_ms"], 0.0)
        self.assertEqual(fast["hidden_fraction"], 1.0)
        with self.assertRaises(ValueError):
            comm_model.project(dict(prof, buckets=[]), lambda b: 1.0)

    def test_interpolation_and_fit(self):
        pts = [(b, 20.0 + 2.0 * (1 / 2) * b / 100e9 * 1e6) for b in (1 << 16, 1 << 20, 1 << 24, 1 << 28)]
        fit = comm_model.fit_alpha_busbw(pts, n=2)
        self.assertAlmostEqual(fit["alpha_us"], 20.0, places=6)
        self.assertAlmostEqual(fit["busbw_gbps"], 100.0, places=6)
        fn = comm_model.interp_ms(pts)
        self.assertAlmostEqual(fn(1 << 20), pts[1][1] / 1e3)
        self.assertAlmostEqual(fn(1), pts[0][1] / 1e3)
        self.assertAlmostEqual(fn(1 << 29), pts[-1][1] * 2 / 1e3)
        mid = fn(1 << 22)
        self.assertTrue(pts[1][1] / 1e3 < mid < pts[2][1] / 1e3)

    def test_effective_busbw_of_a_ring_is_its_busbw(self):
        self.assertAlmostEqual(comm_model.effective_busbw("ring", dict(n=8, busbw=400.0, alpha_us=15.0),
                                                          1e8), 400.0, places=6)

    def test_end_to_end_on_fabricated_results(self):
        tmp = tempfile.mkdtemp(prefix="comm_model_test_")
        self.addCleanup(shutil.rmtree, tmp, True)
        bench = {"gpu": "fake", "results": [
            {"case": {"name": "resnet18-224-tf32", "batch": 128}, "ours": fake_train_json(4000)},
            {"case": {"name": "resnet18-224-tf32-2ranks", "batch": 128},
             "ours": fake_train_json(3000, 2, transport="nccl"),
             "ours_ipc": fake_train_json(3000, 2, transport="ipc")}]}
        bj = os.path.join(tmp, "bench.json")
        with open(bj, "w") as f:
            json.dump(bench, f)
        ar = os.path.join(tmp, "ar.jsonl")
        with open(ar, "w") as f:
            for b in (1 << 20, 1 << 24, 1 << 26):
                for path, bw in (("nccl", 100.0), ("ipc-direct", 150.0)):
                    f.write(json.dumps({"bytes": b, "ranks": 2, "device": "cuda", "transport": "shm",
                                        "path": path, "time_us": 15 + b / bw / 1e3}) + "\n")
            f.write(json.dumps({"bytes": 8, "ranks": 4, "device": "cuda", "time_us": 1.0}) + "\n")
        out_json, out_md = os.path.join(tmp, "m.json"), os.path.join(tmp, "m.md")
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            res = comm_model.main(["--bench-json", bj, "--allreduce-jsonl", ar, "--out-json",
                                   out_json, "--out-md", out_md, "--config",
                                   "extra:ring:n=4,busbw=10,alpha_us=5"])
        self.assertIn("MODEL, not a measurement", printed.getvalue())
        self.assertEqual(len(res["rows"]), len(comm_model.CONFIGS) + 1)
        for r in res["rows"]:
            self.assertGreaterEqual(r["projected_step_ms"], r["compute_step_ms"])
            self.assertTrue(0 <= r["hidden_fraction"] <= 1)
        slow = res["rows"][-1]  # 10 GB/s: mostly exposed
        self.assertLess(slow["hidden_fraction"], res["rows"][0]["hidden_fraction"])
        checks = {c["variant"]: c for c in res["two_rank_check"]}
        self.assertEqual(checks["ours"]["allreduce_group"], "nccl")
        self.assertEqual(checks["ours_ipc"]["allreduce_group"], "ipc-direct")
        self.assertAlmostEqual(checks["ours"]["measured_hidden_fraction"], 0.8)
        self.assertAlmostEqual(checks["ours"]["fit"]["busbw_gbps"], 100.0 * 2 * 1 / 2, places=3)
        md = open(out_md).read()
        self.assertIn("MODEL, not a measurement", md)
        self.assertIn("ASSUMPTION", md)
        self.assertTrue(json.load(open(out_json))["model"])

    def test_labelled_allreduce_files(self):
        # allreduce_perf names only the host transport: LABEL=FILE says which CUDA path ran.
        tmp = tempfile.mkdtemp(prefix="comm_model_label_")
        self.addCleanup(shutil.rmtree, tmp, True)
        files = {}
        for label, t in (("nccl", 100.0), ("ipc", 50.0)):
            files[label] = os.path.join(tmp, label + ".jsonl")
            with open(files[label], "w") as f:
                f.write(json.dumps({"bytes": 1 << 20, "ranks": 2, "device": "cuda",
                                    "transport": "shm", "time_us": t}) + "\n")
        g = comm_model.load_allreduce(["nccl=" + files["nccl"], "ipc=" + files["ipc"]])
        self.assertEqual(g, {"nccl": [(1 << 20, 100.0)], "ipc": [(1 << 20, 50.0)]})
        self.assertEqual(comm_model.load_allreduce([files["ipc"]]), {"shm": [(1 << 20, 50.0)]})
        self.assertEqual(comm_model.split_label("/a=b/c.jsonl"), (None, "/a=b/c.jsonl"))

    def test_bad_config(self):
        with self.assertRaises(ValueError):
            comm_model.parse_config("x:ring:n=4")
        name, kind, p, _ = comm_model.parse_config("x:hier:g=8,m=2,nvl=1,nic=1,alpha_us=0")
        self.assertEqual((kind, p["g"], p["m"]), ("hier", 8, 2))


class ResnetBenchFake(unittest.TestCase):
    """resnet_bench.py --device cuda against a fake ddprun: the bookkeeping."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="resnet_bench_test_")
        cls.bin = os.path.join(cls.tmp, "bin")
        cls.out = os.path.join(cls.tmp, "out")
        os.makedirs(cls.bin)
        ddprun = os.path.join(cls.bin, "ddprun")
        with open(ddprun, "w") as f:
            f.write(FAKE_DDPRUN.replace("#!PYTHON", "#!" + sys.executable).replace(
                "sys.path.insert(0, HERE)", "sys.path.insert(0, %r)" % HERE))
        os.chmod(ddprun, os.stat(ddprun).st_mode | stat.S_IXUSR)
        open(os.path.join(cls.bin, "libddprun_kernel_trace.so"), "w").close()
        cls.log = os.path.join(cls.tmp, "log.jsonl")
        env = dict(os.environ, DDPRUN_BIN_DIR=cls.bin, FAKE_LOG=cls.log,
                   FAKE_OUT_JSON=os.path.join(cls.out, "resnet_bench_cuda.json"),
                   DDPRUN_COMMIT="0123abc")
        cls.proc = subprocess.run([sys.executable, os.path.join(BENCH, "resnet_bench.py"),
                                   "--device", "cuda", "--out", cls.out, "--python", sys.executable,
                                   "--timeout", "120", "--ours-env", "X_TEST=1",
                                   "--extra-case=tf32-extra resnet18-224-tf32 X_EXTRA=2 --foo"],
                                  capture_output=True, text=True, env=env, timeout=600)
        with open(os.path.join(cls.out, "resnet_bench_cuda.json")) as f:
            cls.res = json.load(f)
        with open(cls.log) as f:
            cls.calls = [json.loads(line) for line in f]
        cls.by = {r["case"]["name"]: r for r in cls.res["results"]}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_runs_and_names_every_case(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr[-3000:])
        self.assertEqual(list(self.by), [
            "resnet18-224-tf32", "resnet18-224-fp32", "lenet-fp32", "resnet18-224-tf32-2ranks",
            "resnet18-224-bf16", "resnet18-224-fp16", "resnet18-224-bf16-act32",
            "resnet18-224-tf32-cudnnbn", "resnet18-224-tf32-graph",
            "resnet18-224-bf16-graph", "resnet18-224-fp32-nhwc",
            "resnet18-224-tf32-nchw", "resnet18-224-bf16-nchw", "resnet18-224-tf32-bnfusion",
            "resnet18-224-bf16-bnfusion", "resnet18-224-tf32-asyncalloc",
            "resnet18-224-tf32-fusedstem", "resnet18-224-bf16-fusedstem",
            "resnet18-224-tf32-ownpool", "resnet18-224-bf16-ownpool",
            "resnet18-224-tf32-bnfold", "resnet18-224-bf16-bnfold",
            "resnet18-224-tf32-bnfold-pdl", "resnet18-224-bf16-bnfold-pdl",
            "resnet18-224-tf32-cudagraph", "resnet18-224-bf16-cudagraph",
            "resnet18-224-tf32-recompute", "resnet18-224-bf16-recompute",
            "resnet18-224-fp32-deterministic", "tf32-extra"])
        self.assertEqual(self.res["commit"], "0123abc")
        for k in ("gpu", "date", "versions", "process_costs"):
            self.assertIn(k, self.res)
        self.assertEqual(self.res["versions"]["torch"], "2.11.0+fake")

    def test_json_is_written_after_every_case(self):
        # Each case's first process saw every earlier case in the JSON already.
        firsts = [c["results_in_json"] for c in self.calls if not c["injection"]]
        self.assertEqual(firsts[0], 0)
        self.assertEqual(sorted(firsts), firsts)
        self.assertEqual(max(firsts), len(self.by) - 1)

    def test_ratio_against_the_faster_setting(self):
        tf32 = self.by["resnet18-224-tf32"]
        self.assertEqual(tf32["faster_pytorch"], "pytorch_channels_last")
        self.assertAlmostEqual(tf32["ratio"]["ours"], 4000.0 / 4500.0)
        for key in ("pytorch", "pytorch_channels_last"):
            for field in ("samples_per_second", "peak_device_mb", "peak_reserved_mb", "final_loss",
                          "profile"):
                self.assertIn(field, tf32[key])
        for field in ("samples_per_second", "peak_device_mb", "peak_reserved_mb", "final_loss",
                      "profile", "host_sync_calls_per_step", "host_sync_waits_per_step"):
            self.assertIn(field, tf32["ours"])
        self.assertEqual(self.by["resnet18-224-bf16"]["case"]["settings"],
                         ["pytorch=channels_last", "pytorch_compile=channels_last+compile"])

    def test_compile_is_a_column_not_the_ratio_base(self):
        # torch.compile (6000/s in the fake) is faster than eager (4500/s), yet
        # the ratio stays against eager; compile's own ratio and time are reported.
        tf32 = self.by["resnet18-224-tf32"]
        self.assertIn("pytorch_compile=channels_last+compile", tf32["case"]["settings"])
        self.assertEqual(tf32["faster_pytorch"], "pytorch_channels_last")
        self.assertAlmostEqual(tf32["compile_ratio"]["ours"], 4000.0 / 6000.0)
        self.assertEqual(tf32["pytorch_compile"]["compile_s"], 42.0)
        self.assertNotIn("pytorch_compile", self.by["resnet18-224-fp32"])
        self.assertNotIn("compile_ratio", self.by["resnet18-224-fp32"])
        self.assertIn("| resnet18-224-tf32 | 4000 | 6000 | 0.67x | 42.0 |", self.proc.stdout)
        # An A/B extra gets the base case's compiled figure too.
        self.assertAlmostEqual(self.by["resnet18-224-tf32-nchw"]["compile_ratio"]["ours"],
                               4000.0 / 6000.0)
        self.assertEqual(self.by["resnet18-224-tf32-nchw"]["ours"]["args"], ["--layout", "nchw"])

    def test_failures_are_recorded_and_the_rest_runs(self):
        two = self.by["resnet18-224-tf32-2ranks"]
        self.assertIn("NCCL refuses", two["ours"]["error"])
        self.assertEqual(two["ours_ipc"]["comm_transport"], "ipc")
        self.assertIn("ours_ipc", two["ratio"])
        self.assertNotIn("ours", two["ratio"])

    def test_extras(self):
        a = self.by["resnet18-224-tf32-asyncalloc"]
        self.assertEqual(a["ours"]["env"], {"DDPRUN_CUDA_ALLOCATOR": "async"})
        p = self.by["resnet18-224-bf16-bnfold-pdl"]
        self.assertEqual(p["ours"]["env"], {"DDPRUN_CUDA_BN_FOLD": "1", "DDPRUN_CUDA_PDL": "1"})
        self.assertEqual(a["pytorch_channels_last"]["same_as"], "resnet18-224-tf32")
        d = self.by["resnet18-224-fp32-deterministic"]
        self.assertEqual(d["case"]["settings"], ["pytorch_channels_last=channels_last"])
        self.assertIn("--deterministic", d["ours"]["command"])
        torch_det = [c for c in self.calls if "--deterministic" in c["argv"] and
                     any(a.endswith("ddp_bench.py") for a in c["argv"])]
        self.assertEqual(len(torch_det), 1)

    def test_extra_case_from_the_command_line(self):
        e = self.by["tf32-extra"]
        self.assertEqual(e["ours"]["env"], {"X_EXTRA": "2"})
        self.assertTrue(e["ours"]["command"].endswith("--foo"))
        self.assertEqual(e["pytorch"]["same_as"], "resnet18-224-tf32")
        call = [c for c in self.calls if "--foo" in c["argv"]]
        self.assertEqual(len(call), 1)

    def test_train_command(self):
        tf32 = [c for c in self.calls if any(a.endswith("train") for a in c["argv"]) and
                "tf32" in c["argv"] and not c["injection"]][0]["argv"]
        v = lambda f: tf32[tf32.index(f) + 1]  # noqa: E731
        total = int(v("--bench-warmup")) + 30 + int(v("--profile-steps"))
        self.assertEqual(int(v("--max-steps")), total)
        self.assertEqual(int(v("--train-samples")), total * 128)
        # The parity check's losses: every warm-up step reported, from the shared weights.
        self.assertEqual(v("--log-interval"), "1")
        self.assertTrue(v("--init").endswith("init_resnet18_imagenet.safetensors"))
        self.assertEqual(v("--data"), "synthetic-cifar")
        # The kernel phase's traced run is the timed configuration, without the parity reads.
        traced = [c for c in self.calls if c["injection"] and
                  any(a.endswith("train") for a in c["argv"])][0]["argv"]
        self.assertGreater(int(traced[traced.index("--log-interval") + 1]), total)

    def test_loss_parity(self):
        tf32 = self.by["resnet18-224-tf32"]
        p = tf32["loss_parity"]["ours~pytorch_channels_last"]
        self.assertTrue(p["ok"])
        self.assertEqual(p["ours"], [2.3 - 0.01 * i for i in range(5)])
        self.assertEqual(p["bound"], 1e-2)
        self.assertNotIn("failed", tf32)
        self.assertAlmostEqual(tf32["ours"]["final_loss"],  # the mean over all steps' records
                               (sum(2.3 - 0.01 * i for i in range(8)) + 1.0 * (43 - 8)) / 43)
        fp16 = self.by["resnet18-224-fp16"]
        self.assertFalse(fp16["loss_parity"]["ours~pytorch"]["ok"])
        self.assertTrue(any("ours~pytorch" in f for f in fp16["failed"]))
        # One initial weights file per model and stem, both sides given it.
        inits = [c for c in self.calls if "--save-init" in c["argv"]]
        self.assertEqual(sorted(c["argv"][c["argv"].index("--model") + 1] for c in inits),
                         ["lenet", "resnet18"])
        torch_tf32 = [c["argv"] for c in self.calls if "--setting" in c["argv"]
                      and "tf32" in c["argv"]][0]
        self.assertIn("--init", torch_tf32)
        self.assertEqual(torch_tf32[torch_tf32.index("--record-losses") + 1], "5")
        self.assertIn("Loss parity: the first 5 step losses", self.proc.stdout)

    def test_repeats_alternate_and_give_median_and_spread(self):
        tf32 = self.by["resnet18-224-tf32"]
        self.assertEqual(tf32["case"]["repeats"], 3)
        self.assertEqual(tf32["ours"]["runs"], [4000.0] * 3)
        self.assertEqual(tf32["ours"]["spread"], 0.0)
        self.assertEqual(len(tf32["pytorch_channels_last"]["runs"]), 3)
        self.assertEqual(len(tf32["pytorch_compile"]["runs"]), 1)  # one compile
        self.assertEqual(self.by["resnet18-224-tf32-asyncalloc"]["ours"]["repeats"], 1)
        # ours, PyTorch, ours, PyTorch, ...: the case's processes alternate.
        sides = ["train" if any(a.endswith("train") for a in c["argv"]) else "torch"
                 for c in self.calls if not c["injection"] and "--save-init" not in c["argv"]
                 and "--precision" in c["argv"] and c["argv"][c["argv"].index("--precision") + 1]
                 == "fp32" and "--model" in c["argv"] and
                 c["argv"][c["argv"].index("--model") + 1] == "resnet18" and
                 "--deterministic" not in c["argv"] and "--layout" not in c["argv"]]
        self.assertEqual(sides, ["train", "torch"] * 3)

    def test_two_ranks_gloo_is_a_second_column(self):
        two = self.by["resnet18-224-tf32-2ranks"]
        self.assertIn("pytorch_gloo", two)
        self.assertEqual(two["pytorch_gloo"]["comm_backend"], "gloo")
        self.assertFalse(two["faster_pytorch"].endswith("_gloo"))

    def test_lenet_graph_column_and_machine_state(self):
        lenet = self.by["lenet-fp32"]
        self.assertIn("pytorch_graph=nchw+graph", lenet["case"]["settings"])
        self.assertIn("pytorch_graph", lenet)
        self.assertNotEqual(lenet["faster_pytorch"], "pytorch_graph")
        # Ours graphed too (DDPRUN_CUDA_GRAPH=1), a column with its own ratio.
        self.assertEqual(lenet["ours_graph"]["env"], {"DDPRUN_CUDA_GRAPH": "1"})
        self.assertIn("ours_graph", lenet["ratio"])
        self.assertIn("commit", self.res["machine"]["tree"])
        self.assertIn("dirty", self.res["machine"]["tree"])
        self.assertIn("gpu_start", self.res["machine"])

    def test_kernel_phase(self):
        for name in ("resnet18-224-tf32", "lenet-fp32"):
            kt = self.by[name]["kernel_trace"]
            self.assertEqual(sorted(kt), ["ours", "pytorch_channels_last"])
            o = kt["ours"]
            p = self.by[name]["case"]["profile_steps"]
            self.assertAlmostEqual(o["kernels_per_step"], 1000 / p)
            self.assertAlmostEqual(o["busy_ms_per_step"], 90.0 / p)
            self.assertAlmostEqual(o["busy_fraction_of_wall"], 90.0 / p / 31.0)
        # bf16's PyTorch side is its one setting (autocast + channels_last).
        kt = self.by["resnet18-224-bf16"]["kernel_trace"]
        self.assertEqual(sorted(kt), ["ours", "pytorch"])
        self.assertNotIn("error", kt["pytorch"])
        traced = [c for c in self.calls if c["injection"]]
        self.assertEqual(len(traced), 6)

    def test_table_and_plot(self):
        out = self.proc.stdout
        self.assertIn("| resnet18-224-tf32 | 4000 (3 runs, spread 0.0%) | 4500 "
                      "(pytorch_channels_last, 3 runs, spread 0.0%) | 0.89x |", out)
        self.assertIn("kernels/step", out)
        self.assertIn("faster PyTorch setting", out)
        if HAVE_MPL:
            self.assertTrue(os.path.getsize(os.path.join(self.out, "resnet_bench_cuda.png")) > 1000)

    def test_comm_model_written(self):
        with open(os.path.join(self.out, "comm_model.json")) as f:
            m = json.load(f)
        self.assertTrue(m["model"])
        self.assertEqual(m["case"], "resnet18-224-tf32")
        self.assertEqual(len(m["rows"]), len(comm_model.CONFIGS))
        # No allreduce_perf lines were given: the two-rank check says so.
        self.assertTrue(all("skipped" in c for c in m["two_rank_check"]))
        self.assertIn("MODEL, not a measurement", self.proc.stdout)

    def test_replot(self):
        out = os.path.join(self.tmp, "replot")
        os.makedirs(out)
        shutil.copy(os.path.join(self.out, "resnet_bench_cuda.json"), out)
        p = subprocess.run([sys.executable, os.path.join(BENCH, "resnet_bench.py"), "--out", out,
                            "--replot"], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, DDPRUN_BIN_DIR=self.bin))
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        self.assertIn("| resnet18-224-tf32 | 4000 (3 runs", p.stdout)
        self.assertTrue(os.path.exists(os.path.join(out, "comm_model.json")))

    def test_only_and_merge(self):
        out = os.path.join(self.tmp, "merge")
        shutil.copytree(self.out, out)
        env = dict(os.environ, DDPRUN_BIN_DIR=self.bin, FAKE_LOG=os.path.join(self.tmp, "log2"),
                   FAKE_OUT_JSON=os.path.join(out, "resnet_bench_cuda.json"))
        p = subprocess.run([sys.executable, os.path.join(BENCH, "resnet_bench.py"), "--out", out,
                            "--python", sys.executable, "--only", "lenet-fp32", "--merge",
                            "--kernel-trace", "off"], capture_output=True, text=True, env=env,
                           timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        res = json.load(open(os.path.join(out, "resnet_bench_cuda.json")))
        self.assertEqual(len(res["results"]), len(self.by))
        # The extras alone, merged: their base cases' PyTorch figures come from the JSON.
        p = subprocess.run([sys.executable, os.path.join(BENCH, "resnet_bench.py"), "--out", out,
                            "--python", sys.executable, "--extras-only", "--merge",
                            "--kernel-trace", "off"], capture_output=True, text=True, env=env,
                           timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        res = {r["case"]["name"]: r for r in
               json.load(open(os.path.join(out, "resnet_bench_cuda.json")))["results"]}
        self.assertEqual(len(res), len(self.by))
        a = res["resnet18-224-tf32-asyncalloc"]
        self.assertEqual(a["pytorch_channels_last"]["same_as"], "resnet18-224-tf32")
        self.assertNotIn("error", a["pytorch_channels_last"])
        self.assertEqual(res["resnet18-224-fp32-deterministic"]["case"]["settings"],
                         ["pytorch_channels_last=channels_last"])
        p = subprocess.run([sys.executable, os.path.join(BENCH, "resnet_bench.py"), "--only", "nope"],
                           capture_output=True, text=True, env=env, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("unknown case", p.stderr)


class CaseSelection(unittest.TestCase):
    """resnet_bench's case list: --no-compile drops torch.compile's column
    (minutes of cold compile) and nothing else."""

    def test_no_compile_keeps_the_eager_settings(self):
        import resnet_bench
        full = resnet_bench.select_cases(resnet_bench.parse_args(
            ["--only", "resnet18-224-tf32,resnet18-224-bf16"]))
        lean = resnet_bench.select_cases(resnet_bench.parse_args(
            ["--only", "resnet18-224-tf32,resnet18-224-bf16", "--no-compile"]))
        self.assertEqual([c["name"] for c in lean], [c["name"] for c in full])
        for f, n in zip(full, lean):
            self.assertIn(resnet_bench.COMPILE, f["settings"])
            self.assertEqual(n["settings"], [s for s in f["settings"] if s != resnet_bench.COMPILE])


@unittest.skipUnless(shutil.which("cc"), "no C compiler to build the stand-in libraries")
class TraceLibLoading(unittest.TestCase):
    """resnet_bench's trace_setup: a tracer whose libcupti does not resolve is
    loaded from a copy beside a link to one found elsewhere (no LD_LIBRARY_PATH)."""

    def test_copy_beside_a_found_libcupti(self):
        import argparse
        import resnet_bench
        tmp = tempfile.mkdtemp(prefix="trace_setup_test_")
        self.addCleanup(shutil.rmtree, tmp, True)
        wheel = os.path.join(tmp, "nvidia", "cu99", "lib")
        os.makedirs(wheel)
        src = os.path.join(tmp, "x.c")
        with open(src, "w") as f:
            f.write("int cupti_stand_in(void) { return 1; }\n")
        cupti = os.path.join(wheel, "libcupti.so.99")
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcupti.so.99", "-o", cupti, src],
                       check=True)
        built = os.path.join(tmp, "built")
        os.makedirs(built)
        lib = os.path.join(built, resnet_bench.TRACE_LIB_NAME)
        with open(src, "w") as f:
            f.write("int cupti_stand_in(void);\nint InitializeInjection(void) "
                    "{ return cupti_stand_in(); }\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-rpath,$ORIGIN", "-o", lib, src, cupti],
                       check=True)
        # Without the wheel's directory the stand-in cannot load.
        self.assertIn("not found", subprocess.run(["ldd", lib], capture_output=True, text=True).stdout)
        o = argparse.Namespace(kernel_trace_lib=lib, python=sys.executable)
        libdir = os.path.join(tmp, "libdir")
        os.makedirs(libdir)
        env, why = resnet_bench.trace_setup(o, libdir)
        self.assertIsNone(env)
        self.assertIn("libcupti.so.99", why)
        os.environ["DDPRUN_CUPTI_DIRS"] = wheel
        self.addCleanup(os.environ.pop, "DDPRUN_CUPTI_DIRS", None)
        env, why = resnet_bench.trace_setup(o, libdir)
        self.assertIsNone(why)
        self.assertEqual(os.path.dirname(env["CUDA_INJECTION64_PATH"]), libdir)
        self.assertNotIn("LD_LIBRARY_PATH", env)
        out = subprocess.run(["ldd", env["CUDA_INJECTION64_PATH"]], capture_output=True, text=True).stdout
        self.assertNotIn("not found", out)


def trace_lib():
    lib = os.path.join(BIN, "libddprun_kernel_trace.so")
    return lib if os.path.isfile(lib) else None


@unittest.skipUnless(trace_lib(), "the kernel tracer is not built (a build with CUDA and CUPTI)")
class KernelTraceLib(unittest.TestCase):
    def test_loads_initialises_and_writes_at_exit_without_crashing(self):
        tmp = tempfile.mkdtemp(prefix="kernel_trace_test_")
        self.addCleanup(shutil.rmtree, tmp, True)
        code = ("import ctypes, os\n"
                "lib = ctypes.CDLL(%r)\n"
                "assert lib.InitializeInjection() == 1 and lib.InitializeInjection() == 1\n"
                "print(os.getpid())\n") % trace_lib()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, DDPRUN_KERNEL_TRACE_OUT=os.path.join(tmp, "t_%p.json")))
        self.assertEqual(p.returncode, 0, p.stderr)
        pid = int(p.stdout.split()[-1])
        with open(os.path.join(tmp, "t_%d.json" % pid)) as f:
            t = json.load(f)
        self.assertEqual((t["tool"], t["pid"], t["range"], t["kernels"]),
                         ("ddprun_kernel_trace", pid, "none", 0))
        self.assertIsInstance(t["errors"], list)  # without a GPU CUPTI's subscribe fails: recorded
        for e in t["errors"]:
            self.assertIn("ddprun_kernel_trace: " + e, p.stderr)


def torch_python():
    """An interpreter with PyTorch and numpy, or None (probed when first needed:
    the fake ddprun imports this module and must stay quick)."""
    venv = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
    for py in (sys.executable, "/usr/bin/python3", os.path.join(venv, "bin/python")):
        if os.access(py, os.X_OK) and _has(py, ["torch", "numpy"]):
            return py
    return None


class DdpBenchCpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.py = torch_python()
        if cls.py is None:
            raise unittest.SkipTest("no Python with PyTorch and numpy (scripts/setup-test-deps.sh)")

    def bench(self, *args, py=None):
        p = subprocess.run([py or self.py, os.path.join(ROOT, "examples/pytorch/ddp_bench.py"),
                            "--device", "cpu", "--threads", "1"] + list(args),
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        lines = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        return lines[-1], lines[:-1]

    def test_lenet_two_settings_profile_in_trains_names(self):
        last, per = self.bench("--model", "lenet", "--batch-size", "16", "--warmup", "2", "--steps",
                               "3", "--profile-steps", "2", "--setting", "pytorch=nchw",
                               "--setting", "pytorch_channels_last=channels_last")
        self.assertEqual([r["setting"] for r in per], ["pytorch", "pytorch_channels_last"])
        self.assertEqual(last["train_samples"], 7 * 16)
        for key, r in last["settings"].items():
            self.assertGreater(r["samples_per_second"], 0)
            self.assertTrue(math.isfinite(r["final_loss"]))
            prof = r["profile"]
            self.assertEqual(prof["steps"], 2)
            self.assertEqual([l["name"] for l in prof["layers"]], LENET_LAYERS)
            for l in prof["layers"]:
                self.assertIsNotNone(l["forward_ms"])
                self.assertIsNotNone(l["backward_ms"])
            for k in ("step_ms", "wall_step_ms", "data_ms", "forward_ms", "loss_ms", "backward_ms",
                      "reducer_ms", "optimizer_ms", "backward_end_ms"):
                self.assertIsNotNone(prof[k], k)
            self.assertLessEqual(prof["backward_end_ms"], prof["step_ms"])
        # Same seed, same data: the two settings train alike.
        a, b = (last["settings"][k]["final_loss"] for k in ("pytorch", "pytorch_channels_last"))
        self.assertAlmostEqual(a, b, delta=1e-3)

    def test_loss_parity_with_train_from_the_same_weights(self):
        # The harness's parity path end to end on the CPU: ddp_bench.py
        # --save-init, then train --init (losses from its --metrics at
        # --log-interval 1, a bench window after them) and ddp_bench.py --init
        # on the same batches: LeNet's first 5 losses agree to float rounding.
        import bench_harness
        train = os.path.join(BIN, "train")
        if not os.access(train, os.X_OK):
            self.skipTest("no train in %s (this build's pass does not build it)" % BIN)
        tmp = tempfile.mkdtemp(prefix="parity_")
        self.addCleanup(shutil.rmtree, tmp, True)
        init = os.path.join(tmp, "init.safetensors")
        self.bench("--model", "lenet", "--save-init", init)
        metrics = os.path.join(tmp, "m.jsonl")
        warm, steps, batch = 6, 4, 16
        total = warm + steps
        p = subprocess.run([train, "--device", "cpu", "--model", "lenet",
                            "--data", "synthetic", "--batch-size", str(batch), "--lr", "0.05",
                            "--momentum", "0.9", "--max-steps", str(total), "--train-samples",
                            str(total * batch), "--test-samples", "64", "--quiet", "--init", init,
                            "--metrics", metrics, "--log-interval", "1", "--bench-warmup",
                            str(warm)], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        ours, mean = bench_harness.losses_from_metrics(metrics, 5)
        last, _ = self.bench("--model", "lenet", "--batch-size", str(batch), "--warmup", str(warm),
                             "--steps", str(steps), "--init", init)
        torch_losses = last["settings"]["pytorch"]["first_losses"]
        check = bench_harness.loss_parity(ours, torch_losses, "fp32")
        self.assertTrue(check["ok"], check)
        self.assertLess(check["max_abs_diff"], 1e-4)
        self.assertTrue(math.isfinite(mean))
        # Without --init the sides start apart: LeNet's final-loss gap of earlier runs.
        last, _ = self.bench("--model", "lenet", "--batch-size", str(batch), "--warmup", str(warm),
                             "--steps", str(steps))
        self.assertEqual(len(last["settings"]["pytorch"]["first_losses"]), 5)

    def test_resnet_layers_are_trains_blocks(self):
        last, _ = self.bench("--model", "resnet18", "--stem", "cifar", "--own-resnet",
                             "--batch-size", "2", "--warmup", "1", "--steps", "1",
                             "--profile-steps", "1")
        names = [l["name"] for l in last["settings"]["pytorch"]["profile"]["layers"]]
        self.assertEqual(names, RESNET_LAYERS)

    def test_compile_setting(self):
        # The plumbing of +compile (the eager backend: dynamo without inductor's
        # C++ build, seconds here): compiled, a compile time, no profile.
        venv = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
        py = next((p for p in (self.py, os.path.join(venv, "bin/python"))
                   if os.access(p, os.X_OK) and subprocess.run(
                       [p, "-c", "import sys, torch; sys.exit(not hasattr(torch, 'compile'))"],
                       capture_output=True, timeout=120).returncode == 0), None)
        if py is None:
            self.skipTest("no PyTorch 2 (torch.compile) here: scripts/setup-test-deps.sh")
        last, _ = self.bench("--model", "lenet", "--batch-size", "8", "--warmup", "2", "--steps",
                             "2", "--profile-steps", "1", "--compile-backend", "eager",
                             "--setting", "pytorch_compile=nchw+compile",
                             "--setting", "pytorch_graph=nchw+graph", py=py)
        self.assertEqual(last["settings"]["pytorch_graph"]["compile_mode"], "reduce-overhead")
        self.assertEqual(last["settings"]["pytorch_compile"]["compile_mode"], "default")
        r = last["settings"]["pytorch_compile"]
        self.assertTrue(r["compiled"])
        self.assertEqual(r["compile_backend"], "eager")
        self.assertGreater(r["compile_s"], 0)
        self.assertGreater(r["samples_per_second"], 0)
        self.assertIsNone(r["profile"])
        self.assertIn("compiled", r["profile_skipped"])
        self.assertTrue(math.isfinite(r["final_loss"]))

    def test_bad_setting(self):
        p = subprocess.run([self.py, os.path.join(ROOT, "examples/pytorch/ddp_bench.py"),
                            "--device", "cpu", "--setting", "torch=nchw"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 2)
        self.assertIn("must start with 'pytorch'", p.stderr)
        p = subprocess.run([self.py, os.path.join(ROOT, "examples/pytorch/ddp_bench.py"),
                            "--device", "cpu", "--setting", "pytorch=nchw+jit"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 2)
        self.assertIn("optionally followed by +compile", p.stderr)


class BnKernelBench(unittest.TestCase):
    """src/bench/bn_kernel_bench: its flags and, on a GPU, one small run (the
    GPU session's `kernels` stage runs the full one)."""

    def setUp(self):
        self.exe = os.path.join(BIN, "bn_kernel_bench")
        if not os.path.exists(self.exe):
            self.skipTest("no bn_kernel_bench in %s (built only with CUDA)" % BIN)

    def run_bench(self, *args):
        return subprocess.run([self.exe] + list(args), capture_output=True, text=True,
                              timeout=300)

    def test_bad_flags_name_the_flag_and_exit_2(self):
        for args, flag in ((["--batch", "0"], "--batch"), (["--image", "16"], "--image"),
                           (["--dtypes", "int8"], "--dtypes"), (["--reps", "0"], "--reps")):
            p = self.run_bench(*args)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(flag, p.stderr)

    def test_small_run_or_a_clear_skip(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "bn.json")
            p = self.run_bench("--batch", "2", "--image", "32", "--reps", "2", "--dtypes",
                               "bfloat16,float32", "--out", out)
            if p.returncode == 77:
                self.assertIn("no CUDA device", p.stderr)
                self.assertFalse(os.path.exists(out))
                self.skipTest("no GPU here: bn_kernel_bench exits 77 and measures nothing")
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(out) as f:
                doc = json.load(f)
            # 2 dtypes x 12 layer configurations (the stem, layer1's two kinds,
            # layer2-4's three) x 4 kernels, each timed.
            self.assertEqual(len(doc["rows"]), 2 * 12 * 4)
            for r in doc["rows"]:
                self.assertGreater(r["ms"], 0)
                self.assertGreater(r["copy_gbps"], 0)
            for name in ("bfloat16", "float32"):
                self.assertGreater(doc["step"][name]["total_ms"], 0)
                for key in ("forward_unfolded_ms", "forward_folded_ms", "backward_unfolded_ms",
                            "backward_folded_ms"):
                    self.assertGreater(doc["step"][name][key], 0, key)
            # Each configuration's two directions, unfolded and folded, and
            # folded under programmatic dependent launch on an sm_90+ device
            # (all rows or none).
            self.assertEqual(len(doc["directions"]), 2 * 12 * 2)
            pdl = ["folded_pdl_ms" in r for r in doc["directions"]]
            self.assertIn(sum(pdl), (0, len(pdl)), "PDL timed for some rows only")
            for r in doc["directions"]:
                self.assertGreater(r["unfolded_ms"], 0)
                self.assertGreater(r["folded_ms"], 0)
                if "folded_pdl_ms" in r:
                    self.assertGreater(r["folded_pdl_ms"], 0)


class CudnnFusionProbe(unittest.TestCase):
    """src/bench/cudnn_fusion_probe: its flags, and every pattern's graph built
    for ResNet-18's layers (cuDNN builds graphs without a device; on a GPU the
    plans are tried too, and which are supported is its output)."""

    def setUp(self):
        self.exe = os.path.join(BIN, "cudnn_fusion_probe")
        if not os.path.exists(self.exe):
            self.skipTest("no cudnn_fusion_probe in %s (built only with CUDA)" % BIN)

    def test_bad_flags_name_the_flag_and_exit_2(self):
        for args, flag in ((["--batch", "0"], "--batch"), (["--dtypes", "int8"], "--dtypes")):
            p = subprocess.run([self.exe] + args, capture_output=True, text=True, timeout=60)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(flag, p.stderr)

    def test_every_graph_builds(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "probe.json")
            p = subprocess.run([self.exe, "--batch", "8", "--out", out], capture_output=True,
                               text=True, timeout=300)
            self.assertIn(p.returncode, (0, 77), p.stderr)
            with open(out) as f:
                doc = json.load(f)
            # 3 patterns x 2 types x 4 layers.
            self.assertEqual(len(doc["rows"]), 3 * 2 * 4)
            for r in doc["rows"]:
                self.assertTrue(r["graph_built"], r)
                if p.returncode == 77:
                    self.assertFalse(r["supported"], r)
                    self.assertIn("no device", r["plan_why"])
                elif r["supported"]:
                    self.assertIn("engine", r["engine"])


if __name__ == "__main__":
    from testmain import main
    main()
