"""A real Slurm cluster on this one host, for the Slurm integration test and
the srun launch benchmark: munged, slurmctld and three slurmd (nodes n1 n2
n3, 2 CPUs each, one partition), started by `with SlurmCluster() as c:` and
torn down completely when the block ends.

How it is built, and why:
- Three nodes on one host: Debian's slurmd runs for a node named on its
  command line (`slurmd -N n2`), and slurm.conf gives each node its own Port=,
  NodeAddr= and spool/pid/log files (%n), so three slurmd run side by side
  with no network namespaces.
- Host names: each slurmd runs in a UTS namespace of its own named after its
  node, so a step's tasks see gethostname() == SLURMD_NODENAME, as on a real
  cluster (torchrun's c10d rendezvous decides from it which agent hosts the
  store).
- Addresses: every node has its own loopback address (127.0.0.11, .12, .13; all of
  127/8 is local on Linux). The process moves into a private mount namespace
  (unshare(CLONE_NEWNS), mounts made private) and bind-mounts a hosts file
  over /etc/hosts there: the daemons, srun, slurmstepd, ddprun and the
  workers (all its descendants) resolve n1..n3 through getaddrinfo, and the
  machine's /etc/hosts is never written. The namespace also names what the
  cluster started: every process in it but the test itself.
- Authentication: munged with a fresh random key, its socket, pid, log and
  seed files in the temporary directory (AuthInfo=socket=... points Slurm at
  it); the system's /etc/munge and any running munged are left alone.
- Ports: slurmctld's and the slurmd's ports must be written into slurm.conf
  before they start. Each is a ReservedPort (bound with SO_REUSEADDR, never
  listened on, held until the end): the kernel gives it to nobody else, and
  Slurm, which sets SO_REUSEADDR on its listening sockets, binds it.
  Job ids start at a FirstJobId chosen so that the master port ddprun derives
  under Slurm (15000 + job id % 10000, Lightning's convention) of each of the
  next `jobs` jobs is held the same way, after checking nothing listens there.
- Cleanup: stop() cancels every job, waits until the queue is empty, stops
  the daemons (SIGTERM, then SIGKILL after a bounded wait), kills whatever
  is left in the namespace (recorded in `leftovers`, which a test asserts
  empty), then munged, and removes the directory. A watchdog (a detached
  process, outside the test's process tree, so a ctest timeout that kills
  the tree does not kill it) does the same with SIGKILL if the test dies
  before stop().

Needs root, the Debian packages slurmctld slurmd slurm-client munge
(scripts/setup-test-deps.sh), and a process that has started no thread
(unshare(CLONE_NEWNS) refuses a process sharing its filesystem state)."""
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import alive, listening, wait_for  # noqa: E402
from reserved_port import ReservedPort  # noqa: E402

PROGRAMS = ("munged", "munge", "slurmctld", "slurmd", "slurmstepd", "srun", "sinfo", "squeue",
            "scancel", "scontrol")
PACKAGES = "slurmctld slurmd slurm-client munge"
SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")

# Bounds against hangs on a loaded machine, never expectations of speed.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
DAEMON_TERM_WAIT = 30.0

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18


def _which(name):
    found = shutil.which(name)
    if found:
        return found
    for d in SBIN:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return None


def missing_programs():
    """The Slurm and MUNGE programs not found here (empty when all are)."""
    return [p for p in PROGRAMS if _which(p) is None]


_PROBE = ("import ctypes,os; libc=ctypes.CDLL(None,use_errno=True);"
          "rc=libc.unshare(%d); os._exit(0 if rc==0 else ctypes.get_errno())"
          % (_CLONE_NEWNS | _CLONE_NEWUTS))


def cannot_run():
    """Why this process cannot run a cluster as root here (not root, no mount
    or UTS namespaces), or None. Missing packages are another matter: see
    missing_programs()."""
    if os.geteuid() != 0:
        return "needs root (runs slurmctld, slurmd and munged, and a private mount namespace)"
    r = subprocess.run([sys.executable, "-c", _PROBE], stdin=subprocess.DEVNULL, timeout=60)
    if r.returncode != 0:
        return "cannot create mount and UTS namespaces here (unshare: %s)" % \
            os.strerror(r.returncode)
    return None


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def _mount_ns(pid="self"):
    try:
        return os.readlink("/proc/%s/ns/mnt" % pid)
    except OSError:
        return None


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


# The watchdog: detaches (a grandchild in its own session, outside the test's
# process tree), prints its pid, and waits for EOF on stdin (the test closed
# it, or died). Then it SIGKILLs every process of the mount namespace it
# shares with the test (itself and the test excepted) until none is left,
# and removes the directory.
_WATCHDOG = r'''
import os, shutil, sys, time
test, tmp = int(sys.argv[1]), sys.argv[2]
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
me = os.getpid()
ns = os.readlink("/proc/self/ns/mnt")
os.write(1, b"%d\n" % me)
os.close(1)
while os.read(0, 4096):
    pass
def ours():
    found = []
    for n in os.listdir("/proc"):
        if n.isdigit() and int(n) not in (me, test):
            try:
                if os.readlink("/proc/%s/ns/mnt" % n) == ns:
                    found.append(int(n))
            except OSError:
                pass
    return found
for _ in range(600):
    left = ours()
    if not left:
        break
    for p in left:
        try:
            os.kill(p, 9)
        except OSError:
            pass
    time.sleep(0.1)
shutil.rmtree(tmp, ignore_errors=True)
'''


class SlurmCluster:
    """A Slurm cluster of `nodes` nodes (n1, n2, ...) with `cpus` CPUs each.

    Not thread-safe; one per process at a time. `jobs` bounds how many jobs
    (srun or salloc) it can run: their derived master ports are reserved.
    Every process this process starts while the cluster runs (srun, and
    anything else) counts as the cluster's: stop() ends them all."""

    def __init__(self, nodes=3, cpus=2, jobs=100):
        self.nodes = ["n%d" % (i + 1) for i in range(nodes)]
        self.addrs = {n: "127.0.0.%d" % (11 + i) for i, n in enumerate(self.nodes)}
        self.cpus = cpus
        self.jobs = jobs
        self.tmp = None
        self.conf = None
        self.first_job_id = None
        self.leftovers = []
        self._ports = []
        self._daemons = {}  # name -> Popen
        self._logs = []
        self._watchdog = None
        self._watchdog_pid = None
        self._hosts_mounted = False
        self._ns = None
        self._launches = 0

    # ------------------------------------------------------------ lifecycle

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def start(self):
        missing = missing_programs()
        if missing:
            raise RuntimeError("Slurm programs not found: %s (install the Debian packages %s, "
                               "e.g. with scripts/setup-test-deps.sh)" % (" ".join(missing),
                                                                          PACKAGES))
        try:
            self._start()
        except BaseException:
            logs = self.daemon_logs()
            self.stop()
            if logs:
                print(logs, file=sys.stderr)
            raise

    def _start(self):
        self.tmp = tempfile.mkdtemp(prefix="ddprun_slurm_")
        # munged wants every directory above its socket searchable by all.
        os.chmod(self.tmp, 0o755)
        for d in ("munge", "state", "spool", "log"):
            os.mkdir(self.path(d), 0o755)
        self._private_hosts()
        self._start_watchdog()
        self._start_munged()
        self.conf = self.path("slurm.conf")
        self._write_conf()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        self._await(lambda: self._ctl_up(), "slurmctld to answer")
        for n in self.nodes:
            self._spawn("slurmd_" + n, ["slurmd", "-D", "-N", n, "-f", self.conf],
                        preexec_fn=_named(n))
        self._await(lambda: self.node_states() == {n: "idle" for n in self.nodes},
                    "the nodes %s to be idle" % ",".join(self.nodes))

    def stop(self):
        """Cancels every job and stops everything; idempotent. Whatever was
        still running in the namespace after the daemons stopped (munged
        aside) is killed and listed in `leftovers`."""
        if self.tmp is None:
            return
        try:
            if "slurmctld" in self._daemons and self._daemons["slurmctld"].poll() is None:
                self._cancel_all()
            for name in [n for n in self._daemons if n != "munged"]:
                self._stop_daemon(name)
            self.leftovers = [(p, _cmdline(p)) for p in self.processes()
                              if p != self._pid_of("munged")]
            self._kill_until_gone([p for p, _ in self.leftovers])
            if "munged" in self._daemons:
                self._stop_daemon("munged")
            self._kill_until_gone(self.processes())
        finally:
            for log in self._logs:
                log.close()
            self._logs = []
            for p in self._ports:
                p.close()
            self._ports = []
            if self._hosts_mounted:
                _libc().umount2(b"/etc/hosts", 0)
                self._hosts_mounted = False
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
            self._stop_watchdog()

    # ---------------------------------------------------------- the pieces

    def path(self, *names):
        return os.path.join(self.tmp, *names)

    def _private_hosts(self):
        """This process (and all it starts) into a private mount namespace in
        which a hosts file naming the nodes covers /etc/hosts."""
        hosts = self.path("hosts")
        try:
            with open("/etc/hosts") as f:
                original = f.read()
        except OSError:
            original = "127.0.0.1 localhost\n"
        with open(hosts, "w") as f:
            f.write(original.rstrip("\n") + "\n# ddprun test Slurm cluster\n")
            for n in self.nodes:
                f.write("%s %s\n" % (self.addrs[n], n))
        os.chmod(hosts, 0o644)
        libc = _libc()
        if self._ns is None:
            _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None),
                   "making the mounts private")
            self._ns = _mount_ns()
        _check(libc.mount(hosts.encode(), b"/etc/hosts", None, _MS_BIND, None),
               "bind-mounting %s over /etc/hosts" % hosts)
        self._hosts_mounted = True

    def _start_watchdog(self):
        self._watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), self.tmp],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._watchdog_pid = int(self._watchdog.stdout.readline())
        self._watchdog.stdout.close()
        self._watchdog.wait()  # the intermediate process; the watchdog runs on

    def _stop_watchdog(self):
        if self._watchdog is None:
            return
        self._watchdog.stdin.close()  # EOF: it finds nothing left and exits
        pid = self._watchdog_pid
        self._watchdog = None
        if not wait_for(lambda: not alive(pid), STOP_TIMEOUT, 0.02):
            raise RuntimeError("the cluster's watchdog (pid %d) did not exit" % pid)

    def _start_munged(self):
        key = self.path("munge", "munge.key")
        with open(key, "wb") as f:
            f.write(secrets.token_bytes(1024))
        os.chmod(key, 0o600)
        self.munge_socket = self.path("munge", "munge.socket")
        self._spawn("munged", ["munged", "--foreground", "--key-file=" + key,
                               "--socket=" + self.munge_socket,
                               "--pid-file=" + self.path("munge", "munged.pid"),
                               "--log-file=" + self.path("log", "munged.log"),
                               "--seed-file=" + self.path("munge", "munged.seed")])
        self._await(lambda: subprocess.run(
            ["munge", "-n", "-S", self.munge_socket], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode == 0,
            "munged to answer on " + self.munge_socket)

    def _reserve(self):
        r = ReservedPort()
        self._ports.append(r)
        return r.port

    def _reserve_job_ports(self):
        """Picks FirstJobId so that 15000 + id % 10000 is held for the next
        `jobs` ids: each port bound (SO_REUSEADDR, not listening) on the
        wildcard address, after checking that nothing listens on it."""
        for _ in range(100):
            first = 1 + secrets.randbelow(10000 - self.jobs)
            held = []
            try:
                for i in range(self.jobs):
                    held.append(_hold_port(15000 + first + i))
            except OSError:
                for s in held:
                    s.close()
                continue
            self._ports.extend(held)
            return first
        raise RuntimeError("found no %d free ports in 15001-24999 for the jobs' master ports"
                           % self.jobs)

    def _write_conf(self):
        host = socket.gethostname().split(".")[0]
        self.first_job_id = self._reserve_job_ports()
        lines = [
            "ClusterName=ddpruntest",
            # slurmctld runs only where its host name is SlurmctldHost.
            "SlurmctldHost=%s(127.0.0.1)" % host,
            "SlurmctldPort=%d" % self._reserve(),
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s" % self.munge_socket,
            "SlurmUser=root",
            "SlurmdUser=root",
            "StateSaveLocation=%s" % self.path("state"),
            "SlurmdSpoolDir=%s" % self.path("spool", "%n"),
            "SlurmctldPidFile=%s" % self.path("slurmctld.pid"),
            "SlurmdPidFile=%s" % self.path("slurmd.%n.pid"),
            "SlurmctldLogFile=%s" % self.path("log", "slurmctld.log"),
            "SlurmdLogFile=%s" % self.path("log", "slurmd.%n.log"),
            # No cgroups in a container: processes are tracked by parentage.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "ReturnToService=2",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MailProg=/bin/true",
            "FirstJobId=%d" % self.first_job_id,
            # Seconds between a job's SIGTERM and its SIGKILL.
            "KillWait=10",
            "InactiveLimit=0",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for n in self.nodes:
            lines.append("NodeName=%s NodeAddr=%s NodeHostname=%s Port=%d CPUs=%d State=UNKNOWN"
                         % (n, self.addrs[n], n, self._reserve(), self.cpus))
            os.mkdir(self.path("spool", n))
        lines.append("PartitionName=test Nodes=%s Default=YES MaxTime=INFINITE State=UP"
                     % ",".join(self.nodes))
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _spawn(self, name, argv, preexec_fn=None):
        log = open(self.path("log", name + ".out"), "w")
        self._logs.append(log)
        argv = [_which(argv[0])] + argv[1:]
        self._daemons[name] = subprocess.Popen(argv, env=self.env(), stdin=subprocess.DEVNULL,
                                               stdout=log, stderr=subprocess.STDOUT,
                                               preexec_fn=preexec_fn)

    def _pid_of(self, name):
        p = self._daemons.get(name)
        return p.pid if p else None

    def _await(self, cond, what):
        def check():
            for name, p in self._daemons.items():
                if p.poll() is not None:
                    raise RuntimeError("%s exited (%s) while waiting for %s"
                                       % (name, p.returncode, what))
            return cond()
        if not wait_for(check, START_TIMEOUT, 0.1):
            raise RuntimeError("no %s after %.0f s" % (what, START_TIMEOUT))

    def _ctl_up(self):
        return self.run(["scontrol", "ping"]).returncode == 0

    def _stop_daemon(self, name):
        p = self._daemons.pop(name)
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(DAEMON_TERM_WAIT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _cancel_all(self):
        ids = self.job_ids()
        if ids:
            self.run(["scancel", *ids])
        if not wait_for(lambda: not self.job_ids(), STOP_TIMEOUT, 0.1):
            print("slurm_cluster: jobs %s still queued after %.0f s; stopping anyway"
                  % (self.job_ids(), STOP_TIMEOUT), file=sys.stderr)

    def _kill_until_gone(self, pids):
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        wait_for(lambda: not any(alive(p) for p in pids), STOP_TIMEOUT, 0.02)

    # ------------------------------------------------------------- queries

    def env(self, extra=None):
        """This environment plus `extra`, for Slurm commands: SLURM_CONF set,
        and no other SLURM_* or PET_* variable (the test may itself run in a
        Slurm job)."""
        e = dict(os.environ, **(extra or {}))
        e = {k: v for k, v in e.items() if not k.startswith(("SLURM_", "PET_"))}
        e["SLURM_CONF"] = self.conf or ""
        return e

    def run(self, argv, timeout=60, **kw):
        """A Slurm command to its end, output captured as text."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw["env"] = self.env(kw.get("env"))
        return subprocess.run(argv, timeout=timeout, **kw)

    def node_states(self):
        r = self.run(["sinfo", "-h", "-N", "-o", "%N %T"])
        if r.returncode != 0:
            return {}
        return dict(line.split() for line in r.stdout.splitlines() if line.strip())

    def job_ids(self):
        r = self.run(["squeue", "-h", "-o", "%i"])
        return r.stdout.split() if r.returncode == 0 else []

    def processes(self):
        """Every live process in this cluster's mount namespace but this one
        and the watchdog: the daemons, slurmstepd, the tasks and theirs."""
        if self._ns is None:
            return []
        me, found = os.getpid(), []
        for n in os.listdir("/proc"):
            if n.isdigit() and int(n) not in (me, self._watchdog_pid):
                if _mount_ns(n) == self._ns and alive(int(n)):
                    found.append(int(n))
        return found

    def step_daemons(self, job_id=None):
        """The pids of the slurmstepd processes (of job `job_id`, or all)."""
        tag = "[%s." % job_id if job_id is not None else "["
        return [p for p in self.processes()
                if _cmdline(p).startswith("slurmstepd:") and tag in _cmdline(p)]

    def daemon_logs(self, lines=30):
        """The last lines of every daemon's log, for a failure message."""
        if self.tmp is None:
            return ""
        out = []
        for name in sorted(os.listdir(self.path("log"))):
            try:
                with open(self.path("log", name), errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
            except OSError:
                continue
            out.append("--- %s:\n%s" % (name, "\n".join(tail)))
        return "\n".join(out)

    # ---------------------------------------------------------------- jobs

    def srun_argv(self, args, minutes=10):
        """srun with a job name of its own (to cancel it by name) and a time
        limit (Slurm's own bound, should the test die)."""
        self._launches += 1
        if self._launches > self.jobs:
            raise RuntimeError("more than %d jobs: make the SlurmCluster with a larger jobs="
                               % self.jobs)
        name = "ddprun_t%d" % self._launches
        return name, [_which("srun"), "--job-name=" + name, "--time=%d" % minutes, *args]

    def srun(self, args, timeout, env=None, **kw):
        """srun ARGS to its end (CompletedProcess, output captured as text).
        Past `timeout` seconds the job is cancelled, srun killed, and
        subprocess.TimeoutExpired raised."""
        name, argv = self.srun_argv(args)
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        p = subprocess.Popen(argv, env=self.env(env), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE if kw["capture_output"] else None,
                             stderr=subprocess.PIPE if kw["capture_output"] else None,
                             text=kw["text"])
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cancel_by_name(name)
            p.kill()
            p.communicate()
            raise
        return subprocess.CompletedProcess(argv, p.returncode, out, err)

    def popen_srun(self, args, env=None, **kw):
        """srun ARGS in the background: (job name, Popen). The caller waits
        for it, and cancels and kills it on the way out."""
        name, argv = self.srun_argv(args)
        kw.setdefault("stdin", subprocess.DEVNULL)
        return name, subprocess.Popen(argv, env=self.env(env), **kw)

    def cancel_by_name(self, name):
        self.run(["scancel", "--name=" + name])

    def scancel(self, *args):
        """scancel ARGS; fails unless it succeeds."""
        r = self.run(["scancel", *args])
        if r.returncode != 0:
            raise RuntimeError("scancel %s failed (%d): %s" % (" ".join(args), r.returncode,
                                                                r.stderr.strip()))
        return r


def _named(node):
    """A preexec_fn giving the child a UTS namespace of its own whose host
    name is `node`."""
    def enter():
        libc = _libc()
        _check(libc.unshare(_CLONE_NEWUTS), "unshare(CLONE_NEWUTS)")
        name = node.encode()
        _check(libc.sethostname(name, len(name)), "sethostname")
    return enter


def _hold_port(port):
    """A socket holding `port` (SO_REUSEADDR, bound on the wildcard address,
    never listening); OSError if something listens there or holds it
    without SO_REUSEADDR."""
    try:
        s = socket.socket(socket.AF_INET6)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        addr = "::"
    except OSError:
        s = socket.socket(socket.AF_INET)
        addr = "0.0.0.0"
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        if listening(port):
            raise OSError("port %d has a listener" % port)
    except OSError:
        s.close()
        raise
    return s
