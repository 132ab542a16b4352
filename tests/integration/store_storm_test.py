"""The store under a connection storm (issue 43): ~2,000 clients connect to a
ddprun-store (port 0) at once from one process (build/bin/store_storm) and
each does what a rank does at init_process_group: the >= 2.2 handshake, ADD
a shared counter, SET its address, WAIT for `go` (set by the client whose ADD
returned N), GET it. Asserts that every client finished, that the counter is
exactly N, that every client read `go` and every address key holds what its
client set (store_storm checks these over a client's connection and exits 1
otherwise), and that the server is still up and serves a fresh client.

Nothing asserts on durations: store_storm's own deadline is a bound against
hangs on a loaded machine. A connection the server refuses or drops before
its ADD is retried by store_storm (counted, not failed); one lost after its
ADD fails the run, since the ADD may have counted."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from ddprun_case import BIN, PATIENCE  # noqa: E402
from store_server import StoreServer  # noqa: E402
from storewire import round_trip  # noqa: E402

STORM = os.path.join(BIN, "store_storm")
CLIENTS = 2000


class StoreStormTest(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(STORM):
            self.skipTest("store_storm is not built (cmake --build build --target store_storm)")
        self.tmp = tempfile.mkdtemp(prefix="ddprun_storm_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def storm(self, srv, n, *args):
        r = subprocess.run([STORM, "--port", str(srv.port), "--host", "127.0.0.1", "-n", str(n),
                            "--json", "--timeout-s", "240", *args],
                           capture_output=True, text=True, timeout=300)
        lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
        self.assertTrue(lines, "store_storm printed no result (exit %d); stderr:\n%s"
                        % (r.returncode, r.stderr[-3000:]))
        return r, json.loads(lines[-1])

    def test_every_client_of_a_storm_finishes_and_the_counter_is_exact(self):
        srv = StoreServer(BIN, self.tmp, "--host", "127.0.0.1", capped=False)
        self.addCleanup(srv.stop)
        r, res = self.storm(srv, CLIENTS)
        detail = "result %s; store_storm stderr:\n%s\nserver stderr:\n%s" % (
            res, r.stderr[-3000:], srv.stderr()[-3000:])
        self.assertEqual(res["done"], CLIENTS, detail)
        self.assertEqual(res["failed"], 0, detail)
        self.assertEqual(res["verify_mismatches"], 0, detail)
        self.assertEqual(r.returncode, 0, detail)
        self.assertTrue(srv.alive(), "ddprun-store %s after the storm" % srv.describe_exit())
        self.assertEqual(round_trip(srv.port, "after_storm", b"ok", timeout=PATIENCE), b"ok")

    def test_a_second_storm_on_the_same_server_counts_from_zero_on_its_own_keys(self):
        # The first storm's N connections are reset at its end (store_storm
        # closes with SO_LINGER 0) while the second's arrive: the server
        # reaps the one and accepts the other, and the counts stay exact.
        srv = StoreServer(BIN, self.tmp, "--host", "127.0.0.1", capped=False)
        self.addCleanup(srv.stop)
        for prefix in ("first", "second"):
            r, res = self.storm(srv, CLIENTS // 2, "--prefix", prefix)
            self.assertEqual((r.returncode, res["done"], res["verify_mismatches"]),
                             (0, CLIENTS // 2, 0),
                             "storm %s: %s\n%s" % (prefix, res, r.stderr[-3000:]))
        self.assertTrue(srv.alive(), "ddprun-store %s after the storms" % srv.describe_exit())

    def test_idle_connections_are_held_and_released(self):
        # --idle: N handshaken connections held until stdin closes; the server
        # serves another client meanwhile.
        srv = StoreServer(BIN, self.tmp, "--host", "127.0.0.1", capped=False)
        self.addCleanup(srv.stop)
        holder = subprocess.Popen([STORM, "--port", str(srv.port), "--host", "127.0.0.1",
                                   "-n", "1000", "--idle", "--json"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.addCleanup(holder.stdout.close)
        self.addCleanup(holder.kill)
        res = json.loads(holder.stdout.readline())
        self.assertEqual(res["idle_connections"], 1000, res)
        self.assertEqual(round_trip(srv.port, "beside_idle", b"1", timeout=PATIENCE), b"1")
        holder.stdin.close()
        self.assertEqual(holder.wait(PATIENCE), 0)


if __name__ == "__main__":
    unittest.main()
