"""End-to-end tests of the bundled trainer: real `ddprun`, real `train` workers.

The main command exactly as the README writes it, determinism, resume after a
worker is killed with SIGKILL, bad input (exit 2 with a message, never a
crash), and the same result alone / under ddprun / under torchrun 2.x.
Small sample counts keep the file within a few minutes on two cores. Without
the Fashion-MNIST files the runs use --data synthetic and the cases about the
data files are skipped."""
import glob
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DDPRUN = os.path.join(BIN, "ddprun")
TRAIN = os.path.join(BIN, "train")
DATA = "/usr/share/datasets/fashion-mnist"
DATA_FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
              "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
HAVE_DATA = all(os.path.exists(os.path.join(DATA, f)) for f in DATA_FILES)
DATA_ARGS = [] if HAVE_DATA else ["--data", "synthetic"]
TORCHRUN = os.path.join(os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2"),
                        "bin/torchrun")
SMALL = DATA_ARGS + ["--train-samples", "1024", "--test-samples", "256"]
CKPT = re.compile(r"^ckpt-\d{9}\.safetensors$")
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


def step_lines(path):
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
    return [r for r in rows if r.get("type") == "step"]


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

    def test_main_command_four_workers(self):
        # `ddprun --nproc_per_node=4 train` exactly, from a directory holding
        # nothing, with only size flags added. The port comes from the
        # environment (PET_MASTER_PORT=0: a free one), not from a flag.
        flags = DATA_ARGS + ["--train-samples", "4000", "--test-samples", "500"]
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
        flags = DATA_ARGS + ["--train-samples", "3000", "--test-samples", "300", "--epochs", "2",
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
        # The restarted rank 0 logged steps from a checkpoint on, not from 1.
        gs = [r["global_step"] for r in step_lines(metrics)]
        starts = [0] + [i for i in range(1, len(gs)) if gs[i] <= gs[i - 1]]
        first = gs[starts[-1]]
        self.assertGreater(first, 1, "the restarted job trained from the beginning")
        self.assertTrue((first - 1) % 5 == 0 or first - 1 == 47,
                        "resumed at global step %d: not after a checkpoint (every 5, epoch end 47)"
                        % first)

    # ------------------------------------------------------------- (d) bad input

    def test_bad_flags_exit_2_with_a_message(self):
        self.refused(self.train_alone("--model", "resnet9", *SMALL),
                     "resnet9", "mlp", "lenet", "lenet-bn", what="unknown model")
        self.refused(self.train_alone("--optimizer", "rmsprop", *SMALL),
                     "rmsprop", "sgd", "adam", what="unknown optimizer")
        self.refused(self.train_alone("--batch-size", "0", *SMALL), "batch-size", what="batch 0")
        self.refused(self.train_alone("--epochs", "0", *SMALL), "epochs", what="epochs 0")

    def test_missing_data_names_the_file_and_the_remedy(self):
        p = self.train_alone("--data", "/nonexistent", "--train-samples", "64")
        self.refused(p, "/nonexistent", ("setup.sh", "--data synthetic"), what="--data /nonexistent")

    @unittest.skipUnless(HAVE_DATA, "Fashion-MNIST not installed (scripts/setup.sh)")
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
        first = self.ok(self.train_alone(*flags), "run writing checkpoints")
        names = checkpoints(d)
        self.assertGreaterEqual(len(names), 2, "expected checkpoints every 2 steps: %s" % names)
        newest = os.path.join(d, names[-1])
        with open(newest, "r+b") as f:
            f.truncate(os.path.getsize(newest) // 2)
        # A restarted worker resumes (TORCHELASTIC_RESTART_COUNT > 0, as the
        # launcher sets it on attempt 1); a first attempt starts afresh.
        p = self.train_alone(*flags, env=clean_env(TORCHELASTIC_RESTART_COUNT="1"))
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
        p = self.ddprun(4, *DATA_ARGS, "--train-samples", "3", "--test-samples", "16")
        self.assertIsNone(crashed(p), "%s\n%s" % (crashed(p), p.stderr[-3000:]))
        self.assertNotEqual(p.returncode, 0, "4 ranks trained on 3 samples")
        self.assertRegex(p.stderr, r"exitcode\s*:\s*2\b", "no worker exited 2:\n" + p.stderr[-3000:])
        self.assertIn("samples", p.stderr)

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
