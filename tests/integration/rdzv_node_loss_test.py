"""A node lost from an elastic job (issue 18), real agents on loopback with
the default settings (--max-restarts 0, heartbeat timeout 15 s):

1. kill -9 of a node's agent while the workers run a collective: the
   survivors' workers fail on the broken collective (here: each worker
   watches its round's peers and exits 1 when one dies, as gloo does), the
   rendezvous finds the peer gone (its connection to the store closed), and
   the survivors re-form down to MIN without counting a restart; the job
   finishes with exit 0 and the time from the kill to the survivors'
   workers running is printed (docs/benchmarks.md);
2. the host never waits out its close timeout (set to an hour here) for a
   node that is gone: it exits as soon as the job is over;
3. a node that stalls (SIGSTOP: its connection stays open) is still dropped
   by the heartbeat, after its timeout;
4. (issue 25) a TCP reset of a live node's heartbeat connection (`ss -K`)
   leaves no tombstone once the node beats again: a later failure is a
   failure (exit 1 with --max-restarts 0), not an endless uncounted loop;
   and no client may write a tombstone itself.
Processes are awaited through files and /proc with generous bounds."""
import os
import re
import signal
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from elastic_case import (FAST_DEATH_S, FAST_KEEP_ALIVE, PATIENCE, SLACK, WAIT_GO,  # noqa: E402
                          ElasticCase, of_round)
from procs import wait_for  # noqa: E402
from reserved_port import reserve_port  # noqa: E402
from storewire import RawClient  # noqa: E402

# The workers' collective: until the go file appears, each worker watches the
# other workers of its round (same worker store and world size) and exits 1
# as soon as one of them is gone, the way a gloo all_reduce fails when a
# peer's socket closes.
COLLECTIVE = r'''
# How each worker ended, for the message of a test that fails.
trap 'echo "SIGTERM at $(date +%s%N)" >> "$d/end.$$"; exit 143' TERM
trap 'echo "exit $? at $(date +%s%N)" >> "$d/end.$$"' EXIT
n=0
while [ ! -e "$d/go" ]; do
  for f in "$d"/starts/*; do
    case $f in *.tmp) continue ;; esac
    grep -qx "MASTER_PORT=$MASTER_PORT" "$f" 2>/dev/null || continue
    grep -qx "WORLD_SIZE=$WORLD_SIZE" "$f" || continue
    p=$(sed -n 's/^PID=//p' "$f")
    [ "$p" = "$$" ] && continue
    s=$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)
    [ -e "$d/go" ] && exit 0  # the job is over: peers leave as they see it
    if [ -z "$s" ] || [ "$s" = Z ]; then
      echo "collective broken: peer $p ($f) is gone at $(date +%s%N):" \
           "$(cat "$d/end.$p" 2>/dev/null || echo 'killed')" >&2
      exit 1
    fi
  done
  sleep 0.05; n=$((n+1)); [ $n -lt 2400 ] || exit 90
done
'''

GONE = r"is gone: its connection to the rendezvous store closed"

# A's worker exits 7 once the fail file appears; every other waits for go.
FAIL_ON_A = ('[ "$NODE" = a ] && { n=0; until [ -e "$d/fail" ]; do sleep 0.05; n=$((n+1)); '
             '[ $n -lt 2400 ] || exit 90; done; exit 7; }\n' + WAIT_GO)


def ss_kill_unsupported():
    """Why `ss -K` cannot reset a TCP connection here (None if it can): it
    needs root and a kernel with SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY)."""
    try:
        with socket.socket() as lst:
            lst.bind(("127.0.0.1", 0))
            lst.listen()
            with socket.create_connection(lst.getsockname(), timeout=10) as c:
                srv, _ = lst.accept()
                with srv:
                    r = subprocess.run(["ss", "-tnK", "src", "127.0.0.1", "sport", "=",
                                        ":%d" % c.getsockname()[1]],
                                       capture_output=True, text=True, timeout=30)
                    srv.settimeout(10)
                    try:
                        srv.recv(1)
                    except ConnectionResetError:
                        return None
                    except OSError:
                        pass
                    return "ss -K did not reset a loopback connection (rc %d: %s)" % (
                        r.returncode, r.stderr.strip() or "no error")
    except (OSError, subprocess.SubprocessError) as e:
        return "ss -K is not usable here: %s" % e


def connections(pid, port):
    """{local port: (bytes sent, bytes received)} of process `pid`'s
    established TCP connections to 127.0.0.1:`port`, from `ss -tnpi`."""
    out = subprocess.run(["ss", "-tnpiH", "state", "established", "dst", "127.0.0.1:%d" % port],
                         capture_output=True, text=True, timeout=30).stdout
    found, current = {}, None
    for line in out.splitlines():
        m = re.match(r"\s*\d+\s+\d+\s+127\.0\.0\.1:(\d+)\s+\S+\s+users:.*pid=(\d+),", line)
        if m:
            current = int(m.group(1)) if int(m.group(2)) == pid else None
            if current is not None:
                found[current] = (0, 0)
        elif current is not None:
            sent = re.search(r"bytes_sent:(\d+)", line)
            got = re.search(r"bytes_received:(\d+)", line)
            found[current] = (int(sent.group(1)) if sent else 0, int(got.group(1)) if got else 0)
    return found


class NodeLoss(ElasticCase):
    def hosted_endpoint(self):
        self.port = reserve_port(self)
        return "127.0.0.1:%d" % self.port

    def wait_round(self, world_size, nodes=None, after=()):
        seen = {s["PID"] for s in after}

        def found(starts):
            return [s for s in of_round(starts, world_size, None, nodes) if s["PID"] not in seen]
        self.wait_starts(lambda s: len(found(s)) == world_size,
                         "a round of %d workers on %s" % (world_size, nodes))
        return found(self.starts())

    def heartbeat_connection(self, pid):
        """The local port of the connection agent `pid` beats on: the one that
        keeps sending while it receives next to nothing (a beat is a SET, no
        reply, and a CHECK, a 1-byte reply; the watcher's and the
        rendezvous's reads bring values back)."""
        before = connections(pid, self.port)
        found = []

        def one():
            now = connections(pid, self.port)
            found[:] = [p for p, (sent, got) in now.items() if p in before
                        and sent - before[p][0] >= 200
                        and (got - before[p][1]) * 20 <= sent - before[p][0]]
            return len(found) == 1
        if not wait_for(one, PATIENCE):
            self.fail("no single heartbeat connection of pid %d: %r -> %r\n%s" % (
                pid, before, connections(pid, self.port), self.agents_said()))
        return found[0]

    def reset_heartbeat(self, agent, node_id):
        """Resets `agent`'s heartbeat connection with `ss -K` and returns once
        the store has seen its end (the tombstone was written) and the node
        beats again on a new connection."""
        job = "/ddprun/%s/" % self.run_id
        probe = RawClient(self.port, timeout=PATIENCE)
        self.addCleanup(probe.close)
        if not wait_for(lambda: probe.check([job + "hb/" + node_id]), PATIENCE):
            self.fail("no heartbeat key for %s\n%s" % (node_id, self.agents_said()))
        waiter = RawClient(self.port, timeout=PATIENCE)
        self.addCleanup(waiter.close)
        waiter.send(waiter.wire.wait([job + "gone/" + node_id]))
        hb = self.heartbeat_connection(agent.pid)
        subprocess.run(["ss", "-tnK", "state", "established", "dst", "127.0.0.1:%d" % self.port,
                        "sport", "=", ":%d" % hb], capture_output=True, timeout=30, check=True)
        self.assertEqual(waiter.recv_exact(1), b"\x00", "the store never saw the reset")
        if not wait_for(lambda: probe.check([job + "hb/" + node_id]), PATIENCE):
            self.fail("%s never beat again after the reset\n%s" % (node_id, self.agents_said()))

    def test_a_reset_heartbeat_connection_leaves_no_tombstone_and_a_failure_counts(self):
        why = ss_kill_unsupported()
        if why:
            self.skipTest(why)
        ep = self.hosted_endpoint()
        w = self.worker(FAIL_ON_A)
        a = self.agent("a", ep, "2:2", w, conf=[*FAST_KEEP_ALIVE, "is_host=1"])
        b = self.agent("b", ep, "2:2", w, conf=[*FAST_KEEP_ALIVE, "is_host=0"])
        self.wait_round(2)
        self.reset_heartbeat(b, self.node_id(self.port, b))
        self.touch("fail")
        # Issue 25: the old tombstone made every failure a "departure" of B,
        # uncounted, forever (thousands of worker starts, no agent exited).
        for agent in (a, b):
            self.assertEqual(self.exit_code(agent, PATIENCE), 1,
                             "starts: %d\n%s" % (len(self.starts()), self.agents_said()))
        starts = self.starts()
        self.assertLessEqual(len(starts), 6, self.brief(starts))  # at most one re-form
        self.assertEqual({s["TORCHELASTIC_RESTART_COUNT"] for s in starts}, {0})
        self.assertRegex(a.err(), r"exitcode\s*: 7")

    def test_no_client_can_write_a_tombstone(self):
        ep = self.hosted_endpoint()
        w = self.worker(FAIL_ON_A)
        a = self.agent("a", ep, "2:2", w, conf=[*FAST_KEEP_ALIVE, "is_host=1"])
        b = self.agent("b", ep, "2:2", w, conf=[*FAST_KEEP_ALIVE, "is_host=0"])
        self.wait_round(2)
        gone = "/ddprun/%s/gone/%s" % (self.run_id, self.node_id(self.port, b))
        forger = RawClient(self.port, timeout=PATIENCE)
        self.addCleanup(forger.close)
        forger.set(gone, "")
        self.assertTrue(forger.closed_by_server(PATIENCE),
                        "the store accepted a client's SET of the tombstone " + gone)
        reader = RawClient(self.port, timeout=PATIENCE)
        self.addCleanup(reader.close)
        self.assertFalse(reader.check([gone]))
        self.touch("fail")
        for agent in (a, b):
            self.assertEqual(self.exit_code(agent, PATIENCE), 1,
                             "starts: %d\n%s" % (len(self.starts()), self.agents_said()))
        self.assertEqual(len(self.starts()), 2, self.brief(self.starts()))

    def test_kill_9_of_a_node_default_settings_the_survivors_reform_uncounted(self):
        ep = self.hosted_endpoint()
        w = self.worker(COLLECTIVE)
        agents = {}
        for name in ("a", "b", "c"):  # a hosts the store; c will die
            agents[name] = self.agent(name, ep, "2:3", w, conf=[
                "close_timeout=3600", "is_host=%d" % (name == "a")])
        first = self.wait_round(3)
        t0 = time.monotonic()
        agents["c"].signal(signal.SIGKILL)
        second = self.wait_round(2, nodes=("a", "b"), after=first)
        took = time.monotonic() - t0
        self.timing_bound("default settings: kill -9 of a node's agent to the survivors' "
                          "workers running (torchrun: 44.9 s)", took, 15.0 + SLACK)
        self.assertEqual({s["TORCHELASTIC_RESTART_COUNT"] for s in second}, {0})  # not counted
        self.assertEqual({s["GROUP_WORLD_SIZE"] for s in second}, {2})
        self.assert_gone([s["PID"] for s in first], "the first round's workers")
        self.go()
        # The host exits with the job, not after its hour of close timeout.
        self.assert_exits([agents["a"], agents["b"]], 0)
        self.assertEqual(self.exit_code(agents["c"]), -signal.SIGKILL)
        for name in ("a", "b"):
            err = agents[name].err()
            self.assertRegex(err, r"\(pid %d\) %s" % (agents["c"].pid, GONE), err)
            self.assertIn("not counted as a restart", err)
            self.assertNotIn("restart 1 of", err)
            self.assertNotIn("Root Cause", err)

    def test_the_host_does_not_wait_for_the_goodbye_of_a_node_that_is_gone(self):
        ep = self.hosted_endpoint()
        # a's worker fails for real once told to; b's waits.
        w = self.worker('[ "$NODE" = a ] && { until [ -e "$d/fail" ]; do sleep 0.05; done; '
                        'exit 3; }\n' + COLLECTIVE)
        a = self.agent("a", ep, "2", w, conf=["close_timeout=3600", "is_host=1"])
        b = self.agent("b", ep, "2", w, conf=["close_timeout=3600", "is_host=0"])
        self.wait_round(2)
        b.signal(signal.SIGSTOP)  # it can no longer say goodbye; its connection stays open
        self.addCleanup(lambda: b.poll() is None and b.signal(signal.SIGKILL))
        self.touch("fail")
        # The job is over (no restarts): a reports, then waits for b's goodbye.
        if not wait_for(lambda: "Root Cause" in a.err() or a.poll() is not None):
            self.fail("a never reported its failure\n" + self.agents_said())
        self.assertIsNone(a.poll(), "a exited without waiting for a stalled peer\n"
                          + self.agents_said())
        b.signal(signal.SIGKILL)  # now its connection closes: a stops waiting
        self.assertEqual(self.exit_code(a), 1, self.agents_said())

    def test_a_stalled_node_is_dropped_by_the_heartbeat(self):
        ep = self.hosted_endpoint()
        w = self.worker()  # waits for go: nothing breaks on a stall
        agents = {n: self.agent(n, ep, "2:3", w, conf=[*FAST_KEEP_ALIVE, "is_host=%d" % (n == "a")])
                  for n in ("a", "b", "c")}
        first = self.wait_round(3)
        t0 = time.monotonic()
        agents["c"].signal(signal.SIGSTOP)
        self.addCleanup(lambda: agents["c"].poll() is None and agents["c"].signal(signal.SIGKILL))
        self.wait_round(2, nodes=("a", "b"), after=first)
        self.timing_bound("a stalled node dropped by the heartbeat (timeout %.1f s)"
                          % FAST_DEATH_S, time.monotonic() - t0, FAST_DEATH_S + SLACK)
        self.go()
        self.assert_exits([agents["a"], agents["b"]], 0)
        for n in ("a", "b"):
            self.assertRegex(agents[n].err(), r"\(pid %d\) missed heartbeats" % agents["c"].pid)


if __name__ == "__main__":
    from testmain import main
    main()
