"""Every job ends, with the exit code it earned (issue 40): the adversarial
reproducers of three ways a job was lost, as tests with real agents.

1. One lost reply at the end of a job. The last node to report that its
   workers succeeded sends its report; the store applies it and the reply is
   lost to a reset (a StoreProxy in front of that node only). The report must
   survive (it is idempotent and sent again), so that somebody writes the
   round's end and every node exits 0: static and c10d. Before the fix the
   report was an ADD, which a client must not send again, and every node
   waited forever.
2. The same lost reply on the arrival number (c10d, an ADD): the node takes
   another number instead of exiting 3 ("store gone") while the store is
   fine, and the folder skips the number it lost. And a
   request lost with its connection where the client expected no reply (a
   SET): the barrier key of a static node, the worker store's address of
   c10d's group rank 0; both are now compare_sets, answered and sent again.
3. A store restarted empty mid-round (c10d, a ddprun-store behind a proxy
   that then points at a fresh one): the node whose worker then fails must
   not exit 0, nor must any node of the failed job.
4. Two agents with the same address and the same pid (each PID 1 of its own
   PID namespace, as two containers with host networking): they must not
   merge into one node; a 2:2 job forms with two nodes.

Orders that the faults need are made with facts, never sleeps: the node that
must report last has a worker that waits for the go file, created once the
store holds the other node's report."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from ddprun_case import DDPRUN, PATIENCE  # noqa: E402
from elastic_case import EXIT_PATIENCE, WAIT_GO, Agent, ElasticCase, of_round  # noqa: E402
from procs import listening, wait_for  # noqa: E402
from reserved_port import reserve_port  # noqa: E402
from store_proxy import StoreProxy  # noqa: E402
from storewire import RawClient  # noqa: E402

# Node "a" finishes at once; every other node waits for the go file.
A_FIRST = '[ "$NODE" = a ] && exit 0\n' + WAIT_GO


class LostReplyCase(ElasticCase):
    def proxy(self, port):
        p = StoreProxy(port)
        self.addCleanup(p.stop)
        return p

    def client(self, port):
        c = RawClient(port)
        self.addCleanup(c.close)
        return c

    def assert_dropped(self, proxy, what):
        self.assertTrue(proxy.dropped.is_set(),
                        "the proxy never dropped the reply to %s: the test did not "
                        "reproduce the fault\n%s" % (what, self.agents_said()))

    def node_ids(self, store):
        """The c10d state's participants' ids (the state key, JSON)."""
        raw = store.get("/ddprun/%s/state" % self.run_id)
        return [p["id"] for p in json.loads(raw).get("p", [])]

    def reported(self, store, round_, node):
        """Whether `node` (a static rank or a c10d node id) has reported its
        workers' success for `round_`: its own key, or (the old protocol)
        the round's counter."""
        base = "/ddprun/%s/round/%d/done" % (self.run_id, round_)
        return store.check([base + "/" + str(node)]) or store.check([base])


class StaticLostReply(LostReplyCase):
    def agent_static(self, name, rank, port, worker):
        out_path, err_path = self.path("agent_%s.out" % name), self.path("agent_%s.err" % name)
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = self.popen("--nnodes=2", "--node-rank=%d" % rank, "--master-addr=127.0.0.1",
                           "--master-port=%d" % port, "--rdzv-id=%s" % self.run_id,
                           "--rdzv-conf=timeout=60", "--no-python", worker,
                           env={"NODE": name}, stdout=out, stderr=err)
        a = Agent(name, p, out_path, err_path)
        self.agents.append(a)
        return a

    def test_the_last_success_report_survives_a_lost_reply(self):
        port = reserve_port(self)
        worker = self.worker(A_FIRST)
        a = self.agent_static("a", 0, port, worker)  # hosts the agent store
        self.assertTrue(wait_for(lambda: listening(port), PATIENCE), self.agents_said())
        proxy = self.proxy(port)
        proxy.drop_reply_once(b"/round/0/done")  # node 1's report, the last one
        b = self.agent_static("b", 1, proxy.port, worker)
        self.wait_starts(lambda s: len(s) == 2, "both nodes' workers")
        store = self.client(port)
        self.assertTrue(wait_for(lambda: self.reported(store, 0, 0), PATIENCE),
                        "node 0's report never reached the store\n" + self.agents_said())
        self.go()
        self.assert_exits([a, b], 0)
        self.assert_dropped(proxy, "node 1's success report")


    def test_a_barrier_key_lost_with_its_connection_is_sent_again(self):
        port = reserve_port(self)
        worker = self.worker()
        a = self.agent_static("a", 0, port, worker)
        self.assertTrue(wait_for(lambda: listening(port), PATIENCE), self.agents_said())
        proxy = self.proxy(port)
        proxy.drop_request_once(b"/round/0/node/1")  # node 1's arrival at the barrier
        b = self.agent_static("b", 1, proxy.port, worker)
        self.wait_starts(lambda s: len(s) == 2, "both nodes' workers")
        self.go()
        self.assert_exits([a, b], 0)
        self.assert_dropped(proxy, "node 1's barrier key")


class C10dLostReply(LostReplyCase):
    def test_a_worker_store_address_lost_with_its_connection_is_sent_again(self):
        store = self.store()
        worker = self.worker()
        proxy = self.proxy(store.port)
        proxy.drop_request_once(b"/round/0/worker_store")
        # b arrives first at a separate store: group rank 0, which publishes
        # the round's worker store (through the proxy).
        b = self.agent("b", "127.0.0.1:%d" % proxy.port, "2:2", worker)
        client = self.client(store.port)
        self.assertTrue(wait_for(lambda: client.check(["/ddprun/%s/state" % self.run_id]),
                                 PATIENCE), "node b never wrote the state\n" + self.agents_said())
        a = self.agent("a", "127.0.0.1:%d" % store.port, "2:2", worker)
        starts = self.wait_starts(lambda s: len(s) == 2, "both nodes' workers")
        self.assertEqual({s["NODE"]: s["GROUP_RANK"] for s in starts}, {"a": 1, "b": 0})
        self.go()
        self.assert_exits([a, b], 0)
        self.assert_dropped(proxy, "node b's worker store address")

    def test_the_last_success_report_survives_a_lost_reply(self):
        store = self.store()
        worker = self.worker(A_FIRST)
        proxy = self.proxy(store.port)
        proxy.drop_reply_once(b"/round/0/done")
        a = self.agent("a", "127.0.0.1:%d" % store.port, "2:2", worker)
        b = self.agent("b", "127.0.0.1:%d" % proxy.port, "2:2", worker)
        self.wait_starts(lambda s: len(s) == 2, "both nodes' workers")
        client = self.client(store.port)
        a_id = self.node_id(store.port, a)
        self.assertTrue(wait_for(lambda: self.reported(client, 0, a_id), PATIENCE),
                        "node a's report never reached the store\n" + self.agents_said())
        self.go()
        self.assert_exits([a, b], 0)
        self.assert_dropped(proxy, "node b's success report")

    def test_a_lost_arrival_reply_arrives_again(self):
        store = self.store()
        worker = self.worker()
        proxy = self.proxy(store.port)
        a = self.agent("a", "127.0.0.1:%d" % store.port, "2:2", worker)
        client = self.client(store.port)
        self.assertTrue(wait_for(lambda: client.check(["/ddprun/%s/state" % self.run_id]),
                                 PATIENCE), "node a never wrote the state\n" + self.agents_said())
        proxy.drop_reply_once(b"/%s/arrivals" % self.run_id.encode())
        b = self.agent("b", "127.0.0.1:%d" % proxy.port, "2:2", worker)
        starts = self.wait_starts(lambda s: len(of_round(s, world_size=2)) == 2,
                                  "a round of both nodes")
        self.assertEqual(sorted(s["NODE"] for s in starts), ["a", "b"])
        self.go()
        self.assert_exits([a, b], 0)
        self.assert_dropped(proxy, "node b's arrival number")

    def test_no_node_of_a_job_failed_after_a_store_restart_exits_0(self):
        old = self.store()
        proxy = self.proxy(old.port)
        # Node a's worker fails once told to; b's waits. Restarts are left,
        # so only the job's state (gone with the store) can end the job.
        worker = self.worker('if [ "$NODE" = a ]; then\n'
                             '  n=0; until [ -e "$d/fail" ]; do sleep 0.05; n=$((n+1)); '
                             '[ $n -lt 2400 ] || exit 90; done; exit 1\nfi\n' + WAIT_GO)
        endpoint = "127.0.0.1:%d" % proxy.port
        a = self.agent("a", endpoint, "2:2", worker, extra=("--max-restarts=3",))
        b = self.agent("b", endpoint, "2:2", worker, extra=("--max-restarts=3",))
        self.wait_starts(lambda s: len(s) == 2, "both nodes' workers")
        new = self.store()
        proxy.set_upstream(new.port)
        old.stop()  # every connection breaks; each reconnects to the empty store
        self.touch("fail")
        codes = {x.name: self.exit_code(x, PATIENCE) for x in (a, b)}
        self.assertEqual(codes, {"a": 1, "b": 1}, self.agents_said())
        self.assertNotIn("nothing to do", a.err() + b.err())


class DuplicateAddress(LostReplyCase):
    def unshared(self, name, endpoint, worker):
        """An agent that is PID 1 of a PID namespace of its own, with
        --local-addr 127.0.0.1: the same address and pid as its twin."""
        out_path, err_path = self.path("agent_%s.out" % name), self.path("agent_%s.err" % name)
        args = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", DDPRUN,
                "--nnodes=2:2", "--rdzv-backend=c10d", "--rdzv-endpoint=%s" % endpoint,
                "--rdzv-id=%s" % self.run_id, "--local-addr=127.0.0.1", "--no-python", worker]
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = subprocess.Popen(args, env=self.env({"NODE": name}), stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=err)
        self.addCleanup(self._reap, p)
        a = Agent(name, p, out_path, err_path)
        self.agents.append(a)
        return a

    def test_two_pid_1_agents_on_one_address_are_two_nodes(self):
        probe = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
                                "true"], capture_output=True)
        if probe.returncode != 0:
            self.skipTest("cannot make a PID namespace here (needs root and unshare): %s"
                          % probe.stderr.decode(errors="replace").strip())
        store = self.store()
        worker = self.worker()
        endpoint = "127.0.0.1:%d" % store.port
        a = self.unshared("a", endpoint, worker)
        b = self.unshared("b", endpoint, worker)
        starts = self.wait_starts(lambda s: len(of_round(s, world_size=2)) == 2,
                                  "a round of two nodes")
        self.assertEqual(sorted(s["GROUP_RANK"] for s in starts), [0, 1])
        self.assertEqual(sorted(s["NODE"] for s in starts), ["a", "b"])
        ids = self.node_ids(self.client(store.port))
        self.assertEqual(len(set(ids)), 2, ids)
        self.assertTrue(all("_1_" in i for i in ids), "both are pid 1: %r" % ids)
        self.go()
        self.assert_exits([a, b], 0)


if __name__ == "__main__":
    import unittest
    unittest.main(verbosity=2)
