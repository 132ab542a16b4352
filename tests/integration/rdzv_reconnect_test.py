"""An agent survives a reset of any of its store connections (issue 25, fault
2; docs/rendezvous.md "Reconnects"), and the token rules at connect time.

Real ddprun agents of one c10d job on loopback (the endpoint hosted by agent
a). Agent b runs with LOGLEVEL=debug, so each of its store clients logs its
local address at every (re)connect; the test destroys one kind of them with
`ss -K` (the kernel aborts the socket: the agent's next use sees "Software
caused connection abort", the store a reset) while the workers run:
- the rendezvous client (the first "rendezvous" connection: it is idle while
  workers run and reconnects at its next request, the round's report),
- the round watcher (the latest "rendezvous" connection, blocked in a WAIT),
- both heartbeat connections (beats and peer reads).
Each time b reconnects, the job finishes (exit 0 on both) and b never says
the store is gone. `ss -K` needs root and a kernel with INET_DIAG_DESTROY:
without them the reset tests are skipped, saying why.
Then: a node with a token refuses a store that requires none (exit 3) unless
$DDPRUN_RDZV_ALLOW_OPEN_STORE=1, and a node without a token against a store
that requires one exits 3 saying so. Every wait is on a fact with a bound."""
import os
import re
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from elastic_case import FAST_KEEP_ALIVE, PATIENCE, Agent, ElasticCase, of_round  # noqa: E402
from procs import listening, wait_for  # noqa: E402
from reserved_port import reserve_port  # noqa: E402

SECRET = b"the-job-secret-of-rdzv-reconnect-test"


def ss_kill_works():
    """None if `ss -K` destroys a TCP socket here, else why not."""
    if os.geteuid() != 0:
        return "ss -K needs root"
    socks = []
    try:
        srv = socket.socket()
        socks.append(srv)
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        cli = socket.create_connection(srv.getsockname(), timeout=5)
        socks.append(cli)
        socks.append(srv.accept()[0])
        port = cli.getsockname()[1]
        try:
            r = subprocess.run(["ss", "-tnK", "src", "127.0.0.1", "sport", "=", ":%d" % port],
                               capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as e:
            return "cannot run ss: %s" % e
        try:
            cli.send(b"x")
        except OSError:
            return None  # aborted: it works
        return "ss -K did not destroy the socket (rc %d: %s; kernel without INET_DIAG_DESTROY?)" % (
            r.returncode, r.stderr.decode(errors="replace").strip())
    finally:
        for s in socks:
            s.close()


class RdzvReconnectTest(ElasticCase):
    def setUp(self):
        super().setUp()
        self.port = reserve_port(self)
        self.ep = "127.0.0.1:%d" % self.port

    def start(self, name, host=False, conf=(), env=None, nnodes="2:2", keep_alive=FAST_KEEP_ALIVE):
        conf = keep_alive + ("is_host=%d" % host, "join_timeout=60") + tuple(conf)
        a = self.agent(name, self.ep, nnodes, self.worker(), conf=conf, env=env)
        if host and not wait_for(lambda: listening(self.port) or a.poll() is not None, PATIENCE):
            self.fail("agent %s never listened on %d\n%s" % (name, self.port, self.agents_said()))
        return a

    def connects(self, agent):
        """(kind, local port, again) of every store (re)connect the agent logged."""
        pat = re.compile(r"store: (\w[\w ]*?) client 127\.0\.0\.1:(\d+) connected to "
                         r"127\.0\.0\.1:%d( again)?" % self.port)
        return [(m.group(1), int(m.group(2)), bool(m.group(3))) for m in pat.finditer(agent.err())]

    def kill(self, port):
        r = subprocess.run(["ss", "-tnK", "src", "127.0.0.1", "sport", "=", ":%d" % port],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(":%d" % port, r.stdout, "no connection from port %d was killed" % port)

    def two_agents_running(self, keep_alive=FAST_KEEP_ALIVE):
        a = self.start("a", host=True, keep_alive=keep_alive)
        b = self.start("b", env={"LOGLEVEL": "debug"}, keep_alive=keep_alive)
        self.wait_starts(lambda s: len(of_round(s, 2)) == 2, "round 0 of a and b")
        # The round watcher connects right after the join, the heartbeat's
        # reader once it has peers to watch: wait for their lines.
        def kinds():
            return [k for k, _, _ in self.connects(b)]
        if not wait_for(lambda: kinds().count("rendezvous") >= 2 and
                        kinds().count("heartbeat") >= 2, PATIENCE):
            self.fail("b never logged its round watcher's and heartbeat reader's connections\n"
                      + self.agents_said())
        return a, b

    def finish_cleanly(self, a, b, reconnected):
        self.go()
        self.assert_exits([a, b], 0)
        said = self.agents_said()
        self.assertNotIn("gone or unreachable", b.err(), said)
        again = [c for c in self.connects(b) if c[2]]
        for kind in reconnected:
            self.assertTrue([c for c in again if c[0] == kind],
                            "b's %s client never reconnected\n%s" % (kind, said))
        # The job went on: one round, no restart.
        self.assertEqual(sorted(s["NODE"] for s in self.starts()), ["a", "b"], said)

    def require_ss(self):
        why = ss_kill_works()
        if why:
            self.skipTest(why)

    def test_the_rendezvous_client_survives_a_reset(self):
        self.require_ss()
        a, b = self.two_agents_running()
        first = [c for c in self.connects(b) if c[0] == "rendezvous"][0]
        self.kill(first[1])
        self.finish_cleanly(a, b, ["rendezvous"])

    def test_the_round_watcher_survives_a_reset(self):
        self.require_ss()
        a, b = self.two_agents_running()
        latest = [c for c in self.connects(b) if c[0] == "rendezvous"][-1]
        self.kill(latest[1])
        if not wait_for(lambda: len([c for c in self.connects(b) if c[2]]) >= 1, PATIENCE):
            self.fail("b's round watcher did not reconnect\n" + self.agents_said())
        self.assertIsNone(b.poll(), self.agents_said())
        self.finish_cleanly(a, b, ["rendezvous"])

    def test_the_heartbeat_connections_survive_a_reset(self):
        self.require_ss()
        # A reset heartbeat connection reconnects at its next beat; the host
        # drops a node only if it does not beat again within the heartbeat
        # timeout of the close. A 10 s timeout makes "b beats again in time"
        # a fact on any machine, loaded or not.
        a, b = self.two_agents_running(("keep_alive_interval=1", "keep_alive_max_attempt=10"))
        beats = [c for c in self.connects(b) if c[0] == "heartbeat"]
        self.assertEqual(len(beats), 2, self.agents_said())
        for c in beats:
            self.kill(c[1])
        if not wait_for(lambda: len([c for c in self.connects(b)
                                     if c[0] == "heartbeat" and c[2]]) >= 2, PATIENCE):
            self.fail("b's heartbeat clients did not both reconnect\n" + self.agents_said())
        self.assertIn("set its 1 own key(s) again", b.err(), self.agents_said())
        self.assertIsNone(b.poll(), self.agents_said())
        # The store ends the old connection's lease when it sees the reset;
        # b owns its key again on the new connection, and the job goes on
        # without re-forming.
        self.finish_cleanly(a, b, ["heartbeat"])

    # The static rendezvous (--master-addr/--master-port): a blip that resets
    # every client connection to node 0's agent store at once (both agents'
    # rendezvous clients, heartbeats and watchers).

    def static_agent(self, name, rank, env=None):
        args = ["--nnodes=2", "--node-rank=%d" % rank, "--master-addr=127.0.0.1",
                "--master-port=%d" % self.port, "--nproc-per-node=1",
                "--rdzv-id=%s" % self.run_id,
                # 10 s of heartbeat timeout: the reconnect's budget and the
                # time a node whose connection closed has to beat again.
                "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=10"]
        out_path, err_path = self.path("agent_%s.out" % name), self.path("agent_%s.err" % name)
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = self.popen(*args, "--no-python", self.worker(),
                           env=dict(env or {}, NODE=name, LOGLEVEL="debug"),
                           stdout=out, stderr=err)
        a = Agent(name, p, out_path, err_path)
        self.agents.append(a)
        return a

    def test_a_static_job_survives_a_reset_of_every_store_connection(self):
        self.require_ss()
        a = self.static_agent("a", 0)
        if not wait_for(lambda: listening(self.port) or a.poll() is not None, PATIENCE):
            self.fail("node 0 never listened on %d\n%s" % (self.port, self.agents_said()))
        b = self.static_agent("b", 1)
        self.wait_starts(lambda s: len(s) == 2, "both nodes' workers")
        # Every client side of a connection to the agent store, both agents'.
        r = subprocess.run(["ss", "-tnK", "dst", "127.0.0.1", "dport", "=", ":%d" % self.port],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        killed = r.stdout.count(":%d" % self.port)
        self.assertGreaterEqual(killed, 4, "too few connections reset:\n" + r.stdout)
        if not wait_for(lambda: "connected to 127.0.0.1:%d again" % self.port in b.err() and
                        "set its 1 own key(s) again" in b.err(), PATIENCE):
            self.fail("node 1 never reconnected and beat again\n" + self.agents_said())
        self.go()
        self.assert_exits([a, b], 0)
        said = self.agents_said()
        for agent in (a, b):
            self.assertNotIn("gone or unreachable", agent.err(), said)
            self.assertNotIn("ending the round", agent.err(), said)
        # One round: the workers ran on, nothing restarted.
        self.assertEqual(sorted(s["NODE"] for s in self.starts()), ["a", "b"], said)

    # Authentication at connect time.

    def token_file(self, name, secret):
        path = self.path(name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(secret + b"\n")
        return path

    def test_a_node_with_a_token_refuses_a_store_that_requires_none(self):
        store = self.store()  # a ddprun-store without a token
        self.ep = "127.0.0.1:%d" % store.port
        token = "token_file=" + self.token_file("job.token", SECRET)
        c = self.start("c", conf=(token,), nnodes="1")
        self.assertEqual(self.exit_code(c, PATIENCE), 3, self.agents_said())
        self.assertIn("requires no token", c.err(), self.agents_said())
        self.assertIn("DDPRUN_RDZV_ALLOW_OPEN_STORE", c.err(), self.agents_said())
        self.assertEqual(self.starts(), [])
        # Opted out: it runs, with a warning.
        d = self.start("d", conf=(token,), nnodes="1", env={"DDPRUN_RDZV_ALLOW_OPEN_STORE": "1"})
        self.wait_starts(lambda s: len(of_round(s, 1, nodes=("d",))) == 1, "d's worker")
        self.go()
        self.assert_exits([d], 0)
        self.assertIn("requires no token", d.err(), self.agents_said())

    def test_a_node_without_a_token_is_told_the_store_requires_one(self):
        token = "token_file=" + self.token_file("job.token", SECRET)
        a = self.start("a", host=True, conf=(token,))
        c = self.start("c")  # no token
        self.assertEqual(self.exit_code(c, PATIENCE), 3, self.agents_said())
        self.assertIn("requires a token", c.err(), self.agents_said())
        self.assertIn("token_file=", c.err(), self.agents_said())
        self.assertNotIn("gone or unreachable", c.err(), self.agents_said())
        a.signal(15)
        self.exit_code(a, PATIENCE)


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
