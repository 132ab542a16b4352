"""The elastic rendezvous against a rogue or broken store client (issue 16):
real ddprun agents of one job (--rdzv-backend=c10d) on loopback around a
separate ddprun-store, trivial shell workers (tests/pyutil/elastic_case.py),
and a raw store client of the test that deletes, overwrites or forges the
job's keys (ddprun/<run id>/...) while the workers run.

What is asserted is the outcome (exit codes, messages, what the store holds
afterwards, which workers ran), each awaited on facts with generous bounds;
never a duration. The time from the tampering (or from the workers' end,
when nothing can notice before) to that outcome is printed as a
"[ figure ]" line for docs/benchmarks.md ("Rendezvous integrity")."""
import json
import os
import signal
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from elastic_case import (FAST_KEEP_ALIVE, PATIENCE, ElasticCase, of_round)  # noqa: E402
from procs import wait_for  # noqa: E402
from storewire import RawClient, string  # noqa: E402

# DELETE_KEY of the >= 2.2 dialect (tests/pyutil/storewire.py's table): the
# key, then an int64 reply.
_DELETE_KEY = 8


class Rogue(RawClient):
    """The test's own client of the job's store: another program on it."""

    def delete(self, key):
        self.send(bytes([_DELETE_KEY]) + string(key))
        return struct.unpack("<q", self.recv_exact(8))[0]

    def value(self, key):
        """The value under `key`, or None when there is none."""
        return self.get(key) if self.check([key]) else None


def figure(what, seconds):
    print("[ figure ] %s: %.2f s" % (what, seconds), flush=True)


class TamperCase(ElasticCase):
    def setUp(self):
        super().setUp()
        self.endpoint_store = self.store()
        self.port = self.endpoint_store.port
        self.ep = "127.0.0.1:%d" % self.port
        self.rogue = Rogue(self.port)
        self.addCleanup(self.rogue.close)

    def key(self, name):
        """A key of this job as every c10d client spells it (leading "/")."""
        return "/ddprun/%s/%s" % (self.run_id, name)

    def state(self):
        raw = self.rogue.value(self.key("state"))
        return None if raw is None else json.loads(raw)

    def pair(self, conf=()):
        """Two agents of a 2:2 job, once both of their workers run (round 0)."""
        conf = FAST_KEEP_ALIVE + ("join_timeout=60",) + tuple(conf)
        agents = [self.agent(n, self.ep, "2:2", self.worker(), conf=conf) for n in "ab"]
        starts = self.wait_starts(lambda s: len(of_round(s, 2)) == 2, "round 0 of a and b")
        return agents, {s["NODE"]: s["GROUP_RANK"] for s in starts}

    def finish_all(self, agents, code, what):
        """Lets the workers finish, then every agent must exit with `code`."""
        t0 = time.monotonic()
        self.go()
        self.assert_exits(agents, code)
        figure(what, time.monotonic() - t0)

    def assert_said(self, agent, text):
        self.assertIn(text, agent.err() + agent.out(), self.agents_said())


class StateUnderARunningRound(TamperCase):
    def test_a_deleted_state_still_lets_the_workers_decide(self):
        agents, _ = self.pair()
        self.assertEqual(self.rogue.delete(self.key("state")), 1)
        # Before issue 16's fix: reportSuccess wrote an empty state, the
        # round never ended, and both agents waited for ever.
        self.finish_all(agents, 0, "state deleted, workers succeed: workers' end to every exit")
        st = self.state()
        self.assertTrue(st["x"], st)  # closed: no job starts again over its keys
        self.assertEqual(len(self.starts()), 2, self.brief(self.starts()))

    def test_an_invalid_state_is_a_clear_error_on_every_agent_and_is_replaced(self):
        agents, _ = self.pair()
        t0 = time.monotonic()
        self.rogue.set(self.key("state"), b"Y2FuaW1hZGFt")
        # The workers are never let go: the agents look at the state once per
        # heartbeat timeout while they run, stop them and exit 1. Before the
        # fix nothing looked, and after the workers' end both waited for ever.
        self.assert_exits(agents, 1)
        figure("junk state while the workers run: tampering to every exit",
               time.monotonic() - t0)
        for a in agents:
            self.assert_said(a, "'Y2FuaW1hZGFt' under ddprun/%s/state" % self.run_id)
        st = self.state()
        self.assertTrue(st["x"], st)
        self.assertIn("Y2FuaW1hZGFt", st["why"])
        # The next agent on this run id finds a closed job, not junk.
        late = self.agent("late", self.ep, "2:2", self.worker(), conf=FAST_KEEP_ALIVE)
        self.assertEqual(self.exit_code(late), 0, self.agents_said())
        self.assert_said(late, "is already over")


class ForgedRoundEnds(TamperCase):
    def forge_then_finish(self, value, what):
        agents, ranks = self.pair()
        end = self.key("round/0/end")
        self.rogue.set(end, value.format(**ranks).encode())
        # The agents find that the state does not back it and delete it (the
        # test goes on either way: before the fix it stayed, and the agents
        # took it as the round's end).
        wait_for(lambda: not self.rogue.check([end]), PATIENCE)
        self.finish_all(agents, 0, what)
        self.assertEqual(len(self.starts()), 2, "no worker was stopped or restarted: %s"
                         % self.brief(self.starts()))
        self.assertEqual(self.rogue.value(end), b"finished")

    def test_a_forged_finished_end_is_ignored(self):
        # Before: the agents ignored "finished" while their workers ran, then
        # waited for ever for an end that had already come.
        self.forge_then_finish("finished", "forged 'finished': workers' end to every exit")

    def test_a_forged_failure_naming_a_node_is_ignored(self):
        # Before: node a took a failure naming its group rank as its own and
        # ignored it; b stopped its workers and waited for a new round.
        self.forge_then_finish("failed:{a}:x", "forged failure of a: workers' end to every exit")


class GroupRankZeroStalls(TamperCase):
    def test_the_others_reform_without_it_instead_of_waiting_read_timeout(self):
        conf = FAST_KEEP_ALIVE + ("join_timeout=60",)  # read_timeout: its default, 60 s
        a = self.agent("a", self.ep, "1:2", self.worker(), conf=conf)
        if not wait_for(lambda: len((self.state() or {}).get("p", [])) == 1, PATIENCE):
            self.fail("a never joined\n" + self.agents_said())
        # Group rank 0 (the first to arrive) stalls before the round that b
        # completes, so it never publishes the round's worker store.
        a.signal(signal.SIGSTOP)
        self.addCleanup(lambda: a.poll() is None and a.signal(signal.SIGKILL))
        t0 = time.monotonic()
        b = self.agent("b", self.ep, "1:2", self.worker(), conf=conf)
        # Before: b waited read_timeout (60 s) for round/0/worker_store, then
        # exited 3. Now heartbeats drop a, the round ends, b re-forms alone.
        starts = self.wait_starts(lambda s: len(of_round(s, 1, nodes=["b"])) == 1,
                                  "b's round without a")
        figure("group rank 0 stopped: b's start to its re-formed round's worker",
               time.monotonic() - t0)
        self.assertEqual([s["NODE"] for s in starts], ["b"], self.brief(starts))
        a.signal(signal.SIGKILL)
        self.finish_all([b], 0, "b alone finishing")


class MismatchedSettings(TamperCase):
    def test_an_agent_with_other_nnodes_is_refused_and_the_others_go_on(self):
        conf = FAST_KEEP_ALIVE + ("join_timeout=60", "last_call_timeout=0.5")
        good = [self.agent(n, self.ep, "3:4", self.worker(), conf=conf) for n in "ab"]
        if not wait_for(lambda: len((self.state() or {}).get("p", [])) == 2, PATIENCE):
            self.fail("a and b never joined\n" + self.agents_said())
        before = self.rogue.value(self.key("state"))
        t0 = time.monotonic()
        odd = self.agent("odd", self.ep, "1:2", self.worker(), conf=conf)
        # Before: it wrote a participant with "s": -1 into the state, both
        # good agents exited 3, and it looped on "could not drop node".
        self.assertEqual(self.exit_code(odd), 2, self.agents_said())
        figure("mismatched --nnodes: start to exit 2", time.monotonic() - t0)
        self.assert_said(odd, "--nnodes 1:2 differs from the job's 3:4 (set by node 127.0.0.1")
        self.assertEqual(self.rogue.value(self.key("state")), before, "the state was touched")
        good.append(self.agent("c", self.ep, "3:4", self.worker(), conf=conf))
        self.wait_starts(lambda s: len(of_round(s, 3)) == 3, "the round of a, b and c")
        self.finish_all(good, 0, "the good agents finishing")


def state_json(participants, round_=0, nnodes="1:2"):
    """A state of the format dynamic_state.h describes (job settings "j"
    matching an agent with --nnodes `nnodes` and FAST_KEEP_ALIVE, default
    last_call_timeout), forming, with the given participants."""
    hb = int(round(float(FAST_KEEP_ALIVE[0].split("=")[1]) * 1000)) * 3
    return json.dumps({"r": round_, "c": False, "x": False, "p": participants, "e": [],
                       "w": [], "d": [], "lc": 0, "rc": 0, "er": -1,
                       "ns": len(participants) + 1,
                       "j": {"n": nnodes, "lc": 30000, "hb": hb, "by": "10.9.9.9_1_0"}},
                      separators=(",", ":")).encode()


class ValuesOutOfBounds(TamperCase):
    def refused(self, value, says, what):
        self.rogue.set(self.key("state"), value)
        t0 = time.monotonic()
        a = self.agent("a", self.ep, "1:2", self.worker(), conf=FAST_KEEP_ALIVE)
        self.assertEqual(self.exit_code(a), 3, self.agents_said())
        figure(what, time.monotonic() - t0)
        self.assert_said(a, says)
        self.assertEqual(self.starts(), [], "no worker may start")

    def test_a_huge_state_is_refused_before_it_is_parsed(self):
        # 700,000 participants, 27 MB: it cost 575 MB per agent to parse.
        ps = [{"id": "10.%d.%d.%d_1_0" % (i >> 16, (i >> 8) & 255, i & 255), "n": 1, "s": i}
              for i in range(700000)]
        value = state_json(ps)
        self.assertGreater(len(value), 25 << 20)
        self.refused(value, "%d bytes under ddprun/%s/state" % (len(value), self.run_id),
                     "27 MB state: start to exit 3")

    def test_a_round_counter_at_int32_max_is_refused(self):
        # Before: accepted, and the next round wrapped negative.
        self.refused(state_json([], round_=2147483647), '"r" = 2147483647 is outside',
                     "round 2^31-1: start to exit 3")

    def test_a_participant_with_2147483647_workers_is_refused(self):
        # Before: WORLD_SIZE=-2147483647.
        value = state_json([{"id": "10.9.9.9_1_0", "n": 2147483647, "s": 0}])
        self.refused(value, '"n" = 2147483647 is outside', "nproc 2^31-1: start to exit 3")


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
