"""ddprun-store with a shared secret (--token-file), over real sockets: the
challenge-response of include/ddprun/store/auth.h done by hand in both wire
dialects, a raw client that skips it, and PyTorch's own TCPStore (1.13 from
Debian, 2.x from the test venv, where installed), which knows no token and
must be refused. Nothing asserts on durations; every wait is bounded."""
import hashlib
import hmac
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
from ddprun_case import BIN, DDPRUN, PATIENCE  # noqa: E402
from store_server import StoreServer  # noqa: E402
from storewire import LEGACY, V2, RawClient  # noqa: E402

SECRET = b"a-shared-secret-for-the-auth-test"
NONCE_KEY, PROOF_KEY, VERDICT_KEY = "ddprun-auth/nonce", "ddprun-auth/proof", "ddprun-auth/verdict"
TORCH_PYTHONS = ["/usr/bin/python3",
                 os.path.join(os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2"),
                              "bin", "python")]


def proof(nonce, direction):
    return hmac.new(SECRET, nonce + b"ddprun-store-auth-v1 " + direction, hashlib.sha256).digest()


def authenticate(c):
    """The client's half of the exchange; returns the server's proof."""
    nonce = c.get(NONCE_KEY)
    c.set(PROOF_KEY, proof(nonce, b"client"))
    return nonce, c.get(VERDICT_KEY)


class StoreAuthTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_store_auth_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        token = os.path.join(self.tmp, "token")
        with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(SECRET + b"\n")
        self.token = token
        self.srv = self.store()

    def store(self, *args):
        srv = StoreServer(BIN, self.tmp, "--token-file", self.token, *args, capped=False)
        self.addCleanup(srv.stop)
        return srv

    def client(self, dialect=V2):
        c = RawClient(self.srv.port, dialect, timeout=PATIENCE)
        self.addCleanup(c.close)
        return c

    def test_the_exchange_by_hand_in_both_dialects(self):
        for dialect in (LEGACY, V2):
            c = self.client(dialect)
            nonce, verdict = authenticate(c)
            self.assertEqual(len(nonce), 32)
            self.assertEqual(verdict, proof(nonce, b"server"), "the server proves the secret")
            c.set("/k-" + dialect, b"v")
            self.assertEqual(c.get("/k-" + dialect), b"v")
        self.assertNotEqual(self.client().get(NONCE_KEY), self.client().get(NONCE_KEY),
                            "each connection gets its own nonce")

    def test_a_client_that_skips_authentication_is_closed_and_logged(self):
        owner = self.client()
        authenticate(owner)
        raw = self.client()
        raw.set("/k", b"intruder")
        self.assertTrue(raw.closed_by_server(PATIENCE), "an unauthenticated SET was served")
        wrong = self.client(LEGACY)
        nonce = wrong.get(NONCE_KEY)
        wrong.set(PROOF_KEY, hmac.new(b"guess", nonce, hashlib.sha256).digest())
        self.assertTrue(wrong.closed_by_server(PATIENCE), "a wrong proof was accepted")
        self.assertEqual(owner.get("/k"), b"", "the unauthenticated SET was applied")
        self.assertEqual(self.srv.terminate(), 0)
        err = self.srv.stderr()
        port = raw.sock.getsockname()[1]
        self.assertIn("unauthenticated client", err)
        self.assertIn(":%d" % port, err, "the log line names the peer")
        self.assertNotIn(SECRET.decode(), err)

    def test_a_silent_connection_is_closed_after_the_auth_timeout(self):
        self.srv.stop()
        self.srv = self.store("--auth-timeout", "5")
        owner = self.client()
        authenticate(owner)
        silent = self.client()  # VALIDATE only, then nothing
        self.assertTrue(silent.closed_by_server(PATIENCE),
                        "an unauthenticated connection outlived --auth-timeout")
        owner.set("/still", b"here")  # an authenticated one is never timed out
        self.assertEqual(owner.get("/still"), b"here")
        self.assertEqual(self.srv.terminate(), 0)
        self.assertIn("did not authenticate in time", self.srv.stderr())

    def test_pytorch_tcpstore_without_the_token_is_refused(self):
        script = r'''
import datetime, sys
import torch.distributed as dist
try:
    s = dist.TCPStore("127.0.0.1", %d, is_master=False, timeout=datetime.timedelta(seconds=10))
    s.set("torch-key", "v")
    s.get("torch-key")
except Exception as e:
    print("refused:", type(e).__name__, e)
    sys.exit(0)
sys.exit("served")
''' % self.srv.port
        ran = 0
        for py in TORCH_PYTHONS:
            if not os.path.exists(py) or subprocess.run(
                    [py, "-c", "import torch.distributed"], capture_output=True).returncode:
                continue
            ran += 1
            r = subprocess.run([py, "-c", script], capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, "%s: %s %s" % (py, r.stdout, r.stderr[-2000:]))
            owner = self.client()
            authenticate(owner)
            self.assertEqual(owner.get("/torch-key"), b"", py)
        if not ran:
            self.skipTest("no PyTorch installed (scripts/setup-test-deps.sh)")


class TokenFileRefusals(unittest.TestCase):
    """What may not be a token file: a FIFO (open(2) would wait for a writer
    forever) and a file its group can read (docs/rendezvous.md: 0600 or
    stricter). Both programs that read one exit 2 at once, naming the file;
    a program still running after PATIENCE is the fault."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_token_file_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def fifo(self):
        path = os.path.join(self.tmp, "token.fifo")
        os.mkfifo(path, 0o600)
        return path

    def group_readable(self):
        path = os.path.join(self.tmp, "token")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(SECRET + b"\n")
        os.chmod(path, 0o640)
        return path

    def refused(self, argv, *needles):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                               timeout=PATIENCE, env=dict(os.environ, TMPDIR=self.tmp))
        except subprocess.TimeoutExpired:
            self.fail("%s still running after %.0f s (blocked on the token file, or "
                      "serving with it)"
                      % (os.path.basename(argv[0]), PATIENCE))
        self.assertEqual(r.returncode, 2, r.stderr)
        for n in needles:
            self.assertIn(n, r.stderr)
        self.assertNotIn(SECRET.decode(), r.stderr)

    def store(self, token):
        return [os.path.join(BIN, "ddprun-store"), "--port", "0", "--token-file", token]

    def agent(self, token):
        return [DDPRUN, "--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
                "--rdzv-conf", "token_file=" + token, "--no-python", "true"]

    def test_a_fifo_is_refused_by_the_store_and_the_agent(self):
        fifo = self.fifo()
        self.refused(self.store(fifo), "'%s' is not a regular file (a FIFO)" % fifo)
        self.refused(self.agent(fifo), "'%s' is not a regular file (a FIFO)" % fifo)

    def test_a_group_readable_file_is_refused_naming_the_mode_and_the_fix(self):
        token = self.group_readable()
        for argv in (self.store(token), self.agent(token)):
            self.refused(argv, "has mode 0640", "chmod 600 '%s'" % token)


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
