"""The agent's status endpoint (--status-port, docs/status.md) under running
jobs: /status fields against the workers' real pids, /healthz, /metrics
parsed by prometheus_client's own parser (in the PyTorch 2 test venv), a
restart seen as attempt 1 and worker exits by code, hostile and malformed
HTTP answered without harming the job, and `ddprun status HOST:PORT`.

Workers are shell scripts that write their pid and then wait for a file the
test creates at the end; the test waits on files and on what the endpoint
says, never on time, and asserts no duration."""
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from ddprun_case import DDPRUN, PATIENCE, DdprunCase, read  # noqa: E402
from procs import wait_for  # noqa: E402
from reserved_port import reserve_port  # noqa: E402

VENV = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
VENV_PYTHON = os.path.join(VENV, "bin", "python")

# Reads the text format on stdin with prometheus_client's parser; prints the
# families as JSON: {name: {"type": ..., "samples": [[name, labels, value]]}}.
PARSE = """
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for f in text_string_to_metric_families(sys.stdin.read()):
    out[f.name] = {"type": f.type, "samples": [[s.name, s.labels, s.value] for s in f.samples]}
print(json.dumps(out))
"""


def prometheus_parser_missing():
    """Why prometheus_client's parser cannot run here, or None."""
    if not os.path.exists(VENV_PYTHON):
        return "no PyTorch 2 test venv at %s (scripts/setup-test-deps.sh)" % VENV
    r = subprocess.run([VENV_PYTHON, "-c", "import prometheus_client"], capture_output=True)
    if r.returncode != 0:
        return "prometheus_client is not installed in %s (scripts/setup-test-deps.sh)" % VENV
    return None


def raw_exchange(port, data, shut=True):
    """Sends `data` on a new connection, then reads until the server closes;
    the bytes received."""
    with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE) as s:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        return got


class StatusEndpoint(DdprunCase):
    # ------------------------------------------------------------ helpers
    def worker(self, restart_body=""):
        """Writes pid_<attempt>_<local rank>, waits for the file `go`, says done."""
        return self.script(
            'd="%s"\n%s'
            'echo $$ > "$d/pid_${TORCHELASTIC_RESTART_COUNT}_$LOCAL_RANK.tmp"\n'
            'mv "$d/pid_${TORCHELASTIC_RESTART_COUNT}_$LOCAL_RANK.tmp" '
            '"$d/pid_${TORCHELASTIC_RESTART_COUNT}_$LOCAL_RANK"\n'
            'until [ -e "$d/go" ]; do sleep 0.05; done\n'
            'echo "done rank $RANK"\n' % (self.tmp, restart_body))

    def start_job(self, *args):
        """ddprun with --status-port 0 in the background; its port, read from
        the line it prints."""
        self.out_path, self.err_path = self.path("stdout.txt"), self.path("stderr.txt")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.job = self.popen("--no-python", "--status-port", "0", *args,
                                  stdout=out, stderr=err)
        rx = re.compile(r"status endpoint at http://127\.0\.0\.1:(\d+)/status")
        found = {}

        def printed():
            m = rx.search(read(self.err_path))
            if m:
                found["port"] = int(m.group(1))
            return bool(m) or self.job.poll() is not None
        self.assertTrue(wait_for(printed, PATIENCE), "no status line")
        self.assertIn("port", found, read(self.err_path))
        self.port = found["port"]
        return self.port

    def get(self, path, method="GET", body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=PATIENCE)
        try:
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read().decode()
        finally:
            c.close()

    def status(self):
        code, _, body = self.get("/status")
        self.assertEqual(code, 200, body)
        return json.loads(body)

    def wait_status(self, cond, what):
        """The first /status for which cond(status) holds."""
        seen = {}

        def ok():
            seen["s"] = self.status()
            return cond(seen["s"])
        self.assertTrue(wait_for(ok, PATIENCE, interval=0.05),
                        "%s; last /status: %s" % (what, seen.get("s")))
        return seen["s"]

    def pids(self, attempt, n):
        out = []
        for r in range(n):
            p = self.path("pid_%d_%d" % (attempt, r))
            self.kill_at_end(p)
            self.wait_file(p)
            out.append(int(read(p)))
        return out

    def running(self, attempt, n):
        return lambda s: (s["attempt"] == attempt and s["state"] == "running" and
                          len(s["workers"]) == n and
                          all(w["state"] == "running" for w in s["workers"]))

    def finish_job(self, n):
        self.touch("go")
        self.assertEqual(self.wait_exit(self.job), 0, read(self.err_path))
        out = read(self.out_path)
        for r in range(n):
            self.assertIn("done rank %d" % r, out)
        return out

    def metrics(self):
        code, headers, text = self.get("/metrics")
        self.assertEqual(code, 200)
        self.assertTrue(headers["Content-Type"].startswith("text/plain; version=0.0.4"))
        missing = prometheus_parser_missing()
        if missing:
            self.skipTest(missing)
        r = subprocess.run([VENV_PYTHON, "-c", PARSE], input=text, capture_output=True,
                           text=True, timeout=PATIENCE)
        self.assertEqual(r.returncode, 0, "prometheus_client rejected:\n%s\n%s" % (text, r.stderr))
        return json.loads(r.stdout)

    @staticmethod
    def value(families, family, sample, **labels):
        for name, lab, v in families[family]["samples"]:
            if name == sample and all(lab.get(k) == x for k, x in labels.items()):
                return v
        raise AssertionError("no %s%s in %s" % (sample, labels, families[family]))

    # ------------------------------------------------------------ tests
    def test_status_fields_healthz_and_table(self):
        self.start_job("--nproc-per-node", "2", "--max-restarts", "2", "--rdzv-id", "job7",
                       self.worker())
        pids = self.pids(0, 2)
        s = self.wait_status(self.running(0, 2), "workers never shown running")
        self.assertEqual(s["run_id"], "job7")
        self.assertEqual(s["node"], socket.gethostname())
        self.assertEqual(s["group_rank"], 0)
        self.assertEqual(s["group_world_size"], 1)
        self.assertEqual(s["restarts_left"], 2)
        self.assertEqual(s["max_restarts"], 2)
        self.assertEqual(s["rendezvous"]["round"], 0)
        self.assertEqual(s["rendezvous"]["world_size"], 2)
        self.assertEqual(s["rendezvous"]["members"],
                         [{"group_rank": 0, "local_world_size": 2, "base_rank": 0}])
        ws = sorted(s["workers"], key=lambda w: w["local_rank"])
        self.assertEqual([w["global_rank"] for w in ws], [0, 1])
        self.assertEqual([w["pid"] for w in ws], pids)
        for w in ws:
            self.assertRegex(w["started"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
            self.assertIsNone(w["exit_code"])
        code, _, body = self.get("/healthz")
        self.assertEqual((code, body), (200, "ok\n"))
        code, headers, body = self.get("/status", method="HEAD")
        self.assertEqual((code, body), (200, ""))
        self.assertGreater(int(headers["Content-Length"]), 0)
        # ddprun status: the table names every worker's pid; --json is /status.
        t = subprocess.run([DDPRUN, "status", "127.0.0.1:%d" % self.port], capture_output=True,
                           text=True, timeout=PATIENCE)
        self.assertEqual(t.returncode, 0, t.stderr)
        self.assertIn("job7", t.stdout)
        for pid in pids:
            self.assertRegex(t.stdout, r"\b%d\b.*running" % pid)
        j = subprocess.run([DDPRUN, "status", "--json", "127.0.0.1:%d" % self.port],
                           capture_output=True, text=True, timeout=PATIENCE)
        self.assertEqual(j.returncode, 0, j.stderr)
        self.assertEqual(json.loads(j.stdout)["workers"][0]["pid"], ws[0]["pid"])
        self.finish_job(2)

    def test_metrics_parse_with_prometheus_client(self):
        self.start_job("--nproc-per-node", "2", "--rdzv-id", 'we"ird\\id', self.worker())
        self.pids(0, 2)
        self.wait_status(self.running(0, 2), "workers never shown running")
        m = self.metrics()
        run = 'we"ird\\id'  # escaped in the text, read back as given
        self.assertEqual(self.value(m, "ddprun_attempt", "ddprun_attempt", run_id=run), 0)
        self.assertEqual(self.value(m, "ddprun_workers_running", "ddprun_workers_running"), 2)
        self.assertEqual(m["ddprun_restarts"]["type"], "counter")
        self.assertEqual(self.value(m, "ddprun_restarts", "ddprun_restarts_total"), 0)
        h = "ddprun_rendezvous_round_duration_seconds"
        self.assertEqual(m[h]["type"], "histogram")
        self.assertEqual(self.value(m, h, h + "_count"), 1)
        self.assertEqual(self.value(m, h, h + "_bucket", le="+Inf"), 1)
        self.assertEqual(self.value(m, "ddprun_heartbeats_missed",
                                    "ddprun_heartbeats_missed_total"), 0)
        self.finish_job(2)

    def test_restart_shows_attempt_and_exit_codes(self):
        # Attempt 0: local rank 1 exits 3 once rank 0 runs; rank 0 is stopped.
        fail = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$LOCAL_RANK" = 1 ]; then\n'
                '  until [ -s "$d/pid_0_0" ]; do sleep 0.01; done\n'
                '  exit 3\n'
                'fi\n')
        self.start_job("--nproc-per-node", "2", "--max-restarts", "1", self.worker(fail))
        self.kill_at_end(self.path("pid_0_0"))
        pids = self.pids(1, 2)
        s = self.wait_status(self.running(1, 2), "attempt 1 never shown running")
        self.assertEqual(s["restarts_left"], 0)
        self.assertEqual(sorted(w["pid"] for w in s["workers"]), sorted(pids))
        self.assertEqual(s["rendezvous"]["round"], 1)
        missing = prometheus_parser_missing()
        if missing:  # the endpoint's text, checked without the parser
            code, _, text = self.get("/metrics")
            self.assertIn('ddprun_worker_exits_total{run_id="none",code="3"} 1', text)
            self.assertIn('ddprun_attempt{run_id="none"} 1', text)
            self.finish_job(2)
            self.skipTest(missing)
        m = self.metrics()
        self.assertEqual(self.value(m, "ddprun_attempt", "ddprun_attempt"), 1)
        self.assertEqual(self.value(m, "ddprun_worker_exits", "ddprun_worker_exits_total",
                                    code="3"), 1)
        self.assertEqual(self.value(m, "ddprun_worker_exits", "ddprun_worker_exits_total",
                                    code="SIGTERM"), 1)
        self.assertEqual(self.value(m, "ddprun_restarts", "ddprun_restarts_total"), 1)
        h = "ddprun_rendezvous_round_duration_seconds"
        self.assertEqual(self.value(m, h, h + "_count"), 2)
        self.finish_job(2)

    def test_malformed_http_does_not_harm_the_job(self):
        self.start_job("--nproc-per-node", "2", self.worker())
        self.pids(0, 2)
        self.wait_status(self.running(0, 2), "workers never shown running")
        port = self.port
        # Truncated, then closed: nothing to answer, nothing broken.
        raw_exchange(port, b"GET /sta")
        # Oversized headers: 431.
        big = b"GET /status HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
        self.assertRegex(raw_exchange(port, big, shut=False), rb"^HTTP/1\.1 431 ")
        # A body over the limit: 413.
        self.assertRegex(raw_exchange(port, b"POST /status HTTP/1.1\r\nHost: x\r\n"
                                            b"Content-Length: 1000000\r\n\r\n"),
                         rb"^HTTP/1\.1 413 ")
        # Not HTTP at all: 400.
        self.assertRegex(raw_exchange(port, b"HELLO THERE\r\n\r\n"), rb"^HTTP/1\.1 400 ")
        self.assertRegex(raw_exchange(port, b"\x00\x01\x02 garbage\r\n\r\n"), rb"^HTTP/1\.1 400 ")
        # A slow client that sends nothing: others are served meanwhile.
        slow = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE)
        slow2 = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE)
        slow2.sendall(b"GET /status HTTP/1.1\r\n")  # and never the rest
        self.assertEqual(self.get("/healthz")[0], 200)
        # Unknown path, other method.
        self.assertEqual(self.get("/nope")[0], 404)
        code, headers, _ = self.get("/status", method="POST", body="x")
        self.assertEqual(code, 405)
        self.assertEqual(headers["Allow"], "GET, HEAD")
        # More idle connections than the cap: the excess is closed, and once
        # they are gone the endpoint answers again.
        idle = [socket.create_connection(("127.0.0.1", port), timeout=PATIENCE)
                for _ in range(40)]
        for s in idle + [slow, slow2]:
            s.close()

        def healthy():
            try:
                return self.get("/healthz")[0] == 200
            except OSError:
                return False
        self.assertTrue(wait_for(healthy, PATIENCE, interval=0.05))
        s = self.status()
        self.assertTrue(all(w["state"] == "running" for w in s["workers"]))
        self.finish_job(2)
        err = read(self.err_path)
        self.assertNotIn("warning", err)
        self.assert_agent_messages_clean(err)

    def test_bad_flags_and_a_taken_port(self):
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            taken = holder.getsockname()[1]
            p = self.run_ddprun("--no-python", "--status-port", str(taken), "true")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("--status-port %d" % taken, p.stderr)
        self.assertIn("cannot listen", p.stderr)
        p = self.run_ddprun("--no-python", "--status-port", "0", "--status-addr", "nowhere",
                            "true")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--status-addr", p.stderr)
        p = self.run_ddprun("--no-python", "--status-port", "70000", "true")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--status-port", p.stderr)

    def test_status_command_errors(self):
        p = subprocess.run([DDPRUN, "status", "nonsense"], capture_output=True, text=True,
                           timeout=PATIENCE)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("HOST:PORT", p.stderr)
        p = subprocess.run([DDPRUN, "status"], capture_output=True, text=True, timeout=PATIENCE)
        self.assertEqual(p.returncode, 2, p.stderr)
        port = reserve_port(self)  # bound, never listened on: nobody answers
        p = subprocess.run([DDPRUN, "status", "127.0.0.1:%d" % port], capture_output=True,
                           text=True, timeout=PATIENCE)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("127.0.0.1:%d" % port, p.stderr)
        self.assertIn("connect", p.stderr)
        self.assert_agent_messages_clean(p.stderr)

    def test_a_script_named_status_runs_as_dot_slash(self):
        w = self.script('echo "I am the status script"\n')
        os.rename(w, self.path("status"))
        p = self.run_ddprun("--no-python", "./status", cwd=self.tmp)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("I am the status script", p.stdout)


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
