"""Training progress the agent sees (DDPRUN_PROGRESS_FILE, docs/status.md):
real ddprun, real Python workers reporting through python/ddprun/progress.py.

- every rank's step, epoch and loss shown by /status, /metrics and
  `ddprun status` shortly after the workers report them, and the job's ETA
  from two reports of each rank;
- --progress-timeout 3 with a rank the test SIGSTOPs after it reported: the
  group fails (exit 1), the report names that rank, its pid and its last step;
- the same hang without --progress-timeout: nothing is stopped;
- a --progress-timeout that is not a finite positive number: exit 2.

The test waits on files the workers write and on what the endpoint says
(bounded polling), never on time, and asserts no duration."""
import glob
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))
from ddprun_case import DDPRUN, PATIENCE, DdprunCase, read  # noqa: E402
from procs import wait_for  # noqa: E402

PACKAGE_ROOT = os.path.abspath(os.path.join(HERE, "..", "..", "python"))
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

# A worker: reports through ddprun.progress, then waits for files of the test.
#   twice: step RANK at time 1000, once the file `second` exists step 10+RANK
#          at time 1010 (1 step/s of its own clock), then waits for `go`;
#   loop:  a step every 50 ms until `go` exists; its pid in pid_<rank> after
#          its first report.
WORKER = r"""
import os, sys, time
from ddprun import progress
d, mode = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])

def there(name):
    return os.path.exists(os.path.join(d, name))

def wait(name):
    while not there(name):
        time.sleep(0.02)

def write(name, text):
    tmp = os.path.join(d, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(d, name))

if mode == "twice":
    assert progress.report(rank, loss=0.5 + rank, epoch=1, samples_per_second=100.0 + rank,
                           total_steps=100, time=1000.0, force=True)
    wait("second")
    assert progress.report(10 + rank, loss=0.25 + rank, epoch=1, samples_per_second=100.0,
                           total_steps=100, time=1010.0, force=True)
    wait("go")
else:
    step = 0
    while not there("go"):
        step += 1
        assert progress.report(step, loss=1.0 / step, epoch=0, force=True)
        if step == 1:
            write("pid_%d" % rank, str(os.getpid()))
        time.sleep(0.05)
print("done rank %d" % rank, flush=True)
"""


class Progress(DdprunCase):
    def setUp(self):
        super().setUp()
        self.worker = self.pyscript(WORKER)

    def env_extra(self):
        return {"PYTHON_EXEC": PYTHON, "PYTHONPATH": PACKAGE_ROOT}

    def start(self, mode, *flags):
        """ddprun with 2 workers in the background; its port when
        --status-port 0 is among the flags."""
        self.err_path = self.path("stderr.txt")
        self.out_path = self.path("stdout.txt")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.job = self.popen("--nproc-per-node", "2", "--log-dir", self.path("logs"),
                                  *flags, self.worker, self.tmp, mode, stdout=out, stderr=err,
                                  env=self.env_extra())
        if "--status-port" not in flags:
            return None
        rx = re.compile(r"status endpoint at http://127\.0\.0\.1:(\d+)/status")
        self.assertTrue(wait_for(lambda: rx.search(read(self.err_path)) or
                                 self.job.poll() is not None, PATIENCE), "no status line")
        m = rx.search(read(self.err_path))
        self.assertIsNotNone(m, read(self.err_path))
        self.port = int(m.group(1))
        return self.port

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=PATIENCE)
        try:
            c.request("GET", path)
            r = c.getresponse()
            body = r.read().decode()
            self.assertEqual(r.status, 200, body)
            return body
        finally:
            c.close()

    def wait_status(self, cond, what):
        seen = {}

        def ok():
            seen["s"] = json.loads(self.get("/status"))
            return self.job.poll() is None and cond(seen["s"])
        self.assertTrue(wait_for(ok, PATIENCE, interval=0.05),
                        "%s; last /status: %s; stderr: %s" %
                        (what, seen.get("s"), read(self.err_path)))
        return seen["s"]

    @staticmethod
    def steps(s):
        """{local_rank: step} of the workers that reported."""
        return {w["local_rank"]: w["progress"]["step"] for w in s["workers"]
                if w.get("progress")}

    def pids(self):
        out = []
        for r in range(2):
            p = self.path("pid_%d" % r)
            self.kill_at_end(p)
            self.wait_file(p)
            out.append(int(read(p)))
        return out

    def progress_file(self, local_rank):
        """The worker's progress file: <log dir>/<run>/attempt_0/<rank>/progress.json."""
        found = glob.glob(self.path("logs/*/attempt_0/%d/progress.json" % local_rank))
        self.assertEqual(len(found), 1, found)
        return found[0]

    def stop_rank_1(self):
        """SIGSTOPs rank 1 after its first report; its pid and last step."""
        pids = self.pids()
        os.kill(pids[1], signal.SIGSTOP)
        self.addCleanup(self.cont, pids[1])
        with open(self.progress_file(1)) as f:
            return pids, json.load(f)["step"]

    @staticmethod
    def cont(pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def finish_ok(self):
        self.touch("go")
        self.assertEqual(self.wait_exit(self.job), 0, read(self.err_path))
        out = read(self.out_path)
        for r in range(2):
            self.assertIn("done rank %d" % r, out)

    # ------------------------------------------------------------ tests
    def test_status_metrics_and_table_show_every_ranks_progress(self):
        self.start("twice", "--status-port", "0")
        s = self.wait_status(lambda s: self.steps(s) == {0: 0, 1: 1},
                             "the first reports never shown")
        self.touch("second")
        s = self.wait_status(lambda s: self.steps(s) == {0: 10, 1: 11} and
                             s["eta_seconds"] is not None, "the second reports never shown")
        by_rank = {w["local_rank"]: w for w in s["workers"]}
        for r in range(2):
            p = by_rank[r]["progress"]
            self.assertEqual(p["loss"], 0.25 + r)
            self.assertEqual(p["epoch"], 1)
            self.assertEqual(p["samples_per_second"], 100.0)
            self.assertEqual(p["total_steps"], 100)
            self.assertEqual(p["time"], 1010.0)
            self.assertGreaterEqual(p["seconds_since_progress"], 0)
        # 1 step/s of the workers' own clock: rank 0 has 90 steps left.
        self.assertEqual(s["eta_seconds"], 90.0)
        self.assertIsNone(s["progress_timeout"])
        metrics = self.get("/metrics")
        for r in range(2):
            labels = 'run_id="[^"]*",rank="%d",local_rank="%d"' % (r, r)
            self.assertRegex(metrics, r"ddprun_worker_step\{%s\} %d\n" % (labels, 10 + r))
            self.assertRegex(metrics, r"ddprun_worker_loss\{%s\} %s\n" % (labels, 0.25 + r))
            self.assertRegex(metrics, r"ddprun_worker_epoch\{%s\} 1\n" % labels)
            self.assertRegex(metrics, r"ddprun_worker_samples_per_second\{%s\} 100\n" % labels)
            self.assertRegex(metrics,
                             r"ddprun_worker_last_progress_timestamp_seconds\{%s\} 1010\n" %
                             labels)
        self.assertRegex(metrics, r"ddprun_job_eta_seconds\{run_id=\"[^\"]*\"\} 90\n")
        t = subprocess.run([DDPRUN, "status", "127.0.0.1:%d" % self.port], capture_output=True,
                           text=True, timeout=PATIENCE)
        self.assertEqual(t.returncode, 0, t.stderr)
        self.assertIn("STEP", t.stdout)
        self.assertIn("eta:     1m 30s", t.stdout)
        self.assertRegex(t.stdout, r"\n0 +0 .*running.* 10 +1 +0\.25 +100\.0 ")
        self.assertRegex(t.stdout, r"\n1 +1 .*running.* 11 +1 +1\.25 +100\.0 ")
        self.finish_ok()

    def test_a_hung_rank_fails_the_group_naming_it(self):
        self.start("loop", "--progress-timeout", "3", "--max-restarts", "0")
        pids, step = self.stop_rank_1()
        code = self.wait_exit(self.job)
        err = read(self.err_path)
        self.assertEqual(code, 1, err)
        why = "rank 1 (local_rank 1, pid %d) made no progress for " % pids[1]
        self.assertIn(why, err)
        self.assertRegex(err, re.escape(why) + r"[0-9.]+ s \(last step %d\)" % step)
        self.assertIn("--progress-timeout 3 s", err)
        root = err.split("Root Cause (first observed failure):")[1]
        self.assertIn("rank      : 1 (local_rank: 1)", root)
        self.assertIn("(pid: %d)" % pids[1], root)
        self.assertIn("(last step %d)" % step, root)
        # The other rank was stopped for it, a victim.
        failures = err.split("Failures:")[1].split("Root Cause")[0]
        self.assertIn("stopped by ddprun", failures)
        report = glob.glob(self.path("logs/*/failure_report.txt"))
        self.assertEqual(len(report), 1)
        self.assertIn(why, read(report[0]))
        events = [json.loads(line) for line in
                  read(glob.glob(self.path("logs/*/events.jsonl"))[0]).splitlines()]
        stalled = [e for e in events if e["event"] == "stalled"]
        self.assertEqual(len(stalled), 1, events)
        self.assertEqual((stalled[0]["rank"], stalled[0]["pid"], stalled[0]["last_step"]),
                         (1, pids[1], step))
        self.assert_agent_messages_clean(err)

    def test_a_hung_rank_restarts_the_group_when_restarts_are_left(self):
        self.start("loop", "--progress-timeout", "3", "--max-restarts", "1")
        pids, step = self.stop_rank_1()
        # Attempt 1: the workers write their pids again; the test lets them end.
        for r in range(2):
            os.unlink(self.path("pid_%d" % r))
        self.assertTrue(wait_for(lambda: "restart 1 of 1" in read(self.err_path) or
                                 self.job.poll() is not None, PATIENCE), read(self.err_path))
        new = self.pids()
        self.assertNotIn(pids[1], new)
        self.finish_ok()
        self.assertIn("rank 1 (local_rank 1, pid %d) made no progress" % pids[1],
                      read(self.err_path))

    def test_without_progress_timeout_nothing_is_stopped(self):
        self.start("loop", "--status-port", "0")
        pids, step = self.stop_rank_1()
        # Rank 1 silent past what --progress-timeout 3 would have allowed.
        self.wait_status(lambda s: any(w["local_rank"] == 1 and w.get("progress") and
                                       w["progress"]["seconds_since_progress"] >= 4
                                       for w in s["workers"]),
                         "rank 1 never shown silent")
        s = json.loads(self.get("/status"))
        self.assertEqual([w["state"] for w in s["workers"]], ["running", "running"])
        self.assertEqual(s["attempt"], 0)
        os.kill(pids[1], signal.SIGCONT)
        self.finish_ok()
        self.assertNotIn("made no progress", read(self.err_path))

    def test_a_progress_timeout_that_is_not_a_positive_number_is_refused(self):
        for bad in ("0", "-3", "nan", "inf", "abc", ""):
            p = self.run_ddprun("--progress-timeout", bad, "--no-python", "true")
            self.assertEqual(p.returncode, 2, (bad, p.stderr))
            self.assertIn("--progress-timeout", p.stderr)
        p = self.run_ddprun("--no-python", "true", env={"PET_PROGRESS_TIMEOUT": "never"})
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("PET_PROGRESS_TIMEOUT", p.stderr)

    def test_workers_get_their_own_progress_file(self):
        w = self.script('echo "$DDPRUN_PROGRESS_FILE" > "%s/file_$LOCAL_RANK"\n' % self.tmp)
        p = self.run_ddprun("--no-python", "--nproc-per-node", "2", "--log-dir",
                            self.path("logs"), w, env={"DDPRUN_PROGRESS_FILE": "/outer/x"})
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in range(2):
            self.assertRegex(read(self.path("file_%d" % r)).strip(),
                             r"^%s/[^/]+/attempt_0/%d/progress\.json$" %
                             (re.escape(self.path("logs")), r))


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
