"""Hosts made of Linux network namespaces, for multi-host tests on one machine.

A Cluster is a hub namespace holding a bridge and one namespace per node, each
node joined to the bridge by a veth pair: node i has the address
10.<subnet>.<i + 1>/24 on its end ("eth0"), `lo` up, and reaches every other
node through the bridge as separate machines would through a switch. Every
name carries a random suffix, so concurrent runs never collide; the veth ends
are created directly inside their namespaces (never in the caller's), so no
interface of the machine is touched. destroy() removes everything and is
idempotent; create() registers it with atexit too, so a test that dies still
leaves no namespace behind.

Needs root and iproute2 (`ip`); unavailable() says why not, for a skip."""
import atexit
import os
import secrets
import shutil
import subprocess
import sys

IP = shutil.which("ip") or "/usr/sbin/ip"


# Listens on port 0 at argv[1], prints the port, accepts one connection.
_LISTEN = ("import socket,sys; s=socket.socket(); s.bind((sys.argv[1],0)); s.listen();"
           "print(s.getsockname()[1], flush=True); s.settimeout(60); s.accept()")
_CONNECT = ("import socket,sys; socket.create_connection((sys.argv[1],int(sys.argv[2])),"
            "timeout=float(sys.argv[3]))")


def _ip(*args, check=True):
    """Runs `ip ARGS`; an error names the command and what ip said."""
    r = subprocess.run([IP, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError("ip %s failed (%d): %s" % (" ".join(args), r.returncode,
                                                       r.stderr.strip()))
    return r


def unavailable():
    """None if this process can create network namespaces, else the reason."""
    if os.geteuid() != 0:
        return "needs root (creates network namespaces)"
    if not os.path.exists(IP):
        return "needs iproute2's `ip` (not found)"
    probe = "ddprun_probe_" + secrets.token_hex(4)
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return "cannot create a network namespace here: " + r.stderr.strip()
    _ip("netns", "del", probe, check=False)
    return None


class Cluster:
    def __init__(self, nodes, subnet=None):
        tag = secrets.token_hex(3)
        self.hub = "ddprun_hub_" + tag
        self.names = ["ddprun_n%d_%s" % (i, tag) for i in range(nodes)]
        # Any 10.x.y.0/24 does: the namespaces see nothing but each other.
        self.prefix = subnet or "10.%d.%d" % (200 + secrets.randbelow(50), secrets.randbelow(256))
        self.addrs = ["%s.%d" % (self.prefix, i + 1) for i in range(nodes)]
        self._made = []

    def create(self):
        """Builds the hub, its bridge, the nodes and their links; on an error
        removes what was made and raises."""
        atexit.register(self.destroy)
        try:
            self._add_ns(self.hub)
            _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.hub, "link", "set", "br0", "up")
            for i, ns in enumerate(self.names):
                self._add_node(i, ns)
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_ns(self, ns):
        _ip("netns", "add", ns)
        self._made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def _add_node(self, i, ns):
        self._add_ns(ns)
        port = "v%d" % i
        _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port,
            "netns", self.hub)
        _ip("-n", self.hub, "link", "set", port, "master", "br0")
        _ip("-n", self.hub, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", self.addrs[i] + "/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")

    def exec_prefix(self, i):
        """The argv prefix that runs a command on node i."""
        return [IP, "netns", "exec", self.names[i]]

    def link(self, i, up):
        """Takes node i's link down (cut off from every other node) or up."""
        _ip("-n", self.names[i], "link", "set", "eth0", "up" if up else "down")

    def reaches(self, src, dst, timeout=5.0):
        """Whether node `src` opens a TCP connection to node `dst`: a listener
        on port 0 in dst (its port read back), one connect from src."""
        listener = subprocess.Popen(
            self.exec_prefix(dst) + [sys.executable, "-c", _LISTEN, self.addrs[dst]],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        try:
            port = listener.stdout.readline().strip()
            if not port:
                return False
            r = subprocess.run(self.exec_prefix(src) + [sys.executable, "-c", _CONNECT,
                                                        self.addrs[dst], port, str(timeout)],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
            return r.returncode == 0
        finally:
            listener.kill()
            listener.wait()
            listener.stdout.close()

    def destroy(self):
        """Deletes every namespace made (their links go with them). Processes
        still inside keep a namespace alive until they exit: stop them first."""
        while self._made:
            _ip("netns", "del", self._made.pop(), check=False)
