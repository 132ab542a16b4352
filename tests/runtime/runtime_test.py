"""Collectives of ddprun_runtime run by real ranks.

The correctness matrix (every dtype, op and size 0/1/7/4097/1M+3, in place and
out of place, many operations in flight) runs as `coll_check` under ddprun for
every world size 1..8 over shared memory, over TCP only, hierarchically across
two simulated hosts (two ddprun agents with different DDPRUN_HOST_ID), and on
shared-heap buffers. Fault tests start ranks by hand (rank 0 hosts the store,
as under torchrun 1.x or Slurm), kill -9 or SIGSTOP one rank mid-collective,
and assert that every other rank fails, exits non-zero and names it.

Ports: a single agent runs with --standalone and picks its own. Where a port
must be known in advance (two agents, or ranks started by hand) the test
reserves one with ReservedPort, which holds it until the test ends."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from reserved_port import reserve_port  # noqa: E402

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DDPRUN = os.path.join(BIN, "ddprun")
CHECK = os.path.join(BIN, "coll_check")
# DDPRUN_RUNTIME_TEST_QUICK=1 trims the matrix (used by the sanitizer pass).
QUICK = os.environ.get("DDPRUN_RUNTIME_TEST_QUICK") == "1"


class LaunchTest(unittest.TestCase):
    """Runs ddprun with its worker logs in a temporary directory it removes."""

    def setUp(self):
        self.logs = tempfile.mkdtemp(prefix="ddprun_runtime_test_")
        self.addCleanup(shutil.rmtree, self.logs, ignore_errors=True)

    def ddprun(self, *args):
        return [DDPRUN, "--log-dir=%s" % self.logs, *args]


def env_with(**kv):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in kv.items()})
    return env


class Matrix(LaunchTest):
    def run_check(self, nproc, transport="auto", extra=(), timeout=600, env=None):
        args = self.ddprun("--nproc-per-node=%d" % nproc, "--standalone", "--no-python", CHECK, *extra)
        if QUICK:
            args += ["--sizes", "0,1,7,4097", "--dtypes", "float32,int64,bfloat16"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                           env=env_with(DDPRUN_TRANSPORT=transport, **(env or {})))
        self.assertEqual(p.returncode, 0, "n=%d %s\n%s\n%s" % (nproc, transport, p.stdout, p.stderr))
        passed = [l for l in p.stdout.splitlines() if "checks passed" in l]
        self.assertEqual(len(passed), nproc, p.stdout)
        return p.stdout

    def test_shm_every_world_size(self):
        for n in range(1, 9):
            with self.subTest(n=n):
                # auto picks shm on one host; n = 3 and 5 force it explicitly
                out = self.run_check(n, "shm" if n in (3, 5) else "auto")
                self.assertIn("transport shm" if n > 1 else "checks passed", out)

    def test_tcp_only(self):
        for n in (2, 3, 5, 8):
            with self.subTest(n=n):
                self.assertIn("transport tcp", self.run_check(n, "tcp"))

    def test_shared_heap_buffers(self):
        # Buffers from allocShared: the in-place path that reads peers' memory.
        for n in (2, 4):
            with self.subTest(n=n):
                self.run_check(n, extra=["--shared"])

    def test_bad_transport_is_named(self):
        p = subprocess.run(self.ddprun("--nproc-per-node=2", "--standalone",
                                       "--no-python", CHECK, "--sizes", "1"),
                           capture_output=True, text=True, timeout=60,
                           env=env_with(DDPRUN_TRANSPORT="rdma"))
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("DDPRUN_TRANSPORT", p.stdout + p.stderr)


# The first NCCL release that accepts two ranks on one GPU.
NCCL_MULTI_RANK_GPU = 23000


def nccl_runtime_version():
    """(code, "X.Y.Z", visible GPUs) of the NCCL library coll_check loads here
    (code 0 without CUDA)."""
    p = subprocess.run([CHECK, "--nccl-version"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError("coll_check --nccl-version failed:\n%s%s" % (p.stdout, p.stderr))
    _, code, name, _, gpus = p.stdout.split()
    return int(code), name, int(gpus)


class CudaMatrix(LaunchTest):
    """The matrix on CUDA buffers (and coll_check's stream-ordered checks): its
    own ctest entry (runtime_collectives_cuda), reported as skipped where
    coll_check finds no GPU or CUDA was not built. Two ranks on one GPU: the
    default transport (CUDA IPC) and NCCL forced (NCCL >= 2.30)."""

    def run_cuda(self, env=None):
        p = subprocess.run(self.ddprun("--nproc-per-node=2", "--standalone",
                                       "--no-python", CHECK, "--device", "cuda"),
                           capture_output=True, text=True, timeout=600, env=env_with(**(env or {})))
        skipped = [l for l in p.stdout.splitlines() if "SKIPPED" in l]
        if skipped:  # coll_check found no GPU; it says why (and whether CUDA was built)
            # The first rank to skip exits 77 and ddprun stops the other, which
            # may not have printed yet: one or two lines, and no check ran.
            self.assertIn(len(skipped), (1, 2), p.stdout)
            self.assertNotIn("checks passed", p.stdout)
            # A skipped check exits 77, never 0: ddprun reports its workers' failure.
            self.assertRegex(p.stderr + p.stdout, r"exitcode\s*:\s*77\b")
            self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
            self.skipTest(skipped[0].split("SKIPPED", 1)[1].lstrip(": "))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(p.stdout.count("checks passed"), 2, p.stdout)
        return p.stdout

    def test_cuda_matrix(self):
        self.run_cuda()

    def test_cuda_matrix_through_nccl_on_one_gpu(self):
        code, name, gpus = nccl_runtime_version()
        if code == 0:
            self.skipTest("built without CUDA")
        if gpus == 0:
            self.skipTest("no CUDA GPU on this machine")
        if code < NCCL_MULTI_RANK_GPU:
            self.skipTest("NCCL %s is loaded here: two ranks on one GPU need NCCL >= 2.30 "
                          "(pip install 'nvidia-nccl-cu13>=2.30' and put its lib directory first "
                          "on LD_LIBRARY_PATH)" % name)
        # DDPRUN_CUDA_DEVICE=0: both ranks on one GPU even where there are more.
        out = self.run_cuda({"DDPRUN_CUDA_TRANSPORT": "nccl", "DDPRUN_CUDA_DEVICE": "0"})
        self.assertEqual(out.count("cuda transport nccl"), 2, out)

    def test_old_nccl_refuses_one_gpu_naming_the_version_and_the_fix(self):
        code, name, gpus = nccl_runtime_version()
        if code == 0 or gpus == 0:
            self.skipTest("no CUDA GPU on this machine" if code else "built without CUDA")
        if code >= NCCL_MULTI_RANK_GPU:
            self.skipTest("NCCL %s accepts two ranks on one GPU: nothing to refuse" % name)
        p = subprocess.run(self.ddprun("--nproc-per-node=2", "--standalone", "--no-python", CHECK,
                                       "--device", "cuda", "--sizes", "7", "--dtypes", "float32"),
                           capture_output=True, text=True, timeout=300,
                           env=env_with(DDPRUN_CUDA_TRANSPORT="nccl", DDPRUN_CUDA_DEVICE="0"))
        out = p.stdout + p.stderr
        self.assertNotEqual(p.returncode, 0, out)
        for words in (name, "nvidia-nccl-cu13>=2.30", "LD_LIBRARY_PATH"):
            self.assertIn(words, out)


class TwoSimulatedHosts(LaunchTest):
    """Two ddprun agents (static rendezvous on loopback), each claiming its own host."""

    def launch(self, nprocs, transport, extra=()):
        port = reserve_port(self)  # node 0's agent hosts the rendezvous store there
        procs = []
        for node, n in enumerate(nprocs):
            args = self.ddprun("--nnodes=%d" % len(nprocs), "--node-rank=%d" % node,
                               "--master-addr=127.0.0.1", "--master-port=%d" % port,
                               "--nproc-per-node=%d" % n, "--rdzv-conf=timeout=60", "--no-python",
                               CHECK, *extra)
            if QUICK:
                args += ["--sizes", "0,1,7,4097", "--dtypes", "float32,int32"]
            procs.append(subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=env_with(DDPRUN_HOST_ID="simhost-%d" % node, DDPRUN_TRANSPORT=transport)))
        outs = [p.communicate(timeout=900) for p in procs]
        for p, (o, e) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, o + e)
        return "".join(o for o, _ in outs)

    def test_hierarchical_two_by_two(self):
        out = self.launch((2, 2), "auto")
        self.assertEqual(out.count("checks passed"), 4, out)
        self.assertIn("of 2 (local 1/2), transport hier", out)

    def test_hierarchical_uneven_hosts(self):
        out = self.launch((3, 1), "hier")
        self.assertEqual(out.count("checks passed"), 4, out)

    def test_one_rank_per_host_uses_the_ring(self):
        out = self.launch((1, 1), "auto")
        self.assertIn("transport tcp", out)


def sh(*args):
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=30)


class NetnsHosts(LaunchTest):
    """Two real network hosts: network namespaces joined by a veth pair
    (10.231.<n>.1 and .2), created and removed by the test. One ddprun agent
    runs in each; ranks reach each other only over the veth link. The fixed
    master port is safe: nothing but this test runs in these namespaces."""

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0 or subprocess.run(["sh", "-c", "command -v ip"],
                                               capture_output=True).returncode != 0:
            raise unittest.SkipTest("needs root and iproute2 for network namespaces")
        tag = "%d" % (os.getpid() % 100000)
        cls.ns = ["ddprt%s_%d" % (tag, i) for i in range(2)]
        cls.addr = ["10.231.%d.%d" % (os.getpid() % 250, i + 1) for i in range(2)]
        veth = ["vdr%s_%d" % (tag, i) for i in range(2)]
        try:
            for ns in cls.ns:
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
            for i in range(2):
                sh("ip", "link", "set", veth[i], "netns", cls.ns[i])
                sh("ip", "-n", cls.ns[i], "addr", "add", cls.addr[i] + "/24", "dev", veth[i])
                sh("ip", "-n", cls.ns[i], "link", "set", veth[i], "up")
        except subprocess.CalledProcessError as e:
            cls.tearDownClass()
            raise unittest.SkipTest("cannot create network namespaces here: %s" % e.stderr)

    @classmethod
    def tearDownClass(cls):
        for ns in getattr(cls, "ns", []):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def launch(self, nproc, extra_env=None):
        procs = []
        for node in range(2):
            env = env_with(DDPRUN_HOST_ID="netns-host-%d" % node, **(extra_env or {}))
            args = ["ip", "netns", "exec", self.ns[node], *self.ddprun(
                "--nnodes=2", "--node-rank=%d" % node, "--master-addr=%s" % self.addr[0],
                "--master-port=29517", "--nproc-per-node=%d" % nproc,
                "--rdzv-conf=timeout=60", "--no-python", CHECK,
                "--sizes", "0,7,4097,1048579", "--dtypes", "float32,int64,float16")]
            procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env))
        outs = [p.communicate(timeout=600) for p in procs]
        for p, (o, e) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, o + e)
        return "".join(o for o, _ in outs)

    def test_ring_over_veth(self):
        out = self.launch(1)
        self.assertEqual(out.count("checks passed"), 2, out)
        self.assertIn("transport tcp", out)

    def test_hierarchical_over_veth(self):
        out = self.launch(2)
        self.assertEqual(out.count("checks passed"), 4, out)
        self.assertIn("transport hier", out)


class Faults(unittest.TestCase):
    """Ranks started by hand; one is killed or stopped mid-collective."""

    # How long a surviving rank may take to fail before the test calls it a
    # hang: a guard against waiting forever, far above every timeout used
    # here, not a measure of how fast failures are seen.
    HANG_GUARD_S = 120

    def start(self, n, transport, timeout_s, host_ids=None):
        port = reserve_port(self)  # rank 0 hosts the store there
        self.procs, self.lines = [], [[] for _ in range(n)]
        reached = [threading.Event() for _ in range(n)]
        for r in range(n):
            env = env_with(RANK=r, WORLD_SIZE=n, LOCAL_RANK=r, LOCAL_WORLD_SIZE=n,
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                           DDPRUN_TRANSPORT=transport, DDPRUN_COLLECTIVE_TIMEOUT=timeout_s)
            env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
            if host_ids:
                env["DDPRUN_HOST_ID"] = host_ids[r]
            p = subprocess.Popen([CHECK, "--loop"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
            self.procs.append(p)
            threading.Thread(target=self.pump, args=(p, self.lines[r], reached[r]),
                             daemon=True).start()
        # Every rank must be iterating (several collectives completed) before
        # the fault, so the fault hits a collective in flight, not the setup.
        for r, p in enumerate(self.procs):
            reached[r].wait(self.HANG_GUARD_S)
            self.assertIn("iter 3", self.lines[r],
                          "rank %d did not reach iter 3 (exit %s):\n%s" %
                          (r, p.poll(), "\n".join(self.lines[r][-5:])))
            self.assertIsNone(p.poll(), "rank %d exited before the fault" % r)

    @staticmethod
    def pump(p, sink, reached):
        for line in p.stdout:
            sink.append(line.strip())
            if line.startswith("iter 3"):
                reached.set()
        reached.set()  # end of output: the rank is gone; start() says so

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()
            p.stdout.close()
            p.stderr.close()

    def expect_others_fail(self, victim, words, any_words=(), no_words=()):
        """Every rank but `victim` exits non-zero, its stderr holds each of
        `words` and none of `no_words`; some rank's stderr holds each of
        `any_words`. Returns the seconds this took (reported, not asserted)."""
        t0 = time.monotonic()
        errs = []
        for r, p in enumerate(self.procs):
            if r == victim:
                continue
            try:
                p.wait(timeout=self.HANG_GUARD_S)
            except subprocess.TimeoutExpired:
                self.fail("rank %d hangs: still running %d s after rank %d's fault"
                          % (r, self.HANG_GUARD_S, victim))
            err = p.stderr.read()
            errs.append(err)
            self.assertNotEqual(p.returncode, 0, "rank %d stderr:\n%s" % (r, err))
            for w in words:
                self.assertIn(w, err, "rank %d stderr:\n%s" % (r, err))
            for w in no_words:
                self.assertNotIn(w, err, "rank %d stderr:\n%s" % (r, err))
        for w in any_words:
            self.assertTrue(any(w in e for e in errs), "no rank said %r:\n%s" % (w, "".join(errs)))
        return time.monotonic() - t0

    def kill_victim(self, transport, n=4, victim=1, host_ids=None):
        self.start(n, transport, timeout_s=30, host_ids=host_ids)
        self.procs[victim].send_signal(signal.SIGKILL)
        # A death is seen as one (a closed connection, a gone peer), not
        # waited out until the collective timeout.
        took = self.expect_others_fail(victim, ["Rank %d is the likely culprit" % victim],
                                       no_words=["timed out"])
        print("\n%s: others failed %.2f s after kill -9 of rank %d" % (transport, took, victim),
              file=sys.stderr)

    def test_kill_shm(self):
        self.kill_victim("shm")

    def test_kill_tcp(self):
        self.kill_victim("tcp")

    def test_kill_hierarchical(self):
        self.kill_victim("hier", host_ids=["a", "a", "b", "b"], victim=2)

    def test_stall_times_out_naming_the_rank(self):
        self.start(3, "tcp", timeout_s=3)
        self.procs[2].send_signal(signal.SIGSTOP)
        self.expect_others_fail(2, ["Rank 2 is the likely culprit"], ["timed out"])

    def test_stall_on_shared_memory(self):
        self.start(3, "shm", timeout_s=3)
        self.procs[1].send_signal(signal.SIGSTOP)
        self.expect_others_fail(1, ["Rank 1 is the likely culprit"], ["timed out"])


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
