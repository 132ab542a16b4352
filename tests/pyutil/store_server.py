"""A ddprun-store process for tests: started on port 0 (its port read back
from its "listening on" line), its stderr kept in a file, its memory read
from /proc, stopped and reaped by stop() whatever happened."""
import os
import re
import resource
import signal
import subprocess

from procs import status_kib

MiB = 1 << 20

# Address space given to a server under attack. A server that does not bound
# its memory then fails with std::bad_alloc (and the test says so) instead of
# taking gigabytes from a machine shared with other work; a bounded server
# stays far below it.
ADDRESS_SPACE_CAP = 2048 * MiB


def cap_address_space():
    """preexec_fn: the child's RLIMIT_AS becomes ADDRESS_SPACE_CAP."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))


class StoreServer:
    def __init__(self, bin_dir, tmp, *args, timeout=30.0, capped=True):
        """`capped`: under ADDRESS_SPACE_CAP (for attacks; a sanitizer build
        cannot start under it, whose shadow memory is terabytes of address
        space). A store that is only an endpoint needs no cap."""
        self.stderr_path = os.path.join(tmp, "store_%d.stderr" % id(self))
        self._err = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "ddprun-store"), "--port", "0", *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._err,
            preexec_fn=cap_address_space if capped else None)
        self.pid = self.proc.pid
        # readline returns at the server's first line, or at EOF if it dies.
        line = self.proc.stdout.readline().decode(errors="replace")
        m = re.search(r"listening on .*:(\d+)$", line.strip())
        if not m:
            self.stop()
            raise RuntimeError("ddprun-store did not print its address (%s): %r %s"
                               % (self.describe_exit(), line, self.stderr()))
        self.port = int(m.group(1))

    def alive(self):
        return self.proc.poll() is None

    def hwm_bytes(self):
        """Peak resident memory so far (VmHWM), or None once it has exited."""
        kib = status_kib(self.pid, "VmHWM")
        return None if kib is None else kib * 1024

    def stderr(self):
        with open(self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stderr_bytes(self):
        with open(self.stderr_path, "rb") as f:
            return f.read()

    def terminate(self, timeout=30.0):
        """SIGTERM, then its exit code (None if it outlived `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        """Kills (if still running) and reaps; idempotent."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stdout.close()
        self._err.close()

    def describe_exit(self):
        rc = self.proc.poll()
        if rc is None:
            return "running"
        if rc < 0:
            return "killed by signal %d (%s)" % (-rc, signal.Signals(-rc).name)
        return "exit %d" % rc
