"""The workers' console under ddprun, end to end with real processes: a
terminal seen by the workers when the agent has one (the agent runs under a
pseudo-terminal here), `\\r` progress updates relayed live, stdout and stderr
kept in the order written, every byte copied at exit (300,000 lines; a 100 MB
line without a newline) and a console closed by its reader (`| head -2`) that
does not end the job.

Liveness is shown by a worker that waits for a file the test creates only
after it has seen the worker's update: no timing assertion, no sleep."""
import os
import re
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from ddprun_case import SANITIZED, Console, DdprunCase, read, read_bytes  # noqa: E402
from procs import status_kib, wait_for  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "bench"))
import glued_lines  # noqa: E402

# Python for workers: wait(name) waits for a file the test creates (bounded:
# a worker left alone gives up with exit 90 rather than hang).
WAIT = ("import os, sys, time\n"
        "def wait(path, limit=120):\n"
        "    end = time.monotonic() + limit\n"
        "    while not os.path.exists(path):\n"
        "        if time.monotonic() > end:\n"
        "            sys.exit(90)\n"
        "        time.sleep(0.01)\n")

# Each of two ranks writes N lines alternately to stdout and stderr, one
# write() per line.
ALTERNATE = ("import os\n"
             "r = os.environ['RANK']\n"
             "for i in range(%d):\n"
             "    os.write(1, b'r%%s out %%d\\n' %% (r.encode(), i))\n"
             "    os.write(2, b'r%%s err %%d\\n' %% (r.encode(), i))\n")


class WorkerConsole(DdprunCase):
    def check_order(self, text, nlines):
        """Each rank's lines complete and in the order written; every other
        line is the agent's own. A glued or cut line matches neither."""
        seen = {"0": [], "1": []}
        for line in text.splitlines():
            m = re.fullmatch(r"r([01]) (out|err) (\d+)", line)
            if m:
                seen[m.group(1)].append(line)
            else:
                self.assertTrue(line.startswith("ddprun") or line.startswith("[ddprun"),
                                "a line neither a worker's nor the agent's: %r" % line)
        for r in "01":
            want = []
            for i in range(nlines):
                want += ["r%s out %d" % (r, i), "r%s err %d" % (r, i)]
            self.assertEqual(seen[r], want, "rank %s's lines out of order or missing" % r)

    def test_workers_see_a_terminal_when_the_agent_has_one(self):
        w = self.pyscript("import os\n"
                          "open(%r + '/tty_' + os.environ['RANK'], 'w').write("
                          "'%%s %%s' %% (os.isatty(1), os.isatty(2)))\n" % self.tmp)
        con = Console()
        p = con.start(self, "--standalone", "--nproc-per-node=2", w)
        self.assertEqual(self.wait_exit(p), 0, con.data())
        for r in range(2):
            self.assertEqual(read(self.path("tty_%d" % r)), "True True", "rank %d: isatty(1), isatty(2)" % r)

    def test_carriage_return_updates_arrive_live(self):
        # tqdm-style: '\r' updates with no newline, on stderr then on stdout;
        # the worker goes on only once the test has seen each update.
        w = self.pyscript(WAIT + "d = %r\n"
                          "sys.stderr.write('progress 1/3\\r'); sys.stderr.flush()\n"
                          "wait(d + '/go1')\n"
                          "sys.stdout.write('tick A\\r'); sys.stdout.flush()\n"
                          "wait(d + '/go2')\n"
                          "sys.stderr.write('progress 3/3\\n')\n" % self.tmp)
        con = Console()
        p = con.start(self, "--standalone", w)
        self.assertTrue(con.wait_for(rb"progress 1/3\r"),
                        "stderr update not relayed while the worker runs: %r" % con.data())
        self.touch("go1")
        self.assertTrue(con.wait_for(rb"tick A\r"),
                        "stdout update not relayed while the worker runs: %r" % con.data())
        self.touch("go2")
        self.assertEqual(self.wait_exit(p), 0, con.data())
        self.assertTrue(con.wait_for(rb"progress 3/3"), con.data())

    def test_order_kept_on_a_terminal(self):
        w = self.pyscript(ALTERNATE % 500)
        con = Console()
        p = con.start(self, "--standalone", "--nproc-per-node=2", w)
        self.assertEqual(self.wait_exit(p), 0, con.data())
        self.assertTrue(con.wait_eof())
        self.check_order(con.data().decode().replace("\r\n", "\n"), 500)

    def test_order_kept_when_stdout_and_stderr_share_a_pipe(self):
        w = self.pyscript(ALTERNATE % 2000)
        p = self.run_ddprun("--standalone", "--nproc-per-node=2", w,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, capture_output=False)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:])
        self.check_order(p.stdout, 2000)

    def test_four_workers_20k_lines_each_none_glued(self):
        # The glue benchmark (scripts/bench/glued_lines.py, docs/benchmarks.md)
        # as a test: print() into a pipe writes 8 KiB blocks that end inside
        # a line; each console line must still be exactly one worker's line.
        w = self.pyscript(glued_lines.WORKER % glued_lines.LINES)
        p = self.run_ddprun("--standalone", "--nproc-per-node=%d" % glued_lines.NPROC, w,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            capture_output=False, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:])
        whole, glued, other, seen = glued_lines.count(p.stdout)
        bad = [l for l in p.stdout.splitlines()
               if not glued_lines.WHOLE.fullmatch(l) and not l.startswith(("ddprun", "[ddprun"))]
        self.assertEqual((glued, bad[:5]), (0, []), "console lines glued or cut")
        for r, numbers in seen.items():
            self.assertEqual(numbers, list(range(glued_lines.LINES)),
                             "rank %s's lines missing or out of order" % r)


class OutputVolume(DdprunCase):
    def test_300k_stderr_lines_all_present_in_order_at_exit_0_and_3(self):
        n = 300000
        # Written in large pieces that end mid-line, then exit at once: the
        # agent must copy what is still in the channel when the worker is gone.
        w = self.pyscript("import os, sys\n"
                          "data = b''.join(b'line %%06d\\n' %% i for i in range(%d))\n"
                          "for i in range(0, len(data), 100003):\n"
                          "    sys.stderr.buffer.write(data[i:i + 100003])\n"
                          "sys.stderr.flush()\n"
                          "os._exit(int(sys.argv[1]))\n" % n)
        want = ["line %06d" % i for i in range(n)]
        for code, agent_rc in ((0, 0), (3, 1)):
            with self.subTest(exit=code):
                err = self.path("stderr_%d" % code)
                with open(err, "wb") as f:
                    p = self.run_ddprun("--standalone", w, str(code), stdout=subprocess.DEVNULL,
                                        stderr=f, capture_output=False, text=False, timeout=120)
                text = read_bytes(err).decode(errors="replace")
                self.assertEqual(p.returncode, agent_rc, text[-3000:])
                body = text.split("\n" + "=" * 20)[0]  # the failure report's lines come after
                got = [l for l in body.splitlines() if l.startswith("line ")]
                self.assertEqual(len(got), n, "lines lost or glued")
                self.assertEqual(got, want)

    def test_100mb_line_without_newline(self):
        size = 100 << 20
        w = self.pyscript("import sys\n"
                          "chunk = b'~' * (1 << 20)\n"
                          "for _ in range(%d):\n"
                          "    sys.stderr.buffer.write(chunk)\n"
                          "sys.stderr.flush()\n" % (size >> 20))
        p = self.popen("--standalone", w, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        counted = {"payload": 0, "other": bytearray()}

        def pump():  # the line may come in pieces; only the payload bytes count
            for chunk in iter(lambda: p.stderr.read1(1 << 20), b""):
                tildes = chunk.count(b"~")
                counted["payload"] += tildes
                if len(counted["other"]) < 4096:
                    counted["other"] += chunk.replace(b"~", b"")[:4096]
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        peak = [0]

        def exited():  # VmHWM is the agent's peak so far; sample it until exit
            hwm = status_kib(p.pid, "VmHWM")
            peak[0] = max(peak[0], hwm or 0)
            return p.poll() is not None
        self.assertTrue(wait_for(exited, timeout=120, interval=0.05),
                        "ddprun did not finish a 100 MB line within 120 s")
        reader.join(30)
        self.assertEqual(p.returncode, 0, bytes(counted["other"]))
        self.assertEqual(counted["payload"], size)
        if not SANITIZED:  # ASan's memory is not the agent's
            self.assertLess(peak[0], 64 << 10, "agent peak RSS %d KiB for a 100 MB line" % peak[0])

    def test_console_closed_by_its_reader_does_not_end_the_job(self):
        # `ddprun ... | head -2`: the reader takes two lines and goes away.
        for tee in ((), ("--tee=3",)):
            with self.subTest(tee=tee):
                d = self.path("run%d" % len(tee))
                os.mkdir(d)
                w = self.script('echo a\necho b\n'
                                'until [ -e "%s/go" ]; do sleep 0.01; done\n'
                                'i=0; while [ $i -lt 2000 ]; do echo "line $i"; i=$((i+1)); done\n'
                                'echo finished > "%s/done"\n'
                                'exit 3\n' % (d, d))
                logs = os.path.join(d, "logs")
                err = os.path.join(d, "stderr")
                with open(err, "w") as f:
                    p = self.popen("--no-python", "--standalone", "--log-dir", logs, *tee, w,
                                   stdout=subprocess.PIPE, stderr=f)
                for _ in range(2):
                    self.assertTrue(p.stdout.readline())
                p.stdout.close()
                with open(os.path.join(d, "go"), "w"):
                    pass
                rc = self.wait_exit(p)
                self.assertEqual(rc, 1, "exit %d (141 or -13: killed by SIGPIPE); stderr: %s"
                                 % (rc, read(err)[-2000:]))
                self.assertTrue(os.path.exists(os.path.join(d, "done")),
                                "the worker did not run to its end; stderr: %s" % read(err)[-2000:])
                run = os.path.join(logs, os.listdir(logs)[0])
                report = read(os.path.join(run, "failure_report.txt"))
                self.assertIn("exitcode  : 3", report)
                self.assertIn("FAILED", report)
                self.assertTrue(read(os.path.join(run, "events.jsonl")).strip())
                if tee:  # the files still get everything
                    self.assertIn("line 1999\n", read(os.path.join(run, "attempt_0/0/stdout.log")))


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
