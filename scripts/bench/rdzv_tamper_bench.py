#!/usr/bin/env python3
"""Rendezvous integrity (issue 16): the peak memory of one agent that finds a
27 MB state (700,000 participants) under its job's key, the time until it
exits, and its exit code.

    python3 scripts/bench/rdzv_tamper_bench.py [--bin-dir build/bin]

A separate ddprun-store on port 0 holds the state (written by a raw client,
tests/pyutil/storewire.py); one `ddprun --nnodes=1:2 --rdzv-backend=c10d`
agent joins it. Its VmHWM is sampled from /proc every few milliseconds
until it exits (or 15 s pass: an agent that does not exit is killed and
reported as such), so the peak is a lower bound of the true one. The
times to an error or to a re-formed round for every other tampering case
are printed by tests/integration/rdzv_tamper_test.py ("[ figure ]" lines).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "pyutil"))
from store_server import StoreServer  # noqa: E402
from storewire import RawClient  # noqa: E402


def huge_state(n=700000):
    ps = [{"id": "10.%d.%d.%d_1_0" % (i >> 16, (i >> 8) & 255, i & 255), "n": 1, "s": i}
          for i in range(n)]
    return json.dumps({"r": 0, "c": False, "x": False, "p": ps, "e": [], "w": [], "d": [],
                       "lc": 0, "rc": 0, "er": -1, "ns": n + 1,
                       "j": {"n": "1:2", "lc": 30000, "hb": 15000, "by": "10.9.9.9_1_0"}},
                      separators=(",", ":")).encode()


def vm_hwm_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", default=os.path.join(HERE, "..", "..", "build", "bin"))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="rdzv_tamper_bench_")
    store = StoreServer(args.bin_dir, tmp, capped=False)
    try:
        value = huge_state()
        c = RawClient(store.port)
        c.set("/ddprun/bench/state", value)
        c.get("/ddprun/bench/state")  # stored before the agent starts
        c.close()
        t0 = time.monotonic()
        p = subprocess.Popen([os.path.join(args.bin_dir, "ddprun"), "--nnodes=1:2",
                              "--rdzv-backend=c10d", "--rdzv-id=bench",
                              "--rdzv-endpoint=127.0.0.1:%d" % store.port,
                              "--no-python", "/bin/true"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        hwm = 0
        while p.poll() is None and time.monotonic() - t0 < 15:
            hwm = max(hwm, vm_hwm_kib(p.pid))
            time.sleep(0.002)
        took = time.monotonic() - t0
        rc = p.poll()
        if rc is None:
            p.kill()
            p.wait()
        print("state of %d bytes: agent %s after %.2f s, peak RSS >= %.0f MiB"
              % (len(value), "exit %d" % rc if rc is not None else "still running (killed)",
                 took, hwm / 1024))
    finally:
        store.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
