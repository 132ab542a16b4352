"""End-to-end tests of the ddprun launcher with real worker processes.

Workers are small shell scripts run with --no-python (no PyTorch needed), or
Python scripts. Each test asserts on exit codes, files the workers write, the
console and the failure report; never on durations. A worker that must be
stopped by the agent sleeps far longer than the test's process timeout, so a
missed stop fails the test by that timeout. Ports are held by the test for its
whole life (tests/pyutil/reserved_port.py), never bound, closed and reused."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from ddprun_case import DDPRUN, PATIENCE, DdprunCase, read  # noqa: E402
from procs import alive, read_pids, wait_for  # noqa: E402
from reserved_port import reserve_port  # noqa: E402


class AgentE2E(DdprunCase):
    def launch(self, *args, **kw):
        return self.run_ddprun("--no-python", *args, **kw)

    def test_env_contract_per_rank(self):
        w = self.script('env > "%s/env_$LOCAL_RANK"\n' % self.tmp)
        port = reserve_port(self)  # --master-port: the fixed-port static behaviour
        p = self.launch("--nproc-per-node=3", "--max-restarts=2", "--role=trainer",
                        "--master-port=%d" % port, w)
        self.assertEqual(p.returncode, 0, p.stderr)
        ports = set()
        for r in range(3):
            lines = read(self.path("env_%d" % r)).splitlines()
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
        p = self.launch("--standalone", "--nproc-per-node=2", w)
        self.assertEqual(p.returncode, 0, p.stderr)
        ports = {read(self.path("port_%d" % r)).strip() for r in range(2)}
        self.assertEqual(len(ports), 1)
        self.assertNotEqual(ports.pop(), "29500")

    def test_failure_on_first_attempt_then_success_after_restart(self):
        # Rank 1 fails once rank 0 runs; rank 0 would sleep past the process
        # timeout unless the agent stops it.
        w = self.script('d="%s"\n'
                        'echo "$TORCHELASTIC_RESTART_COUNT" >> "$d/attempts_$LOCAL_RANK"\n'
                        '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] || exit 0\n'
                        'if [ "$LOCAL_RANK" = 1 ]; then\n'
                        '  until [ -s "$d/attempts_0" ]; do sleep 0.01; done\n'
                        '  exit 3\n'
                        'fi\n'
                        'exec sleep 1000\n' % self.tmp)
        p = self.launch("--standalone", "--nproc-per-node=2", "--max-restarts=1", w)
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in range(2):
            self.assertEqual(read(self.path("attempts_%d" % r)).split(), ["0", "1"])

    def test_restarts_exhausted_names_the_culprit(self):
        w = self.script('if [ "$LOCAL_RANK" = 1 ]; then echo "boom: disk on fire" >&2; exit 7; fi\n'
                        'exec sleep 1000\n')
        p = self.launch("--standalone", "--nproc-per-node=3", "--max-restarts=1", w)
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
        self.assertIn("restart 1 of 1", err)

    def test_error_file_traceback_is_reported(self):
        w = self.script('[ "$LOCAL_RANK" = 0 ] || exit 0\n'
                        'cat > "$TORCHELASTIC_ERROR_FILE" <<EOF\n'
                        '{"message": {"message": "ValueError: bad lr", "extraInfo": '
                        '{"py_callstack": "Traceback (most recent call last):\\\\n  ValueError: bad lr", '
                        '"timestamp": "1700000000"}}}\n'
                        'EOF\n'
                        'exit 1\n')
        p = self.launch("--standalone", "--nproc-per-node=2", w)
        self.assertEqual(p.returncode, 1)
        root = p.stderr.split("Root Cause (first observed failure):")[1]
        self.assertIn("Traceback (most recent call last):", root)
        self.assertIn("error.json", root)

    def test_agent_error_file_duplicate_filters_and_exit_events(self):
        logdir = self.path("logs")
        own = self.path("agent_error.json")
        # Rank 1 fails only once the agent has recorded rank 0's exit: else
        # the group's stop may end rank 0 before it has printed a line.
        w = self.script('echo "loss=1.5 step=$LOCAL_RANK"\necho "noise"\n'
                        '[ "$LOCAL_RANK" = 1 ] || exit 0\n'
                        'until grep -qs \'"exit_code":0\' "%s"/*/events.jsonl; do\n'
                        '  sleep 0.01\n'
                        'done\n' % logdir +
                        'echo \'{"message": {"message": "RuntimeError: r1", "extraInfo": '
                        '{"py_callstack": "tb", "timestamp": "1"}}}\' > "$TORCHELASTIC_ERROR_FILE"\n'
                        'exit 4\n')
        p = self.launch("--standalone", "--nproc-per-node=2", "--log-dir", logdir,
                        "--duplicate-stdout-filters=loss=", w,
                        env={"TORCHELASTIC_ERROR_FILE": own})
        self.assertEqual(p.returncode, 1, p.stderr)
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
        self.assertEqual(sorted(e["exit_code"] for e in exits), [0, 4])

    def test_sigterm_is_forwarded_and_exit_is_128_plus_signal(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            mark = self.path("got_%d" % sig)
            # `wait` returns when a trapped signal arrives; the trap ends the
            # sleep it started so that nothing outlives the worker.
            w = self.script("trap 'echo $LOCAL_RANK >> %s; kill $pid 2>/dev/null; exit 0' TERM INT\n"
                            'sleep 1000 & pid=$!\n'
                            'echo $pid >> "%s/pids"\n'
                            'echo ready > "%s/ready_${LOCAL_RANK}_%d"\n'
                            'wait $pid\n' % (mark, self.tmp, self.tmp, sig))
            self.kill_at_end(self.path("pids"))
            p = self.popen("--no-python", "--standalone", "--nproc-per-node=2", w,
                           stderr=subprocess.PIPE, text=True)
            for r in range(2):
                self.wait_file(self.path("ready_%d_%d" % (r, sig)))
            p.send_signal(sig)
            rc = self.wait_exit(p)
            self.assertEqual(rc, 128 + sig, p.stderr.read())
            self.assertEqual(sorted(read(mark).split()), ["0", "1"])

    def test_worker_ignoring_sigterm_is_killed_after_grace(self):
        # The workers note each SIGTERM and carry on; only SIGKILL ends them.
        w = self.script('trap \'echo term >> "%s/term_$LOCAL_RANK"\' TERM\n'
                        'echo $$ > "%s/pid_$LOCAL_RANK"\n'
                        'while :; do sleep 1000 & wait $!; done\n' % (self.tmp, self.tmp))
        pidfiles = [self.path("pid_%d" % r) for r in range(2)]
        for f in pidfiles:
            self.kill_at_end(f)
        p = self.popen("--no-python", "--standalone", "--nproc-per-node=2",
                       "--shutdown-timeout=1", w, stderr=subprocess.PIPE, text=True)
        for f in pidfiles:
            self.wait_file(f)
        pids = [read_pids(f)[0] for f in pidfiles]
        p.send_signal(signal.SIGTERM)
        rc = self.wait_exit(p)
        err = p.stderr.read()
        self.assertEqual(rc, 128 + signal.SIGTERM, err)
        self.assertTrue(wait_for(lambda: not any(alive(x) for x in pids)),
                        "workers left: %r" % [x for x in pids if alive(x)])
        for r in range(2):  # SIGTERM first; they survived it, then SIGKILL
            self.assertIn("term", read(self.path("term_%d" % r)).split())
        self.assertIn("SIGKILL", err)

    def test_kill_9_of_agent_leaves_no_workers(self):
        w = self.script('echo $$ > "%s/pid_$LOCAL_RANK"\nexec sleep 1000\n' % self.tmp)
        pidfiles = [self.path("pid_%d" % r) for r in range(3)]
        for f in pidfiles:
            self.kill_at_end(f)
        p = self.popen("--no-python", "--standalone", "--nproc-per-node=3", w,
                       stderr=subprocess.DEVNULL)
        for f in pidfiles:
            self.wait_file(f)
        pids = [read_pids(f)[0] for f in pidfiles]
        self.assertTrue(all(alive(x) for x in pids))
        p.send_signal(signal.SIGKILL)
        self.wait_exit(p)
        self.assertTrue(wait_for(lambda: not any(alive(x) for x in pids)),
                        "orphaned workers: %r" % [x for x in pids if alive(x)])

    def test_tee_prefixes_console_and_writes_log_files(self):
        logdir = self.path("logs")
        w = self.script('echo "hello from $LOCAL_RANK"\necho "err line $LOCAL_RANK" >&2\n'
                        'echo "$TORCHELASTIC_RUN_ID" > "%s/run_id"\n' % self.tmp)
        p = self.launch("--standalone", "--nproc-per-node=2", "--tee=3", "--log-dir", logdir, w)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("[default0]:hello from 0", p.stdout)
        self.assertIn("[default1]:hello from 1", p.stdout)
        self.assertIn("[default1]:err line 1", p.stderr)
        runs = os.listdir(logdir)
        self.assertEqual(len(runs), 1)
        self.assertTrue(runs[0].startswith(read(self.path("run_id")).strip() + "_"), runs)
        base = os.path.join(logdir, runs[0])
        self.assertEqual(read(os.path.join(base, "attempt_0/1/stdout.log")), "hello from 1\n")
        self.assertEqual(read(os.path.join(base, "attempt_0/0/stderr.log")), "err line 0\n")
        events = read(os.path.join(base, "events.jsonl"))
        self.assertIn('"event":"start"', events)
        self.assertIn('"event":"succeeded"', events)

    def test_redirect_hides_and_filter_selects_ranks(self):
        logdir = self.path("logs")
        w = self.script('echo "out $LOCAL_RANK"\n')
        p = self.launch("--standalone", "--nproc-per-node=3", "-r", "0:1", "--tee", "1:1,2:1",
                        "--local-ranks-filter=2", "--log-dir", logdir, w)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("out 0", p.stdout)  # redirected: file only
        self.assertNotIn("out 1", p.stdout)  # teed but filtered out of the console
        self.assertIn("[default2]:out 2", p.stdout)
        base = os.path.join(logdir, os.listdir(logdir)[0], "attempt_0")
        for r in range(3):
            self.assertEqual(read(os.path.join(base, str(r), "stdout.log")), "out %d\n" % r)

    def test_python_script_and_local_rank_macro(self):
        script = self.path("train.py")
        with open(script, "w") as f:
            f.write("import os, sys\nopen(sys.argv[1], 'w').write(os.environ['RANK'])\n")
        p = self.run_ddprun("--standalone", "--nproc_per_node=2", script,
                            self.path("out_${local_rank}"))
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in range(2):
            self.assertEqual(read(self.path("out_%d" % r)), str(r))

    def test_bad_invocations_exit_two_or_three(self):
        cases = [(["--nproc-per-node=0", "x"], 2), (["--bogus", "x"], 2), ([], 2),
                 (["--nnodes=1:2", "--node-rank=2", "x"], 2), (["--nnodes=2", "--node-rank=2", "x"], 2),
                 (["--nnodes=2", "--standalone", "x"], 2),
                 (["--rdzv-backend=c10d", "--nnodes=2", "x"], 2),
                 (["--log-dir=/proc/forbidden", "--standalone", "x"], 3)]
        for args, code in cases:
            p = self.run_ddprun(*args)
            self.assertEqual(p.returncode, code, (args, p.stderr))
            self.assertIn("ddprun: error:", p.stderr, args)

    def test_missing_program_reports_and_fails(self):
        p = self.launch("--standalone", "/nonexistent/program")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("/nonexistent/program", p.stderr)

    def test_port_in_use_is_named(self):
        # A listening socket holds the port while ddprun tries it.
        s = socket.socket(socket.AF_INET6)
        self.addCleanup(s.close)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", 0))
        s.listen()
        port = s.getsockname()[1]
        p = self.launch("--master-port", str(port), self.script("exit 0\n"))
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(str(port), p.stderr)
        self.assertIn("in use", p.stderr)


class ProgramResolution(DdprunCase):
    """`ddprun --nproc_per_node=2 NAME` where NAME is no file in the current
    directory: the program of that name beside the ddprun binary (bundled, like
    `train`), else on PATH, run directly without python. The test runs its own
    ddprun (a link or copy) from a temporary bin/, so that bin/ is the bundled
    directory, and sets PYTHON_EXEC=/bin/false so that any python run fails."""

    def setUp(self):
        super().setUp()
        self.dirs = {}
        for d in ("cwd", "bin", "path"):
            self.dirs[d] = self.path(d)
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
        env = self.env({"PYTHON_EXEC": python,
                        "PATH": self.dirs["path"] + ":" + os.environ.get("PATH", "/usr/bin:/bin")})
        return subprocess.run([self.ddprun, "--nproc_per_node=2", "--log-dir", self.path("logs"),
                               *args], cwd=self.dirs["cwd"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=60, env=env)

    def ran(self):
        return [read(self.path("ran_%d" % r)).strip() for r in range(2)]

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

    def test_file_in_current_directory_runs_under_python_unless_no_python(self):
        self.put("bin", "hello", "bundled")
        pycode = ("import os\nopen(%r + '/ran_' + os.environ['RANK'], 'w').write('python')\n"
                  % self.tmp)
        hello = os.path.join(self.dirs["cwd"], "hello")
        for mode in (0o644, 0o755):  # a text script runs under python, as torchrun runs it
            with open(hello, "w") as f:
                f.write(pycode)
            os.chmod(hello, mode)
            p = self.launch("hello", python=sys.executable)
            self.assertEqual(p.returncode, 0, (oct(mode), p.stderr))
            self.assertEqual(self.ran(), ["python"] * 2, oct(mode))
        os.remove(hello)
        self.put("cwd", "hello", "cwd")  # --no-python: ./hello, not from PATH or bin/
        p = self.launch("--no-python", "hello")
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


class StaticTwoNodes(DdprunCase):
    """Two agents on this machine, --nnodes 2 --node-rank 0/1 (static rendezvous)."""

    def setUp(self):
        super().setUp()
        self.port = reserve_port(self)  # node 0's agent hosts the rendezvous store there

    def launch(self, worker, nprocs=(2, 1), extra=()):
        return self.popen_static(self.port, nprocs, "--no-python", *extra, worker)

    def test_heterogeneous_ranks_and_shared_worker_store(self):
        w = self.script('env > "%s/env_$RANK"\n' % self.tmp)
        res = self.finish(self.launch(w))
        for rc, _, err in res:
            self.assertEqual(rc, 0, err)
        envs = []
        for r in range(3):
            lines = read(self.path("env_%d" % r)).splitlines()
            envs.append(dict(l.split("=", 1) for l in lines if "=" in l))
        self.assertEqual([e["LOCAL_RANK"] for e in envs], ["0", "1", "0"])
        self.assertEqual([e["GROUP_RANK"] for e in envs], ["0", "0", "1"])
        self.assertEqual({e["WORLD_SIZE"] for e in envs}, {"3"})
        self.assertEqual({e["GROUP_WORLD_SIZE"] for e in envs}, {"2"})
        self.assertEqual([e["LOCAL_WORLD_SIZE"] for e in envs], ["2", "2", "1"])
        ports = {e["MASTER_PORT"] for e in envs}
        self.assertEqual(len(ports), 1)
        # As under torchrun: the workers share the agent store on --master-port.
        self.assertEqual(ports.pop(), str(self.port))

    def test_failure_on_one_node_restarts_both(self):
        # Rank 2 fails once ranks 0 and 1 (the other node) are running; they
        # would sleep past the process timeout unless stopped.
        w = self.script('d="%s"\n'
                        'echo "$TORCHELASTIC_RESTART_COUNT" >> "$d/attempts_$RANK"\n'
                        '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] || exit 0\n'
                        'if [ "$RANK" = 2 ]; then\n'
                        '  while [ ! -s "$d/attempts_0" ] || [ ! -s "$d/attempts_1" ]; do sleep 0.01; done\n'
                        '  exit 5\n'
                        'fi\n'
                        'exec sleep 1000\n' % self.tmp)
        res = self.finish(self.launch(w, extra=["--max-restarts=1"]))
        for rc, _, err in res:
            self.assertEqual(rc, 0, err)
        for r in range(3):
            self.assertEqual(read(self.path("attempts_%d" % r)).split(), ["0", "1"])

    def test_restarts_exhausted_fails_both_and_names_the_node(self):
        w = self.script('[ "$RANK" = 2 ] && { echo "rank two broke" >&2; exit 9; }\nexec sleep 1000\n')
        res = self.finish(self.launch(w, extra=["--max-restarts=1"]))
        (rc0, _, err0), (rc1, _, err1) = res
        self.assertEqual(rc1, 1, err1)
        self.assertIn("rank      : 2 (local_rank: 0)", err1.split("Root Cause")[1])
        self.assertIn("rank two broke", err1)
        self.assertEqual(rc0, 1, err0)
        self.assertIn("the job failed on node 1", err0)

    def test_signal_on_one_node_ends_the_job_everywhere(self):
        w = self.script('echo $$ > "%s/pid_$RANK"\nexec sleep 1000\n' % self.tmp)
        for r in range(2):
            self.kill_at_end(self.path("pid_%d" % r))
        procs = self.launch(w, nprocs=(1, 1))
        for r in range(2):
            self.wait_file(self.path("pid_%d" % r))
        procs[0].send_signal(signal.SIGTERM)
        (rc0, _, e0), (rc1, _, e1) = self.finish(procs, timeout=PATIENCE)
        self.assertEqual(rc0, 128 + signal.SIGTERM, e0)
        self.assertEqual(rc1, 1, e1)


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
