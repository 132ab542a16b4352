"""Multi-host tests of the dynamic (c10d) rendezvous: three hosts made of
network namespaces on one bridge (tests/pyutil/netns.py), one agent per host,
the endpoint hosted by the agent on host 0.

A host is cut off by taking its link down: nothing is closed or reset, its
packets just stop, as when a machine loses power or its cable. The two others
must drop it within the heartbeat timeout and finish as a 2-node job; the
cut-off agent must end by itself with a message naming the endpoint, leaving
no worker behind.

Needs root and iproute2: skipped with the reason elsewhere (ctest reports it
skipped). The issue's detection bound (heartbeat timeout) is measured and
printed as a "TIMING" line, asserted only with DDPRUN_TIMING_ASSERTS=1;
everything else waits on files and processes with bounded deadlines."""
import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
import netns  # noqa: E402
from ddprun_case import DDPRUN, PATIENCE, DdprunCase, read  # noqa: E402
from procs import alive, wait_for  # noqa: E402

# The endpoint's port on host 0. A fixed port is safe here and only here:
# host 0 is a namespace this test just created, so the only sockets in it
# are the ones its own agent opens (the endpoint, and port-0 binds and
# outgoing connections, which the kernel takes from the ephemeral range,
# checked in setUp to lie above this port). It is torchrun's default.
ENDPOINT_PORT = 29400

KEEP_ALIVE_S = 0.2
KEEP_ALIVE_ATTEMPTS = 3
HEARTBEAT_TIMEOUT_S = KEEP_ALIVE_S * KEEP_ALIVE_ATTEMPTS
# Detection plus a new round plus spawning, on a 2-core machine shared with
# other builds: far above what it takes, far below anything like a hang.
DETECTION_SLACK_S = 10.0
# Short store and join timeouts, so that the cut-off agent gives up soon.
READ_TIMEOUT_S = 2
JOIN_TIMEOUT_S = 20

# Records its environment, atomically, in $RECORDS/w_<node>_<pid> (fields in
# FIELDS order), then runs until $RECORDS/finish_<node> appears.
WORKER = r'''#!/bin/sh
f="$RECORDS/w_${NODE}_$$"
echo "$NODE $GROUP_RANK $GROUP_WORLD_SIZE $WORLD_SIZE $RANK $MASTER_ADDR" \
     "$TORCHELASTIC_RESTART_COUNT $$ $(date +%s.%N)" > "$f.tmp"
mv "$f.tmp" "$f"
until [ -e "$RECORDS/finish_$NODE" ]; do sleep 0.02; done
'''
FIELDS = ("node", "group_rank", "group_world_size", "world_size", "rank", "master_addr",
          "restart_count", "pid", "started")


class ThreeHosts(DdprunCase):
    @classmethod
    def setUpClass(cls):
        why = netns.unavailable()
        if why:
            raise unittest.SkipTest("multi-host tests " + why)

    def setUp(self):
        super().setUp()
        # Cleanups run last-registered first: processes (registered later)
        # are reaped before their namespaces go.
        self.hosts = netns.Cluster(3)
        self.addCleanup(self.hosts.destroy)
        self.hosts.create()
        self.assertTrue(self.hosts.reaches(1, 0) and self.hosts.reaches(2, 0),
                        "the namespaces do not reach each other through the bridge")
        low, high = map(int, self._run_on(0, ["cat", "/proc/sys/net/ipv4/ip_local_port_range"])
                        .split())
        self.assertFalse(low <= ENDPOINT_PORT <= high, "the endpoint port is ephemeral here")
        self.records = self.path("records")
        os.mkdir(self.records)
        self.worker = self.script(WORKER)
        self.agents = []

    def _run_on(self, host, argv):
        return subprocess.run(self.hosts.exec_prefix(host) + argv, check=True, text=True,
                              capture_output=True, timeout=PATIENCE).stdout

    # ------------------------------------------------------------- agents

    def endpoint(self):
        return "%s:%d" % (self.hosts.addrs[0], ENDPOINT_PORT)

    def start_agent(self, host):
        """The same command on every host but for --local-addr (its address)."""
        conf = ("keep_alive_interval=%g,keep_alive_max_attempt=%d,read_timeout=%d,"
                "join_timeout=%d" % (KEEP_ALIVE_S, KEEP_ALIVE_ATTEMPTS, READ_TIMEOUT_S,
                                     JOIN_TIMEOUT_S))
        argv = [DDPRUN, "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                "--rdzv-endpoint=" + self.endpoint(), "--rdzv-id=netns",
                "--local-addr=" + self.hosts.addrs[host], "--rdzv-conf=" + conf,
                "--max-restarts=3", "--no-python", self.worker]
        err = open(self.path("agent_%d.stderr" % host), "w")
        self.addCleanup(err.close)
        p = subprocess.Popen(self.hosts.exec_prefix(host) + argv, stdin=subprocess.DEVNULL,
                             stdout=err, stderr=subprocess.STDOUT,
                             env=self.env({"NODE": str(host), "RECORDS": self.records}))
        self.addCleanup(self._reap, p)
        self.agents.append(p)
        return p

    def output(self, host):
        return read(self.path("agent_%d.stderr" % host))

    def outputs(self):
        return "\n".join("--- agent %d:\n%s" % (h, self.output(h)) for h in range(3))

    # ------------------------------------------------------------- workers

    def workers(self):
        """Every worker record so far, as dicts (a record is complete once
        it is there: written then renamed)."""
        found = []
        for name in os.listdir(self.records):
            if name.startswith("w_") and not name.endswith(".tmp"):  # one being written
                found.append(dict(zip(FIELDS, read(os.path.join(self.records, name)).split())))
        return found

    def running(self, world, hosts):
        """{host: record} of live workers in a `world`-node round, once
        there is one on each of `hosts`; else None."""
        live = {}
        for w in self.workers():
            if int(w["world_size"]) == world and alive(int(w["pid"])):
                live[int(w["node"])] = w
        return live if set(live) == set(hosts) else None

    def wait_round(self, world, hosts, timeout):
        got = {}

        def formed_or_ended():  # an agent that exited will form nothing
            got["round"] = self.running(world, hosts)
            return got["round"] is not None or any(self.agents[h].poll() is not None
                                                   for h in hosts)
        if not wait_for(formed_or_ended, timeout) or got["round"] is None:
            self.fail("no %d-node round on hosts %s after %.0f s; workers: %s\n%s"
                      % (world, hosts, timeout, self.workers(), self.outputs()))
        return got["round"]

    # ------------------------------------------------------------- the test

    def form_three_and_cut_host_2(self):
        """Three agents form one group; then host 2's link goes down.
        Returns (the 3-node workers by host, when the link went down)."""
        for host in range(3):
            self.start_agent(host)
        three = self.wait_round(3, [0, 1, 2], PATIENCE)
        self.assertEqual(sorted(int(w["group_rank"]) for w in three.values()), [0, 1, 2])
        self.assertEqual(three[0]["group_rank"], "0", "the endpoint's host is group rank 0")
        for w in three.values():
            self.assertEqual((w["group_world_size"], w["master_addr"]),
                             ("3", self.hosts.addrs[0]), w)
        self.assertEqual(sorted(int(w["rank"]) for w in three.values()), [0, 1, 2])
        cut = time.time()
        self.hosts.link(2, up=False)
        return three, cut

    def test_the_others_drop_a_cut_off_host_and_finish(self):
        three, cut = self.form_three_and_cut_host_2()
        two = self.wait_round(2, [0, 1], HEARTBEAT_TIMEOUT_S + PATIENCE)
        reformed = max(float(w["started"]) for w in two.values()) - cut
        self.timing_bound("host 2 cut off -> 2-node workers running (heartbeat timeout %.1f s)"
                          % HEARTBEAT_TIMEOUT_S, reformed, HEARTBEAT_TIMEOUT_S + DETECTION_SLACK_S)
        self.assertEqual((two[0]["group_rank"], two[1]["group_rank"]), ("0", "1"))
        for w in two.values():
            self.assertEqual((w["group_world_size"], w["master_addr"]),
                             ("2", self.hosts.addrs[0]), w)
        for w in three.values():
            if w["node"] != "2":
                self.assertFalse(alive(int(w["pid"])), "a 3-node worker survived the new round")
        for host in (0, 1):
            open(os.path.join(self.records, "finish_%d" % host), "w").close()
        for host in (0, 1):
            self.assertEqual(self.wait_exit(self.agents[host], what="agent %d" % host), 0,
                             self.outputs())

    def test_the_cut_off_agent_ends_naming_the_endpoint(self):
        # It reaches nobody, so it must end by its own timeouts (liveness,
        # store requests, then the join), stopping its workers: left running,
        # they would be a second job believing it has 3 nodes.
        self.form_three_and_cut_host_2()
        bound = HEARTBEAT_TIMEOUT_S + READ_TIMEOUT_S * 4 + JOIN_TIMEOUT_S + PATIENCE
        try:
            rc = self.agents[2].wait(bound)
        except subprocess.TimeoutExpired:
            self.fail("the cut-off agent still running %.0f s after its link went down; "
                      "its output:\n%s" % (bound, self.output(2)))
        err = self.output(2)
        self.assertNotEqual(rc, 0, err)
        self.assertIn(self.endpoint(), err)
        self.assert_agent_messages_clean(err)
        orphans = [w["pid"] for w in self.workers() if w["node"] == "2"]
        self.assertTrue(wait_for(lambda: not any(alive(int(p)) for p in orphans), PATIENCE),
                        "workers of the cut-off agent still running: %s" % orphans)


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
