"""ddprun under a real Slurm: a local 3-node cluster (tests/pyutil/
slurm_cluster.py: munged, slurmctld, three slurmd on this host, nodes
n1 n2 n3 with 2 CPUs each), and `srun ddprun` with no rendezvous flag.

- One group of 6 from `srun -N3 --ntasks-per-node=1 ddprun --nproc_per_node=2`:
  ranks 0..5 once each, WORLD_SIZE 6, ranks 0 and 1 on the step's first
  node, run id "<job id>.<step id>", one "ddprun: from Slurm:" line per agent.
- A failed worker restarts the group across the three nodes (--max-restarts
  1, the workers per node from `srun -c 2`): all 6 run twice, the job exits 0.
- `scancel` ends the job: no worker, ddprun or slurmstepd of it is left.
- `scancel --signal=USR1` (Slurm's preemption notice) reaches every worker
  and the job still ends as its workers do (exit 0).
- Two ddprun tasks on one node: an error naming the Slurm variable.

Slurm signals every process of a step (proctrack/linuxproc, as cgroup
tracking does): the agent and each worker get scancel's signal directly.

Needs root (daemons, a private mount namespace): skipped otherwise. As root,
the Debian packages slurmctld slurmd slurm-client munge must be installed
(scripts/setup-test-deps.sh): without them the test fails and says so."""
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
import slurm_cluster  # noqa: E402
from ddprun_case import DDPRUN, DdprunCase  # noqa: E402
from procs import alive, wait_for  # noqa: E402

# One srun of 3 agents and 6 Python workers on a loaded 2-core machine, far
# above what it takes; past it the job is cancelled and srun killed.
JOB_TIMEOUT = 180

# Records what the launcher gave it in $RECORDS/a<attempt>_r<rank>.json,
# then, by $MODE:
#   done       exits 0
#   fail_once  attempt 0: rank 3 exits 1 once all 6 recorded, the others
#              block; attempt 1 exits 0
#   block      blocks until a signal ends it
#   usr1       handles SIGUSR1 (each receipt appended to usr1_r<rank>) before
#              recording, then exits 0 once it got one
WORKER = r'''
import json, os, signal, sys
e = os.environ
attempt, rank, mode = e["TORCHELASTIC_RESTART_COUNT"], e["RANK"], e["MODE"]
got = []
def on_usr1(sig, frame):
    with open(os.path.join(e["RECORDS"], "usr1_r" + rank), "a") as f:
        f.write("%d\n" % os.getpid())
    got.append(sig)
if mode == "usr1":
    signal.signal(signal.SIGUSR1, on_usr1)
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "SLURMD_NODENAME", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST",
        "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")
rec = dict({k: e.get(k) for k in keys}, pid=os.getpid())
name = os.path.join(e["RECORDS"], "a%s_r%s" % (attempt, rank))
with open(name + ".tmp", "w") as f:
    json.dump(rec, f)
os.rename(name + ".tmp", name + ".json")
if mode == "fail_once" and attempt == "0" and rank == "3":
    # Once every worker of attempt 0 has recorded itself (the test bounds
    # the wait with srun's timeout).
    import glob, time
    while len(glob.glob(os.path.join(e["RECORDS"], "a0_r*.json"))) < int(e["WORLD_SIZE"]):
        time.sleep(0.01)
    sys.exit(1)
if mode == "block" or (mode == "fail_once" and attempt == "0"):
    while True:
        signal.pause()
if mode == "usr1":
    while not got:
        signal.pause()
'''


class SlurmJobs(DdprunCase):
    maxDiff = None
    cluster = None
    _why = None

    @classmethod
    def setUpClass(cls):
        cls._why = slurm_cluster.cannot_run()
        if cls._why:
            return
        missing = slurm_cluster.missing_programs()
        if missing:
            raise RuntimeError("Slurm programs not found: %s; install the Debian packages %s "
                               "(scripts/setup-test-deps.sh)" % (" ".join(missing),
                                                                 slurm_cluster.PACKAGES))
        cls.cluster = slurm_cluster.SlurmCluster(nodes=3, cpus=2, jobs=20)
        cls.cluster.start()

    @classmethod
    def tearDownClass(cls):
        if cls.cluster:
            cls.cluster.stop()
            if cls.cluster.leftovers:
                raise AssertionError("processes left after the cluster stopped: %s"
                                     % cls.cluster.leftovers)

    def setUp(self):
        # Each test skips (not the class): testmain counts skipped tests.
        if self._why:
            self.skipTest(self._why)
        super().setUp()
        self.records = self.path("records")
        os.mkdir(self.records)
        self.worker = self.pyscript(WORKER)

    # ------------------------------------------------------------- helpers

    def job_env(self, mode):
        return self.env({"RECORDS": self.records, "MODE": mode})

    def srun(self, srun_args, ddprun_args, mode):
        """srun SRUN_ARGS ddprun DDPRUN_ARGS worker, to its end."""
        try:
            return self.cluster.srun([*srun_args, DDPRUN, *ddprun_args, self.worker],
                                     timeout=JOB_TIMEOUT, env=self.job_env(mode))
        except subprocess.TimeoutExpired:
            self.fail("srun still running after %d s (cancelled)\n%s"
                      % (JOB_TIMEOUT, self.cluster.daemon_logs()))

    def background(self, srun_args, ddprun_args, mode):
        """srun in the background; cancelled and reaped when the test ends."""
        out = open(self.path("srun.out"), "w")
        self.addCleanup(out.close)
        name, p = self.cluster.popen_srun([*srun_args, DDPRUN, *ddprun_args, self.worker],
                                          env=self.job_env(mode), stdout=out,
                                          stderr=subprocess.STDOUT, text=True)
        self.addCleanup(self._end, name, p)
        return p

    def _end(self, name, p):
        if p.poll() is None:
            self.cluster.cancel_by_name(name)
            try:
                p.wait(JOB_TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def srun_output(self):
        with open(self.path("srun.out")) as f:
            return f.read()

    def records_of(self, attempt):
        """{rank: record} of the workers of `attempt` so far."""
        out = {}
        for path in glob.glob(os.path.join(self.records, "a%d_r*.json" % attempt)):
            with open(path) as f:
                rec = json.load(f)
            out[int(rec["RANK"])] = rec
        return out

    def wait_records(self, attempt, n, what):
        if not wait_for(lambda: len(self.records_of(attempt)) == n, JOB_TIMEOUT, 0.05):
            self.fail("%d of %d workers of attempt %d %s\n%s\n%s"
                      % (len(self.records_of(attempt)), n, attempt, what, self.srun_output(),
                         self.cluster.daemon_logs()))

    def assert_one_group(self, recs, attempt=0):
        """The 6 workers of one attempt form one group over n1 n2 n3, node
        ranks in the order of the step's node list."""
        self.assertEqual(sorted(recs), list(range(6)), recs)
        job = recs[0]["SLURM_JOB_ID"]
        step = recs[0]["SLURM_STEP_ID"]
        nodes = ["n1", "n2", "n3"]
        for rank, rec in recs.items():
            where = "rank %d: %s" % (rank, rec)
            self.assertEqual(rec["WORLD_SIZE"], "6", where)
            self.assertEqual(rec["TORCHELASTIC_RESTART_COUNT"], str(attempt), where)
            self.assertEqual((rec["SLURM_JOB_ID"], rec["SLURM_STEP_ID"]), (job, step), where)
            self.assertEqual(rec["TORCHELASTIC_RUN_ID"], "%s.%s" % (job, step), where)
            self.assertEqual(rec["SLURM_STEP_NODELIST"], "n[1-3]", where)
            self.assertEqual(rec["GROUP_RANK"], str(rank // 2), where)
            self.assertEqual(rec["LOCAL_RANK"], str(rank % 2), where)
            self.assertEqual(rec["SLURMD_NODENAME"], nodes[rank // 2], where)
            self.assertIn(rec["MASTER_ADDR"], ("n1", "127.0.0.11"), where)
        self.assertEqual(recs[0]["SLURMD_NODENAME"], "n1")
        self.assertEqual(recs[1]["SLURMD_NODENAME"], "n1")

    def assert_gone(self, job, pids):
        """Waits (bounded) until no worker in `pids`, no ddprun and no
        slurmstepd of `job` runs; fails naming what is left."""
        def left():
            procs = self.cluster.processes()
            agents = [p for p in procs if _exe(p) == os.path.realpath(DDPRUN)]
            return ([p for p in pids if alive(p)], agents, self.cluster.step_daemons(job))
        if not wait_for(lambda: not any(left()), JOB_TIMEOUT, 0.05):
            self.fail("left running after the job ended (workers, ddprun, slurmstepd): %s"
                      % (left(),))

    # --------------------------------------------------------------- tests

    def test_one_group_of_six_with_no_rendezvous_flag(self):
        r = self.srun(["-N3", "--ntasks-per-node=1"], ["--nproc_per_node=2"], "done")
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assert_one_group(self.records_of(0))
        self.assertEqual(len(re.findall(r"(?m)^ddprun: from Slurm", out)), 3, out)
        self.assert_agent_messages_clean(out)

    def test_a_failed_worker_restarts_the_group(self):
        r = self.srun(["-N3", "--ntasks-per-node=1", "--cpus-per-task=2"], ["--max-restarts=1"],
                      "fail_once")
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        first, second = self.records_of(0), self.records_of(1)
        self.assert_one_group(first, attempt=0)
        self.assert_one_group(second, attempt=1)
        self.assertEqual(first[0]["TORCHELASTIC_RUN_ID"], second[0]["TORCHELASTIC_RUN_ID"])
        self.assertEqual(self.records_of(2), {})

    def test_scancel_ends_every_process_of_the_job(self):
        p = self.background(["-N3", "--ntasks-per-node=1"], ["--nproc_per_node=2"], "block")
        self.wait_records(0, 6, "started")
        recs = self.records_of(0)
        self.assert_one_group(recs)
        job = recs[0]["SLURM_JOB_ID"]
        self.cluster.scancel(job)
        try:
            p.wait(JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail("srun still running %d s after scancel\n%s" % (JOB_TIMEOUT,
                                                                   self.srun_output()))
        self.assertNotEqual(p.returncode, 0, self.srun_output())
        self.assert_gone(job, [r["pid"] for r in recs.values()])
        self.assertEqual(self.records_of(1), {}, "workers restarted after scancel")

    def test_scancel_signal_usr1_reaches_every_worker(self):
        p = self.background(["-N3", "--ntasks-per-node=1"], ["--nproc_per_node=2"], "usr1")
        self.wait_records(0, 6, "started")
        recs = self.records_of(0)
        job = recs[0]["SLURM_JOB_ID"]
        self.cluster.scancel("--signal=USR1", job)
        try:
            rc = p.wait(JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail("srun still running %d s after SIGUSR1\n%s" % (JOB_TIMEOUT,
                                                                    self.srun_output()))
        receipts = {}
        for rank in range(6):
            try:
                with open(os.path.join(self.records, "usr1_r%d" % rank)) as f:
                    receipts[rank] = f.read().split()
            except FileNotFoundError:
                receipts[rank] = []
        print("SIGUSR1 receipts per rank (pids): %s" % receipts, file=sys.stderr)
        self.assertTrue(all(receipts.values()), "a worker never got SIGUSR1: %s (srun exited "
                        "%s)\n%s" % (receipts, rc, self.srun_output()))
        self.assertEqual(rc, 0, "the job did not end as its workers did (0) after SIGUSR1:\n"
                         + self.srun_output())
        self.assert_gone(job, [r["pid"] for r in recs.values()])

    def test_two_tasks_on_a_node_is_an_error_naming_the_variable(self):
        r = self.srun(["-N1", "--ntasks-per-node=2"], ["--nproc_per_node=1"], "done")
        out = r.stdout + r.stderr
        self.assertNotEqual(r.returncode, 0, out)
        self.assertRegex(out, r"SLURM_(STEP_NUM_TASKS|NTASKS)=2")
        self.assertEqual(self.records_of(0), {}, "workers started: " + out)
        self.assert_agent_messages_clean(out)


def _exe(pid):
    try:
        return os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return None


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
    from testmain import main
    main()
