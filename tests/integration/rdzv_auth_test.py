"""The rendezvous store's shared secret end to end (--rdzv-conf token_file,
docs/rendezvous.md "Authentication"): real ddprun agents of one c10d job on
loopback, the endpoint hosted by agent a, and raw store clients of the test.

- Agents that know the secret form and finish the job; a client that does
  not know it is closed at its first request and leaves the job's state as
  it was (it can neither join, beat nor end rounds).
- An agent given another secret is refused with a message saying so and a
  setup error (exit 3), and the others go on without it.
- The round's worker store stays open: a client without the secret (as
  PyTorch's TCPStore in the workers) is served there.
Every wait is on a fact with a generous bound; nothing asserts a duration."""
import hashlib
import hmac
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from elastic_case import FAST_KEEP_ALIVE, PATIENCE, ElasticCase, of_round  # noqa: E402
from procs import listening, wait_for  # noqa: E402
from reserved_port import reserve_port  # noqa: E402
from storewire import RawClient, round_trip  # noqa: E402

SECRET = b"the-job-secret-of-rdzv-auth-test"
# include/ddprun/store/auth.h: the exchange's keys and the proof's context.
NONCE_KEY, PROOF_KEY, VERDICT_KEY = "ddprun-auth/nonce", "ddprun-auth/proof", "ddprun-auth/verdict"


def proof(secret, nonce, direction):
    return hmac.new(secret, nonce + b"ddprun-store-auth-v1 " + direction,
                    hashlib.sha256).digest()


class AuthenticatedClient(RawClient):
    """A raw client that proves it knows `secret` first, as an agent does."""

    def __init__(self, port, secret):
        super().__init__(port, timeout=PATIENCE)
        nonce = self.get(NONCE_KEY)
        self.set(PROOF_KEY, proof(secret, nonce, b"client"))
        if self.get(VERDICT_KEY) != proof(secret, nonce, b"server"):
            raise AssertionError("the store did not prove it knows the secret")


class RdzvAuthTest(ElasticCase):
    def setUp(self):
        super().setUp()
        self.port = reserve_port(self)
        self.ep = "127.0.0.1:%d" % self.port

    def token_file(self, name, secret):
        path = self.path(name)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(secret + b"\n")
        return path

    def start(self, name, token, nnodes="2:2", host=False):
        conf = FAST_KEEP_ALIVE + ("is_host=%d" % host, "join_timeout=60", "token_file=" + token)
        a = self.agent(name, self.ep, nnodes, self.worker(), conf=conf)
        if host and not wait_for(lambda: listening(self.port) or a.poll() is not None):
            self.fail("agent %s never listened on %d\n%s" % (name, self.port, self.agents_said()))
        return a

    def key(self, name):
        return "/ddprun/%s/%s" % (self.run_id, name)

    def test_a_client_without_the_secret_can_neither_read_nor_change_the_state(self):
        token = self.token_file("job.token", SECRET)
        a = self.start("a", token, host=True)
        b = self.start("b", token)
        starts = self.wait_starts(lambda s: len(of_round(s, 2)) == 2, "round 0 of a and b")
        owner = AuthenticatedClient(self.port, SECRET)
        self.addCleanup(owner.close)
        before = owner.get(self.key("state"))
        self.assertEqual(len(json.loads(before)["p"]), 2, before)

        # A forged round end and an emptied state: SET has no reply, so the
        # server's verdict is the connection being closed.
        rogue = RawClient(self.port, timeout=PATIENCE)
        self.addCleanup(rogue.close)
        rogue.set(self.key("round/0/end"), b"finished")
        rogue.set(self.key("state"), b"{}")
        self.assertTrue(rogue.closed_by_server(PATIENCE), "a client without the secret was served")
        # A plain read is refused the same way.
        reader = RawClient(self.port, timeout=PATIENCE)
        self.addCleanup(reader.close)
        with self.assertRaises(ConnectionError):
            reader.check([self.key("state")])
        self.assertEqual(owner.get(self.key("state")), before, "the state changed")
        self.assertFalse(owner.check([self.key("round/0/end")]), "a forged round end landed")

        # The round's worker store is open to clients without the secret.
        worker_port = int(starts[0]["MASTER_PORT"])
        self.assertEqual(round_trip(worker_port, "/probe", b"ok", timeout=PATIENCE), b"ok")

        self.go()
        self.assert_exits([a, b], 0)
        self.assertIn("unauthenticated client", a.err(), self.agents_said())

    def test_an_agent_with_another_secret_is_refused_and_the_others_go_on(self):
        token = self.token_file("job.token", SECRET)
        other = self.token_file("other.token", b"not-the-job-secret")
        a = self.start("a", token, host=True)
        c = self.start("c", other)
        rc = self.exit_code(c, PATIENCE)
        self.assertEqual(rc, 3, self.agents_said())  # a setup error (docs/agent.md)
        self.assertIn("refused this client's token", c.err(), self.agents_said())
        self.assertNotIn("not-the-job-secret", c.err() + a.err(), "a secret was printed")
        b = self.start("b", token)
        self.wait_starts(lambda s: len(of_round(s, 2, nodes=("a", "b"))) == 2,
                         "round 0 of a and b without c")
        self.assertEqual([s for s in self.starts() if s["NODE"] == "c"], [])
        self.go()
        self.assert_exits([a, b], 0)


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
