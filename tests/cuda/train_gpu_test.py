"""`train --device cuda` end to end, on a GPU (skipped, with the reason, without one).

- CPU and CUDA train the same: same seed (so the same initial weights), same
  batches, fp32, 20 steps: per-step losses within 1e-4, with CUDA's
  activations NHWC and NCHW (--layout); NHWC with our NHWC batch norm kernels
  (the default), with cuDNN's (DDPRUN_CUDA_OUR_BN=0) and with cuDNN's fused
  batch norm + ReLU (+ add) (DDPRUN_CUDNN_BN_FUSION=1 on cuDNN's).
- bf16 and fp16 with 16-bit activations (the default; DDPRUN_CUDA_ACT16=0 is
  float activations) train within a band of the same precision with float
  activations (LeNet-BN, ResNet-18).
- ResNet's conv2 inputs recomputed for backward (DDPRUN_CUDA_RECOMPUTE=1)
  train bitwise as kept ones, at a lower peak of allocated memory.
- CUDA graphs of the step (DDPRUN_CUDA_GRAPH=1) train bitwise as eager
  steps, with one capture; two ranks stay eager.
- Our batch norm with its sums' epilogue folded into one launch
  (DDPRUN_CUDA_BN_FOLD=1) trains bitwise as the unfolded launches.
- Convolutions through cuDNN's graph API (DDPRUN_CUDNN_GRAPH=1) train within
  a band of the legacy search's in tf32 and bf16 (ResNet-18, 7x7 stem).
- 2 ranks sharing one GPU equal 1 rank at twice the batch (losses within 1e-4),
  through CUDA IPC (the default there) and through NCCL (forced; fp32,
  --deterministic; needs NCCL >= 2.30, whose version coll_check reports).
- Resume after kill -9 on CUDA ends with bitwise the same weights as an
  uninterrupted run (--deterministic: the default fast algorithms repeat only
  to rounding). The CPU/CUDA and rank-count comparisons also run in that mode.
- A CPU checkpoint resumes on CUDA and a CUDA checkpoint on the CPU.
- fp16: dynamic loss scaling recovers from a forced overflow (skipped steps
  counted in the final JSON, training goes on).
The GPU is probed by asking train itself (`--device cuda` for one step): a
build without CUDA or a machine without a visible GPU skips every test."""
import os
import signal
import subprocess
import sys
import tempfile
import shutil
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
from train_e2e_test import (DDPRUN, TRAIN, clean_env, final_json, descendants, env_of,  # noqa: E402
                            records, step_lines, checkpoints, read)

SMALL = ["--data", "synthetic", "--train-samples", "1024", "--test-samples", "256"]
LOSS_TOL = 1e-4


def probe():
    """None when train can run on CUDA here, else why not."""
    try:
        p = subprocess.run([TRAIN, "--device", "cuda", "--max-steps", "1", "--quiet",
                            "--epochs", "1", *SMALL], capture_output=True, text=True,
                           timeout=300, env=clean_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        return "train --device cuda could not run: %s" % e
    if p.returncode == 2 and ("no CUDA GPU" in p.stderr or "without CUDA" in p.stderr):
        return p.stderr.strip().splitlines()[-1]
    return None


NO_GPU = probe() if os.access(TRAIN, os.X_OK) else "train not built"
COLL_CHECK = os.path.join(os.path.dirname(TRAIN), "coll_check")
NCCL_MULTI_RANK_GPU = 23000  # the first NCCL that accepts two ranks on one GPU


def nccl_problem():
    """None when the NCCL that train loads here accepts two ranks on one GPU,
    else why not. coll_check links the same runtime and libnccl.so.2 as train
    and runs in the same environment (LD_LIBRARY_PATH), so it loads the same
    library."""
    if not os.access(COLL_CHECK, os.X_OK):
        return "coll_check not built (it reports the NCCL version)"
    p = subprocess.run([COLL_CHECK, "--nccl-version"], capture_output=True, text=True,
                       timeout=60, env=clean_env())
    if p.returncode != 0:
        return "coll_check --nccl-version failed: %s" % (p.stdout + p.stderr).strip()
    _, code, name = p.stdout.split()[:3]
    if int(code) < NCCL_MULTI_RANK_GPU:
        return ("NCCL %s is loaded here: two ranks on one GPU need NCCL >= 2.30 (pip install "
                "'nvidia-nccl-cu13>=2.30' and put its lib directory first on LD_LIBRARY_PATH)"
                % name)
    return None


def losses(path):
    return [r["loss"] for r in step_lines(path)]


@unittest.skipIf(NO_GPU is not None, "no GPU: %s" % NO_GPU)
class TrainGpu(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="train_gpu_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_ok(self, cmd, what, env=None, timeout=600):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.tmp,
                           env=env or clean_env())
        self.assertEqual(p.returncode, 0, "%s exited %d\nstdout:\n%s\nstderr:\n%s"
                         % (what, p.returncode, p.stdout[-3000:], p.stderr[-5000:]))
        self.last_stderr = p.stderr
        res = final_json(p.stdout)
        self.assertIsNotNone(res, "%s printed no final JSON" % what)
        return res

    def train(self, name, *args, nproc=0, env=None):
        metrics = os.path.join(self.tmp, name + ".jsonl")
        cmd = [TRAIN] if nproc == 0 else [DDPRUN, "--standalone", "--nproc_per_node=%d" % nproc,
                                          "--no_python", TRAIN]
        res = self.run_ok(cmd + list(args) + ["--metrics", metrics, "--log-interval", "1",
                                              "--quiet"], name, env=env)
        return res, losses(metrics)

    def switch_ab(self, name, flags, var, extra_env=None):
        """The run with environment switch `var` off (0) and on (1), the rest
        alike: ((final JSON, losses) off, (final JSON, losses) on)."""
        runs = []
        for v in ("0", "1"):
            env = dict(clean_env(), **(extra_env or {}))
            env[var] = v
            runs.append(self.train("%s_%s%s" % (name, var.lower(), v), *flags, env=env))
        return runs[0], runs[1]

    def compare(self, what, a, b, tol=LOSS_TOL):
        self.assertEqual(len(a), len(b), "%s: %d vs %d logged steps" % (what, len(a), len(b)))
        worst = max(abs(x - y) for x, y in zip(a, b))
        print("\n%s: worst |loss diff| over %d steps %.2e" % (what, len(a), worst), file=sys.stderr)
        self.assertLessEqual(worst, tol, "%s: losses differ by %.3g\n%s\n%s" % (what, worst, a, b))

    def test_cpu_and_cuda_train_the_same_fp32(self):
        # ResNet-18 at batch 32 is chaotic: a 1e-7 nudge of the weights moves
        # PyTorch's own losses by 1e-3 within a few steps (tests/interop's
        # resnet parity measures it), so its free-running check covers the
        # first 2 steps (the third already differs by 2e-4 on an H100); LeNet's
        # covers all 20.
        models = [("lenet", SMALL, 20), ("lenet-bn", SMALL, 20),
                  ("resnet18", ["--data", "synthetic-cifar", "--stem", "cifar",
                                "--train-samples", "640", "--test-samples", "64"], 2)]
        for model, data, checked in models:
            flags = ["--model", model, *data, "--batch-size", "32", "--max-steps", "20",
                     "--no-shuffle", "--lr", "0.01", "--precision", "fp32", "--deterministic"]
            cpu, lc = self.train(model + "_cpu", "--device", "cpu", *flags)
            # Both layouts; NHWC with our batch norm kernels (the default), with
            # cuDNN's, and with cuDNN's fused batch norm + ReLU (+ add).
            for layout, what, env in (("nhwc", "nhwc our bn", {}), ("nchw", "nchw", {}),
                                      ("nhwc", "nhwc cudnn bn", {"DDPRUN_CUDA_OUR_BN": "0"}),
                                      ("nhwc", "nhwc fused bn", {"DDPRUN_CUDA_OUR_BN": "0",
                                                                 "DDPRUN_CUDNN_BN_FUSION": "1"})):
                gpu, lg = self.train(model + "_cuda_" + what.replace(" ", "_"), "--device",
                                     "cuda", "--layout", layout, *flags,
                                     env=dict(clean_env(), **env))
                self.assertEqual((cpu["device"], gpu["device"]), ("cpu", "cuda"))
                self.assertEqual((cpu["layout"], gpu["layout"]), ("nchw", layout))
                if layout == "nhwc":  # the default is ours; =0 is cuDNN's
                    self.assertEqual("our batch norm" in gpu["backend"], what == "nhwc our bn",
                                     gpu["backend"])
                self.assertEqual(len(lg), 20)
                self.compare("%s cpu vs cuda %s, first %d steps" % (model, what, checked),
                             lc[:checked], lg[:checked])

    def test_16bit_activations_train_as_float_activations(self):
        # 16-bit activations (the default) keep the activations (and the
        # gradients through them) in 16 bits, batch norm through our NHWC kernels; against the
        # same precision with float activations the run differs by the
        # activations' rounding only, so the losses stay within a band (bf16
        # 5 %, fp16 2 % of the loss) over LeNet-BN's 20 steps and ResNet-18's
        # first 5 (chaotic after, as in the fp32 comparison), and both learn.
        models = [("lenet-bn", SMALL, 20),
                  ("resnet18", ["--data", "synthetic-cifar", "--stem", "cifar",
                                "--train-samples", "640", "--test-samples", "64"], 5)]
        for model, data, checked in models:
            for prec, band in (("bf16", 0.05), ("fp16", 0.02)):
                flags = ["--device", "cuda", "--model", model, *data, "--batch-size", "32",
                         "--max-steps", "20", "--no-shuffle", "--lr", "0.01", "--precision",
                         prec, "--layout", "nhwc", "--deterministic"]
                runs = {}
                for act16 in ("0", "1"):
                    runs[act16] = self.train("%s_%s_act16_%s" % (model, prec, act16), *flags,
                                             env=dict(clean_env(), DDPRUN_CUDA_ACT16=act16))
                (ref, lr), (got, lg) = runs["0"], runs["1"]
                self.assertIn("16-bit activations", got["backend"])
                self.assertNotIn("16-bit activations", ref["backend"])
                self.assertEqual(len(lg), 20)
                what = "%s %s: 16-bit vs float activations, first %d steps" % (model, prec,
                                                                                checked)
                worst = max(abs(a - b) / abs(b) for a, b in zip(lg[:checked], lr[:checked]))
                print("\n%s: worst relative loss difference %.2e" % (what, worst),
                      file=sys.stderr)
                self.assertLessEqual(worst, band, "%s\n%s\n%s" % (what, lg, lr))
                self.assertLess(sum(lg[-5:]), sum(lg[:5]), "%s: no learning: %s" % (what, lg))

    def test_folded_batch_norm_launches_train_bitwise_as_unfolded(self):
        # DDPRUN_CUDA_BN_FOLD=1 folds our batch norm's chunk reduction, its
        # finish and its parameter gradients into the sums' launch: the same
        # arithmetic in the same order, so with the convolutions deterministic
        # the weights after 10 steps are bitwise those of the unfolded launches
        # (ResNet-18 with the ImageNet stem, bf16 and tf32; the fused stem too).
        data = ["--data", "synthetic-cifar", "--stem", "imagenet", "--image-size", "64",
                "--train-samples", "640", "--test-samples", "64"]
        for prec, stem in (("bf16", "0"), ("tf32", "0"), ("bf16", "1")):
            flags = ["--device", "cuda", "--model", "resnet18", *data, "--batch-size", "32",
                     "--max-steps", "10", "--no-shuffle", "--lr", "0.01", "--precision", prec,
                     "--layout", "nhwc", "--deterministic"]
            (ref, lr), (got, lg) = self.switch_ab(
                "resnet18_%s_stem%s" % (prec, stem), flags, "DDPRUN_CUDA_BN_FOLD",
                {"DDPRUN_CUDA_FUSED_STEM": stem})
            self.assertIn("(sums folded)", got["backend"])
            self.assertNotIn("(sums folded)", ref["backend"])
            self.assertEqual(lg, lr, "%s stem %s: losses" % (prec, stem))
            self.assertEqual(got["params_sha256"], ref["params_sha256"],
                             "%s stem %s: folded and unfolded weights differ" % (prec, stem))

    def test_programmatic_dependent_launch_trains_bitwise(self):
        # DDPRUN_CUDA_PDL=1 launches our batch norm's kernels with programmatic
        # dependent launch: each waits for the kernel before it at its start,
        # so the weights are bitwise those of ordinary launches, folded or
        # not, and inside a CUDA graph of the step too (programmatic edges).
        data = ["--data", "synthetic-cifar", "--stem", "imagenet", "--image-size", "64",
                "--train-samples", "640", "--test-samples", "64"]
        for prec, fold, graph in (("bf16", "1", "0"), ("tf32", "0", "0"), ("bf16", "1", "1")):
            flags = ["--device", "cuda", "--model", "resnet18", *data, "--batch-size", "32",
                     "--max-steps", "10", "--no-shuffle", "--lr", "0.01", "--precision", prec,
                     "--layout", "nhwc", "--deterministic"]
            (ref, lr), (got, lg) = self.switch_ab(
                "resnet18_%s_fold%s_graph%s" % (prec, fold, graph), flags, "DDPRUN_CUDA_PDL",
                {"DDPRUN_CUDA_BN_FOLD": fold, "DDPRUN_CUDA_GRAPH": graph})
            self.assertIn("(PDL)", got["backend"])
            self.assertNotIn("(PDL)", ref["backend"])
            if graph == "1":
                self.assertEqual(got["cuda_graph"]["state"], "on", got["cuda_graph"])
            self.assertEqual(lg, lr, "%s fold %s graph %s: losses" % (prec, fold, graph))
            self.assertEqual(got["params_sha256"], ref["params_sha256"],
                             "%s fold %s graph %s: PDL changed the weights" % (prec, fold, graph))

    def test_recomputed_conv2_inputs_train_bitwise_with_less_memory(self):
        # DDPRUN_CUDA_RECOMPUTE=1: each ResNet block gives relu(bn1(c1)) back
        # after conv2's forward and recomputes it (our kernels' apply with
        # the saved statistics) for backward: bitwise the same weights, a
        # lower peak of allocated memory (ResNet-18, ImageNet stem at 64 px).
        data = ["--data", "synthetic-cifar", "--stem", "imagenet", "--image-size", "64",
                "--train-samples", "640", "--test-samples", "64"]
        for prec in ("bf16", "tf32"):
            flags = ["--device", "cuda", "--model", "resnet18", *data, "--batch-size", "64",
                     "--max-steps", "6", "--no-shuffle", "--lr", "0.01", "--precision", prec,
                     "--layout", "nhwc", "--deterministic"]
            (ref, lr), (got, lg) = self.switch_ab("resnet18_%s" % prec, flags,
                                                  "DDPRUN_CUDA_RECOMPUTE")
            self.assertEqual(lg, lr, "%s: losses" % prec)
            self.assertEqual(got["params_sha256"], ref["params_sha256"], prec)
            print("\nresnet18 %s: peak allocated %.1f MiB recomputed, %.1f MiB kept"
                  % (prec, got["peak_device_mb"], ref["peak_device_mb"]), file=sys.stderr)
            self.assertLess(got["peak_device_mb"], ref["peak_device_mb"], prec)

    def test_cuda_graph_steps_train_bitwise_as_eager_steps(self):
        # DDPRUN_CUDA_GRAPH=1: from the third step (the first two search the
        # convolutions and rebuild the buckets) forward, loss, backward and
        # the optimizer are one captured graph, replayed with the input and
        # labels copied into its slots and the step's learning rate and step
        # count staged into the optimizer's (the warm-up and cosine schedule,
        # stepped per step, change the rate every step; each epoch's
        # evaluation forces a recapture). Under fp16's loss scaler the optimizer stays eager,
        # saying why. With the convolutions deterministic the run is bitwise
        # the eager one. One capture an epoch and no failure also says no
        # allocation happened inside it (the allocator refuses one, which
        # fails the capture and turns graphs off); fp16 recaptures when an
        # overflow changes its loss scale.
        sched = ["--epochs", "2", "--warmup-epochs", "1", "--lr-schedule", "cosine",
                 "--lr-step-on", "step"]
        cases = [("lenet", SMALL, "fp32", ["--optimizer", "adam", *sched], "in the graph"),
                 ("lenet", SMALL, "fp16", [], "loss scaler"),
                 ("resnet18", ["--data", "synthetic-cifar", "--stem", "cifar",
                               "--train-samples", "640", "--test-samples", "64"], "bf16",
                  ["--momentum", "0.9", *sched], "in the graph")]
        for model, data, prec, extra, optimizer in cases:
            flags = ["--device", "cuda", "--model", model, *data, "--batch-size", "32",
                     "--max-steps", "12", "--no-shuffle", "--lr", "0.01", "--precision", prec,
                     "--deterministic", *extra]
            epochs = 2 if "--epochs" in extra else 1
            (ref, lr), (got, lg) = self.switch_ab("%s_%s" % (model, prec), flags,
                                                  "DDPRUN_CUDA_GRAPH")
            self.assertIn("DDPRUN_CUDA_GRAPH=1", ref["cuda_graph"]["state"])
            c = got["cuda_graph"]
            self.assertEqual(c["state"], "on", c)
            self.assertIn(optimizer, c["optimizer"], c)
            # Every capture held the optimizer, or (fp16) none did.
            self.assertEqual(c["optimizer_captures"],
                             0 if prec == "fp16" else c["captures"], c)
            self.assertEqual(c["eager_steps"] + c["captures"] + c["replays"], 12 * epochs, c)
            if prec != "fp16":  # an overflow changes fp16's loss scale: a recapture
                self.assertEqual(c["captures"], epochs, c)
                self.assertGreaterEqual(c["replays"], (12 - 3) * epochs, c)
            self.assertEqual(lg, lr, "%s %s: graphed and eager losses" % (model, prec))
            self.assertEqual(got["params_sha256"], ref["params_sha256"],
                             "%s %s: graphed and eager weights differ" % (model, prec))
        # Two ranks stay eager, saying why.
        res, _ = self.train("lenet_graph_2ranks", "--device", "cuda", "--model", "lenet", *SMALL,
                            "--max-steps", "4", nproc=2,
                            env=dict(clean_env(), DDPRUN_CUDA_GRAPH="1"))
        self.assertIn("2 ranks", res["cuda_graph"]["state"])

    def test_graph_api_convolutions_train_as_the_legacy_search(self):
        # DDPRUN_CUDNN_GRAPH=1 runs every convolution through a cuDNN graph-API
        # engine, timed and accuracy-checked as the legacy algorithms are. It
        # applies in fast mode only, where both searches pick their fastest
        # passing algorithms (by timing, so the pairs differ from run to run),
        # and the runs differ by those algorithms' rounding. ResNet-18 (the 7x7
        # stem with 3 input channels at 64x64, whose backward-filter the graph
        # API is for), tf32 and bf16, checked where the comparison means
        # something:
        # - step 0, the same weights: the forward's loss within 1 %;
        # - step 1, after one update: the two updates moved the loss alike,
        #   within 20 % of the step-0-to-1 change (the gradients agree);
        # - both learn over 20 steps, and no convolution falls back.
        # Not a later step's loss: this run memorises its data at lr 0.01, and a
        # rounding difference grows about tenfold a step (H200, tf32: 4e-6,
        # 3e-4, 2.7e-3, 8e-3, 5.4e-2 over steps 0-4 in one run; 3e-5, 3.4e-3,
        # 1.2e-2 over steps 0-2 in another, whose step-1 difference was 2 % of
        # the step's change), while each graph engine's own error against
        # float64 stays within the check's bounds (ConvFastModeWithinTheCheckBounds).
        data = ["--data", "synthetic-cifar", "--stem", "imagenet", "--image-size", "64",
                "--train-samples", "640", "--test-samples", "64"]
        for prec in ("tf32", "bf16"):
            flags = ["--device", "cuda", "--model", "resnet18", *data, "--batch-size", "32",
                     "--max-steps", "20", "--no-shuffle", "--lr", "0.01", "--precision", prec,
                     "--layout", "nhwc"]
            ref, lr = self.train("resnet18_%s_legacy" % prec, *flags,
                                 env=dict(clean_env(), DDPRUN_CUDNN_GRAPH="0"))
            got, lg = self.train("resnet18_%s_graph" % prec, *flags,
                                 env=dict(clean_env(), DDPRUN_CUDNN_GRAPH="1"))
            self.assertIn("cuDNN graph convolutions", got["backend"])
            self.assertNotIn("cuDNN graph convolutions", ref["backend"])
            self.assertNotIn("no cuDNN graph-API engine may run", self.last_stderr)
            what = "resnet18 %s: graph API vs legacy search" % prec
            forward = abs(lg[0] - lr[0]) / abs(lr[0])
            update = abs(lg[1] - lr[1]) / abs(lr[0] - lr[1])
            print("\n%s: step 0 relative loss difference %.2e; step 1 difference %.2e of the "
                  "step's change" % (what, forward, update), file=sys.stderr)
            self.assertLessEqual(forward, 0.01, "%s, step 0\n%s\n%s" % (what, lg, lr))
            self.assertLessEqual(update, 0.2, "%s, step 1\n%s\n%s" % (what, lg, lr))
            self.assertLess(sum(lg[-5:]), sum(lg[:5]), "%s: no learning: %s" % (what, lg))

    def test_two_ranks_sharing_one_gpu_equal_one_rank_at_twice_the_batch(self):
        flags = ["--device", "cuda", "--model", "lenet", *SMALL, "--max-steps", "10",
                 "--no-shuffle", "--deterministic"]
        two, l2 = self.train("two", *flags, "--batch-size", "16", nproc=2)
        one, l1 = self.train("one", *flags, "--batch-size", "32")
        self.assertEqual((two["world"], one["world"]), (2, 1))
        self.compare("2 ranks x 16 vs 1 rank x 32 on one GPU", l2, l1)

    def test_two_ranks_through_nccl_on_one_gpu_equal_one_rank_at_twice_the_batch(self):
        why = nccl_problem()
        if why:
            self.skipTest(why)
        # Forced, not chosen: with DDPRUN_CUDA_TRANSPORT=nccl the runtime uses
        # NCCL or fails (no silent fallback), so a pass went through NCCL, with
        # the reducer's all-reduces ordered on NCCL's stream.
        flags = ["--device", "cuda", "--model", "lenet", *SMALL, "--max-steps", "10",
                 "--no-shuffle", "--precision", "fp32", "--deterministic"]
        env = clean_env(DDPRUN_CUDA_TRANSPORT="nccl", DDPRUN_CUDA_DEVICE="0")
        two, l2 = self.train("two_nccl", *flags, "--batch-size", "16", nproc=2, env=env)
        one, l1 = self.train("one_nccl", *flags, "--batch-size", "32")
        self.assertEqual((two["world"], one["world"]), (2, 1))
        self.compare("2 ranks x 16 through NCCL vs 1 rank x 32 on one GPU", l2, l1)

    def test_resume_after_sigkill_on_cuda_is_bitwise(self):
        flags = ["--device", "cuda", "--model", "lenet-bn", "--data", "synthetic",
                 "--train-samples", "3000", "--test-samples", "300", "--epochs", "2",
                 "--batch-size", "32", "--checkpoint-every", "5", "--log-interval", "1",
                 "--deterministic"]
        ref = self.run_ok([DDPRUN, "--standalone", "--nproc_per_node=2", "--no_python", TRAIN,
                           *flags, "--checkpoint-dir", os.path.join(self.tmp, "ref")],
                          "uninterrupted run")
        ckpt_dir = os.path.join(self.tmp, "ckpt")
        metrics = os.path.join(self.tmp, "m.jsonl")
        out, err = (open(os.path.join(self.tmp, n), "w+") for n in ("out", "err"))
        agent = subprocess.Popen([DDPRUN, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
                                  "--no_python", TRAIN, *flags, "--checkpoint-dir", ckpt_dir,
                                  "--metrics", metrics],
                                 stdout=out, stderr=err, cwd=self.tmp, env=clean_env())
        try:
            victim = None
            deadline = time.time() + 300
            while time.time() < deadline and agent.poll() is None:
                if len(step_lines(metrics)) >= 12 and checkpoints(ckpt_dir):
                    workers = {env_of(c).get("LOCAL_RANK"): c for c in descendants(agent.pid)}
                    if "1" in workers:
                        victim = workers["1"]
                        os.kill(victim, signal.SIGKILL)
                        break
                time.sleep(0.005)
            self.assertIsNotNone(victim, "no worker to kill: rc %s\n%s"
                                 % (agent.poll(), read(err.name)[-3000:]))
            rc = agent.wait(timeout=300)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            out.close()
            err.close()
        self.assertEqual(rc, 0, "the restarted job failed:\n" + read(err.name)[-5000:])
        res = final_json(read(out.name))
        self.assertEqual(len([r for r in records(metrics) if r.get("type") == "resume"]), 1)
        self.assertEqual(res["params_sha256"], ref["params_sha256"],
                         "resumed CUDA run ends with other weights than the uninterrupted one")

    def test_checkpoints_move_between_cpu_and_cuda(self):
        base = ["--model", "lenet-bn", *SMALL, "--batch-size", "32", "--no-shuffle",
                "--epochs", "2", "--max-steps", "8", "--checkpoint-every", "4",
                "--keep-checkpoints", "10"]
        ref, _ = self.train("ref_cpu", "--device", "cpu", *base[:-4])
        for first, second in (("cpu", "cuda"), ("cuda", "cpu")):
            d = os.path.join(self.tmp, "ck_" + first)
            env = clean_env(TORCHELASTIC_RUN_ID="move-" + first)
            self.train("a_" + first, "--device", first, *base, "--checkpoint-dir", d, env=env)
            # Keep only the checkpoint at global step 4: the run resumes there
            # on the other device and trains the remaining 12 steps.
            kept = [n for n in checkpoints(d) if n.endswith("-000000004.safetensors")]
            self.assertEqual(len(kept), 1, "no checkpoint at step 4 in %s" % checkpoints(d))
            for n in checkpoints(d):
                if n not in kept:
                    os.remove(os.path.join(d, n))
            res, ls = self.train("b_" + first, "--device", second, *base, "--checkpoint-dir", d,
                                 "--resume", env=env)
            self.assertEqual(res["device"], second)
            self.assertEqual(len(ls), 12, "the resumed run did not start at step 5")
            self.assertAlmostEqual(res["final_loss"], ref["final_loss"], delta=1e-3,
                                   msg="%s -> %s resume drifted from the CPU-only run"
                                   % (first, second))

    def test_fp16_loss_scaling_recovers_from_an_overflow(self):
        flags = ["--device", "cuda", "--precision", "fp16", "--model", "lenet", *SMALL,
                 "--max-steps", "30", "--batch-size", "32"]
        probe16 = subprocess.run([TRAIN, *flags[:4], "--max-steps", "1", *SMALL, "--quiet"],
                                 capture_output=True, text=True, env=clean_env(), timeout=300)
        if probe16.returncode == 2 and "not available" in probe16.stderr:
            self.skipTest(probe16.stderr.strip().splitlines()[-1])
        start = 2 ** 40  # dy * 2^40 overflows fp16 (max 65504) at once
        res, ls = self.train("fp16", *flags, env=clean_env(DDPRUN_LOSS_SCALE=str(start)))
        print("\nfp16: %d skipped steps, loss scale %g -> %g, loss %.4f -> %.4f"
              % (res["skipped_steps"], start, res["loss_scale"], ls[0], ls[-1]), file=sys.stderr)
        self.assertGreater(res["skipped_steps"], 0, "no overflow was detected at scale 2^40")
        self.assertLess(res["skipped_steps"], 30, "the scaler never recovered")
        self.assertLess(res["loss_scale"], start)
        self.assertLess(ls[-1], ls[0], "fp16 training did not reduce the loss after recovering")


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
