"""The elastic (c10d-style) rendezvous end to end: several real ddprun agents
on loopback, one job (--rdzv-backend=c10d --rdzv-id), trivial shell workers
that record their environment and wait for the test's go file
(tests/pyutil/elastic_case.py).

The endpoint is either hosted by an agent (a port held for the test by
tests/pyutil/reserved_port.py, on which the hosting agent listens) or a
separate ddprun-store listening on port 0. Processes are awaited through
files and /proc with generous bounds. The issue's own timing bounds (a dead
node detected within the heartbeat timeout, a signal during a rendezvous wait
obeyed within a second) are measured and printed as "TIMING" lines, asserted
only with DDPRUN_TIMING_ASSERTS=1 (DdprunCase.timing_bound)."""
import json
import os
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from elastic_case import (FAST_DEATH_S, FAST_KEEP_ALIVE, PATIENCE, SLACK,  # noqa: E402
                          Agent, ElasticCase, WAIT_GO, listener_pid, of_round)
from procs import listening, signal_handled, wait_for  # noqa: E402
from reserved_port import reserve_port  # noqa: E402
from storewire import RawClient  # noqa: E402


class ElasticTest(ElasticCase):
    def hosted_endpoint(self):
        """An endpoint for an agent to host: a port held for this test."""
        self.port = reserve_port(self)
        return "127.0.0.1:%d" % self.port

    def store_endpoint(self):
        """An endpoint served by a separate ddprun-store."""
        self.endpoint_store = self.store()
        self.port = self.endpoint_store.port
        return "127.0.0.1:%d" % self.port

    def wait_ready(self, agent):
        """Until `agent` handles SIGINT (past its setup, in the rendezvous)."""
        if not wait_for(lambda: signal_handled(agent.pid, signal.SIGINT)
                        or agent.poll() is not None):
            self.fail("agent %s never got ready\n%s" % (agent.name, self.agents_said()))
        self.assertIsNone(agent.poll(), self.agents_said())

    def wait_hosting(self, agent):
        """Until `agent` listens on the endpoint's port, and checks it is the one."""
        if not wait_for(lambda: listening(self.port) or agent.poll() is not None):
            self.fail("agent %s never listened on %d\n%s"
                      % (agent.name, self.port, self.agents_said()))
        self.assertEqual(listener_pid(self.port, [agent.pid]), agent.pid, self.agents_said())

    def state(self):
        """The job's state as the endpoint's store holds it, parsed, or None:
        the JSON under "ddprun/<run id>/state" (dynamic_rendezvous.h; its
        fields in src/rendezvous/dynamic_state.h), with the leading "/" that
        PyTorch's clients, and ours, put on every key."""
        key = "/ddprun/%s/state" % self.run_id
        try:
            if getattr(self, "_state_client", None) is None:
                self._state_client = RawClient(self.port)
                self.addCleanup(self._state_client.close)
            c = self._state_client
            return json.loads(c.get(key)) if c.check([key]) else None
        except OSError:  # no store there yet (its agent is starting), or gone
            self._state_client = None
            return None

    def wait_joined(self, n):
        """Until n nodes have joined the forming round (or it completed with
        them): arrival order made certain before the next agent starts."""
        def joined():
            st = self.state()
            return st is not None and len(st.get("p", [])) >= n
        if not wait_for(joined, PATIENCE, interval=0.02):
            self.fail("%d nodes never joined; state %r\n%s" % (n, self.state(), self.agents_said()))

    def wait_round(self, world_size, nodes=None, restart=None, after=()):
        """The starts of a round of `world_size` workers (on `nodes`, at
        restart count `restart`, if given; not among the starts `after`)
        once every one of them started."""
        seen = {s["PID"] for s in after}

        def found(starts):
            return [s for s in of_round(starts, world_size, restart, nodes) if s["PID"] not in seen]
        what = "a round of %d workers (nodes %s, restart %s)" % (world_size, nodes, restart)
        self.wait_starts(lambda s: len(found(s)) == world_size, what)
        return found(self.starts())

    def check_ranks(self, starts, nprocs):
        """One round's starts: ranks 0..W-1 once each, WORLD_SIZE right, each
        node's ranks the contiguous block after the nodes of lower group rank,
        one worker store. `nprocs`: node name -> its --nproc-per-node.
        Returns node name -> group rank."""
        world = sum(nprocs.values())
        self.assertEqual(sorted(s["RANK"] for s in starts), list(range(world)), self.brief(starts))
        group = {}
        for s in starts:
            group.setdefault(s["NODE"], s["GROUP_RANK"])
            self.assertEqual(s["GROUP_RANK"], group[s["NODE"]], self.brief(starts))
            self.assertEqual(s["WORLD_SIZE"], world)
            self.assertEqual(s["GROUP_WORLD_SIZE"], len(nprocs))
            self.assertEqual(s["LOCAL_WORLD_SIZE"], nprocs[s["NODE"]])
            self.assertEqual(s["ROLE_RANK"], s["RANK"])
            self.assertEqual(s["ROLE_WORLD_SIZE"], world)
            self.assertEqual(s["TORCHELASTIC_RUN_ID"], self.run_id)
        self.assertEqual(sorted(group.values()), list(range(len(nprocs))), group)
        for s in starts:
            base = sum(nprocs[n] for n, g in group.items() if g < group[s["NODE"]])
            self.assertEqual(s["RANK"], base + s["LOCAL_RANK"], self.brief(starts))
        self.assertEqual(len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in starts}), 1,
                         self.brief(starts))
        self.assertNotEqual(starts[0]["MASTER_PORT"], self.port)  # the round's own store
        return group


class Forming(ElasticTest):
    def test_three_agents_one_group_host_is_group_rank_0_though_it_starts_last(self):
        ep = self.hosted_endpoint()
        w = self.worker("")
        nprocs = {"b": 1, "c": 3, "a": 2}
        b = self.agent("b", ep, "3", w, nproc=1, conf=["is_host=0"])
        c = self.agent("c", ep, "3", w, nproc=3, conf=["is_host=0"])
        for x in (b, c):  # both connecting (with backoff) before the host exists
            self.wait_ready(x)
        a = self.agent("a", ep, "3", w, nproc=2, conf=["is_host=1"])
        self.assert_exits([a, b, c], 0)
        starts = self.starts()
        self.assertEqual(len(starts), 6, self.brief(starts))
        group = self.check_ranks(starts, nprocs)
        self.assertEqual(group["a"], 0)
        self.assertEqual(sorted(s["RANK"] for s in starts if s["NODE"] == "a"), [0, 1])
        self.assertEqual({s["TORCHELASTIC_RESTART_COUNT"] for s in starts}, {0})
        for x in (a, b, c):
            self.assert_agent_messages_clean(x.err())

    def test_separate_store_endpoint_ranks_in_order_of_arrival(self):
        ep = self.store_endpoint()
        w = self.worker("")
        nprocs = {"a": 2, "b": 1, "c": 3}
        agents = []
        for n, name in enumerate(("a", "b", "c")):
            agents.append(self.agent(name, ep, "3", w, nproc=nprocs[name]))
            if n < 2:
                self.wait_joined(n + 1)  # arrival order: a, b, c
        self.assert_exits(agents, 0)
        starts = self.starts()
        self.assertEqual(len(starts), 6, self.brief(starts))
        group = self.check_ranks(starts, nprocs)
        self.assertEqual(group, {"a": 0, "b": 1, "c": 2})  # no agent hosts: order of arrival
        self.assertTrue(self.endpoint_store.alive(), self.endpoint_store.stderr())

    def test_ipv6_endpoint_and_local_addr_advertised(self):
        # The endpoint as [::1]:PORT, hosted by a; a advertises 127.0.0.2
        # (--local-addr, an IP: used as is), so the round's worker store,
        # hosted by a, is given to every worker at that address; each worker
        # connects to it.
        self.port = reserve_port(self)
        ep = "[::1]:%d" % self.port
        w = self.worker('exec "$PYTHON_EXEC" -c "import os, socket; socket.create_connection('
                        '(os.environ[\'MASTER_ADDR\'], int(os.environ[\'MASTER_PORT\'])), 10)"\n')
        a = self.agent("a", ep, "2", w, conf=["is_host=1"], extra=["--local-addr=127.0.0.2"])
        self.wait_hosting(a)
        b = self.agent("b", ep, "2", w, conf=["is_host=0"])
        self.assert_exits([a, b], 0)
        starts = self.starts()
        self.assertEqual(self.check_ranks(starts, {"a": 1, "b": 1}), {"a": 0, "b": 1})
        self.assertEqual({s["MASTER_ADDR"] for s in starts}, {"127.0.0.2"}, self.brief(starts))


class Membership(ElasticTest):
    def test_kill_9_of_a_node_survivors_reform_at_once_no_orphan_and_it_can_rejoin(self):
        ep = self.hosted_endpoint()
        w = self.worker()
        nprocs = {"a": 2, "b": 2, "c": 1}
        agents = {}
        for n, name in enumerate(("a", "b", "c")):
            agents[name] = self.agent(name, ep, "2:3", w, nproc=nprocs[name], conf=FAST_KEEP_ALIVE)
            if n == 0:  # inferred: the first agent on a loopback endpoint hosts it
                self.wait_hosting(agents[name])
            if n < 2:
                self.wait_joined(n + 1)
        first = self.wait_round(5)
        self.assertEqual(self.check_ranks(first, nprocs), {"a": 0, "b": 1, "c": 2})
        t0 = time.monotonic()
        agents["b"].signal(signal.SIGKILL)  # the middle one: c moves up
        survivors = {"a": 2, "c": 1}
        second = self.wait_round(3, nodes=survivors)
        took = time.monotonic() - t0
        self.timing_bound("kill -9 to the survivors' workers running (heartbeat timeout %.1f s)"
                          % FAST_DEATH_S, took, FAST_DEATH_S + SLACK)
        self.assert_gone([s["PID"] for s in first if s["NODE"] == "b"],
                         "the killed agent's workers")
        self.assert_gone([s["PID"] for s in first if s["NODE"] != "b"], "the first round's workers")
        group = self.check_ranks(second, survivors)
        self.assertEqual(group, {"a": 0, "c": 1})
        self.assertEqual({s["TORCHELASTIC_RESTART_COUNT"] for s in second}, {0})  # not a failure
        # The node restarted (the same command again) rejoins: all three re-form.
        agents["b2"] = self.agent("b2", ep, "2:3", w, nproc=2, conf=FAST_KEEP_ALIVE)
        third = self.wait_round(5, after=first)
        self.assertEqual(self.check_ranks(third, {"a": 2, "c": 1, "b2": 2}),
                         {"a": 0, "c": 1, "b2": 2})
        self.assertEqual({s["TORCHELASTIC_RESTART_COUNT"] for s in third}, {0})
        self.go()
        self.assert_exits([agents["a"], agents["c"], agents["b2"]], 0)
        self.assertEqual(self.exit_code(agents["b"]), -signal.SIGKILL)
        for name in ("a", "c"):
            err = agents[name].err()
            # Its connection to the store closed, or, on a loaded machine, the
            # short heartbeat timeout of this test came first (rdzv_node_loss
            # tests the former with the default timeout).
            self.assertRegex(err, r"\(pid %d\) (is gone: its connection to the rendezvous "
                             r"store closed|missed heartbeats)" % agents["b"].pid, err)
            self.assertIn("not counted as a restart", err)

    def test_a_late_node_joins_a_running_job_through_an_uncounted_restart(self):
        ep = self.hosted_endpoint()
        w = self.worker()
        conf = ["last_call_timeout=1"]
        a = self.agent("a", ep, "2:4", w, conf=conf)
        self.wait_hosting(a)
        b = self.agent("b", ep, "2:4", w, conf=conf)
        first = self.wait_round(2)
        self.check_ranks(first, {"a": 1, "b": 1})
        c = self.agent("c", ep, "2:4", w, conf=conf)
        second = self.wait_round(3)
        group = self.check_ranks(second, {"a": 1, "b": 1, "c": 1})
        self.assertEqual(group, {"a": 0, "b": 1, "c": 2})  # arrival order kept across rounds
        self.assertEqual({s["TORCHELASTIC_RESTART_COUNT"] for s in second}, {0})
        self.assert_gone([s["PID"] for s in first], "the first round's workers")
        self.go()
        self.assert_exits([a, b, c], 0)
        self.assertEqual(len(self.starts()), 5, self.brief(self.starts()))  # nobody restarted twice
        for x in (a, b):
            err = x.err()
            self.assertRegex(err, r"\(pid %d\) is waiting to join" % c.pid, err)
            self.assertIn("not counted as a restart", err)
            self.assertNotIn("warning", err)  # a node arriving is no fault

    def test_sigterm_makes_one_node_leave_and_the_rest_finish(self):
        ep = self.store_endpoint()
        w = self.worker()
        agents = {}
        for n, name in enumerate(("a", "b", "c")):
            agents[name] = self.agent(name, ep, "2:3", w)  # default keep-alives: 15 s to a death
            if n < 2:
                self.wait_joined(n + 1)
        first = self.wait_round(3)
        self.assertEqual(self.check_ranks(first, {"a": 1, "b": 1, "c": 1}),
                         {"a": 0, "b": 1, "c": 2})
        agents["a"].signal(signal.SIGTERM)  # group rank 0, the round's worker store host, leaves
        self.assertEqual(self.exit_code(agents["a"]), 128 + signal.SIGTERM, self.agents_said())
        second = self.wait_round(2)
        regroup = self.check_ranks(second, {"b": 1, "c": 1})
        self.assertEqual(regroup, {"b": 0, "c": 1})
        self.assertEqual({s["TORCHELASTIC_RESTART_COUNT"] for s in second}, {0})
        self.assert_gone([s["PID"] for s in first], "the first round's workers")
        self.go()
        self.assert_exits([agents["b"], agents["c"]], 0)
        for name in ("b", "c"):
            self.assertRegex(agents[name].err(), r"\(pid %d\) left" % agents["a"].pid)


class Signals(ElasticTest):
    def assert_prompt_exit(self, agent, sig):
        t0 = time.monotonic()
        agent.signal(sig)
        rc = self.exit_code(agent)
        took = time.monotonic() - t0
        self.assertEqual(rc, 128 + sig, self.agents_said())
        self.assertIn("received %s while joining the rendezvous" % sig.name, agent.err())
        # The issue: "within a second"; stated with slack for a loaded machine.
        self.timing_bound("%s obeyed during a rendezvous wait" % sig.name, took, SLACK)
        self.assertEqual(self.starts(), [])

    def test_sigint_while_hosting_and_waiting_for_peers(self):
        ep = self.hosted_endpoint()
        a = self.agent("a", ep, "3", self.worker())
        self.wait_hosting(a)
        self.wait_ready(a)
        self.wait_joined(1)
        self.assert_prompt_exit(a, signal.SIGINT)

    def test_sigint_while_waiting_on_a_separate_store(self):
        ep = self.store_endpoint()
        a = self.agent("a", ep, "3:3", self.worker())
        self.wait_ready(a)
        self.wait_joined(1)
        self.assert_prompt_exit(a, signal.SIGINT)
        self.assertTrue(self.endpoint_store.alive())
        self.assertEqual(self.state()["p"], [])  # it left the forming round


class Ending(ElasticTest):
    def test_a_finished_job_is_closed_and_a_late_node_exits_0(self):
        ep = self.store_endpoint()
        w = self.worker("")
        a = self.agent("a", ep, "2", w)
        b = self.agent("b", ep, "2", w)
        self.assert_exits([a, b], 0)
        self.assertEqual(len(self.starts()), 2)
        late = self.agent("late", ep, "2", w)
        self.assertEqual(self.exit_code(late), 0, self.agents_said())
        self.assertIn("ddprun: the job %s is already over" % self.run_id, late.err())
        self.assert_agent_messages_clean(late.err())
        self.assertEqual([s for s in self.starts() if s["NODE"] == "late"], [])

    def test_fewer_than_min_until_join_timeout_is_a_clear_error(self):
        ep = self.store_endpoint()
        a = self.agent("a", ep, "2:3", self.worker(), conf=["join_timeout=1"])
        rc = self.exit_code(a)
        err = a.err()
        self.assertEqual(rc, 3, err)  # docs/cli.md: setup failed
        self.assertIn("ddprun: error:", err)
        self.assertIn("1 of at least 2 nodes joined", err)  # who is there, who is missing
        self.assertIn("(pid %d)" % a.pid, err)
        self.assertIn("1 more needed", err)
        self.assertIn(ep, err)
        self.assert_agent_messages_clean(err)
        self.assertEqual(self.starts(), [])

    def test_the_endpoint_host_killed_the_others_fail_fast_naming_it(self):
        ep = self.hosted_endpoint()
        w = self.worker()
        a = self.agent("a", ep, "2", w, conf=["is_host=1", *FAST_KEEP_ALIVE])
        b = self.agent("b", ep, "2", w, conf=["is_host=0", *FAST_KEEP_ALIVE])
        starts = self.wait_round(2)
        t0 = time.monotonic()
        a.signal(signal.SIGKILL)
        rc = self.exit_code(b)
        took = time.monotonic() - t0
        err = b.err()
        self.assertEqual(rc, 1, err)  # docs/agent.md: the job is over (store lost)
        self.assertIn(ep, err)  # names the endpoint
        self.timing_bound("the endpoint host's kill -9 noticed", took, FAST_DEATH_S + SLACK)
        self.assert_agent_messages_clean(err)
        self.assert_gone([s["PID"] for s in starts], "the workers")


class Restarts(ElasticTest):
    FAIL_ONCE = ('echo x > "$d/started_${TORCHELASTIC_RESTART_COUNT}_$RANK"\n'
                 '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] || exit 0\n'
                 'if [ "$NODE" = b ]; then\n'
                 '  n=0; until [ -e "$d/started_0_0" ]; do sleep 0.05; n=$((n+1)); '
                 '[ $n -lt 2400 ] || exit 90; done\n'
                 '  exit 5\n'
                 'fi\n'
                 'exec sleep 1000\n')
    # Attempt 0 fails on node a, attempt 1 on node b: each node sees only one
    # failure of its own, yet the job-wide budget of 1 is spent.
    FAIL_ON_EACH = ('echo x > "$d/started_${TORCHELASTIC_RESTART_COUNT}_$RANK"\n'
                    'mine=$([ "$NODE" = a ] && echo 0 || echo 1)\n'
                    '[ "$TORCHELASTIC_RESTART_COUNT" = "$mine" ] || exec sleep 1000\n'
                    'n=0; until [ -e "$d/started_${TORCHELASTIC_RESTART_COUNT}_0" ] && '
                    '[ -e "$d/started_${TORCHELASTIC_RESTART_COUNT}_1" ]; do sleep 0.05; '
                    'n=$((n+1)); [ $n -lt 2400 ] || exit 90; done\n'
                    'exit 6\n')

    def start_pair(self, body, hosted=True):
        """Agents a (group rank 0) and b, --max-restarts=1; the endpoint
        hosted by a, or a separate store."""
        ep = self.hosted_endpoint() if hosted else self.store_endpoint()
        w = self.worker(body)
        a = self.agent("a", ep, "2", w, conf=["is_host=1"] if hosted else [],
                       extra=["--max-restarts=1"])
        if not hosted:
            self.wait_joined(1)
        b = self.agent("b", ep, "2", w, conf=["is_host=0"] if hosted else [],
                       extra=["--max-restarts=1"])
        return a, b

    def counts(self):
        return {n: [s["TORCHELASTIC_RESTART_COUNT"] for s in self.starts() if s["NODE"] == n]
                for n in ("a", "b")}

    def test_every_node_sees_the_same_restart_count(self):
        a, b = self.start_pair(self.FAIL_ONCE)
        self.assert_exits([a, b], 0)
        self.assertEqual(self.counts(), {"a": [0, 1], "b": [0, 1]}, self.agents_said())
        self.assertEqual({s["TORCHELASTIC_MAX_RESTARTS"] for s in self.starts()}, {1})

    def test_the_restart_budget_is_job_wide_and_its_end_closes_the_job(self):
        a, b = self.start_pair(self.FAIL_ON_EACH, hosted=False)
        self.assert_exits([a, b], 1)
        self.assertEqual(self.counts(), {"a": [0, 1], "b": [0, 1]}, self.agents_said())
        self.assertIn("exitcode  : 6", b.err())  # b's own failure ended the job
        self.assertIn("the job failed on node 1", a.err())
        self.assertNotIn("Root Cause", a.err())  # the report is the failing node's
        self.assert_gone([s["PID"] for s in self.starts()], "the workers")
        late = self.agent("late", "127.0.0.1:%d" % self.port, "2", self.worker(""))
        self.assertEqual(self.exit_code(late), 0, self.agents_said())
        self.assertIn("ddprun: the job %s is already over" % self.run_id, late.err())

    def test_a_late_node_gets_the_jobs_restart_count(self):
        # a and b fail once (restart 1 of 2); c arrives while restart 1 runs.
        body = ('[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$NODE" = b ] && exit 5\n'
                + WAIT_GO)
        ep = self.hosted_endpoint()
        w = self.worker(body)
        conf = ["last_call_timeout=0.5"]
        a = self.agent("a", ep, "2:3", w, conf=conf + ["is_host=1"], extra=["--max-restarts=2"])
        self.wait_joined(1)
        b = self.agent("b", ep, "2:3", w, conf=conf, extra=["--max-restarts=2"])
        self.wait_round(2, restart=1)
        c = self.agent("c", ep, "2:3", w, conf=conf, extra=["--max-restarts=2"])
        last = self.wait_round(3)
        self.assertEqual({s["TORCHELASTIC_RESTART_COUNT"] for s in last}, {1}, self.brief(last))
        self.go()
        self.assert_exits([a, b, c], 0)
        self.assertIn("the job has used 1 of 2 restarts", c.err())


class OneNode(ElasticTest):
    def test_nnodes_1_with_a_free_port_endpoint(self):
        w = self.worker("")
        a = self.agent("solo", "localhost:0", "1", w, nproc=2)
        self.assertEqual(self.exit_code(a), 0, self.agents_said())
        starts = self.starts()
        self.assertEqual(sorted(s["RANK"] for s in starts), [0, 1], self.brief(starts))
        self.assertEqual({(s["WORLD_SIZE"], s["GROUP_WORLD_SIZE"], s["GROUP_RANK"])
                          for s in starts}, {(2, 1, 0)})

    def test_nnodes_1_to_2_runs_alone_after_the_last_call(self):
        ep = self.hosted_endpoint()
        a = self.agent("solo", ep, "1:2", self.worker(""), conf=["last_call_timeout=1"])
        self.assertEqual(self.exit_code(a), 0, self.agents_said())
        starts = self.starts()
        self.assertEqual(len(starts), 1, self.brief(starts))
        self.assertEqual((starts[0]["WORLD_SIZE"], starts[0]["GROUP_WORLD_SIZE"]), (1, 1))
        self.assertIn("c10d, nodes 1:2", a.err())  # the elastic rendezvous, not the local one


class StaticLiveness(ElasticTest):
    """The same liveness for the static rendezvous: after kill -9 of node 1's
    agent, node 0 ends the round as failed at once (its connection closed),
    and after a stall within the heartbeat timeout (before, it ran on for as
    long as its workers did, as torchrun's static backend does)."""

    def static_agent(self, name, rank, port, worker, conf=FAST_KEEP_ALIVE):
        args = ["--nnodes=2", "--node-rank=%d" % rank, "--master-addr=127.0.0.1",
                "--master-port=%d" % port, "--nproc-per-node=1",
                *(["--rdzv-conf=" + ",".join(conf)] if conf else []), "--no-python", worker]
        out_path, err_path = self.path("agent_%s.out" % name), self.path("agent_%s.err" % name)
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = self.popen(*args, env={"NODE": name}, stdout=out, stderr=err)
        a = Agent(name, p, out_path, err_path)
        self.agents.append(a)
        return a

    def test_kill_9_of_node_1_ends_the_round_on_node_0_at_once(self):
        port = reserve_port(self)
        w = self.worker()
        # The default heartbeat (15 s): only the closed connection explains a
        # prompt end, and the message says which it was.
        a = self.static_agent("a", 0, port, w, conf=())
        b = self.static_agent("b", 1, port, w, conf=())
        first = self.wait_round(2)
        t0 = time.monotonic()
        b.signal(signal.SIGKILL)
        rc = self.exit_code(a)
        took = time.monotonic() - t0
        self.assertEqual(rc, 1, self.agents_said())  # no restarts left: the job failed
        self.timing_bound("static: kill -9 of node 1 to node 0's exit (heartbeat timeout 15 s)",
                          took, SLACK)
        # Heard at once: node 1's connection to node 0's store closed.
        self.assertIn("node 1's agent is gone: its connection to the agent store closed",
                      a.err())
        self.assert_gone([s["PID"] for s in first], "the workers of both nodes")

    def test_a_stalled_node_1_is_found_by_the_heartbeat(self):
        port = reserve_port(self)
        w = self.worker()
        a = self.static_agent("a", 0, port, w)
        b = self.static_agent("b", 1, port, w)
        self.wait_round(2)
        b.signal(signal.SIGSTOP)  # its connections stay open: only its silence tells
        self.addCleanup(lambda: b.poll() is None and b.signal(signal.SIGKILL))
        self.assertEqual(self.exit_code(a), 1, self.agents_said())
        self.assertIn("node 1's agent missed heartbeats", a.err())


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
