"""Helpers shared by the interop tests: start ddprun-store, find tools."""
import os
import re
import signal
import subprocess
import sys
import time

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
SKIP = 77  # ctest SKIP_RETURN_CODE


def fail(msg):
    print("FAILED: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class DdprunStore:
    """ddprun-store on a free port, stopped (and checked) on exit."""

    def __init__(self, *extra):
        self.proc = subprocess.Popen([os.path.join(BIN, "ddprun-store"), "--port", "0", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on .*:(\d+)$", line.strip())
        if not m:
            self.proc.kill()
            fail("ddprun-store did not print its address: %r %s" % (line, self.proc.stderr.read()))
        self.port = int(m.group(1))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        alive = self.proc.poll() is None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = -9
        if exc[0] is None:
            check(alive, "ddprun-store died during the test: " + self.proc.stderr.read())
            check(rc == 0, "ddprun-store exited %s on SIGTERM" % rc)
        return False


def reserved_port():
    """A port nothing else can take until .close() (see tests/pyutil/reserved_port.py);
    servers that set SO_REUSEADDR (ours, PyTorch's) can still listen on it."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
    from reserved_port import ReservedPort
    return ReservedPort()


def torch_major():
    import torch
    return int(torch.__version__.split(".")[0])
