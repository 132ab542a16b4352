"""End-to-end tests of the bundled trainer: real `ddprun`, real `train` workers.

The main command exactly as the README writes it, determinism, resume after a
worker is killed with SIGKILL, bad input (exit 2 with a message, never a
crash), and the same result alone / under ddprun / under torchrun 2.x.
Small sample counts keep the file within a few minutes on two cores. The tests
that need Fashion-MNIST (the README's command on the default data, damaged
copies of the real files) skip, with the reason, when it is not installed;
every other test says --data synthetic itself."""
import fcntl
import glob
import gzip
import json
import os
import re
import resource
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DDPRUN = os.path.join(BIN, "ddprun")
TRAIN = os.path.join(BIN, "train")
DATA = "/usr/share/datasets/fashion-mnist"
DATA_FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
HAVE_DATA = all(os.path.isfile(os.path.join(DATA, f)) for f in DATA_FILES)
NEED_DATA = "Fashion-MNIST not installed in %s (scripts/setup.sh installs it)" % DATA
SYNTHETIC = ["--data", "synthetic"]
TORCHRUN = os.path.join(os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2"),
                        "bin/torchrun")
SMALL = SYNTHETIC + ["--train-samples", "1024", "--test-samples", "256"]
CKPT = re.compile(r"^ckpt-(?:[A-Za-z0-9_.-]+-)?\d{9,}\.safetensors$")
# Launcher variables a caller's environment may carry: none may leak into a
# run that is meant to be alone or launched fresh.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE",
               "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCH_VARS and not k.startswith("PET_")}
    env.update(extra)
    return env


def final_json(stdout):
    """The JSON object on the last line of stdout starting with '{' (the
    launchers may print their own lines after rank 0's)."""
    lines = [l for l in stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def crashed(p):
    """Why a process looks crashed rather than refusing input, or None."""
    if p.returncode < 0:
        return "killed by signal %d" % -p.returncode
    for sign in ("Traceback", "terminate called", "Segmentation fault", "Aborted",
                 "core dumped", "AddressSanitizer", "runtime error:"):
        if sign in p.stderr:
            return "stderr shows %r" % sign
    return None


def descendants(pid):
    """Live pids below `pid` (a scan of /proc): ddprun's workers are the
    children of its per-worker keepers, i.e. its grandchildren."""
    parent = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z":
            parent[int(stat.split("/")[2])] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def env_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0")
                        if "=" in kv)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}


def read(path):
    with open(path) as f:
        return f.read()


def records(path):
    """The complete JSON lines of a metrics file (a line being written is
    left out)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return rows


def step_lines(path):
    return [r for r in records(path) if r.get("type") == "step"]


def checkpoint_name(run, step):
    """The trainer's name for run `run`'s checkpoint at global step `step`
    (a run id of safe characters is its own tag)."""
    return "ckpt-%s-%09d.safetensors" % (run, step)


LENET_NAMES = {"%s.%s" % (layer, kind) for layer in ("conv1", "conv2", "fc1", "fc2", "fc3")
               for kind in ("weight", "bias")}


def safetensors_names(path):
    """Tensor names in a safetensors file's header."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return set(header)


def checkpoints(directory):
    try:
        return sorted(n for n in os.listdir(directory) if CKPT.match(n))
    except FileNotFoundError:
        return []


class TrainE2E(unittest.TestCase):
    _cache = {}

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="train_e2e_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    # ------------------------------------------------------------- helpers

    def run_cmd(self, cmd, timeout=240, cwd=None, env=None):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              cwd=cwd or self.tmp, env=env or clean_env())

    def train_alone(self, *args, timeout=240, env=None):
        return self.run_cmd([TRAIN, *args], timeout=timeout, env=env)

    def ddprun(self, nproc, *args, launcher_flags=(), timeout=240):
        """The second documented form, with the program's path; test (a)
        covers the bare name `train`."""
        return self.run_cmd([DDPRUN, "--standalone", "--nproc_per_node=%d" % nproc,
                             *launcher_flags, "--no_python", TRAIN, *args], timeout=timeout)

    def ok(self, p, what):
        self.assertEqual(p.returncode, 0, "%s exited %d\nstdout:\n%s\nstderr:\n%s"
                         % (what, p.returncode, p.stdout[-3000:], p.stderr[-5000:]))
        res = final_json(p.stdout)
        self.assertIsNotNone(res, "%s printed no final JSON line:\n%s" % (what, p.stdout[-3000:]))
        return res

    def ddprun_result(self, nproc, *args):
        """A successful ddprun run's final JSON, memoised across tests (the
        same command gives the same result; test_determinism checks it)."""
        key = (nproc,) + args
        if key not in self._cache:
            self._cache[key] = self.ok(self.ddprun(nproc, *args), "ddprun %d x train %s"
                                       % (nproc, " ".join(args)))
        return self._cache[key]

    def refused(self, p, *needles, what=""):
        """Exit code 2, no crash, and every needle (a string, or a tuple of
        alternatives) in stderr."""
        self.assertIsNone(crashed(p), "%s: %s\n%s" % (what, crashed(p), p.stderr[-3000:]))
        self.assertEqual(p.returncode, 2, "%s: expected exit code 2, got %d\nstderr:\n%s"
                         % (what, p.returncode, p.stderr[-3000:]))
        for n in needles:
            alts = n if isinstance(n, tuple) else (n,)
            self.assertTrue(any(a in p.stderr for a in alts),
                            "%s: stderr names none of %s:\n%s" % (what, alts, p.stderr[-3000:]))

    # ------------------------------------------------------------- (a) main command

    @unittest.skipUnless(HAVE_DATA, NEED_DATA)
    def test_main_command_four_workers(self):
        # `ddprun --nproc_per_node=4 train` exactly, from a directory holding
        # nothing, with only size flags added: the default data, Fashion-MNIST.
        # The port comes from the environment (PET_MASTER_PORT=0: a free
        # one), not from a flag.
        flags = ["--train-samples", "4000", "--test-samples", "500"]
        p = self.run_cmd([DDPRUN, "--nproc_per_node=4", "train", *flags],
                         env=clean_env(PET_MASTER_PORT="0"))
        res = self.ok(p, "ddprun --nproc_per_node=4 train")
        self.assertTrue(p.stdout.strip().splitlines()[-1].startswith("{"),
                        "the JSON is not the last stdout line:\n" + p.stdout[-2000:])
        self.assertEqual(res["world"], 4)
        self.assertEqual(res["model"], "lenet")
        self.assertEqual(res["epochs"], 1)
        self.assertEqual(res["batch_size"], 64)
        self.assertEqual(res["steps"], 16)  # ceil(4000 / 4 / 64) per rank
        self.assertEqual(res["test_total"], 500)
        self.assertAlmostEqual(res["test_accuracy"], res["test_correct"] / 500.0)
        self.assertGreater(res["test_accuracy"], 0.2, "no better than chance (0.1)")
        for key in ("train_seconds", "samples_per_second", "final_loss", "params_sha256",
                    "breakdown", "comm_hidden_fraction", "peak_rss_mb"):
            self.assertIn(key, res)
        self.assertEqual(set(res["breakdown"]),
                         {"data_s", "forward_backward_s", "comm_wait_s", "optimizer_s"})
        self.assertGreater(res["samples_per_second"], 0)
        self.assertGreater(res["peak_rss_mb"], 0)
        self.assertRegex(res["params_sha256"], r"^[0-9a-f]{64}$")

    # ------------------------------------------------------------- (b) determinism

    def test_two_identical_runs_same_params(self):
        flags = SMALL + ["--seed", "3"]
        first = self.ddprun_result(2, *flags)
        again = self.ok(self.ddprun(2, *flags), "second identical run")
        self.assertEqual(first["world"], 2)
        self.assertEqual(first["params_sha256"], again["params_sha256"])
        self.assertEqual(first["test_correct"], again["test_correct"])
        self.assertEqual(first["final_loss"], again["final_loss"])
        other = self.ddprun_result(2, *(SMALL + ["--seed", "4"]))
        self.assertNotEqual(first["params_sha256"], other["params_sha256"],
                            "the fingerprint ignores the seed")

    # ------------------------------------------------------------- (c) resume after kill -9

    def test_resume_after_worker_sigkill_matches_uninterrupted_run(self):
        flags = SYNTHETIC + ["--train-samples", "3000", "--test-samples", "300", "--epochs", "2",
                             "--batch-size", "32", "--checkpoint-every", "5", "--log-interval", "1"]
        ref_dir = os.path.join(self.tmp, "ref")
        ref = self.ok(self.ddprun(2, *flags, "--checkpoint-dir", ref_dir), "uninterrupted run")
        self.assertEqual(ref["steps"], 2 * 47)  # ceil(1500 / 32) per epoch per rank
        self.assertTrue(checkpoints(ref_dir), "no ckpt-<step>.safetensors in " + ref_dir)
        names = safetensors_names(os.path.join(ref_dir, checkpoints(ref_dir)[-1]))
        self.assertLessEqual(LENET_NAMES, names, "checkpoint lacks PyTorch's LeNet state_dict names")

        ckpt_dir = os.path.join(self.tmp, "ckpt")
        metrics = os.path.join(self.tmp, "m.jsonl")
        out, err = (open(os.path.join(self.tmp, n), "w+") for n in ("out", "err"))
        agent = subprocess.Popen([DDPRUN, "--standalone", "--nproc_per_node=2", "--max_restarts=1",
                                  "--no_python", TRAIN, *flags, "--checkpoint-dir", ckpt_dir, "--metrics", metrics],
                                 stdout=out, stderr=err, cwd=self.tmp, env=clean_env())
        try:
            victim, seen = None, None
            deadline = time.time() + 120
            while time.time() < deadline and agent.poll() is None:
                steps = step_lines(metrics)
                if len(steps) >= 6 and checkpoints(ckpt_dir):
                    workers = {env_of(c).get("LOCAL_RANK"): c for c in descendants(agent.pid)}
                    if "1" in workers:
                        victim, seen = workers["1"], (steps[-1]["global_step"], checkpoints(ckpt_dir))
                        os.kill(victim, signal.SIGKILL)
                        break
                time.sleep(0.005)
            self.assertIsNotNone(victim, "no worker to kill (the job ended or stalled first): rc %s\n%s"
                                 % (agent.poll(), read(err.name)[-3000:]))
            self.assertLess(seen[0], ref["steps"], "killed too late to be mid-training")
            rc = agent.wait(timeout=240)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            out.close()
            err.close()
        stdout, stderr = read(out.name), read(err.name)
        self.assertEqual(rc, 0, "the restarted job failed:\n" + stderr[-5000:])
        self.assertIn("restart", stderr.lower(), "ddprun did not report a restart:\n" + stderr[-3000:])
        res = final_json(stdout)
        self.assertIsNotNone(res, "no final JSON after the restart:\n" + stdout[-3000:])
        print("\nkilled local rank 1 (pid %d) at global step %d with %s on disk"
              % (victim, seen[0], seen[1]), file=sys.stderr)
        self.assertEqual(res["params_sha256"], ref["params_sha256"],
                         "resumed run ends with other weights than the uninterrupted one")
        self.assertEqual(res["test_correct"], ref["test_correct"])
        self.assertEqual(res["steps"], ref["steps"], "the summary counts one attempt, not the run")
        # The restart is read from what the trainer records, never inferred
        # from the logged steps (a restart that resumes past the last logged
        # step continues the sequence): exactly one "resume" record, naming a
        # checkpoint of this run that was written before the kill (every 5
        # global steps, and the epoch end at 47), and rank 0 logged the steps
        # after it from there on.
        rows = records(metrics)
        resumes = [r for r in rows if r.get("type") == "resume"]
        self.assertEqual(len(resumes), 1, "expected one resume record: %s" % resumes)
        r = resumes[0]
        at = r["global_step"]
        self.assertGreater(at, 0, "the restarted job trained from the beginning")
        self.assertTrue(at % 5 == 0 or at == 47, "resumed at global step %d: not a checkpoint" % at)
        self.assertEqual(os.path.basename(r["checkpoint"]), checkpoint_name(r["run"], at))
        after = [x["global_step"] for x in rows[rows.index(r) + 1:] if x.get("type") == "step"]
        self.assertTrue(after and after[0] == at + 1,
                        "after resuming at %d the first logged step is %s" % (at, after[:1]))

    # ------------------------------------------------------------- (d) bad input

    def test_bad_flags_exit_2_with_a_message(self):
        self.refused(self.train_alone("--model", "resnet9", *SMALL),
                     "resnet9", "mlp", "lenet", "lenet-bn", what="unknown model")
        self.refused(self.train_alone("--optimizer", "rmsprop", *SMALL),
                     "rmsprop", "sgd", "adam", what="unknown optimizer")
        self.refused(self.train_alone("--batch-size", "0", *SMALL), "batch-size", what="batch 0")
        self.refused(self.train_alone("--epochs", "0", *SMALL), "epochs", what="epochs 0")

    def test_help_under_four_workers_prints_once_and_a_usage_error_is_never_lost(self):
        # Every rank parses the same command line; rank 0 alone speaks.
        p = self.run_cmd([DDPRUN, "--nproc-per-node=4", "train", "--help"])
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        self.assertEqual(p.stdout.count("Print this help and exit"), 1, p.stdout[-3000:])
        self.assertEqual(p.stdout.count("--batch-size"), 1, p.stdout[-3000:])
        # A usage error: every rank that gets to it says it (whichever rank
        # exits first is the root cause, and ddprun stops the others, maybe
        # before they speak: never lose the message), so 1 to 4 lines on the
        # console (the failure report quotes it again, indented); each rank
        # exits 2 unless stopped. The agent exits 1: workers failed.
        p = self.run_cmd([DDPRUN, "--nproc-per-node=4", "train", "--bogus"])
        self.assertEqual(p.returncode, 1, p.stderr[-3000:])
        self.assertIn(len(re.findall(r"^train: error: .*--bogus", p.stderr, re.M)), (1, 2, 3, 4),
                      p.stderr[-3000:])
        codes = re.findall(r"rank      : (\d) \(local_rank: \d\)\n  exitcode  : (-?\d+)",
                           p.stderr)
        self.assertIn("2", [c for _, c in codes], p.stderr[-3000:])
        self.assertTrue(all(c in ("2", "-15") for _, c in codes), p.stderr[-3000:])

    def test_plot_metrics_without_matplotlib_exits_2_and_installs_nothing(self):
        # matplotlib made unimportable, and a `pip` module that records being
        # run: the script must say how to install matplotlib, never run pip.
        fake = os.path.join(self.tmp, "site")
        os.makedirs(os.path.join(fake, "pip"))
        with open(os.path.join(fake, "matplotlib.py"), "w") as f:
            f.write("raise ImportError('hidden by the test')\n")
        marker = os.path.join(self.tmp, "pip_ran")
        with open(os.path.join(fake, "pip", "__main__.py"), "w") as f:
            f.write("open(%r, 'w').close()\n" % marker)
        open(os.path.join(fake, "pip", "__init__.py"), "w").close()
        metrics = os.path.join(self.tmp, "m.jsonl")
        with open(metrics, "w") as f:
            f.write(json.dumps({"type": "step", "epoch": 0, "global_step": 1, "loss": 2.3}) + "\n")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                              "scripts", "bench", "plot_metrics.py")
        p = self.run_cmd([sys.executable, script, metrics, "-o", os.path.join(self.tmp, "c.png")],
                         env=clean_env(PYTHONPATH=fake))
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("matplotlib is not installed", p.stderr)
        self.assertIn("pip install matplotlib", p.stderr)
        self.assertFalse(os.path.exists(marker), "plot_metrics.py ran pip")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "c.png")))

    def test_device_cuda_without_a_gpu_exits_2(self):
        # CUDA_VISIBLE_DEVICES="" hides every GPU, also on a machine that has one.
        p = self.train_alone("--device", "cuda", *SMALL, env=clean_env(CUDA_VISIBLE_DEVICES=""))
        self.refused(p, "--device cuda", ("no CUDA GPU", "without CUDA"), "--device cpu",
                     what="--device cuda without a GPU")
        p = self.train_alone("--device", "cpu", "--precision", "bf16", *SMALL)
        self.refused(p, "--precision", what="--precision bf16 on the CPU")

    def test_missing_data_names_the_file_and_the_remedy(self):
        p = self.train_alone("--data", "/nonexistent", "--train-samples", "64")
        self.refused(p, "/nonexistent", ("setup.sh", "--data synthetic"), *DATA_FILES,
                     what="--data /nonexistent")

    def train_without_default_data(self, *args):
        """`train *args` on this machine as if Fashion-MNIST were not installed:
        where the default directory's parent exists, an empty directory is
        mounted over it in a private user and mount namespace (unshare -rm),
        so the default directory does not exist, as on a fresh machine. None
        when this machine does not permit that."""
        parent = os.path.dirname(DATA)
        if not os.path.exists(parent):
            return self.train_alone(*args)
        unshare = shutil.which("unshare")
        if unshare is None:
            return None
        empty = tempfile.mkdtemp(dir=self.tmp)
        hide = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
                'mount --bind "$0" "$1" && shift && exec "$@"', empty, parent]
        if self.run_cmd(hide + ["true"], timeout=30).returncode != 0:
            return None
        return self.run_cmd(hide + [TRAIN, *args])

    def test_final_json_says_which_data_and_a_missing_default_set_is_refused(self):
        # --data not given: Fashion-MNIST where it is installed; where it is
        # not, exit 2 naming where train looked and the ways out, never a
        # silent switch to the synthetic set. A directory named with --data
        # is refused the same way (an empty one here).
        small = ["--train-samples", "256", "--test-samples", "64", "--max-steps", "2"]
        res = self.ok(self.train_alone(*SYNTHETIC, *small), "--data synthetic")
        self.assertEqual(res["data"], "synthetic")
        if HAVE_DATA:
            res = self.ok(self.train_alone(*small), "train with the default data")
            self.assertEqual(res["data"], "Fashion-MNIST (%s)" % DATA)
        p = self.train_without_default_data(*small)
        if p is None:
            print("\nnot checked here: train without Fashion-MNIST (no unshare -rm to hide %s)"
                  % DATA, file=sys.stderr)
        else:
            self.refused(p, "no --data given", "Fashion-MNIST", DATA + " does not exist",
                         "apt-get install dataset-fashion-mnist", "setup.sh", "--data synthetic",
                         what="train with no Fashion-MNIST installed")
            self.assertNotIn("{", p.stdout, "it trained on something")
        empty = tempfile.mkdtemp(dir=self.tmp)
        self.refused(self.train_alone("--data", empty, *small), empty, *DATA_FILES, "setup.sh",
                     "--data synthetic", what="--data naming an empty directory")

    def test_synthetic_data_learns_at_the_default_flags(self):
        # LeNet, SGD lr 0.05, momentum 0.9, batch 64: 313 steps. The set used
        # to be separable by so wide a margin that this run diverged (loss
        # back to ln 10 = 2.30, accuracy 0.10); one training sample in 20 is
        # now mislabelled, which puts a floor (0.31) under the loss.
        res = self.ok(self.train_alone(*SYNTHETIC, "--train-samples", "20000", "--test-samples",
                                       "1000", "--device", "cpu"), "train --data synthetic")
        self.assertEqual((res["model"], res["steps"]), ("lenet", 313))
        self.assertLess(res["final_loss"], 0.8, res)
        self.assertGreater(res["test_accuracy"], 0.95, res)

    @unittest.skipUnless(HAVE_DATA, NEED_DATA)
    def test_corrupt_data_files_are_named(self):
        for victim, damage in (("train-images-idx3-ubyte.gz", "truncate"),
                               ("train-labels-idx1-ubyte.gz", "garbage")):
            d = tempfile.mkdtemp(dir=self.tmp)
            for f in DATA_FILES:
                shutil.copy(os.path.join(DATA, f), d)
            path = os.path.join(d, victim)
            if damage == "truncate":  # 4 KiB of a 26 MB stream: far fewer than 2000 images
                with open(path, "r+b") as f:
                    f.truncate(4096)
            else:
                with open(path, "wb") as f:
                    f.write(b"this is not gzip data\n" * 100)
            p = self.train_alone("--data", d, "--train-samples", "2000", "--test-samples", "100")
            self.refused(p, victim.split(".")[0], what="%s %s" % (damage, victim))

    def test_truncated_checkpoint_on_resume_is_refused_and_named(self):
        d = os.path.join(self.tmp, "ckpt")
        flags = SMALL + ["--checkpoint-dir", d, "--checkpoint-every", "2", "--max-steps", "6"]
        run = clean_env(TORCHELASTIC_RUN_ID="trunc")
        first = self.ok(self.train_alone(*flags, env=run), "run writing checkpoints")
        names = checkpoints(d)
        self.assertGreaterEqual(len(names), 2, "expected checkpoints every 2 steps: %s" % names)
        newest = os.path.join(d, names[-1])
        with open(newest, "r+b") as f:
            f.truncate(os.path.getsize(newest) // 2)
        # A restarted worker resumes (TORCHELASTIC_RESTART_COUNT > 0, as the
        # launcher sets it on attempt 1, with the same run id); a first
        # attempt starts afresh.
        p = self.train_alone(*flags, env=clean_env(TORCHELASTIC_RUN_ID="trunc",
                                                   TORCHELASTIC_RESTART_COUNT="1"))
        self.assertIsNone(crashed(p), "%s\n%s" % (crashed(p), p.stderr[-3000:]))
        self.assertIn(names[-1], p.stderr, "the truncated checkpoint is not named:\n" + p.stderr[-3000:])
        if p.returncode == 0:  # fell back to an older good checkpoint: same end point
            self.assertEqual(final_json(p.stdout)["params_sha256"], first["params_sha256"],
                             "resumed from an older checkpoint but ended elsewhere")
        else:
            self.assertEqual(p.returncode, 2, p.stderr[-3000:])

    def test_checkpoint_of_another_model_is_refused(self):
        mlp = os.path.join(self.tmp, "mlp.safetensors")
        self.ok(self.train_alone("--model", "mlp", "--save", mlp, "--max-steps", "1", *SMALL),
                "mlp --save")
        self.assertTrue(os.path.exists(mlp))
        p = self.train_alone("--model", "lenet", "--init", mlp, *SMALL)
        self.refused(p, ("mlp.safetensors", "conv1", "fc1"), what="--init mlp file into lenet")

    def test_more_ranks_than_samples(self):
        p = self.ddprun(4, *SYNTHETIC, "--train-samples", "3", "--test-samples", "16")
        self.assertIsNone(crashed(p), "%s\n%s" % (crashed(p), p.stderr[-3000:]))
        self.assertNotEqual(p.returncode, 0, "4 ranks trained on 3 samples")
        self.assertRegex(p.stderr, r"exitcode\s*:\s*2\b", "no worker exited 2:\n" + p.stderr[-3000:])
        self.assertIn("samples", p.stderr)

    # ------------------------------------------------------------- (f) files and runs

    def assert_unchanged_node(self, path, kind, what):
        st = os.lstat(path)
        self.assertTrue(kind(st.st_mode), "%s: %s is no longer what it was (mode %o)"
                        % (what, path, st.st_mode))

    def test_save_never_replaces_a_device_fifo_or_symlink(self):
        target = os.path.join(self.tmp, "model.txt")
        with open(target, "w") as f:
            f.write("not a model\n")
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        link = os.path.join(self.tmp, "link.safetensors")
        os.symlink(target, link)
        cases = [(fifo, stat.S_ISFIFO, "FIFO"), (link, stat.S_ISLNK, "symbolic link")]
        if os.geteuid() == 0:  # a device node of our own (a copy of /dev/null's numbers)
            dev = os.path.join(self.tmp, "devnode")
            os.mknod(dev, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
            cases.append((dev, stat.S_ISCHR, "character device"))
        for path, kind, name in cases:
            p = self.train_alone("--save", path, "--max-steps", "1", *SMALL, timeout=120)
            self.refused(p, path, name, what="--save onto a " + name)
            self.assert_unchanged_node(path, kind, "--save onto a " + name)
        self.assertEqual(read(target), "not a model\n", "the symlink's target was written")
        # A checkpoint name taken by a FIFO: refused too, the FIFO stays.
        d = os.path.join(self.tmp, "ckpt")
        os.mkdir(d)
        os.mkfifo(os.path.join(d, checkpoint_name("fifo-run", 2)))
        p = self.train_alone("--checkpoint-dir", d, "--checkpoint-every", "2", "--max-steps", "4",
                             *SMALL, env=clean_env(TORCHELASTIC_RUN_ID="fifo-run"), timeout=120)
        self.refused(p, checkpoint_name("fifo-run", 2), "FIFO", what="checkpoint onto a FIFO")
        self.assert_unchanged_node(os.path.join(d, checkpoint_name("fifo-run", 2)),
                                   stat.S_ISFIFO, "checkpoint onto a FIFO")

    def test_fresh_run_keeps_an_older_runs_checkpoints_and_restart_resumes_its_own(self):
        d = os.path.join(self.tmp, "ckpt")
        common = SMALL + ["--checkpoint-dir", d, "--checkpoint-every", "2"]
        # The older run went further: its checkpoints have higher steps.
        self.ok(self.train_alone(*common, "--max-steps", "12", "--seed", "1",
                                 env=clean_env(TORCHELASTIC_RUN_ID="old")), "older run")
        old = checkpoints(d)
        self.assertEqual(len(old), 3, old)  # --keep-checkpoints 3: steps 8, 10, 12
        new_env = clean_env(TORCHELASTIC_RUN_ID="new")
        metrics = os.path.join(self.tmp, "m.jsonl")
        fresh = self.ok(self.train_alone(*common, "--max-steps", "6", "--metrics", metrics,
                                         env=new_env), "fresh run into the same directory")
        now = checkpoints(d)
        self.assertTrue(set(old) <= set(now), "the older run's checkpoints were removed: %s" % now)
        self.assertEqual(len(now), 6, "pruning removed the new run's own checkpoints: %s" % now)
        self.assertEqual(old, [checkpoint_name("old", s) for s in (8, 10, 12)])
        self.assertEqual(sorted(set(now) - set(old)), [checkpoint_name("new", s) for s in (2, 4, 6)])
        # The launcher restarts the new run: it resumes its own newest
        # checkpoint (the epoch end), not the older run's step 12.
        again = self.ok(self.train_alone(*common, "--max-steps", "6", "--metrics", metrics,
                                         env=clean_env(TORCHELASTIC_RUN_ID="new",
                                                       TORCHELASTIC_RESTART_COUNT="1")),
                        "restarted new run")
        self.assertEqual(again["params_sha256"], fresh["params_sha256"],
                         "the restart ended with another model than its own run's")
        resumes = [r for r in records(metrics) if r.get("type") == "resume"]
        self.assertEqual([os.path.basename(r["checkpoint"]) for r in resumes],
                         [checkpoint_name("new", 6)])
        # A first start of a run id that already has checkpoints is refused
        # (it would be taken for the same run), and nothing is removed.
        before = checkpoints(d)
        p = self.train_alone(*common, "--max-steps", "6", env=new_env)
        self.refused(p, "--resume", "'new'", what="second launch with the same run id")
        self.assertEqual(checkpoints(d), before)

    def test_resume_record_when_resuming_at_the_last_logged_step(self):
        # The case that made the kill test flaky: the worker died right after
        # logging step 10 and writing checkpoint 10, so the restart's first
        # logged step (11) continues the sequence and nothing in the step
        # numbers shows a restart. The trainer records it.
        d = os.path.join(self.tmp, "ckpt")
        metrics = os.path.join(self.tmp, "m.jsonl")
        flags = SMALL + ["--checkpoint-dir", d, "--checkpoint-every", "5", "--keep-checkpoints", "10",
                         "--max-steps", "15", "--log-interval", "1", "--metrics", metrics]
        first = self.ok(self.train_alone(*flags, env=clean_env(TORCHELASTIC_RUN_ID="rec")),
                        "uninterrupted run")
        # Cut the run back to the moment of the kill: checkpoints up to 10,
        # metrics up to step 10.
        os.remove(os.path.join(d, checkpoint_name("rec", 15)))
        rows = records(metrics)
        cut = [r for r in rows if r.get("type") == "step" and r["global_step"] <= 10]
        with open(metrics, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in cut)
        again = self.ok(self.train_alone(*flags, env=clean_env(TORCHELASTIC_RUN_ID="rec",
                                                               TORCHELASTIC_RESTART_COUNT="1")),
                        "restart")
        self.assertEqual(again["params_sha256"], first["params_sha256"])
        rows = records(metrics)
        kinds = [(r["type"], r.get("global_step")) for r in rows]
        i = kinds.index(("resume", 10))
        self.assertEqual(rows[i]["checkpoint"], os.path.join(d, checkpoint_name("rec", 10)))
        self.assertEqual(kinds[i - 1], ("step", 10))
        self.assertEqual(kinds[i + 1], ("step", 11))

    def rewrite_metadata(self, path, **fields):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            data = f.read()
        header["__metadata__"].update(fields)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + data)

    def test_checkpoint_fields_out_of_range_are_refused_naming_file_and_field(self):
        d = os.path.join(self.tmp, "ckpt")
        cases = [({"epoch": "0", "step": "-20"}, "step", []),
                 ({"epoch": "-5"}, "epoch", []),
                 ({"optimizer_steps": "-3"}, "optimizer_steps", ["--optimizer", "adam"])]
        for fields, field, extra in cases:
            shutil.rmtree(d, ignore_errors=True)
            flags = SMALL + extra + ["--checkpoint-dir", d, "--checkpoint-every", "2",
                                     "--keep-checkpoints", "1", "--epochs", "2", "--max-steps", "4"]
            run = clean_env(TORCHELASTIC_RUN_ID="meta")
            self.ok(self.train_alone(*flags, env=run), "run writing a checkpoint")
            (name,) = checkpoints(d)
            self.rewrite_metadata(os.path.join(d, name), **fields)
            p = self.train_alone(*flags, env=clean_env(TORCHELASTIC_RUN_ID="meta",
                                                       TORCHELASTIC_RESTART_COUNT="1"))
            self.refused(p, name, "'%s'" % field, what="checkpoint with %s" % fields)

    def test_flags_out_of_range_are_refused(self):
        for flag, value in (("--lr", "inf"), ("--lr", "1e308"), ("--lr", "nan"),
                            ("--momentum", "nan"), ("--weight-decay", "inf"),
                            ("--bucket-cap-mb", "inf"), ("--threads", "40000"),
                            ("--threads", "65536")):
            p = self.train_alone(flag, value, "--max-steps", "1", *SMALL, timeout=120)
            self.refused(p, flag, what="%s %s" % (flag, value))

    def test_init_fifo_is_refused_not_waited_on(self):
        fifo = os.path.join(self.tmp, "init.fifo")
        os.mkfifo(fifo)
        # Before the fix this open blocked forever: the timeout turns that
        # into an error here rather than a hung test.
        p = self.train_alone("--init", fifo, "--max-steps", "1", *SMALL, timeout=120)
        self.refused(p, fifo, "FIFO", what="--init FIFO")

    def test_metrics_write_error_is_a_failure(self):
        p = self.train_alone("--metrics", "/dev/full", "--max-steps", "2", "--log-interval", "1",
                             *SMALL, timeout=120)
        self.assertIsNone(crashed(p), "%s\n%s" % (crashed(p), p.stderr[-3000:]))
        self.assertEqual(p.returncode, 1, "a metrics write error exited %d:\n%s"
                         % (p.returncode, p.stderr[-3000:]))
        self.assertIn("/dev/full", p.stderr)

    def test_metrics_fifo_whose_reader_left_is_a_failure(self):
        fifo = os.path.join(self.tmp, "m.fifo")
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        # More metrics than a pipe holds (about 500 lines of ~200 bytes): the
        # run cannot end before the reader closes, it blocks in a write.
        p = subprocess.Popen([TRAIN, "--metrics", fifo, "--epochs", "30", "--log-interval", "1",
                              "--model", "mlp", *SMALL], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=self.tmp, env=clean_env())
        try:  # until the first bytes arrive (before the writer opens, reads see EOF)
            got, deadline = b"", time.time() + 120
            while not got and time.time() < deadline and p.poll() is None:
                select.select([reader], [], [], 1.0)
                try:
                    got = os.read(reader, 1)
                except BlockingIOError:
                    pass
                if not got:
                    time.sleep(0.005)  # EOF until the writer opens: poll, do not spin
            self.assertTrue(got, "no metrics arrived (exit %s)" % p.poll())
        finally:
            os.close(reader)
        out, err = p.communicate(timeout=240)
        self.assertEqual(p.returncode, 1, "exit %d after the metrics reader left:\n%s"
                         % (p.returncode, err[-3000:]))
        self.assertIn(fifo, err)
        self.assertIn("Broken pipe", err)

    def test_metrics_fifo_whose_reader_never_reads_does_not_stop_training(self):
        # The reader opens the FIFO and never reads. Before the fix the run
        # blocked in write(2) for ever once the pipe was full: the bounded
        # wait turns that into a failure here rather than a hung test.
        fifo = os.path.join(self.tmp, "m.fifo")
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            fcntl.fcntl(reader, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)  # fills in ~20 records
            # 12 epochs x 128 steps at --log-interval 1: 1,500+ records, more
            # than the pipe and the writer's queue (1,024 records) hold.
            p = subprocess.Popen([TRAIN, "--metrics", fifo, "--epochs", "12", "--batch-size", "8",
                                  "--log-interval", "1", "--model", "mlp", *SMALL],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 cwd=self.tmp, env=clean_env())
            try:
                out, err = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                self.fail("train blocked on a --metrics FIFO whose reader does not read:\n"
                          + err[-3000:])
        finally:
            os.close(reader)
        self.assertEqual(p.returncode, 0, "exit %d:\n%s" % (p.returncode, err[-3000:]))
        self.assertEqual(final_json(out)["steps"], 12 * 128)
        said = re.findall(r"--metrics %s: (\d+) of (\d+) records dropped" % re.escape(fifo), err)
        self.assertEqual(len(said), 1, "the dropped count is not said once:\n" + err[-3000:])
        dropped, total = map(int, said[0])
        self.assertGreater(dropped, 0)
        self.assertGreater(total, 12 * 128)

    def test_resumed_run_reports_whole_run_totals_and_one_epoch_numbering(self):
        # 2 epochs of 10 steps; the restart resumes at global step 15 (epoch
        # 1, step 5): before the fix its summary said "steps": 5 and its log
        # said "epoch 2/2" where the metrics said epoch 1.
        d = os.path.join(self.tmp, "ckpt")
        metrics = os.path.join(self.tmp, "m.jsonl")
        flags = SMALL + ["--checkpoint-dir", d, "--checkpoint-every", "5", "--keep-checkpoints", "10",
                         "--epochs", "2", "--max-steps", "10", "--log-interval", "1",
                         "--metrics", metrics]
        first = self.ok(self.train_alone(*flags, env=clean_env(TORCHELASTIC_RUN_ID="whole")),
                        "uninterrupted run")
        self.assertEqual(first["steps"], 20)
        os.remove(os.path.join(d, checkpoint_name("whole", 20)))  # as if killed after step 15
        p = self.train_alone(*flags, env=clean_env(TORCHELASTIC_RUN_ID="whole",
                                                   TORCHELASTIC_RESTART_COUNT="1"))
        again = self.ok(p, "restart")
        self.assertEqual(again["params_sha256"], first["params_sha256"])
        self.assertEqual(again["steps"], 20, "the summary counts one attempt, not the run")
        self.assertEqual(again["attempt_steps"], 5)
        # One numbering (from 0, as PyTorch's set_epoch) in the metrics, the
        # log lines and the summary.
        rows = records(metrics)
        resume = [r for r in rows if r.get("type") == "resume"]
        self.assertEqual([(r["epoch"], r["step"], r["global_step"]) for r in resume], [(1, 5, 15)])
        after = rows[rows.index(resume[0]) + 1:]
        self.assertEqual({r["epoch"] for r in after if r["type"] == "step"}, {1})
        self.assertEqual([r["epoch"] for r in after if r["type"] == "epoch"], [1])
        self.assertEqual(again["last_epoch"], 1)
        self.assertIn("(epoch 1, step 5, global step 15)", p.stderr)
        logged = {int(e) for e in re.findall(r"\bepoch (\d+) of 2\b", p.stderr)}
        self.assertEqual(logged, {1}, "log lines number epochs otherwise:\n" + p.stderr[-3000:])
        self.assertIn("epoch 1 of 2: test accuracy", p.stderr)
        # The resumed epoch's record covers the whole epoch: the same loss as
        # the uninterrupted run's (the checkpoint carried the first 5 steps'),
        # this attempt's share apart; the summary's time is the run's.
        whole = [r for r in rows[:rows.index(resume[0])] if r["type"] == "epoch"]
        resumed = [r for r in after if r["type"] == "epoch"][0]
        self.assertEqual(resumed["train_loss"], whole[1]["train_loss"])
        self.assertIn("attempt_train_loss", resumed)
        self.assertNotEqual(resumed["attempt_train_loss"], resumed["train_loss"])
        self.assertGreaterEqual(resumed["epoch_seconds"], resumed["attempt_epoch_seconds"])
        self.assertNotIn("attempt_train_loss", whole[1])
        self.assertGreaterEqual(again["train_seconds"], again["attempt_train_seconds"])
        steps = [r for r in after if r["type"] == "step"]
        self.assertGreaterEqual(steps[0]["elapsed_s"], again["train_seconds"] - again["attempt_train_seconds"])

    def test_progress_lines_come_every_log_seconds_between_log_intervals(self):
        # --log-seconds far below a step's time: a line after every step, not
        # only at the interval (1000 steps) and the epoch's end; with two
        # ranks they carry rank 0's own loss, marked. 0 turns them off.
        base = SMALL + ["--max-steps", "5", "--log-interval", "1000"]
        lines = lambda err: re.findall(r"step (\d)/5  loss [0-9.]+( \(rank 0\))?", err)
        p = self.ddprun(2, *base, "--log-seconds", "1e-9")
        self.ok(p, "ddprun 2 x train --log-seconds 1e-9")
        got = lines(p.stderr)
        self.assertEqual([int(s) for s, _ in got], [1, 2, 3, 4, 5], p.stderr[-3000:])
        self.assertEqual([m for _, m in got], [" (rank 0)"] * 4 + [""])  # the last is global
        p = self.ddprun(2, *base, "--log-seconds", "0")
        self.ok(p, "ddprun 2 x train --log-seconds 0")
        self.assertEqual([int(s) for s, _ in lines(p.stderr)], [5])

    def test_each_rank_reports_its_progress_to_the_agent(self):
        # Under ddprun each rank writes $DDPRUN_PROGRESS_FILE (what `ddprun
        # status`, /metrics and --progress-timeout read): at the end, every
        # rank's file says the run's last step of its total, its epoch and a
        # finite loss of its own.
        logs = os.path.join(self.tmp, "logs")
        res = self.ok(self.ddprun(2, *SMALL, "--max-steps", "6", "--epochs", "2",
                                  launcher_flags=("--log-dir", logs)), "ddprun 2 x train")
        files = sorted(glob.glob(os.path.join(logs, "*", "attempt_0", "*", "progress.json")))
        self.assertEqual(len(files), 2, files)
        for f in files:
            with open(f) as fh:
                r = json.load(fh)
            self.assertEqual(r["step"], res["steps"], f)
            self.assertEqual(r["total_steps"], 12, f)
            self.assertEqual(r["epoch"], 1, f)
            self.assertTrue(0 < r["loss"] < 10, f)
            self.assertGreater(r["time"], 0)

    def test_save_write_failure_exits_1_and_leaves_no_temporary(self):
        out = os.path.join(self.tmp, "model.safetensors")

        def small_files():  # a full disk, as a write sees it: EFBIG past 64 KiB
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

        p = subprocess.run([TRAIN, "--save", out, "--max-steps", "1", *SMALL], capture_output=True,
                           text=True, timeout=120, cwd=self.tmp, env=clean_env(),
                           preexec_fn=small_files)
        self.assertIsNone(crashed(p), "%s\n%s" % (crashed(p), p.stderr[-3000:]))
        self.assertEqual(p.returncode, 1, "a failed write at run time exited %d:\n%s"
                         % (p.returncode, p.stderr[-3000:]))
        self.assertIn(out, p.stderr)
        self.assertEqual(os.listdir(self.tmp), [], "the failed save left files behind")

    def test_stale_temporaries_of_dead_writers_are_removed_at_start(self):
        d = os.path.join(self.tmp, "ckpt")
        os.mkdir(d)
        gone = subprocess.Popen(["true"])
        gone.wait()  # its pid names no live process (or, reused, not a train)
        stale = [checkpoint_name("tmp-run", 2) + ".tmp.%d" % gone.pid,
                 "ckpt-000000010.safetensors.tmp.%d" % gone.pid,
                 checkpoint_name("other", 4) + ".tmp.%d" % os.getpid()]  # alive, not a train
        for n in stale + ["notes.tmp.%d" % gone.pid]:
            with open(os.path.join(d, n), "w") as f:
                f.write("partial")
        out = os.path.join(self.tmp, "model.safetensors")
        with open(out + ".tmp.%d" % gone.pid, "w") as f:
            f.write("partial")
        p = self.train_alone("--checkpoint-dir", d, "--save", out, "--max-steps", "1", *SMALL,
                             env=clean_env(TORCHELASTIC_RUN_ID="tmp-run"), timeout=120)
        self.ok(p, "run over stale temporaries")
        left = sorted(os.listdir(d))
        for n in stale:
            self.assertNotIn(n, left, "stale temporary %s was kept" % n)
        self.assertIn("notes.tmp.%d" % gone.pid, left, "a file not ours was removed")
        self.assertEqual(sorted(os.listdir(self.tmp)), ["ckpt", "model.safetensors"])

    def test_gzip_claiming_more_than_it_can_plausibly_hold_is_refused_and_named(self):
        # 1 MB of gzip, 1.3 M declared (all-zero) images: 1 GB once inflated.
        d = os.path.join(self.tmp, "data")
        os.mkdir(d)
        count = 1300000
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        parts = [z.compress(struct.pack(">IIII", 0x803, count, 28, 28))]
        zeros = bytes(1 << 24)
        left = count * 784
        while left:
            parts.append(z.compress(zeros[:min(left, len(zeros))]))
            left -= min(left, len(zeros))
        parts.append(z.flush())
        with open(os.path.join(d, "train-images-idx3-ubyte.gz"), "wb") as f:
            f.write(b"".join(parts))
        with open(os.path.join(d, "train-labels-idx1-ubyte.gz"), "wb") as f:
            f.write(gzip.compress(struct.pack(">II", 0x801, count) + bytes(count)))
        for name, n in (("t10k-images-idx3-ubyte.gz", 784 * 16), ("t10k-labels-idx1-ubyte.gz", 16)):
            magic = 0x803 if "images" in name else 0x801
            head = struct.pack(">IIII", magic, 16, 28, 28) if "images" in name else struct.pack(">II", magic, 16)
            with open(os.path.join(d, name), "wb") as f:
                f.write(gzip.compress(head + bytes(n)))
        p = self.train_alone("--data", d, "--max-steps", "1", timeout=120)
        self.refused(p, "train-images-idx3-ubyte.gz", str(count), what="gzip bomb")


    # ------------------------------------------------------------- (e) launchers agree

    def test_alone_equals_ddprun_world_1(self):
        flags = SMALL + ["--seed", "5"]
        alone = self.ok(self.train_alone(*flags), "train alone")
        under = self.ddprun_result(1, *flags)
        self.assertEqual(alone["world"], 1)
        self.assertEqual(under["world"], 1)
        self.assertEqual(alone["params_sha256"], under["params_sha256"])

    @unittest.skipUnless(os.access(TORCHRUN, os.X_OK), "no torchrun 2.x venv (setup-test-deps.sh)")
    def test_torchrun_equals_ddprun_world_2(self):
        flags = SMALL + ["--seed", "3"]
        p = self.run_cmd([TORCHRUN, "--standalone", "--nproc_per_node=2", "--no-python", TRAIN,
                          *flags], timeout=300)
        theirs = self.ok(p, "torchrun --no-python train")
        ours = self.ddprun_result(2, *flags)
        self.assertEqual(theirs["world"], 2)
        self.assertEqual(theirs["params_sha256"], ours["params_sha256"])


if __name__ == "__main__":
    if not (os.access(DDPRUN, os.X_OK) and os.access(TRAIN, os.X_OK)):
        sys.exit("ddprun or train not built in " + BIN)
    from testmain import main  # noqa: E402
    main()
