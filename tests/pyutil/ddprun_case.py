"""A base class for tests that run the real `ddprun` binary with real workers.

Each test gets a temporary directory, removed at the end, that also serves as
TMPDIR for ddprun (so its default log directory lands there too). Processes a
test starts through popen() are killed and reaped at the end whatever
happens; pid files named with kill_at_end() are killed too, so that a failing
test leaves nothing behind."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import kill_all, read_pids, wait_for  # noqa: E402

BIN = os.environ.get("DDPRUN_BIN_DIR",
                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../build/bin"))
DDPRUN = os.path.join(BIN, "ddprun")



def _sanitized():
    """Whether ddprun is built with AddressSanitizer (its memory figures are
    then the sanitizer's, not the agent's): DDPRUN_SANITIZED from CTest, else
    a look at the binary."""
    flag = os.environ.get("DDPRUN_SANITIZED")
    if flag is not None:
        return flag == "1"
    try:
        with open(DDPRUN, "rb") as f:
            return b"__asan_init" in f.read()
    except OSError:
        return False


SANITIZED = _sanitized()

# How long a test waits for something that takes milliseconds when all is
# well: a bound against hangs on a loaded 2-core machine, never an assertion
# on speed.
PATIENCE = 30.0

# Timing bounds (an issue's "detected within the heartbeat timeout", "obeyed
# within a second") depend on the machine's load, so they are not asserted by
# default: DdprunCase.timing_bound() prints every measured figure with a
# "TIMING" label, and asserts the bound only with DDPRUN_TIMING_ASSERTS=1 (a
# quiet machine, e.g. when measuring for docs/benchmarks.md). What a test
# asserts unconditionally is the outcome, awaited with PATIENCE-sized bounds.
TIMING_ASSERTS = os.environ.get("DDPRUN_TIMING_ASSERTS") == "1"


def read(path):
    with open(path) as f:
        return f.read()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


class DdprunCase(unittest.TestCase):
    def timing_bound(self, what, took, bound):
        """Records that `what` took `took` s against the stated `bound` (s);
        asserts took < bound only under DDPRUN_TIMING_ASSERTS=1."""
        print("TIMING %s: %.2f s (bound %.1f s)%s" % (what, took, bound,
              "" if took < bound else " OVER THE BOUND"), file=sys.stderr)
        if TIMING_ASSERTS:
            self.assertLess(took, bound, "%s took %.1f s" % (what, took))

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_test_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self._pidfiles = []
        self.addCleanup(self._kill_recorded)
        self._count = 0

    # Files and workers.

    def path(self, name):
        return os.path.join(self.tmp, name)

    def _new(self, suffix, text, mode):
        self._count += 1
        p = self.path("worker_%d%s" % (self._count, suffix))
        with open(p, "w") as f:
            f.write(text)
        os.chmod(p, mode)
        return p

    def script(self, body):
        """An executable /bin/sh worker (run it with --no-python)."""
        return self._new(".sh", "#!/bin/sh\n" + body, 0o755)

    def pyscript(self, body):
        """A Python worker `worker_N.py` (runs under PYTHON_EXEC)."""
        return self._new(".py", body, 0o644)

    def kill_at_end(self, pidfile):
        """SIGKILL every pid written to `pidfile` when the test ends."""
        self._pidfiles.append(pidfile)

    def _kill_recorded(self):
        for f in self._pidfiles:
            kill_all(read_pids(f))

    # Running ddprun.

    def env(self, extra=None):
        e = dict(os.environ, TMPDIR=self.tmp, PYTHON_EXEC=sys.executable)
        e.pop("LOGLEVEL", None)
        e.pop("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", None)
        e.update(extra or {})
        return e

    def run_ddprun(self, *args, timeout=60, env=None, **kw):
        """ddprun to its end; stdout and stderr captured as text."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run([DDPRUN, *args], timeout=timeout, env=self.env(env), **kw)

    def popen(self, *args, env=None, **kw):
        """ddprun in the background, killed and reaped when the test ends."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen([DDPRUN, *args], env=self.env(env), **kw)
        self.addCleanup(self._reap, p)
        return p

    def popen_static(self, port, nprocs, *args, env=None, timeout_s=30):
        """One agent per entry of `nprocs` (its --nproc-per-node), all on
        this host, a static rendezvous on 127.0.0.1:`port`; stdout and
        stderr piped as text."""
        return [self.popen("--nnodes=%d" % len(nprocs), "--node-rank=%d" % node,
                           "--master-addr=127.0.0.1", "--master-port=%d" % port,
                           "--nproc-per-node=%d" % n, "--rdzv-conf=timeout=%d" % timeout_s, *args,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for node, n in enumerate(nprocs)]

    def finish(self, procs, timeout=60):
        """[(exit code, stdout, stderr)] of each process, in order; fails the
        test if one runs past `timeout`."""
        out = []
        for i, p in enumerate(procs):
            try:
                o, e = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.fail("process %d (%s) still running after %d s" % (i, p.args[1:4], timeout))
            out.append((p.returncode, o, e))
        return out

    @staticmethod
    def _reap(p):
        if p.poll() is None:
            p.kill()
        p.wait()
        for s in (p.stdout, p.stderr):
            if s:
                s.close()

    def wait_exit(self, p, timeout=PATIENCE, what="ddprun"):
        """p's exit code; fails the test if it runs past `timeout`."""
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.fail("%s still running after %.0f s" % (what, timeout))

    def wait_file(self, path, timeout=PATIENCE):
        """Fails unless `path` exists with some content within `timeout`."""
        if not wait_for(lambda: os.path.exists(path) and os.path.getsize(path) > 0, timeout):
            self.fail("no %s after %.0f s" % (path, timeout))

    def touch(self, name):
        """Creates a file atomically (workers wait for it to appear)."""
        tmp = self.path("." + name + ".tmp")
        with open(tmp, "w") as f:
            f.write("go\n")
        os.rename(tmp, self.path(name))

    def assert_agent_messages_clean(self, text):
        """Every line the agent itself writes starts with `ddprun: ` and none
        carries a source location."""
        for line in text.splitlines():
            self.assertNotRegex(line, r"\.cc:\d|\[src/", "source location in: %r" % line)
        self.assertNotIn("[ddprun ", text)


class Console:
    """ddprun's console as a pseudo-terminal: the agent's stdout and stderr
    are the slave side; a thread collects what arrives on the master side."""

    def __init__(self):
        import pty
        self.master, self.slave = pty.openpty()
        self._data = bytearray()
        self._cond = threading.Condition()
        self._eof = False
        self._thread = None

    def start(self, case, *args, env=None):
        """Starts ddprun on this console (reaped before the console closes)."""
        case.addCleanup(self.close)
        p = case.popen(*args, env=env, stdout=self.slave, stderr=self.slave)
        os.close(self.slave)  # EOF (EIO) once ddprun and its workers closed theirs
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()
        return p

    def _pump(self):
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every slave end is closed
                chunk = b""
            with self._cond:
                if not chunk:
                    self._eof = True
                    self._cond.notify_all()
                    return
                self._data += chunk
                self._cond.notify_all()

    def wait_for(self, pattern, timeout=PATIENCE):
        """True once the output so far matches the bytes regex `pattern`."""
        rx = re.compile(pattern)
        with self._cond:
            return self._cond.wait_for(lambda: rx.search(self._data) or self._eof, timeout) \
                and bool(rx.search(self._data))

    def wait_eof(self, timeout=PATIENCE):
        with self._cond:
            return self._cond.wait_for(lambda: self._eof, timeout)

    def data(self):
        with self._cond:
            return bytes(self._data)

    def close(self):
        if self._thread:
            self._thread.join(5)
        try:
            os.close(self.master)
        except OSError:
            pass
