"""End-to-end tests of the ddprun launcher with real worker processes.

Workers are small shell scripts (no PyTorch needed). Each test asserts on exit
codes, files the workers write, the console and the failure report."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from reserved_port import reserve_port  # noqa: E402

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DDPRUN = os.path.join(BIN, "ddprun")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is as good as dead
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    return True


def read(path):
    with open(path) as f:
        return f.read()


def wait_for(cond, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def write_script(directory, body):
    """An executable /bin/sh worker in `directory`, named uniquely."""
    path = os.path.join(directory, "worker_%d.sh" % len(os.listdir(directory)))
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, 0o755)
    return path


class AgentE2E(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_e2e_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def script(self, body):
        return write_script(self.tmp, body)

    def run_ddprun(self, *args, timeout=60, env=None):
        e = dict(os.environ, **(env or {}))
        return subprocess.run([DDPRUN, *args], capture_output=True, text=True, timeout=timeout, env=e)

    def test_env_contract_per_rank(self):
        w = self.script('env > "%s/env_$LOCAL_RANK"\n' % self.tmp)
        port = reserve_port(self)  # the agent hosts the worker store at --master-port
        p = self.run_ddprun("--nproc-per-node=3", "--max-restarts=2", "--role=trainer",
                            "--master-port=%d" % port, w)
        self.assertEqual(p.returncode, 0, p.stderr)
        ports = set()
        for r in range(3):
            lines = read(os.path.join(self.tmp, "env_%d" % r)).splitlines()
            env = dict(l.split("=", 1) for l in lines if "=" in l)
            self.assertEqual(env["RANK"], str(r))
            self.assertEqual(env["LOCAL_RANK"], str(r))
            self.assertEqual(env["WORLD_SIZE"], "3")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "3")
            self.assertEqual(env["GROUP_RANK"], "0")
            self.assertEqual(env["GROUP_WORLD_SIZE"], "1")
            self.assertEqual(env["ROLE_RANK"], str(r))
            self.assertEqual(env["ROLE_WORLD_SIZE"], "3")
            self.assertEqual(env["ROLE_NAME"], "trainer")
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")
            self.assertEqual(env["TORCHELASTIC_RESTART_COUNT"], "0")
            self.assertEqual(env["TORCHELASTIC_MAX_RESTARTS"], "2")
            self.assertEqual(env["TORCHELASTIC_RUN_ID"], "none")
            self.assertEqual(env["TORCHELASTIC_USE_AGENT_STORE"], "True")
            self.assertTrue(env["TORCHELASTIC_ERROR_FILE"].endswith("/attempt_0/%d/error.json" % r))
            self.assertEqual(env["OMP_NUM_THREADS"], "1")
            self.assertEqual(env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1")
            ports.add(env["MASTER_PORT"])
        self.assertEqual(ports, {str(port)})
        self.assertIn("OMP_NUM_THREADS=1", p.stderr)

    def test_standalone_gives_a_free_port_and_store_is_reachable(self):
        w = self.script('echo "$MASTER_PORT" > "%s/port_$LOCAL_RANK"\n' % self.tmp)
        p = self.run_ddprun("--standalone", "--nproc-per-node=2", w)
        self.assertEqual(p.returncode, 0, p.stderr)
        ports = {read(os.path.join(self.tmp, "port_%d" % r)).strip() for r in range(2)}
        self.assertEqual(len(ports), 1)
        self.assertNotEqual(ports.pop(), "29500")

    def test_failure_on_first_attempt_then_success_after_restart(self):
        w = self.script('echo "$TORCHELASTIC_RESTART_COUNT" >> "%s/attempts_$LOCAL_RANK"\n'
                        '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$LOCAL_RANK" = 1 ] && exit 3\n'
                        '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && sleep 30\n'
                        'exit 0\n' % self.tmp)
        t0 = time.time()
        p = self.run_ddprun("--standalone", "--nproc-per-node=2", "--max-restarts=1", w)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertLess(time.time() - t0, 20, "rank 0 was not stopped promptly")
        for r in range(2):
            self.assertEqual(read(os.path.join(self.tmp, "attempts_%d" % r)).split(), ["0", "1"])

    def test_restarts_exhausted_names_the_culprit(self):
        w = self.script('if [ "$LOCAL_RANK" = 1 ]; then echo "boom: disk on fire" >&2; exit 7; fi\n'
                        'sleep 30\n')
        p = self.run_ddprun("--standalone", "--nproc-per-node=3", "--max-restarts=1", w)
        self.assertEqual(p.returncode, 1, p.stderr)
        err = p.stderr
        self.assertIn("FAILED", err)
        root = err.split("Root Cause (first observed failure):")[1]
        self.assertIn("rank      : 1 (local_rank: 1)", root)
        self.assertIn("exitcode  : 7", root)
        self.assertIn("boom: disk on fire", root)  # stderr tail without an error file
        failures = err.split("Failures:")[1].split("Root Cause")[0]
        self.assertIn("-15 (SIGTERM)", failures)  # victims, stopped by ddprun
        self.assertIn("stopped by ddprun", failures)
        self.assertIn("restarting (attempt 1)", err)

    def test_error_file_traceback_is_reported(self):
        w = self.script('[ "$LOCAL_RANK" = 0 ] || exit 0\n'
                        'cat > "$TORCHELASTIC_ERROR_FILE" <<EOF\n'
                        '{"message": {"message": "ValueError: bad lr", "extraInfo": '
                        '{"py_callstack": "Traceback (most recent call last):\\\\n  ValueError: bad lr", '
                        '"timestamp": "1700000000"}}}\n'
                        'EOF\n'
                        'exit 1\n')
        p = self.run_ddprun("--standalone", "--nproc-per-node=2", w)
        self.assertEqual(p.returncode, 1)
        root = p.stderr.split("Root Cause (first observed failure):")[1]
        self.assertIn("Traceback (most recent call last):", root)
        self.assertIn("error.json", root)

    def test_agent_error_file_duplicate_filters_and_exit_durations(self):
        logdir = os.path.join(self.tmp, "logs")
        own = os.path.join(self.tmp, "agent_error.json")
        w = self.script('echo "loss=1.5 step=$LOCAL_RANK"\necho "noise"\n'
                        '[ "$LOCAL_RANK" = 1 ] || exit 0\n'
                        'echo \'{"message": {"message": "RuntimeError: r1", "extraInfo": '
                        '{"py_callstack": "tb", "timestamp": "1"}}}\' > "$TORCHELASTIC_ERROR_FILE"\n'
                        'exit 4\n')
        p = self.run_ddprun("--standalone", "--nproc-per-node=2", "--log-dir", logdir,
                            "--duplicate-stdout-filters=loss=", w,
                            env={"TORCHELASTIC_ERROR_FILE": own})
        self.assertEqual(p.returncode, 1, p.stderr)
        import json
        copied = json.loads(read(own))
        self.assertEqual(copied["message"]["errorCode"], 4)
        self.assertEqual(copied["message"]["message"], "RuntimeError: r1")
        run = os.path.join(logdir, os.listdir(logdir)[0])
        dup = read(os.path.join(run, "duplicate_stdout.log"))
        self.assertIn("[default0]:loss=1.5 step=0", dup)
        self.assertIn("[default1]:loss=1.5 step=1", dup)
        self.assertNotIn("noise", dup)
        self.assertIn("noise", p.stdout)  # the console still gets every line
        events = [json.loads(l) for l in read(os.path.join(run, "events.jsonl")).splitlines()]
        exits = [e for e in events if e["event"] == "exit"]
        self.assertEqual(len(exits), 2)
        self.assertTrue(all(e["duration_s"] >= 0 for e in exits))

    def test_sigterm_is_forwarded_and_exit_is_128_plus_signal(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            mark = os.path.join(self.tmp, "got_%d" % sig)
            w = self.script("trap 'echo $LOCAL_RANK >> %s; exit 0' TERM INT\n"
                            'echo ready > "%s/ready_${LOCAL_RANK}_%d"\n'
                            'while true; do sleep 0.05; done\n' % (mark, self.tmp, sig))
            p = subprocess.Popen([DDPRUN, "--standalone", "--nproc-per-node=2", w],
                                 stderr=subprocess.PIPE, text=True)
            self.addCleanup(p.stderr.close)
            self.assertTrue(wait_for(lambda: all(os.path.exists(os.path.join(self.tmp, "ready_%d_%d" % (r, sig)))
                                                 for r in range(2))))
            p.send_signal(sig)
            rc = p.wait(15)
            self.assertEqual(rc, 128 + sig, p.stderr.read())
            self.assertEqual(sorted(read(mark).split()), ["0", "1"])

    def test_worker_ignoring_sigterm_is_killed_after_grace(self):
        w = self.script("trap '' TERM\n"
                        'echo $$ > "%s/pid_$LOCAL_RANK"\n'
                        'while true; do sleep 0.05; done\n' % self.tmp)
        p = subprocess.Popen([DDPRUN, "--standalone", "--nproc-per-node=2", "--shutdown-timeout=1", w],
                             stderr=subprocess.PIPE, text=True)
        self.addCleanup(p.stderr.close)
        pidfiles = [os.path.join(self.tmp, "pid_%d" % r) for r in range(2)]
        self.assertTrue(wait_for(lambda: all(os.path.exists(f) and read(f).strip() for f in pidfiles)))
        pids = [int(read(f)) for f in pidfiles]
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(15)
        took = time.time() - t0
        self.assertEqual(rc, 128 + signal.SIGTERM)
        self.assertGreaterEqual(took, 0.9)
        self.assertLess(took, 6)
        self.assertTrue(wait_for(lambda: not any(alive(x) for x in pids), 5))
        self.assertIn("SIGKILL", p.stderr.read())

    def test_kill_9_of_agent_leaves_no_workers(self):
        w = self.script('echo $$ > "%s/pid_$LOCAL_RANK"\nwhile true; do sleep 0.05; done\n' % self.tmp)
        p = subprocess.Popen([DDPRUN, "--standalone", "--nproc-per-node=3", w], stderr=subprocess.DEVNULL)
        pidfiles = [os.path.join(self.tmp, "pid_%d" % r) for r in range(3)]
        self.assertTrue(wait_for(lambda: all(os.path.exists(f) and read(f).strip() for f in pidfiles)))
        pids = [int(read(f)) for f in pidfiles]
        self.assertTrue(all(alive(x) for x in pids))
        p.send_signal(signal.SIGKILL)
        p.wait(5)
        self.assertTrue(wait_for(lambda: not any(alive(x) for x in pids), 5),
                        "orphaned workers: %r" % [x for x in pids if alive(x)])

    def test_tee_prefixes_console_and_writes_log_files(self):
        logdir = os.path.join(self.tmp, "logs")
        w = self.script('echo "hello from $LOCAL_RANK"\necho "err line $LOCAL_RANK" >&2\n')
        p = self.run_ddprun("--standalone", "--nproc-per-node=2", "--tee=3", "--log-dir", logdir, w)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[default0]:hello from 0", p.stdout)
        self.assertIn("[default1]:hello from 1", p.stdout)
        self.assertIn("[default1]:err line 1", p.stderr)
        runs = os.listdir(logdir)
        self.assertEqual(len(runs), 1)
        self.assertTrue(runs[0].startswith("standalone_"))
        base = os.path.join(logdir, runs[0])
        self.assertEqual(read(os.path.join(base, "attempt_0/1/stdout.log")), "hello from 1\n")
        self.assertEqual(read(os.path.join(base, "attempt_0/0/stderr.log")), "err line 0\n")
        events = read(os.path.join(base, "events.jsonl"))
        self.assertIn('"event":"start"', events)
        self.assertIn('"event":"succeeded"', events)

    def test_redirect_hides_and_filter_selects_ranks(self):
        logdir = os.path.join(self.tmp, "logs")
        w = self.script('echo "out $LOCAL_RANK"\n')
        p = self.run_ddprun("--standalone", "--nproc-per-node=3", "-r", "0:1", "--tee", "1:1,2:1",
                            "--local-ranks-filter=2", "--log-dir", logdir, w)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("out 0", p.stdout)  # redirected: file only
        self.assertNotIn("out 1", p.stdout)  # teed but filtered out of the console
        self.assertIn("[default2]:out 2", p.stdout)
        base = os.path.join(logdir, os.listdir(logdir)[0], "attempt_0")
        for r in range(3):
            self.assertEqual(open(os.path.join(base, str(r), "stdout.log")).read(), "out %d\n" % r)

    def test_python_script_and_local_rank_macro(self):
        script = os.path.join(self.tmp, "train.py")
        with open(script, "w") as f:
            f.write("import os, sys\nopen(sys.argv[1], 'w').write(os.environ['RANK'])\n")
        p = self.run_ddprun("--standalone", "--nproc_per_node=2", script,
                            os.path.join(self.tmp, "out_${local_rank}"),
                            env={"PYTHON_EXEC": sys.executable})
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in range(2):
            self.assertEqual(read(os.path.join(self.tmp, "out_%d" % r)), str(r))

    def test_bad_invocations_exit_two_or_three(self):
        cases = [(["--nproc-per-node=0", "x"], 2), (["--bogus", "x"], 2), ([], 2),
                 (["--nnodes=1:2", "x"], 2), (["--nnodes=2", "--node-rank=2", "x"], 2),
                 (["--nnodes=2", "--standalone", "x"], 2),
                 (["--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "x"], 2),
                 (["--log-dir=/proc/forbidden", "--standalone", "x"], 3)]
        for args, code in cases:
            p = self.run_ddprun(*args)
            self.assertEqual(p.returncode, code, (args, p.stderr))
            self.assertIn("ddprun: error:", p.stderr, args)

    def test_missing_program_reports_and_fails(self):
        p = self.run_ddprun("--standalone", "--no-python", "/nonexistent/program")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("/nonexistent/program", p.stderr)

    def test_port_in_use_is_named(self):
        s = socket.socket(socket.AF_INET6)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", 0))
        s.listen()
        port = s.getsockname()[1]
        try:
            p = self.run_ddprun("--master-port", str(port), self.script("exit 0\n"))
            self.assertEqual(p.returncode, 3, p.stderr)
            self.assertIn(str(port), p.stderr)
            self.assertIn("in use", p.stderr)
        finally:
            s.close()


class ProgramResolution(unittest.TestCase):
    """`ddprun --nproc_per_node=2 NAME` where NAME is no file in the current
    directory: the program of that name beside the ddprun binary (bundled, like
    `train`), else on PATH, run directly without python. The test runs its own
    ddprun (a link or copy) from a temporary bin/, so that bin/ is the bundled
    directory, and sets PYTHON_EXEC=/bin/false so that any python run fails."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_prog_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.dirs = {}
        for d in ("cwd", "bin", "path"):
            self.dirs[d] = os.path.join(self.tmp, d)
            os.mkdir(self.dirs[d])
        self.ddprun = os.path.join(self.dirs["bin"], "ddprun")
        try:
            os.link(DDPRUN, self.ddprun)
        except OSError:  # another file system
            shutil.copy2(DDPRUN, self.ddprun)

    def put(self, where, name, tag, executable=True):
        """A /bin/sh program that records `tag`, its arguments and RANK."""
        path = os.path.join(self.dirs[where], name)
        with open(path, "w") as f:
            f.write('#!/bin/sh\necho "%s $*" > "%s/ran_$RANK"\n' % (tag, self.tmp))
        os.chmod(path, 0o755 if executable else 0o644)
        return path

    def launch(self, *args, python="/bin/false"):
        env = dict(os.environ, PYTHON_EXEC=python,
                   PATH=self.dirs["path"] + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
        return subprocess.run([self.ddprun, "--nproc_per_node=2", "--log-dir", self.tmp + "/logs",
                               *args], cwd=self.dirs["cwd"],
                              capture_output=True, text=True, timeout=60, env=env)

    def ran(self):
        return [read(os.path.join(self.tmp, "ran_%d" % r)).strip() for r in range(2)]

    def test_bundled_program_beside_ddprun_runs_without_python(self):
        self.put("bin", "hello", "bundled")
        self.put("path", "hello", "path")  # the bundled one comes first
        p = self.launch("hello", "--epochs", "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.ran(), ["bundled --epochs 1"] * 2)

    def test_program_on_path_with_and_without_no_python(self):
        self.put("path", "hello", "path")
        self.put("bin", "hello", "not executable", executable=False)
        for flags in ((), ("--no-python",)):
            p = self.launch(*flags, "hello", "x")
            self.assertEqual(p.returncode, 0, (flags, p.stderr))
            self.assertEqual(self.ran(), ["path x"] * 2, flags)

    def test_file_in_current_directory_keeps_the_python_rule(self):
        self.put("bin", "hello", "bundled")
        with open(os.path.join(self.dirs["cwd"], "hello"), "w") as f:  # not executable: python
            f.write("import os\nopen(%r + '/ran_' + os.environ['RANK'], 'w').write('python')\n"
                    % self.tmp)
        p = self.launch("hello", python=sys.executable)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.ran(), ["python"] * 2)
        self.put("cwd", "hello", "cwd")  # executable here: run directly, not from PATH or bin/
        p = self.launch("hello")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.ran(), ["cwd"] * 2)

    def test_missing_program_names_the_places_searched(self):
        for flags in ((), ("--no-python",)):
            p = self.launch(*flags, "no_such_program")
            self.assertEqual(p.returncode, 3, (flags, p.stderr))
            self.assertIn("'no_such_program' not found", p.stderr)
            self.assertIn(self.dirs["cwd"], p.stderr)
            self.assertIn(os.path.join(self.dirs["bin"], "no_such_program"), p.stderr)
            self.assertIn(self.dirs["path"] + ":", p.stderr)


class StaticTwoNodes(unittest.TestCase):
    """Two agents on this machine, --nnodes 2 --node-rank 0/1 (static rendezvous)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_2n_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.port = reserve_port(self)  # node 0's agent hosts the rendezvous store there

    def script(self, body):
        return write_script(self.tmp, body)

    def launch(self, worker, nprocs=(2, 1), extra=()):
        procs = []
        for node, n in enumerate(nprocs):
            args = [DDPRUN, "--nnodes=2", "--node-rank=%d" % node, "--master-addr=127.0.0.1",
                    "--master-port=%d" % self.port, "--nproc-per-node=%d" % n,
                    "--rdzv-conf=timeout=30", *extra, worker]
            procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        return procs

    def finish(self, procs, timeout=60):
        out = []
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            out.append((p.returncode, o, e))
        return out

    def test_heterogeneous_ranks_and_shared_worker_store(self):
        w = self.script('env > "%s/env_$RANK"\n' % self.tmp)
        res = self.finish(self.launch(w))
        for rc, _, err in res:
            self.assertEqual(rc, 0, err)
        envs = []
        for r in range(3):
            lines = read(os.path.join(self.tmp, "env_%d" % r)).splitlines()
            envs.append(dict(l.split("=", 1) for l in lines if "=" in l))
        self.assertEqual([e["LOCAL_RANK"] for e in envs], ["0", "1", "0"])
        self.assertEqual([e["GROUP_RANK"] for e in envs], ["0", "0", "1"])
        self.assertEqual({e["WORLD_SIZE"] for e in envs}, {"3"})
        self.assertEqual({e["GROUP_WORLD_SIZE"] for e in envs}, {"2"})
        self.assertEqual([e["LOCAL_WORLD_SIZE"] for e in envs], ["2", "2", "1"])
        ports = {e["MASTER_PORT"] for e in envs}
        self.assertEqual(len(ports), 1)
        self.assertNotEqual(ports.pop(), str(self.port))  # the round's worker store, not the agent store

    def test_failure_on_one_node_restarts_both(self):
        # Rank 2 fails once ranks 0 and 1 (the other node) are running.
        w = self.script('d="%s"\n'
                        'echo "$TORCHELASTIC_RESTART_COUNT" >> "$d/attempts_$RANK"\n'
                        'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 2 ]; then\n'
                        '  while [ ! -s "$d/attempts_0" ] || [ ! -s "$d/attempts_1" ]; do sleep 0.02; done\n'
                        '  exit 5\n'
                        'fi\n'
                        '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && sleep 30\n'
                        'exit 0\n' % self.tmp)
        t0 = time.time()
        res = self.finish(self.launch(w, extra=["--max-restarts=1"]))
        self.assertLess(time.time() - t0, 20)
        for rc, _, err in res:
            self.assertEqual(rc, 0, err)
        for r in range(3):
            self.assertEqual(read(os.path.join(self.tmp, "attempts_%d" % r)).split(), ["0", "1"])

    def test_restarts_exhausted_fails_both_and_names_the_node(self):
        w = self.script('[ "$RANK" = 2 ] && { echo "rank two broke" >&2; exit 9; }\nsleep 30\n')
        res = self.finish(self.launch(w, extra=["--max-restarts=1"]))
        (rc0, _, err0), (rc1, _, err1) = res
        self.assertEqual(rc1, 1, err1)
        self.assertIn("rank      : 2 (local_rank: 0)", err1.split("Root Cause")[1])
        self.assertIn("rank two broke", err1)
        self.assertEqual(rc0, 1, err0)
        self.assertIn("the job failed on node 1", err0)

    def test_signal_on_one_node_ends_the_job_everywhere(self):
        w = self.script('echo $$ > "%s/pid_$RANK"\nwhile true; do sleep 0.05; done\n' % self.tmp)
        procs = self.launch(w, nprocs=(1, 1))
        self.assertTrue(wait_for(lambda: all(os.path.exists(os.path.join(self.tmp, "pid_%d" % r))
                                             for r in range(2)), 20))
        procs[0].send_signal(signal.SIGTERM)
        (rc0, _, e0), (rc1, _, e1) = self.finish(procs, timeout=30)
        self.assertEqual(rc0, 128 + signal.SIGTERM, e0)
        self.assertEqual(rc1, 1, e1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
