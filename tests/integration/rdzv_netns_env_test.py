"""torchrun 2.x's multi-node contract for the workers' environment, checked
against torchrun itself: two hosts made of network namespaces
(tests/pyutil/netns.py), one agent per host, 2 workers each, the same worker
script and the same command under torchrun (PyTorch 2.x venv) and ddprun.

- Static (--nnodes 2, and --nnodes 1:2, which torchrun runs with MAX) and
  c10d: every variable the launcher sets must be the one torchrun sets, with
  the same value, except what is random by nature, compared by form: a c10d
  MASTER_PORT (the same on every worker, a port, not the endpoint's, and a
  store answers there for every worker), the log directory's random parts
  in TORCHELASTIC_ERROR_FILE. Every worker connects to MASTER_ADDR:
  MASTER_PORT as a store client and meets the others there.
- A real PyTorch DDP job (gloo, init_method env://) across the two hosts
  under ddprun's static rendezvous on --master-port: the workers share the
  agent store there, as under torchrun. Its first attempt fails after
  PyTorch's process-group keys are in the store; the restarted workers
  must initialise on that same store (node 0 erased the stale keys).

Needs root and iproute2 (namespaces) and the venv of
scripts/setup-test-deps.sh ($DDPRUN_TORCH2_VENV, default
/opt/ddprun-test/venv-torch2): skipped with the reason otherwise."""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyutil"))
import netns  # noqa: E402
from ddprun_case import DDPRUN, PATIENCE, DdprunCase, read  # noqa: E402
from worker_env import ENV_WORKER, LAUNCHER_VARS  # noqa: E402

VENV = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
PYTHON = os.path.join(VENV, "bin", "python")
TORCHRUN = os.path.join(VENV, "bin", "torchrun")

# Ports on host 0. A fixed port is safe here and only here: each launch gets
# namespaces this test just created, so the only sockets in them are those
# of the one job it runs (the stores, and port-0 binds and outgoing
# connections, which the kernel takes from the ephemeral range, checked to
# lie above these ports). They are torchrun's defaults.
MASTER_PORT = 29500
ENDPOINT_PORT = 29400

# A PyTorch job on a 2-core machine shared with builds: importing torch in 4
# workers, the rendezvous, the collectives. Far above what it takes.
JOB_TIMEOUT = 240

# DDP over gloo with init_method env://. Attempt 0: an all_reduce, then the
# last rank fails while the others block in a barrier (the agents stop
# them). Attempt 1 (restart count 1): init on the same store again, an
# all_reduce, a record per rank.
DDP_WORKER = r'''
import datetime, json, os, sys
import torch
import torch.distributed as dist
e = os.environ
rank, world, attempt = int(e["RANK"]), int(e["WORLD_SIZE"]), int(e["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
model(torch.ones(2, 3)).sum().backward()  # one DDP step: gradients all-reduced
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
name = os.path.join(e["RECORDS"], "a%d_r%d" % (attempt, rank))
with open(name + ".tmp", "w") as f:
    json.dump({"sum": t.item(), "master": e["MASTER_ADDR"] + ":" + e["MASTER_PORT"],
               "grad": model.module.weight.grad.tolist()}, f)
os.rename(name + ".tmp", name + ".json")
if attempt == 0 and rank == world - 1:
    sys.exit(1)
# Attempt 0: never completes (the failed rank is gone). Attempt 1: no rank
# tears its gloo pairs down while a peer may still be finishing the
# all-reduce with it (PyTorch 2.x then aborts in teardown: "terminate called
# without an active exception", seen once in CI); the model, which holds the
# group, goes before the group.
dist.barrier()
del model
dist.destroy_process_group()
'''


def _unavailable():
    why = netns.unavailable()
    if why:
        return "multi-host tests " + why
    if not os.access(TORCHRUN, os.X_OK) or not os.access(PYTHON, os.X_OK):
        return "no PyTorch 2.x venv at %s (scripts/setup-test-deps.sh, or set " \
               "DDPRUN_TORCH2_VENV)" % VENV
    return None


class TwoHosts(DdprunCase):
    maxDiff = None

    _why = None

    @classmethod
    def setUpClass(cls):
        cls._why = _unavailable()

    def setUp(self):
        # Each test skips (not the class): testmain counts skipped tests to
        # exit 77, and a class skip runs none.
        if self._why:
            self.skipTest(self._why)
        super().setUp()
        self._launches = 0
        # Both launchers' hosts get the same addresses (namespaces of their
        # own each: they never see one another), so MASTER_ADDR compares.
        self.subnet = netns.Cluster(1).prefix

    # ------------------------------------------------------------- launching

    def base_env(self, records):
        """The agents' environment: this one without what a launcher sets."""
        env = self.env({"PYTHON_EXEC": PYTHON, "RECORDS": records,
                        # gloo picks its interface from the host name, which
                        # the namespaces share with the machine: eth0 is theirs.
                        "GLOO_SOCKET_IFNAME": "eth0",
                        # a worker that aborts shows its Python stack in the log
                        "PYTHONFAULTHANDLER": "1"})
        for k in list(env):
            if k in LAUNCHER_VARS or k.startswith(("PET_", "TORCHELASTIC_")):
                del env[k]
        return env

    def hosts(self, n):
        """n fresh hosts whose ephemeral ports lie above the fixed ones."""
        cluster = netns.Cluster(n, subnet=self.subnet)
        self.addCleanup(cluster.destroy)  # after the agents are reaped (added later)
        cluster.create()
        for i in range(1, n):
            self.assertTrue(cluster.reaches(i, 0), "the namespaces do not reach each other")
        ports = "/proc/sys/net/ipv4/ip_local_port_range"
        r = subprocess.run(cluster.exec_prefix(0) + ["cat", ports], check=True,
                           capture_output=True, text=True, timeout=PATIENCE)
        low = int(r.stdout.split()[0])
        self.assertLess(max(MASTER_PORT, ENDPOINT_PORT), low, "the fixed ports are ephemeral here")
        return cluster

    def launch(self, launcher, node_args, script, nproc=2):
        """Runs `launcher` (torchrun or ddprun) on fresh hosts, one agent per
        entry of node_args (a function of (host index, cluster) giving the
        agent's flags), to its end. Returns (records dir, agents' env,
        cluster); fails the test unless every agent exits 0."""
        self._launches += 1
        records = self.path("records_%s_%d" % (launcher, self._launches))
        os.mkdir(records)
        env = self.base_env(records)
        nodes = len(node_args)
        cluster = self.hosts(nodes)
        exe = [TORCHRUN] if launcher == "torchrun" else [DDPRUN]
        agents = []
        for i, args in enumerate(node_args):
            log = self.path("%s_%d_agent%d.log" % (launcher, self._launches, i))
            out = open(log, "w")
            self.addCleanup(out.close)
            argv = exe + args(i, cluster) + ["--nproc-per-node=%d" % nproc, script]
            p = subprocess.Popen(cluster.exec_prefix(i) + argv, env=env, stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT)
            self.addCleanup(self._reap, p)
            agents.append((p, log, argv))
        for p, log, argv in agents:
            try:
                rc = p.wait(JOB_TIMEOUT)
            except subprocess.TimeoutExpired:
                rc = "still running after %d s" % JOB_TIMEOUT
            if rc != 0:
                self.fail("%s exited %s\n%s" % (" ".join(argv), rc, self.logs(agents)))
        return records, env, cluster, agents

    @staticmethod
    def logs(agents):
        return "\n".join("--- %s:\n%s" % (" ".join(a[2]), read(a[1])) for a in agents)

    def environments(self, launcher, node_args, nnodes):
        """{(group rank, local rank): (launcher-set variables, store probe)}
        of one run of ENV_WORKER, plus the cluster it ran on."""
        script = self.pyscript(ENV_WORKER)
        records, env, cluster, agents = self.launch(launcher, node_args, script)
        found = {}
        for name in sorted(os.listdir(records)):
            with open(os.path.join(records, name)) as f:
                rec = json.load(f)
            set_by_launcher = {k: v for k, v in rec["env"].items() if env.get(k) != v}
            # ddprun's one addition (docs/status.md): where the worker may
            # report its progress, beside its error file. Torchrun sets none.
            progress = set_by_launcher.pop("DDPRUN_PROGRESS_FILE", None)
            error_file = set_by_launcher.get("TORCHELASTIC_ERROR_FILE", "")
            self.assertEqual(progress, None if launcher == "torchrun" else
                             os.path.join(os.path.dirname(error_file), "progress.json"), launcher)
            found[tuple(int(x) for x in name[:-len(".json")].split("_"))] = (
                set_by_launcher, rec["store"])
        self.assertEqual(sorted(found), [(g, l) for g in range(nnodes) for l in range(2)],
                         self.logs(agents))
        return found, cluster

    # ------------------------------------------------------------- comparing

    def assert_same_environment(self, node_args, nnodes, run_id, random_port=False):
        theirs, _ = self.environments("torchrun", node_args, nnodes)
        ours, cluster = self.environments("ddprun", node_args, nnodes)
        ports = {}
        for who, found in (("torchrun", theirs), ("ddprun", ours)):
            for (group, local), (env, store) in found.items():
                self.assertEqual(store, "met %d workers" % (2 * nnodes), "%s worker %d/%d at "
                                 "MASTER_ADDR:MASTER_PORT" % (who, group, local))
                # The log directory's random parts differ by nature.
                path = env.get("TORCHELASTIC_ERROR_FILE", "")
                self.assertRegex(path, r"^%s/torchelastic_[^/]+/%s_[^/]+/attempt_0/%d/error\.json$"
                                 % (re.escape(self.tmp), re.escape(run_id), local), who)
                env["TORCHELASTIC_ERROR_FILE"] = "<tmp>/%s_*/attempt_0/%d/error.json" % (run_id,
                                                                                          local)
                ports.setdefault(who, set()).add(env.get("MASTER_PORT"))
                if random_port:
                    env["MASTER_PORT"] = "<the group's port>"
        for who, seen in ports.items():
            self.assertEqual(len(seen), 1, "%s workers disagree on MASTER_PORT: %s" % (who, seen))
            port = int(seen.pop())
            self.assertTrue(0 < port < 65536)
            if random_port:
                self.assertNotEqual(port, ENDPOINT_PORT, who)
            else:
                self.assertEqual(port, MASTER_PORT, who)
        for key in sorted(theirs):
            t, o = theirs[key][0], ours[key][0]
            self.assertEqual(sorted(o), sorted(t), "variables set for worker %s" % (key,))
            self.assertEqual(o, t, "values for worker %s" % (key,))
        self.assertEqual(ours[(0, 0)][0]["MASTER_ADDR"], cluster.addrs[0])

    @staticmethod
    def static(nnodes):
        return lambda i, c: ["--nnodes=" + nnodes, "--node-rank=%d" % i,
                             "--master-addr=" + c.addrs[0], "--master-port=%d" % MASTER_PORT,
                             "--rdzv-conf=timeout=120"]

    # ------------------------------------------------------------- the tests

    def test_static_environment_is_torchruns(self):
        self.assert_same_environment([self.static("2")] * 2, 2, "none")

    def test_static_with_a_node_range_runs_with_max_nodes_as_torchrun(self):
        self.assert_same_environment([self.static("1:2")] * 2, 2, "none")

    def test_static_on_one_node_with_a_master_port_is_torchruns(self):
        one = [lambda i, c: ["--nnodes=1", "--master-port=%d" % MASTER_PORT]]
        theirs, _ = self.environments("torchrun", one, 1)
        ours, _ = self.environments("ddprun", one, 1)
        for key in theirs:
            for found in (theirs, ours):
                found[key][0]["TORCHELASTIC_ERROR_FILE"] = "<path>"
            self.assertEqual(ours[key], theirs[key], key)
        self.assertEqual(ours[(0, 0)][0]["MASTER_PORT"], str(MASTER_PORT))
        self.assertEqual(ours[(0, 0)][0]["MASTER_ADDR"], "127.0.0.1")

    def test_c10d_environment_is_torchruns(self):
        # is_host explicit: torchrun infers it from the host name, which the
        # namespaces share with the machine (ddprun also looks at the
        # interfaces' addresses). --local-addr: without it torchrun
        # advertises getfqdn(), which no other namespace can reach.
        def c10d(i, c):
            return ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-id=job",
                    "--rdzv-endpoint=%s:%d" % (c.addrs[0], ENDPOINT_PORT),
                    "--local-addr=" + c.addrs[i], "--rdzv-conf=is_host=%d" % (i == 0)]
        self.assert_same_environment([c10d] * 2, 2, "job", random_port=True)

    def test_pytorch_ddp_restarts_on_the_shared_master_port_store(self):
        script = self.pyscript(DDP_WORKER)
        restart = lambda i, c: self.static("2")(i, c) + ["--max-restarts=1"]  # noqa: E731
        records, _, cluster, agents = self.launch("ddprun", [restart] * 2, script)
        got = {}
        for name in os.listdir(records):
            with open(os.path.join(records, name)) as f:
                got[name[:-len(".json")]] = json.load(f)
        self.assertEqual(sorted(got), ["a%d_r%d" % (a, r) for a in range(2) for r in range(4)],
                         self.logs(agents))
        for rec in got.values():
            self.assertEqual(rec["sum"], 1 + 2 + 3 + 4)
            self.assertEqual(rec["master"], "%s:%d" % (cluster.addrs[0], MASTER_PORT))
            self.assertEqual(rec["grad"], got["a1_r0"]["grad"], "DDP's gradients are averaged")
        for _, log, _ in agents:
            self.assertIn("restart 1 of 1", read(log))


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
