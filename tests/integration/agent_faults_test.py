"""Regression tests, with real processes, for the agent faults of issue 9:
restart accounting and its message, two ranks failing at once, memory across
1,000 restarts, descendants of workers (after a worker exits and after
`kill -9` of the agent), descriptors leaked into workers, and signals while a
static rendezvous is joining.

No timing assertions: a prompt exit is shown by an exit within a process
timeout far below the join timeout (900 s); processes are awaited through
files, sockets and /proc with bounded deadlines."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from ddprun_case import PATIENCE, SANITIZED, Console, DdprunCase, read  # noqa: E402
from procs import (alive, children, descendants, kill_all, listening, read_pids,  # noqa: E402
                   signal_handled, state_of, wait_for)
from reserved_port import reserve_port  # noqa: E402


class Restarts(DdprunCase):
    def test_restart_message_counts_up_to_the_limit(self):
        w = self.script("exit 1\n")
        p = self.run_ddprun("--standalone", "--max-restarts=2", "--no-python", w)
        self.assertEqual(p.returncode, 1, p.stderr)
        said = re.findall(r"^ddprun: warning: worker group failed \(.*\); restart (\d+) of (\d+)$",
                          p.stderr, re.M)
        self.assertEqual(said, [("1", "2"), ("2", "2")], p.stderr)
        self.assertNotIn("restarts left", p.stderr)

    def test_two_ranks_failing_at_once_are_both_culprits(self):
        # "At once": the agent is stopped (SIGSTOP) while both ranks exit by
        # themselves, with 1 and 2, and continued once both are zombies. It
        # finds two exits; neither rank was running when it began to stop the
        # group, so neither may be called a victim.
        w = self.script('echo ready > "%s/ready_$LOCAL_RANK"\n'
                        'n=0; until [ -e "%s/go" ]; do sleep 0.01; n=$((n+1)); [ $n -lt 9000 ] || exit 90; done\n'
                        'exit $((LOCAL_RANK + 1))\n' % (self.tmp, self.tmp))
        p = self.popen("--standalone", "--nproc-per-node=2", "--no-python", w,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for r in range(2):
            self.wait_file(self.path("ready_%d" % r))
        os.kill(p.pid, signal.SIGSTOP)
        self.addCleanup(lambda: p.returncode is None and os.kill(p.pid, signal.SIGCONT))
        self.touch("go")

        def both_exited():  # every child of the agent (worker or its helper) a zombie
            kids = children(p.pid)
            return len(kids) >= 2 and all(state_of(k) in ("Z", None) for k in kids)
        self.assertTrue(wait_for(both_exited), "children of the agent: %r"
                        % [(k, state_of(k)) for k in children(p.pid)])
        os.kill(p.pid, signal.SIGCONT)
        self.assertEqual(self.wait_exit(p), 1)
        err = p.stderr.read()
        report = err[err.index("FAILED"):]
        for r in range(2):
            self.assertIn("rank      : %d (local_rank: %d)" % (r, r), report)
        codes = re.findall(r"exitcode  : (\S+)", report)
        self.assertEqual(sorted(codes), ["1", "2"], report)
        self.assertNotIn("stopped by", report)
        self.assertNotIn("SIGTERM", report)

    @unittest.skipIf(SANITIZED, "ASan's quarantine and shadow memory, not the agent's")
    def test_a_thousand_restarts_keep_memory_flat(self):
        # The worker samples the agent's resident memory at restart 100 and
        # at restart 999, while the agent waits for it.
        w = self.script('d="%s"\n'
                        'echo x >> "$d/attempts"\n'
                        'case "$TORCHELASTIC_RESTART_COUNT" in 100|999)\n'
                        '  n=0; until [ -s "$d/agent_pid" ]; do sleep 0.01; n=$((n+1)); [ $n -lt 9000 ] || exit 90; done\n'
                        '  grep VmRSS "/proc/$(cat "$d/agent_pid")/status" > "$d/rss_$TORCHELASTIC_RESTART_COUNT";;\n'
                        'esac\n'
                        'exit 1\n' % self.tmp)
        err = self.path("stderr")
        with open(err, "w") as f:
            p = self.popen("--standalone", "--max-restarts=1000", "--no-python", w,
                           stdout=subprocess.DEVNULL, stderr=f)
        with open(self.path(".agent_pid"), "w") as f:
            f.write(str(p.pid))
        os.rename(self.path(".agent_pid"), self.path("agent_pid"))
        self.assertEqual(self.wait_exit(p, timeout=120), 1, read(err)[-2000:])
        self.assertEqual(len(read(self.path("attempts")).split()), 1001)
        rss = [int(read(self.path("rss_%d" % n)).split()[1]) for n in (100, 999)]
        self.assertLess(rss[1] - rss[0], 4096,
                        "agent VmRSS %d KiB at restart 100, %d KiB at restart 999" % tuple(rss))


class Descendants(DdprunCase):
    def assert_all_gone(self, pids):
        self.assertTrue(wait_for(lambda: not any(alive(x) for x in pids)),
                        "still running: %r of %r" % ([x for x in pids if alive(x)], pids))

    def test_descendants_of_an_exited_worker_are_killed(self):
        # A daemon in its own session, and a child that ignores SIGTERM and
        # keeps the worker's stdout and stderr; the worker exits 0 at once.
        pids = self.path("pids")
        self.kill_at_end(pids)
        w = self.script('setsid sh -c \'echo $$ >> "%s"; exec sleep 1000\' >/dev/null 2>&1 &\n'
                        'sh -c \'trap "" TERM; echo $$ >> "%s"; exec sleep 1000\' &\n'
                        'n=0; until [ "$(wc -l < "%s" 2>/dev/null)" -ge 2 ] 2>/dev/null; do sleep 0.01; n=$((n+1)); [ $n -lt 9000 ] || exit 90; done\n'
                        'exit 0\n' % (pids, pids, pids))
        p = self.popen("--standalone", "--no-python", w,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.assertEqual(self.wait_exit(p), 0)
        got = read_pids(pids)
        self.assertEqual(len(got), 2)
        self.assert_all_gone(got)

    def test_kill_9_of_the_agent_leaves_no_descendant(self):
        pids = self.path("pids")
        self.kill_at_end(pids)
        w = self.script('echo $$ >> "%s"\n'
                        'sleep 1000 & echo $! >> "%s"\n'
                        'setsid sh -c \'echo $$ >> "%s"; exec sleep 1000\' >/dev/null 2>&1 &\n'
                        'sh -c \'trap "" TERM; echo $$ >> "%s"; exec sleep 1000\' &\n'
                        'wait\n' % (pids, pids, pids, pids))
        p = self.popen("--standalone", "--nproc-per-node=2", "--no-python", w,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.assertTrue(wait_for(lambda: len(read_pids(pids)) == 8), read_pids(pids))
        # Everything under the agent now (helpers of its own included).
        got = sorted(set(read_pids(pids)) | set(descendants(p.pid)))
        self.addCleanup(kill_all, got)
        self.assertTrue(all(alive(x) for x in read_pids(pids)))
        p.kill()
        self.wait_exit(p)
        self.assert_all_gone(got)


class Descriptors(DdprunCase):
    """A worker sees only 0, 1 and 2: none of the agent's sockets, pipes,
    pseudo-terminals, log files or events.jsonl."""

    FDS = ("import json, os, sys\n"
           "fds = {}\n"
           "for name in os.listdir('/proc/self/fd'):\n"
           "    try:\n"
           "        fds[name] = os.readlink('/proc/self/fd/' + name)\n"
           "    except OSError:  # the listing's own descriptor, closed by now\n"
           "        pass\n"
           "open('%s/fds_' + os.environ['RANK'], 'w').write(json.dumps(fds))\n")

    def check(self, ranks, what):
        for r in range(ranks):
            fds = json.loads(read(self.path("fds_%d" % r)))
            self.assertEqual(sorted(fds, key=int), ["0", "1", "2"], "%s, rank %d: %r" % (what, r, fds))

    def test_one_node_default_and_tee(self):
        w = self.pyscript(self.FDS % self.tmp)
        for args in ((), ("--tee=3", "--log-dir", self.path("logs"))):
            p = self.run_ddprun("--standalone", "--nproc-per-node=2", *args, w)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.check(2, args or "default")

    def test_on_a_terminal(self):
        w = self.pyscript(self.FDS % self.tmp)
        con = Console()
        p = con.start(self, "--standalone", "--nproc-per-node=2", w)
        self.assertEqual(self.wait_exit(p), 0, con.data())
        self.check(2, "pty")

    def test_two_nodes_static(self):
        w = self.pyscript(self.FDS % self.tmp)
        procs = self.popen_static(reserve_port(self), (1, 1), w)
        for rc, _, err in self.finish(procs):
            self.assertEqual(rc, 0, err)
        self.check(2, "static")


class SignalDuringJoin(DdprunCase):
    """A static rendezvous that cannot complete (the other node is absent or
    silent) is joining with the default timeout of 900 s; a signal ends the
    agent with 128 + the signal long before that."""

    def start(self, node, port):
        return self.popen("--nnodes=2", "--node-rank=%d" % node, "--master-addr=127.0.0.1",
                          "--master-port=%d" % port, "--no-python",
                          self.script('echo ran > "%s/ran"\n' % self.tmp),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def assert_ends(self, p, sig):
        p.send_signal(sig)
        try:
            rc = p.wait(PATIENCE)
        except subprocess.TimeoutExpired:
            self.fail("still joining %.0f s after %s" % (PATIENCE, signal.Signals(sig).name))
        self.assertEqual(rc, 128 + sig, p.stderr.read())
        self.assertFalse(os.path.exists(self.path("ran")))

    def test_node_0_waiting_for_an_absent_node_1_takes_sigint(self):
        port = reserve_port(self)
        p = self.start(0, port)
        self.assertTrue(wait_for(lambda: listening(port) or p.poll() is not None),
                        "node 0 never listened on %d" % port)
        self.assertIsNone(p.poll(), p.stderr.read() if p.poll() is not None else "")
        self.assert_ends(p, signal.SIGINT)

    def test_node_1_facing_a_silent_node_0_takes_sigterm(self):
        # "Node 0" accepts the connection and never answers.
        srv = socket.socket()
        self.addCleanup(srv.close)
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(PATIENCE)
        p = self.start(1, srv.getsockname()[1])
        conn, _ = srv.accept()
        self.addCleanup(conn.close)
        self.assert_ends(p, signal.SIGTERM)

    def test_node_1_facing_an_absent_node_0_takes_sigterm(self):
        # Nothing listens on the port (bound, never listening): every connect
        # is refused and node 1 keeps trying. Signal it once it handles SIGTERM.
        port = reserve_port(self)
        p = self.start(1, port)
        self.assertTrue(wait_for(lambda: signal_handled(p.pid, signal.SIGTERM) or p.poll() is not None))
        self.assertIsNone(p.poll(), p.stderr.read() if p.poll() is not None else "")
        self.assert_ends(p, signal.SIGTERM)


class ExitCodes(DdprunCase):
    """ddprun's exit codes by default, torchrun's (0, 2 usage, 1 for any other
    failure) under DDPRUN_EXIT_CODES=torchrun; a bad value is a usage error."""

    STYLES = {"ddprun": None, "torchrun": {"DDPRUN_EXIT_CODES": "torchrun"}}

    def for_each_style(self, expected, run):
        for style, env in self.STYLES.items():
            with self.subTest(style=style):
                rc, err = run(env)
                self.assertEqual(rc, expected[style], err)
        rc, err = run({"DDPRUN_EXIT_CODES": "ddprun"})  # explicit, the same as unset
        self.assertEqual(rc, expected["ddprun"], err)

    def test_a_failed_worker_is_1_in_both(self):
        w = self.script("exit 7\n")

        def run(env):
            p = self.run_ddprun("--nproc-per-node=2", "--no-python", w, env=env)
            return p.returncode, p.stderr
        self.for_each_style({"ddprun": 1, "torchrun": 1}, run)

    def test_ctrl_c_while_the_workers_run(self):
        # Each worker records that it runs, then waits; SIGINT to the agent.
        w = self.script('echo $$ > "%s/ready_$RANK"\nexec sleep 600\n' % self.tmp)

        def run(env):
            for r in range(2):
                if os.path.exists(self.path("ready_%d" % r)):
                    os.remove(self.path("ready_%d" % r))
            p = self.popen("--nproc-per-node=2", "--no-python", w, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            self.assertTrue(wait_for(lambda: all(os.path.exists(self.path("ready_%d" % r))
                                                 for r in range(2)) or p.poll() is not None))
            self.assertIsNone(p.poll())
            p.send_signal(signal.SIGINT)
            return self.wait_exit(p), p.stderr.read()
        self.for_each_style({"ddprun": 128 + signal.SIGINT, "torchrun": 1}, run)

    def test_a_rendezvous_timeout(self):
        # Node 0 of 2 waits for a node 1 that never comes, for the 1 s timeout.
        port = reserve_port(self)

        def run(env):
            p = self.run_ddprun("--nnodes=2", "--node-rank=0", "--master-addr=127.0.0.1",
                                "--master-port=%d" % port, "--rdzv-conf=timeout=1",
                                "--no-python", self.script("exit 0\n"), env=env)
            return p.returncode, p.stderr
        self.for_each_style({"ddprun": 3, "torchrun": 1}, run)

    def test_usage_errors_are_2_in_both(self):
        def run(env):
            p = self.run_ddprun("--nproc-per-node=0", "x.py", env=env)
            return p.returncode, p.stderr
        self.for_each_style({"ddprun": 2, "torchrun": 2}, run)

    def test_an_unknown_style_is_a_usage_error(self):
        p = self.run_ddprun("--no-python", self.script("exit 0\n"),
                            env={"DDPRUN_EXIT_CODES": "bash"})
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
        self.assertIn("ddprun: error: DDPRUN_EXIT_CODES='bash' is not valid", p.stderr)
        self.assertIn("ddprun", p.stderr.split("expected")[1])
        self.assertIn("torchrun", p.stderr.split("expected")[1])


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
