"""Raw c10d TCPStore requests, byte for byte, in both dialects, and a minimal
client over a plain socket: what the hostile-client tests need to send
requests no well-behaved client would (never reading replies, a request cut
in pieces, one key repeated thousands of times).

The layout is /work/shared/reference/tcpstore-protocol.md (and
src/store/wire.cc): a 1-byte command, then fields; strings are a u64 length
plus the bytes; integers little-endian. The command byte differs between
the 1.13 dialect (LEGACY) and the >= 2.2 dialect (V2, opened by VALIDATE)."""
import select
import socket
import struct
import time

LEGACY = "legacy"
V2 = "v2"

MAGIC = 0x3C85F7CE

_CMDS = {
    LEGACY: dict(SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6,
                 WATCH_KEY=7, DELETE_KEY=8),
    V2: dict(VALIDATE=0, SET=1, COMPARE_SET=2, GET=3, ADD=4, CHECK=5, WAIT=6,
             GETNUMKEYS=7, DELETE_KEY=8, APPEND=9, MULTI_GET=10, MULTI_SET=11,
             CANCEL_WAIT=12, PING=13, QUEUE_PUSH=14, QUEUE_POP=15, QUEUE_LEN=16,
             LIST_KEYS=17, BARRIER=18),
}


def _b(x):
    return x.encode() if isinstance(x, str) else bytes(x)


def string(x):
    """A string field: u64 length, then the bytes."""
    x = _b(x)
    return struct.pack("<Q", len(x)) + x


def u64(n):
    return struct.pack("<Q", n)


def i64(n):
    return struct.pack("<q", n)


class Wire:
    """Encodes requests of one dialect. Each method returns the bytes of one
    request; a command the dialect lacks raises KeyError."""

    def __init__(self, dialect=V2):
        self.dialect = dialect
        self._cmds = _CMDS[dialect]

    def _cmd(self, name):
        return bytes([self._cmds[name]])

    def handshake(self):
        """What a client of this dialect sends first (nothing for 1.13)."""
        return self.validate() if self.dialect == V2 else b""

    def validate(self, magic=MAGIC):
        return self._cmd("VALIDATE") + struct.pack("<I", magic)

    def ping(self, nonce):
        return self._cmd("PING") + struct.pack("<I", nonce)

    def set(self, key, value):
        return self._cmd("SET") + string(key) + string(value)

    def set_header(self, key, value_len):
        """A SET up to its value's length field: the value's bytes follow."""
        return self._cmd("SET") + string(key) + u64(value_len)

    def get(self, key):
        return self._cmd("GET") + string(key)

    def add(self, key, delta):
        return self._cmd("ADD") + string(key) + i64(delta)

    def _key_list(self, name, keys):
        return self._cmd(name) + u64(len(keys)) + b"".join(string(k) for k in keys)

    def check(self, keys):
        return self._key_list("CHECK", keys)

    def wait(self, keys):
        return self._key_list("WAIT", keys)

    def multi_get(self, keys):
        return self._key_list("MULTI_GET", keys)

    def multi_set(self, pairs):
        return (self._cmd("MULTI_SET") + i64(len(pairs))
                + b"".join(string(k) + string(v) for k, v in pairs))

    def num_keys(self):
        return self._cmd("GETNUMKEYS")

    def watch_key(self, key):
        return self._cmd("WATCH_KEY") + string(key)


class RawClient:
    """One connection to a store on 127.0.0.1, with blocking calls bounded by
    `timeout` seconds (socket.timeout, an OSError, past it)."""

    def __init__(self, port, dialect=V2, timeout=30.0, host="127.0.0.1"):
        self.wire = Wire(dialect)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send(self.wire.handshake())

    def send(self, data):
        self.sock.sendall(data)

    def recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        return bytes(buf)

    def set(self, key, value):
        self.send(self.wire.set(key, value))

    def get(self, key):
        self.send(self.wire.get(key))
        (n,) = struct.unpack("<Q", self.recv_exact(8))
        return self.recv_exact(n)

    def add(self, key, delta):
        self.send(self.wire.add(key, delta))
        return struct.unpack("<q", self.recv_exact(8))[0]

    def num_keys(self):
        self.send(self.wire.num_keys())
        return struct.unpack("<q", self.recv_exact(8))[0]

    def check(self, keys):
        self.send(self.wire.check(keys))
        return self.recv_exact(1) == b"\x00"

    def closed_by_server(self, timeout):
        """Reads and discards whatever arrives until the server closes this
        connection (True) or nothing arrives for `timeout` seconds (False)."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(1 << 20):
                pass
            return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self):
        self.sock.close()


def round_trip(port, key="probe", value=b"alive", timeout=30.0, dialect=V2, host="127.0.0.1"):
    """A SET then GET of `key` on a fresh connection; returns what GET read.
    Raises OSError if the server does not serve it within `timeout`."""
    c = RawClient(port, dialect, timeout, host)
    try:
        c.set(key, value)
        return c.get(key)
    finally:
        c.close()


def pump(streams, stall=2.0, deadline=60.0, then_timeout=None):
    """Sends each (socket, bytes) of `streams` concurrently, without blocking
    on any one of them. A socket the server closes is dropped; the pump ends
    when everything is sent, when no socket has taken a byte for `stall`
    seconds (the server stopped reading: backpressure) or at `deadline`.
    The sockets are blocking again afterwards (with `then_timeout`, if given).
    Returns the bytes sent per stream."""
    pending = {}
    for i, (s, data) in enumerate(streams):
        s.setblocking(False)
        pending[s] = [i, memoryview(data), 0]
    sent = [0] * len(streams)
    end = time.monotonic() + deadline
    while pending and time.monotonic() < end:
        _, writable, _ = select.select([], list(pending), [], stall)
        if not writable:
            break
        for s in writable:
            i, mv, off = pending[s]
            try:
                n = s.send(mv[off:off + (256 << 10)])
            except BlockingIOError:
                continue
            except OSError:  # closed by the server
                del pending[s]
                continue
            pending[s][2] = off + n
            sent[i] = off + n
            if off + n == len(mv):
                del pending[s]
    for s, _ in streams:
        try:
            s.setblocking(True)
            if then_timeout is not None:
                s.settimeout(then_timeout)
        except OSError:
            pass
    return sent
