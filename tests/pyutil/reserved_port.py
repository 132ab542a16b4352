"""Race-free ports for tests that must name a port before a server starts."""
import socket


class ReservedPort:
    """A port for a store server the test starts, given to nobody else.

    A socket bound to port 0 with SO_REUSEADDR, never listened on, held open
    until close(). While it is bound the kernel hands that port to no other
    bind(0), connect() or bind() without SO_REUSEADDR, but the ddprun store
    server (which sets SO_REUSEADDR) can bind and listen on it. Unlike binding,
    closing and reusing the number, nothing can take the port in between."""

    def __init__(self):
        try:
            self.sock = socket.socket(socket.AF_INET6)
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            addr = "::"
        except OSError:  # no IPv6 here
            self.sock = socket.socket(socket.AF_INET)
            addr = "0.0.0.0"
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((addr, 0))
        self.port = self.sock.getsockname()[1]

    def close(self):
        self.sock.close()


def reserve_port(test):
    """A ReservedPort's number, held until `test` ends."""
    r = ReservedPort()
    test.addCleanup(r.close)
    return r.port
