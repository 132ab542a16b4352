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
   by the heartbeat, after its timeout.
Processes are awaited through files and /proc with generous bounds."""
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from elastic_case import (FAST_DEATH_S, FAST_KEEP_ALIVE, SLACK, ElasticCase,  # noqa: E402
                          of_round)
from procs import wait_for  # noqa: E402
from reserved_port import reserve_port  # noqa: E402

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
