"""A base class for tests that run several `ddprun` agents of one elastic job
(--rdzv-backend=c10d) on this machine, with trivial shell workers.

Every agent runs with NODE=<its name> in its environment, which its workers
inherit. Each worker, as it starts, records its environment in a file of its
own under <tmp>/starts/ (written then renamed, so a file seen is complete);
the test reads those records to learn who ran, with which ranks, in which
round. The default worker then waits for the file <tmp>/go, which the test
creates when it wants the job to finish (a bounded wait: a worker gives up
with exit 90 after two minutes, so a broken test leaves nothing running).

Agents write their stdout and stderr to files (read at any time, never a pipe
that could fill up); every agent and every worker recorded is killed and
reaped when the test ends, whatever happened."""
import json
import os
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddprun_case import BIN, PATIENCE, SANITIZED, DdprunCase, read  # noqa: E402
from procs import alive, kill_all, listening_inodes, wait_for  # noqa: E402
from store_server import StoreServer  # noqa: E402
from storewire import RawClient  # noqa: E402

# The environment a worker records (plus NODE, PID and T, its start time in ns).
RECORDED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID")

# Seconds a test grants beyond a bound the issue states (a loaded 2-core
# machine, other engineers' builds); twice that under AddressSanitizer.
SLACK = 10.0 if SANITIZED else 5.0

# Keep-alives short enough to detect a dead node in well under a second:
# a node silent for 0.2 s * 3 is dead (0.5 s * 3 under AddressSanitizer,
# whose slower agents must not be taken for dead ones).
_INTERVAL = 0.5 if SANITIZED else 0.2
FAST_KEEP_ALIVE = ("keep_alive_interval=%g" % _INTERVAL, "keep_alive_max_attempt=3")
FAST_DEATH_S = 3 * _INTERVAL

# How long an agent may take to exit once its job is over: a bound against
# hangs, below the default close_timeout (30 s) on purpose, so that an agent
# that waits out the close timeout at the end of a job (a store already gone)
# fails the test instead of passing by a hair.
EXIT_PATIENCE = 20.0


class Agent:
    """One ddprun agent started by ElasticCase.agent()."""

    def __init__(self, name, proc, out_path, err_path):
        self.name = name
        self.proc = proc
        self.pid = proc.pid
        self.out_path = out_path
        self.err_path = err_path

    def out(self):
        return read(self.out_path)

    def err(self):
        return read(self.err_path)

    def poll(self):
        return self.proc.poll()

    def signal(self, sig):
        self.proc.send_signal(sig)

    def describe(self):
        rc = self.proc.poll()
        state = "running" if rc is None else "exit %d" % rc
        return "agent %s (%s):\n--- stderr\n%s--- stdout\n%s" % (
            self.name, state, self.err(), self.out())


class ElasticCase(DdprunCase):
    def setUp(self):
        super().setUp()
        os.mkdir(self.path("starts"))
        self.run_id = "job-" + uuid.uuid4().hex[:8]
        self.agents = []
        self.addCleanup(self._kill_workers)  # runs after the agents are reaped

    # Workers.

    def worker(self, body=None):
        """A /bin/sh worker that records its start, then runs `body` (default:
        wait for the go file, then exit 0). `$d` is the test's directory."""
        prelude = ('d="%s"\n'
                   'f="$d/starts/$NODE.$$"\n'
                   '{ echo "NODE=$NODE"; echo "PID=$$"; echo "T=$(date +%%s%%N)"\n'
                   '  env | grep -E "^(%s)="; } > "$f.tmp" && mv "$f.tmp" "$f"\n'
                   % (self.tmp, "|".join(RECORDED)))
        return self.script(prelude + (body if body is not None else WAIT_GO))

    def go(self):
        """Lets every waiting worker (and every later one) exit 0."""
        self.touch("go")

    def starts(self):
        """Every worker start recorded so far, in the order they started: a
        list of dicts of the RECORDED variables plus NODE and PID (ints where
        the value is a number)."""
        found = []
        for name in os.listdir(self.path("starts")):
            if name.endswith(".tmp"):
                continue
            rec = {}
            for line in read(os.path.join(self.path("starts"), name)).splitlines():
                k, _, v = line.partition("=")
                numeric = v.lstrip("-").isdigit() and k not in ("NODE", "MASTER_ADDR")
                rec[k] = int(v) if numeric else v
            found.append(rec)
        return sorted(found, key=lambda r: r["T"])

    def wait_starts(self, cond, what, timeout=PATIENCE):
        """The recorded starts once cond(starts) holds; fails the test (with
        the starts and the agents' output) if it does not within `timeout`."""
        if not wait_for(lambda: cond(self.starts()), timeout):
            self.fail("%s: not within %.0f s; starts: %s\n%s"
                      % (what, timeout, self.brief(self.starts()), self.agents_said()))
        return self.starts()

    @staticmethod
    def brief(starts):
        return ["%s:rank %s/%s group %s/%s restart %s pid %s" % (
            s["NODE"], s.get("RANK"), s.get("WORLD_SIZE"), s.get("GROUP_RANK"),
            s.get("GROUP_WORLD_SIZE"), s.get("TORCHELASTIC_RESTART_COUNT"), s["PID"])
            for s in starts]

    def _kill_workers(self):
        kill_all([s["PID"] for s in self.starts()])

    # Endpoints and agents.

    def store(self, *args):
        """A separate ddprun-store on a free port (stopped when the test ends)."""
        s = StoreServer(BIN, self.tmp, *args, capped=False)
        self.addCleanup(s.stop)
        return s

    def agent(self, name, endpoint, nnodes, worker, nproc=1, conf=(), extra=(), env=None):
        """Starts one agent of this test's job: c10d rendezvous at `endpoint`
        (HOST:PORT), --nnodes `nnodes` ("2:3"), --rdzv-conf `conf` (KEY=VALUE
        strings), `worker` run with --no-python."""
        args = ["--nnodes=%s" % nnodes, "--nproc-per-node=%d" % nproc, "--rdzv-backend=c10d",
                "--rdzv-endpoint=%s" % endpoint, "--rdzv-id=%s" % self.run_id]
        if conf:
            args.append("--rdzv-conf=" + ",".join(conf))
        out_path, err_path = self.path("agent_%s.out" % name), self.path("agent_%s.err" % name)
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = self.popen(*args, *extra, "--no-python", worker,
                           env=dict(env or {}, NODE=name), stdout=out, stderr=err)
        a = Agent(name, p, out_path, err_path)
        self.agents.append(a)
        return a

    def node_id(self, port, agent):
        """`agent`'s node id ("<addr>_<pid>_<nonce>"), read from the job's
        state in the store on 127.0.0.1:`port` (the agent must be in it, a
        participant or waiting)."""
        c = RawClient(port)
        try:
            state = json.loads(c.get("/ddprun/%s/state" % self.run_id))
        finally:
            c.close()
        ids = [d["id"] for k in ("p", "w", "d") for d in state.get(k, [])]
        mine = [i for i in ids if "_%d_" % agent.pid in i]
        if len(mine) != 1:
            self.fail("agent %s (pid %d) among the node ids %r" % (agent.name, agent.pid, ids))
        return mine[0]

    def agents_said(self, agents=None):
        return "\n".join(a.describe() for a in (agents or self.agents))

    def exit_code(self, agent, timeout=EXIT_PATIENCE):
        """The agent's exit code; fails the test (with every agent's output)
        if it runs past `timeout`."""
        try:
            return agent.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.fail("agent %s still running after %.0f s\n%s"
                      % (agent.name, timeout, self.agents_said()))

    def assert_exits(self, agents, code, timeout=EXIT_PATIENCE):
        for a in agents:
            rc = self.exit_code(a, timeout)
            self.assertEqual(rc, code, self.agents_said())

    def assert_gone(self, pids, what, timeout=PATIENCE):
        """Every pid ends within `timeout` (a zombie counts as gone)."""
        if not wait_for(lambda: not any(alive(p) for p in pids), timeout):
            self.fail("%s still running: %r\n%s"
                      % (what, [p for p in pids if alive(p)], self.agents_said()))


# The default worker body: wait (bounded) for the go file, then exit 0.
WAIT_GO = ('n=0; until [ -e "$d/go" ]; do sleep 0.05; n=$((n+1)); '
           '[ $n -lt 2400 ] || exit 90; done\n')


def of_round(starts, world_size=None, restart=None, nodes=None):
    """The starts matching a round's shape: WORLD_SIZE, restart count, nodes."""
    return [s for s in starts
            if (world_size is None or s.get("WORLD_SIZE") == world_size)
            and (restart is None or s.get("TORCHELASTIC_RESTART_COUNT") == restart)
            and (nodes is None or s["NODE"] in nodes)]


def listener_pid(port, candidates):
    """Which of the `candidates` pids holds the socket listening on TCP
    `port` (IPv4 or IPv6), or None: read from /proc/net and /proc/PID/fd."""
    inodes = listening_inodes(port)
    for pid in candidates:
        fd_dir = "/proc/%d/fd" % pid
        try:
            for fd in os.listdir(fd_dir):
                try:
                    if os.readlink(os.path.join(fd_dir, fd)) in inodes:
                        return pid
                except OSError:
                    pass
        except OSError:
            pass
    return None


__all__ = ["Agent", "ElasticCase", "EXIT_PATIENCE", "FAST_DEATH_S", "FAST_KEEP_ALIVE", "PATIENCE",
           "SANITIZED", "SLACK", "WAIT_GO", "listener_pid", "of_round"]
