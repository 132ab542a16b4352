"""ddprun as a drop-in for torchrun 2.x, end to end with real processes: the
one-node default (a free port and a uuid run id, so two jobs run side by side),
the log line prefix template on a two-node static run, argv[0] as given, text
scripts under Python, the flag cases torchrun accepts or rejects, and the
agent's own messages (one style, no source locations, a start line)."""
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from ddprun_case import DDPRUN, SANITIZED, DdprunCase, read  # noqa: E402
from procs import wait_for  # noqa: E402
from reserved_port import reserve_port  # noqa: E402

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"

# A worker that records its arguments and RANK in <dir>/argv_<RANK>.
RECORD_ARGV = ("import json, os, sys\n"
               "open(%r + '/argv_' + os.environ['RANK'], 'w').write(json.dumps(sys.argv[1:]))\n")


class OneNodeDefault(DdprunCase):
    def test_two_jobs_side_by_side_both_succeed(self):
        # Each job's workers check that the worker store answers, record what
        # they see, and wait until the other job's workers run too.
        w = self.pyscript(
            "import json, os, socket, sys, time\n"
            "d, me, other = sys.argv[1:4]\n"
            "keys = ('MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RUN_ID')\n"
            "env = {k: os.environ[k] for k in keys}\n"
            "socket.create_connection((env['MASTER_ADDR'], int(env['MASTER_PORT'])), 10).close()\n"
            "open('%s/%s_%s' % (d, me, os.environ['RANK']), 'w').write(json.dumps(env))\n"
            "end = time.monotonic() + 60\n"
            "while not all(os.path.exists('%s/%s_%d' % (d, other, r)) for r in range(2)):\n"
            "    if time.monotonic() > end:\n"
            "        sys.exit(90)\n"
            "    time.sleep(0.01)\n")
        jobs = [self.popen("--nproc-per-node=2", w, self.tmp, me, other,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for me, other in (("a", "b"), ("b", "a"))]
        # Ends when both are done, or as soon as one fails.
        wait_for(lambda: any(p.poll() not in (None, 0) for p in jobs)
                 or all(p.poll() is not None for p in jobs), timeout=90)
        for me, p in zip("ab", jobs):
            if p.poll() not in (None, 0):
                self.fail("job %s exited with %d: %s" % (me, p.returncode, p.stderr.read()))
        for rc, _, err in self.finish(jobs, timeout=5):
            self.assertEqual(rc, 0, err)
        seen = {me: [json.loads(read(self.path("%s_%d" % (me, r)))) for r in range(2)]
                for me in "ab"}
        for me in "ab":
            self.assertEqual({e["MASTER_ADDR"] for e in seen[me]}, {"localhost"})
            self.assertEqual(len({e["MASTER_PORT"] for e in seen[me]}), 1)
            self.assertEqual(len({e["TORCHELASTIC_RUN_ID"] for e in seen[me]}), 1)
            self.assertRegex(seen[me][0]["TORCHELASTIC_RUN_ID"], "^%s$" % UUID)
        self.assertNotEqual(seen["a"][0]["MASTER_PORT"], seen["b"][0]["MASTER_PORT"])
        self.assertNotEqual(seen["a"][0]["TORCHELASTIC_RUN_ID"], seen["b"][0]["TORCHELASTIC_RUN_ID"])


class PrefixTemplate(DdprunCase):
    """--tee 3 on two static nodes on this host: node 0 runs ranks 0 and 1,
    node 1 runs rank 2 (its local rank 0)."""

    def run_two_nodes(self, *args, env=None):
        w = self.script('echo "out of $RANK"\necho "err of $RANK" >&2\n')
        procs = self.popen_static(reserve_port(self), (2, 1), "--tee=3", *args, "--no-python", w,
                                  env=env)
        res = self.finish(procs)
        for rc, _, err in res:
            self.assertEqual(rc, 0, err)
        return res

    def hosts(self):
        return {socket.gethostname(), socket.getfqdn()}

    def assert_prefixed(self, text, prefixes, line):
        self.assertTrue(any(p + line in text for p in prefixes), (prefixes, line, text))

    def test_environment_template_uses_the_global_rank_and_the_host_name(self):
        env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${role_name}-${rank}-${local_rank}@${hostname}]"}
        (_, out0, err0), (_, out1, err1) = self.run_two_nodes(env=env)
        for rank, local, out, err in ((0, 0, out0, err0), (1, 1, out0, err0), (2, 0, out1, err1)):
            prefixes = ["[default-%d-%d@%s]" % (rank, local, h) for h in self.hosts()]
            self.assert_prefixed(out, prefixes, "out of %d" % rank)
            self.assert_prefixed(err, prefixes, "err of %d" % rank)

    def test_flag_template(self):
        (_, out0, _), (_, out1, _) = self.run_two_nodes(
            "--log-line-prefix-template", "<${rank}|${local_rank}> ")
        self.assertIn("<1|1> out of 1", out0)
        self.assertIn("<2|0> out of 2", out1)


class WorkerProgram(DdprunCase):
    def test_program_on_path_gets_argv0_as_given(self):
        # The program is the Python interpreter under another name, so that it
        # can print the argv[0] it was started with (a script's $0 would be
        # the path the kernel used to run it, not argv[0]).
        bindir = self.path("bin")
        os.mkdir(bindir)
        os.symlink(sys.executable, os.path.join(bindir, "argv0prog"))
        code = "import os, sys; open(%r + '/argv0_' + os.environ['RANK'], 'w').write(sys.orig_argv[0])" \
            % self.tmp
        p = self.run_ddprun("--standalone", "--nproc-per-node=2", "--no-python", "argv0prog", "-c", code,
                            env={"PATH": bindir + ":" + os.environ.get("PATH", "/usr/bin:/bin")})
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in range(2):
            self.assertEqual(read(self.path("argv0_%d" % r)), "argv0prog")

    def test_text_script_without_py_runs_under_python(self):
        # A shell shebang over Python code: run through its shebang it fails,
        # under Python (as torchrun runs it) it writes its file.
        body = ("#!/bin/sh\nimport os\n"
                "open(%r + '/ran_' + os.environ['RANK'], 'w').write('python')\n" % self.tmp)
        for name, mode in (("job.sh", 0o755), ("job", 0o644)):
            with self.subTest(script=name):
                script = self.path(name)
                with open(script, "w") as f:
                    f.write(body)
                os.chmod(script, mode)
                p = self.run_ddprun("--standalone", "--nproc-per-node=2", script)
                self.assertEqual(p.returncode, 0, p.stderr)
                for r in range(2):
                    self.assertEqual(read(self.path("ran_%d" % r)), "python")
                    os.remove(self.path("ran_%d" % r))


class Flags(DdprunCase):
    def argv_of(self, rank):
        return json.loads(read(self.path("argv_%d" % rank)))

    def test_empty_flag_value_stays_empty(self):
        a = self.path("a.py")
        with open(a, "w") as f:
            f.write(RECORD_ARGV % self.tmp)
        b = self.script('echo b > "%s/b_ran"\n' % self.tmp)
        p = self.run_ddprun("--standalone", "--rdzv_id=", a, b)
        self.assertFalse(os.path.exists(self.path("b_ran")), "ran b.sh, the value's next argument")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.argv_of(0), [b])

    def test_double_dash_before_the_script(self):
        a = self.pyscript(RECORD_ARGV % self.tmp)
        p = self.run_ddprun("--standalone", "--", a, "--x", "y")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.argv_of(0), ["--x", "y"])

    def test_repeated_flag_last_wins(self):
        a = self.pyscript(RECORD_ARGV % self.tmp)
        p = self.run_ddprun("--standalone", "--nproc-per-node=1", "--nproc_per_node", "2", a)
        self.assertEqual(p.returncode, 0, p.stderr)
        for r in range(2):
            self.assertEqual(self.argv_of(r), [])

    def test_bad_rdzv_conf_timeout_exits_2_naming_the_flag(self):
        port = reserve_port(self)  # static on one node: the backend that reads `timeout`
        w = self.script("exit 0\n")
        for value in ("abc", "-5"):
            with self.subTest(timeout=value):
                p = self.run_ddprun("--master-port=%d" % port, "--rdzv-conf", "timeout=" + value,
                                    "--no-python", w)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertRegex(p.stderr, r"^ddprun: error: .*rdzv[-_]conf")
                self.assertIn("timeout", p.stderr)
                self.assertNotIn("stoi", p.stderr)

    def test_numa_binding(self):
        w = self.script("exit 0\n")
        p = self.run_ddprun("--standalone", "--numa-binding=bogus", "--no-python", w)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("numa", p.stderr)
        p = self.run_ddprun("--standalone", "--nproc-per-node=2", "--numa-binding=node", "--no-python", w)
        self.assertEqual(p.returncode, 0, p.stderr)
        warnings = [l for l in p.stderr.splitlines() if l.startswith("ddprun: warning:")]
        self.assertEqual(len(warnings), 1, p.stderr)
        self.assertIn("numa", warnings[0])

    def test_rdzv_endpoint_is_the_static_master(self):
        port = reserve_port(self)
        w = self.script('echo "$MASTER_ADDR:$MASTER_PORT" > "%s/master"\n' % self.tmp)
        p = self.run_ddprun("--rdzv-endpoint=127.0.0.1:%d" % port, "--no-python", w)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(read(self.path("master")).strip(), "127.0.0.1:%d" % port)
        for bad in ("127.0.0.1:notaport", "127.0.0.1:70000"):
            p = self.run_ddprun("--rdzv-endpoint=" + bad, "--no-python", w)
            self.assertEqual(p.returncode, 2, (bad, p.stderr))
            self.assertIn("rdzv", p.stderr)


class HostileInput(DdprunCase):
    """Inputs that once ended ddprun by an uncaught exception or an error far
    from the cause, and a risky one it now names (an exposed endpoint)."""

    def test_a_huge_slurm_node_list_exits_2_naming_it_under_an_address_space_cap(self):
        # 65,536 names of 120,000 bytes: 7.8 GB if expanded. Under a 2 GB cap
        # the expansion ended in an uncaught std::bad_alloc (SIGABRT).
        env = {k: v for k, v in self.env().items() if not k.startswith(("SLURM", "DDPRUN_SLURM"))}
        env.update(SLURM_JOB_ID="7", SLURM_STEP_ID="0",
                   SLURM_STEP_NODELIST="a" * 120000 + "[0-65535]")
        # AddressSanitizer reserves terabytes of shadow address space at
        # start, which no cap allows: there the same input runs uncapped (the
        # plain build's run is the one that shows the memory bound).
        cap = 2 << 30
        limit = None if SANITIZED else (
            lambda: resource.setrlimit(resource.RLIMIT_AS, (cap, cap)))
        p = subprocess.run(
            [DDPRUN, "--no-python", "true"], env=env, capture_output=True, text=True,
            stdin=subprocess.DEVNULL, timeout=60, preexec_fn=limit)
        self.assertEqual(p.returncode, 2, p.stderr[-2000:])
        self.assertTrue(p.stderr.startswith("ddprun: error: SLURM_STEP_NODELIST='aaa"),
                        p.stderr[:300])
        self.assertIn("a host name of 120005 bytes", p.stderr)
        self.assertEqual(p.stderr.count("\n"), 1, "one line, the value abbreviated")

    def test_a_100k_run_id_exits_2_naming_the_variable(self):
        p = self.run_ddprun("--no-python", "true", env={"PET_RDZV_ID": "r" * 100000})
        self.assertEqual(p.returncode, 2, p.stderr[-2000:])
        self.assertTrue(p.stderr.startswith("ddprun: error: PET_RDZV_ID='rrr"), p.stderr[:300])
        self.assertIn("run ids have at most 128", p.stderr)

    def assert_refused_at_parse_time(self, p, needle, ran):
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertTrue(p.stderr.startswith("ddprun: error: "), p.stderr)
        self.assertIn(needle, p.stderr)
        self.assertEqual(p.stderr.count("\n"), 1, "one line: %r" % p.stderr)
        raw = [ch for ch in p.stderr[:-1] if ord(ch) < 0x20 or ord(ch) == 0x7f]
        self.assertEqual(raw, [], "control characters printed raw: %r" % p.stderr)
        self.assertFalse(os.path.exists(ran), "a worker ran")

    def test_control_characters_in_hosts_and_paths_exit_2_shown_escaped(self):
        # Issue 40: such host names reached the resolver (exit 3, or a join
        # that never ended) and the terminal raw; such a --log-dir was made.
        ran = self.path("ran")
        w = self.script('touch "%s"\n' % ran)
        static = ("--nnodes=2", "--node-rank=1", "--master-port=1")
        cases = [
            (static + ("--master-addr=evil\nhost",), None, "--master-addr: 'evil\\x0ahost'"),
            (("--nnodes=2", "--node-rank=1", "--rdzv-endpoint=h\x1b[31m:5"), None,
             "--rdzv-endpoint: 'h\\x1b[31m:5'"),
            (("--rdzv-backend=c10d", "--nnodes=2", "--rdzv-endpoint=h\x1b]0;t\x07:29400"), None,
             "--rdzv-endpoint: 'h\\x1b]0;t\\x07:29400'"),
            (("--log-dir=" + self.path("logs\rx"),), None, "logs\\x0dx' holds a control"),
            (static, {"PET_MASTER_ADDR": "x\x1b[2Jy"},
             "PET_MASTER_ADDR='x\\x1b[2Jy' (from the environment): --master-addr"),
            (("--nnodes=2", "--node-rank=1"), {"PET_RDZV_ENDPOINT": "a\nb:5"},
             "PET_RDZV_ENDPOINT='a\\x0ab:5' (from the environment)"),
            ((), {"PET_LOG_DIR": self.path("l\x7f")}, "--log-dir"),
        ]
        for args, env, needle in cases:
            with self.subTest(args=args, env=env):
                p = self.run_ddprun(*args, "--no-python", w, env=env, timeout=30)
                self.assert_refused_at_parse_time(p, needle, ran)
        self.assertEqual(os.listdir(self.tmp), [os.path.basename(w)], "a log directory was made")

    def test_nan_infinities_and_numbers_beyond_64_bits_exit_2(self):
        # Issue 40, and keep_alive_interval's floor (1e-320 once passed).
        ran = self.path("ran")
        w = self.script('touch "%s"\n' % ran)
        cases = [
            ("--monitor-interval=nan", "--monitor-interval: invalid value 'nan': not a finite"),
            ("--max-restarts=18446744073709551616", "--max-restarts: invalid value"),
            ("--shutdown-timeout=inf", "--shutdown-timeout: invalid value 'inf'"),
            ("--rdzv-conf=join_timeout=-inf", "--rdzv-conf join_timeout='-inf'"),
            ("--rdzv-conf=read_timeout=1e400", "--rdzv-conf read_timeout='1e400': out of range"),
            ("--rdzv-conf=keep_alive_interval=1e-320", "seconds >= 0.05"),
            ("--rdzv-conf=keep_alive_max_attempt=18446744073709551616",
             "--rdzv-conf keep_alive_max_attempt="),
        ]
        for arg, needle in cases:
            with self.subTest(arg=arg):
                p = self.run_ddprun("--rdzv-backend=c10d", arg, "--no-python", w, timeout=30)
                self.assert_refused_at_parse_time(p, needle, ran)

    def test_a_status_endpoint_beyond_loopback_warns_once(self):
        warning = ("ddprun: warning: --status-addr 0.0.0.0: the status endpoint answers anyone "
                   "who can reach this address")
        p = self.run_ddprun("--status-port", "0", "--status-addr", "0.0.0.0", "--no-python",
                            "true")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stderr.count(warning), 1, p.stderr)
        p = self.run_ddprun("--status-port", "0", "--no-python", "true")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("warning", p.stderr)


class Messages(DdprunCase):
    def test_one_style_and_no_source_locations(self):
        held = socket.socket()
        self.addCleanup(held.close)
        held.bind(("127.0.0.1", 0))
        held.listen()
        silent = self.script("exit 0\n")
        cases = [
            ("--bogus-flag", silent),
            ("--nproc-per-node=0", silent),
            ("--rdzv-conf=timeout=abc", "--master-port=%d" % reserve_port(self), "--no-python", silent),
            ("--standalone", "--no-python", "/nonexistent/program"),
            ("--standalone", "--no-python", "no_such_program_anywhere"),
            ("--master-port=%d" % held.getsockname()[1], "--no-python", silent),
            ("--standalone", "--nproc-per-node=2", "--no-python", silent),
        ]
        for args in cases:
            with self.subTest(args=args):
                p = self.run_ddprun(*args)
                self.assertTrue(p.stderr.strip(), args)
                self.assert_agent_messages_clean(p.stderr)
                for line in p.stderr.splitlines():
                    self.assertTrue(line.startswith("ddprun: "), "not the console style: %r" % line)
        p = self.run_ddprun("--standalone", "--no-python", "no_such_program_anywhere")
        self.assertNotIn("PYTHON_EXEC", p.stderr)

    def test_start_line_by_default(self):
        logdir = self.path("logs")
        p = self.run_ddprun("--standalone", "--nproc-per-node=2", "--log-dir", logdir,
                            "--no-python", self.script("exit 0\n"))
        self.assertEqual(p.returncode, 0, p.stderr)
        start = [l for l in p.stderr.splitlines() if "started" in l]
        self.assertEqual(len(start), 1, p.stderr)
        self.assertTrue(start[0].startswith("ddprun: "), start[0])
        self.assertIn("worker store at", start[0])
        self.assertIn("logs in " + logdir, start[0])


class Interpreter(DdprunCase):
    """A ddprun installed in a Python environment runs Python workers with
    that environment's interpreter, as torchrun does; PYTHON_EXEC still wins;
    the start line and the failure report name the interpreter."""

    def setUp(self):
        super().setUp()
        # <env>: a venv (pyvenv.cfg) holding a copy of ddprun and a python3
        # that records how it was started, then runs the real interpreter.
        self.venv = self.path("venv")
        bindir = os.path.join(self.venv, "bin")
        os.makedirs(bindir)
        open(os.path.join(self.venv, "pyvenv.cfg"), "w").write("home = /usr/bin\n")
        self.ddprun = os.path.join(bindir, "ddprun")
        try:
            os.link(DDPRUN, self.ddprun)
        except OSError:  # another file system
            shutil.copy2(DDPRUN, self.ddprun)
        self.python = os.path.join(bindir, "python3")
        self.used = self.path("used")
        self.executable(self.python, 'echo "$0" >> %s\nexec %s "$@"\n' % (self.used, sys.executable))
        # First on PATH: a python3 that cannot run anything (the pyenv shim
        # without torch of the issue).
        fakebin = self.path("fakebin")
        os.mkdir(fakebin)
        self.executable(os.path.join(fakebin, "python3"),
                        "echo 'the python3 on PATH ran' >&2\nexit 1\n")
        self.clean = self.env({"PATH": fakebin + ":/usr/bin:/bin"})
        del self.clean["PYTHON_EXEC"]

    def executable(self, path, body):
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(path, 0o755)

    def launch(self, ddprun, *args, env=None):
        return subprocess.run([ddprun, "--nproc-per-node=2", *args], env=env or self.clean,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=60)

    def start_line(self, stderr):
        start = [l for l in stderr.splitlines() if l.startswith("ddprun: started")]
        self.assertEqual(len(start), 1, stderr)
        return start[0]

    def used_by_workers(self):
        return read(self.used).splitlines() if os.path.exists(self.used) else []

    def test_the_environments_python_runs_the_workers(self):
        # One write per line: two workers share ddprun's stdout, where print's
        # separate writes of its pieces may interleave.
        ok = self.pyscript("import os\n"
                           "os.write(1, b'hello from %s\\n' % os.environ['RANK'].encode())\n")
        p = self.launch(self.ddprun, ok)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.used_by_workers(), [self.python] * 2)
        self.assertEqual(sorted(l for l in p.stdout.splitlines() if "hello" in l),
                         ["hello from 0", "hello from 1"])
        self.assertIn("; python %s (the environment ddprun is installed in)" % self.python,
                      self.start_line(p.stderr))

    def test_the_failure_report_names_the_interpreter(self):
        bad = self.pyscript("import sys\nsys.exit(3)\n")
        logdir = self.path("logs")
        p = self.launch(self.ddprun, "--log-dir", logdir, bad)
        self.assertEqual(p.returncode, 1, p.stderr)
        line = "interpreter: %s (the environment ddprun is installed in)" % self.python
        self.assertIn("\n" + line + "\n", p.stderr)
        [run] = os.listdir(logdir)
        self.assertIn(line, read(os.path.join(logdir, run, "failure_report.txt")))
        events = [json.loads(l) for l in read(os.path.join(logdir, run, "events.jsonl")).splitlines()]
        [failed] = [e for e in events if e["event"] == "failed"]
        self.assertEqual(failed["interpreter"], line[len("interpreter: "):])

    def test_python_exec_wins(self):
        ok = self.pyscript("pass\n")
        p = self.launch(self.ddprun, ok, env=dict(self.clean, PYTHON_EXEC=sys.executable))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.used_by_workers(), [])
        self.assertIn("; python %s (PYTHON_EXEC)" % sys.executable, self.start_line(p.stderr))

    def test_outside_an_environment_python3_on_path_and_the_report_says_which(self):
        # The build tree's ddprun is in no environment: python3 from PATH, the
        # broken one here, and the report names it.
        ok = self.pyscript("pass\n")
        p = self.launch(DDPRUN, ok)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertEqual(self.used_by_workers(), [])
        fake = self.path("fakebin/python3")
        self.assertIn("; python %s (python3 on PATH)" % fake, self.start_line(p.stderr))
        self.assertIn("\ninterpreter: %s (python3 on PATH)\n" % fake, p.stderr)
        self.assertIn("the python3 on PATH ran", p.stderr)

    def test_a_direct_program_names_no_interpreter(self):
        p = self.launch(self.ddprun, "--no-python", self.script("exit 0\n"))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("python", self.start_line(p.stderr))


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
