"""ddprun in the pods of a Kubeflow PyTorchJob, unchanged: the environment
the training operator sets (tests/pyutil/kubeflow.py computes it from the
manifests in examples/kubeflow/, as the operator does), the manifests'
command (`ddprun <script> ...`, no launcher flags), two pods.

- The manifests: PyTorchJobs whose pytorch container runs ddprun, with the
  fields the operator needs (needs PyYAML).
- Plain policy on loopback (no root): master-0 and worker-0 as two agents on
  127.0.0.1 (the master port reserved); the workers see torchrun's
  process-level RANK 0..3, WORLD_SIZE 4, GROUP_RANK = the pod's node rank,
  never the pod-level RANK/WORLD_SIZE the operator set for the pod.
- nprocPerNode "auto" (the operator's default) on a CPU pod counts the CPUs
  the pod may run on (its affinity), as torchrun 2.x does.
- Pods as network namespaces (root): each pod a host of its own with its pod
  name as host name, every pod name resolving to its pod's address (the
  operator's per-pod services), the manifest's port. Plain policy and
  elastic policy (PET_NNODES=1:2, c10d on worker-0): every variable the
  workers get is the one torchrun gives under the same environment (PyTorch
  2.x venv; compared by form where random: a c10d MASTER_PORT, the log
  directory's random parts); and the plain manifest's own job (examples/pytorch/ddp_train.py,
  gloo DDP) runs to its end under ddprun.

Skipped, with the reason, without root and iproute2 (namespaces), PyYAML,
or PyTorch (the venv of scripts/setup-test-deps.sh, $DDPRUN_TORCH2_VENV,
default /opt/ddprun-test/venv-torch2)."""
import copy
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))
import kubeflow  # noqa: E402
import netns  # noqa: E402
from ddprun_case import DDPRUN, PATIENCE, DdprunCase, read  # noqa: E402
from reserved_port import reserve_port  # noqa: E402
from worker_env import ENV_WORKER, LAUNCHER_VARS, launcher_set, read_records  # noqa: E402

try:
    import yaml
except ImportError:  # Debian: python3-yaml
    yaml = None

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples", "kubeflow")
PLAIN, ELASTIC = "pytorchjob.yaml", "pytorchjob-elastic.yaml"
# The Dockerfile copies this script to the path the manifests run.
IMAGE_FILES = {"/workspace/ddp_train.py": os.path.join(ROOT, "examples", "pytorch", "ddp_train.py")}

VENV = os.environ.get("DDPRUN_TORCH2_VENV", "/opt/ddprun-test/venv-torch2")
VPYTHON = os.path.join(VENV, "bin", "python")
TORCHRUN = os.path.join(VENV, "bin", "torchrun")
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"

# Four PyTorch workers importing torch on a 2-core machine shared with
# builds, a rendezvous, collectives: far above what it takes.
JOB_TIMEOUT = 240

# Records the environment, no PyTorch needed (loopback cases).
PLAIN_RECORDER = r'''
import json, os
e = os.environ
name = os.path.join(e["RECORDS"], "%s_%s" % (e["GROUP_RANK"], e["LOCAL_RANK"]))
with open(name + ".tmp", "w") as f:
    json.dump({"env": dict(e)}, f)
os.rename(name + ".tmp", name + ".json")
'''


def manifest(name):
    with open(os.path.join(EXAMPLES, name)) as f:
        return yaml.safe_load(f)


def have_torch2():
    return os.access(TORCHRUN, os.X_OK) and os.access(VPYTHON, os.X_OK)


def no_torch2():
    return "no PyTorch 2.x venv at %s (scripts/setup-test-deps.sh, or set DDPRUN_TORCH2_VENV)" % VENV


def command_args(job, rtype, script=None):
    """The arguments after `ddprun` of the manifest's command for rtype: the
    image's files mapped to this checkout's, the script replaced if given."""
    cmd = kubeflow.container(job, rtype)["command"]
    args = [IMAGE_FILES.get(a, a) for a in cmd[1:]]
    if script:
        args[0] = script
    return args


def agents_env(case, extra):
    """This process's environment without anything a launcher or the
    operator sets, plus `extra`."""
    env = case.env()
    for k in list(env):
        if k in LAUNCHER_VARS or k.startswith(("PET_", "TORCHELASTIC_")) or k == "PYTHONUNBUFFERED":
            del env[k]
    env.update(extra)
    return env


def expected_plain(g, l, nproc, nnodes):
    """What torchrun gives worker (node g, local rank l) on a static rendezvous."""
    rank, world = g * nproc + l, nproc * nnodes
    return {"RANK": str(rank), "LOCAL_RANK": str(l), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(g), "GROUP_WORLD_SIZE": str(nnodes),
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world), "ROLE_NAME": "default"}


class Manifests(DdprunCase):
    def setUp(self):
        if yaml is None:
            self.skipTest("needs PyYAML (Debian: python3-yaml) to read the manifests")
        super().setUp()

    def test_manifests_are_pytorchjobs_that_run_ddprun(self):
        with open(os.path.join(EXAMPLES, "Dockerfile")) as f:
            dockerfile = f.read()
        for name in (PLAIN, ELASTIC):
            job = manifest(name)
            self.assertEqual((job["apiVersion"], job["kind"]), ("kubeflow.org/v1", "PyTorchJob"))
            self.assertRegex(job["metadata"]["name"], r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", name)
            replicas = job["spec"]["pytorchReplicaSpecs"]
            self.assertTrue(set(replicas) <= {"Master", "Worker"}, name)
            self.assertEqual(replicas.get("Master", {"replicas": 1})["replicas"], 1, name)
            for rtype in replicas:
                c = kubeflow.container(job, rtype)
                self.assertTrue(c["image"], name)
                self.assertEqual(c["command"][0], "ddprun", name)
                self.assertNotIn("torchrun", c["command"], name)
                script = c["command"][1]
                self.assertIn(script, IMAGE_FILES, "%s runs a file the image lacks" % name)
                self.assertIn("COPY %s %s" % (os.path.relpath(IMAGE_FILES[script], ROOT), script),
                              dockerfile)
                self.assertIn({"name": kubeflow.PORT_NAME, "containerPort": kubeflow.DEFAULT_PORT},
                              c["ports"], name)
        self.assertIn("Master", manifest(PLAIN)["spec"]["pytorchReplicaSpecs"])
        elastic = manifest(ELASTIC)["spec"]
        self.assertEqual(elastic["elasticPolicy"]["rdzvBackend"], "c10d")
        self.assertIn("Worker", elastic["pytorchReplicaSpecs"])
        envs = [kubeflow.pod_env(manifest(ELASTIC), *p) for p in kubeflow.pods(manifest(ELASTIC))]
        self.assertEqual([e["PET_NNODES"] for e in envs], ["1:2", "1:2"])


class Loopback(DdprunCase):
    """Agents on this host, no root: the pods' addresses are 127.0.0.1."""

    def setUp(self):
        if yaml is None:
            self.skipTest("needs PyYAML (Debian: python3-yaml) to read the manifests")
        super().setUp()

    def test_plain_policy_workers_get_process_ranks_not_the_pods(self):
        job = manifest(PLAIN)
        port = str(reserve_port(self))
        records = self.path("records")
        os.mkdir(records)
        script = self.pyscript(PLAIN_RECORDER)
        pods, procs = [], []
        for rtype, i in kubeflow.pods(job):
            pod = kubeflow.pod_env(job, rtype, i)
            for k in ("MASTER_ADDR", "PET_MASTER_ADDR"):
                pod[k] = "127.0.0.1"
            for k in ("MASTER_PORT", "PET_MASTER_PORT"):
                pod[k] = port
            pods.append(pod)
            env = agents_env(self, dict(pod, RECORDS=records))
            procs.append(subprocess.Popen([DDPRUN, *command_args(job, rtype, script)], env=env,
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
            self.addCleanup(self._reap, procs[-1])
        for p, (rc, out, _) in zip(procs, self.finish(procs, JOB_TIMEOUT)):
            self.assertEqual(rc, 0, out)
        found = read_records(records)
        self.assertEqual(sorted(found), [(g, l) for g in range(2) for l in range(2)])
        for (g, l), rec in found.items():
            env = rec["env"]
            got = {k: env.get(k) for k in expected_plain(g, l, 2, 2)}
            self.assertEqual(got, expected_plain(g, l, 2, 2), (g, l))
            self.assertEqual((env["MASTER_ADDR"], env["MASTER_PORT"]), ("127.0.0.1", port))
            self.assertEqual(env["TORCHELASTIC_RUN_ID"], "none")
            # The operator's variables reach the workers as under torchrun
            # (inherited), except those torchrun sets per process.
            self.assertEqual({k: env.get(k) for k in pods[g] if k not in LAUNCHER_VARS},
                             {k: v for k, v in pods[g].items() if k not in LAUNCHER_VARS})
            self.assertEqual(env["PYTHONUNBUFFERED"], "1")

    # A CPU pod under the kubelet's static CPU manager runs on a cpuset
    # smaller than the node: torchrun 2.x's "auto" (the operator's default
    # nprocPerNode) starts one worker per CPU of the affinity. One test per
    # launcher, so that torchrun's half shows as skipped where it cannot run.
    def nproc_auto_on_one_cpu(self, exe):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            self.skipTest("needs 2 CPUs to run on 1 of them")
        job = copy.deepcopy(manifest(PLAIN))
        del job["spec"]["nprocPerNode"]  # the operator's default: "auto"
        pod = kubeflow.pod_env(job, "Master", 0)
        self.assertEqual(pod["PET_NPROC_PER_NODE"], "auto")
        pod.update(PET_NNODES="1", PET_MASTER_ADDR="127.0.0.1",
                   PET_MASTER_PORT=str(reserve_port(self)))
        records = self.path("records")
        os.mkdir(records)
        r = subprocess.run([exe, self.pyscript(PLAIN_RECORDER)],
                           env=agents_env(self, dict(pod, RECORDS=records)),
                           preexec_fn=lambda: os.sched_setaffinity(0, cpus[:1]),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=JOB_TIMEOUT)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(read_records(records)), 1,
                         "workers started with nproc auto on 1 CPU of %d" % len(cpus))

    def test_nproc_auto_counts_the_cpus_the_pod_may_use(self):
        self.nproc_auto_on_one_cpu(DDPRUN)

    def test_nproc_auto_as_torchrun_counts_them(self):
        if not have_torch2():
            self.skipTest("torchrun not compared: " + no_torch2())
        self.nproc_auto_on_one_cpu(TORCHRUN)


class Pods(DdprunCase):
    """Each pod a network namespace with the pod's name as host name."""
    maxDiff = None
    _why = None

    @classmethod
    def setUpClass(cls):
        why = netns.unavailable()
        cls._why = ("pod tests " + why) if why else None
        if not cls._why and yaml is None:
            cls._why = "needs PyYAML (Debian: python3-yaml) to read the manifests"

    def setUp(self):
        if self._why:
            self.skipTest(self._why)
        super().setUp()
        self._launches = 0

    # ------------------------------------------------------------- the pods

    def cluster(self, job):
        """Fresh hosts, one per pod, the pod names resolving on each (the
        /etc/hosts that `ip netns exec` mounts for a namespace)."""
        pods = kubeflow.pods(job)
        c = netns.Cluster(len(pods))
        self.addCleanup(c.destroy)
        c.create()
        lines = ["127.0.0.1 localhost"] + ["%s %s" % (c.addrs[i], kubeflow.pod_name(job, *p))
                                           for i, p in enumerate(pods)]
        for ns in c.names:
            d = os.path.join("/etc/netns", ns)
            os.makedirs(d)
            self.addCleanup(shutil.rmtree, d, ignore_errors=True)
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write("\n".join(lines) + "\n")
        for i in range(1, len(pods)):
            self.assertTrue(c.reaches(i, 0), "the namespaces do not reach each other")
        r = subprocess.run(c.exec_prefix(0) + ["cat", "/proc/sys/net/ipv4/ip_local_port_range"],
                           check=True, capture_output=True, text=True, timeout=PATIENCE)
        self.assertLess(kubeflow.DEFAULT_PORT, int(r.stdout.split()[0]),
                        "the manifests' port is ephemeral here")
        return c

    def run_job(self, launcher, job, python, script=None):
        """Runs every pod of `job` with the operator's environment and the
        manifest's command (`launcher` in place of ddprun, `script` in place
        of its script) to its end. Returns (records dir, {pod index: agent
        env}, cluster, agents); fails unless every agent exits 0."""
        self._launches += 1
        records = self.path("records_%s_%d" % (launcher, self._launches))
        os.mkdir(records)
        c = self.cluster(job)
        exe = TORCHRUN if launcher == "torchrun" else DDPRUN
        agents, envs = [], {}
        for i, (rtype, index) in enumerate(kubeflow.pods(job)):
            name = kubeflow.pod_name(job, rtype, index)
            envs[i] = agents_env(self, dict(kubeflow.pod_env(job, rtype, index),
                                            RECORDS=records, PYTHON_EXEC=python))
            argv = [exe, *command_args(job, rtype, script)]
            log = self.path("%s_%d_%s.log" % (launcher, self._launches, name))
            out = open(log, "w")
            self.addCleanup(out.close)
            host = [UNSHARE, "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name]
            p = subprocess.Popen(c.exec_prefix(i) + host + argv, env=envs[i],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
            self.addCleanup(self._reap, p)
            agents.append((p, log, name))
        for p, log, name in agents:
            try:
                rc = p.wait(JOB_TIMEOUT)
            except subprocess.TimeoutExpired:
                rc = "still running after %d s" % JOB_TIMEOUT
            if rc != 0:
                self.fail("%s in pod %s exited %s\n%s" % (launcher, name, rc, self.logs(agents)))
        return records, envs, c, agents

    @staticmethod
    def logs(agents):
        return "\n".join("--- pod %s:\n%s" % (a[2], read(a[1])) for a in agents)

    def environments(self, launcher, job):
        """{(group rank, local rank): (launcher-set variables, host, store
        probe)} of ENV_WORKER in every pod of `job`, and the cluster."""
        records, envs, c, agents = self.run_job(launcher, job, VPYTHON,
                                                self.pyscript(ENV_WORKER))
        names = [kubeflow.pod_name(job, *p) for p in kubeflow.pods(job)]
        found = {}
        for key, rec in read_records(records).items():
            pod = names.index(rec["host"])
            env = launcher_set(rec["env"], envs[pod])
            path = env.get("TORCHELASTIC_ERROR_FILE") or ""
            # ddprun's one addition (docs/status.md): where the worker may
            # report its progress, beside its error file. Torchrun sets none.
            progress = env.pop("DDPRUN_PROGRESS_FILE", None)
            self.assertEqual(progress, None if launcher == "torchrun" else
                             os.path.join(os.path.dirname(path), "progress.json"), launcher)
            self.assertRegex(path, r"^%s/torchelastic_[^/]+/[^/]+/attempt_0/%d/error\.json$"
                             % (re.escape(self.tmp), key[1]), launcher)
            env["TORCHELASTIC_ERROR_FILE"] = "<log dir>/attempt_0/%d/error.json" % key[1]
            found[key] = (env, rec["host"], rec["store"])
        self.assertEqual(sorted(found), [(g, l) for g in range(len(names)) for l in range(2)],
                         self.logs(agents))
        for key, (_, _, store) in found.items():
            self.assertEqual(store, "met %d workers" % len(found), "%s worker %s" % (launcher, key))
        return found, c

    def compare_with_torchrun(self, job, ours, by_form=()):
        """Every worker's launcher-set variables equal torchrun's, those in
        by_form after the caller checked their form."""
        if not have_torch2():  # the callers skip first; a new one must not pass silently
            self.skipTest("torchrun not compared: " + no_torch2())
        theirs, _ = self.environments("torchrun", job)
        self.assertEqual(sorted(ours), sorted(theirs))
        for key in sorted(theirs):
            t, o = dict(theirs[key][0]), dict(ours[key][0])
            for k in by_form:
                t[k] = o[k] = "<by form>"
            self.assertEqual(o, t, "worker %s: ddprun's environment vs torchrun's" % (key,))
            self.assertEqual(ours[key][1], theirs[key][1], "pod of worker %s" % (key,))
        return theirs

    # ------------------------------------------------------------- the tests

    def test_plain_policy_environment_is_torchruns(self):
        if not have_torch2():
            self.skipTest(no_torch2())
        job = manifest(PLAIN)
        ours, _ = self.environments("ddprun", job)
        names = [kubeflow.pod_name(job, *p) for p in kubeflow.pods(job)]
        for (g, l), (env, host, _) in ours.items():
            self.assertEqual(host, names[g], "node rank = the pod's PET_NODE_RANK")
            self.assertEqual({k: env[k] for k in expected_plain(g, l, 2, 2)},
                             expected_plain(g, l, 2, 2))
            self.assertEqual((env["MASTER_ADDR"], env["MASTER_PORT"]),
                             ("ddprun-ddp-master-0", "23456"))
        self.compare_with_torchrun(job, ours)

    def test_elastic_policy_forms_one_group_as_torchrun(self):
        if not have_torch2():
            self.skipTest(no_torch2())
        job = copy.deepcopy(manifest(ELASTIC))
        # PET_NNODES=1:2: the round completes when the second pod joins, or
        # last_call_timeout after the first; a bound so long that a loaded
        # machine still forms one group of both pods.
        for conf in job["spec"]["elasticPolicy"]["rdzvConf"]:
            if conf["key"] == "last_call_timeout":
                conf["value"] = str(JOB_TIMEOUT)
        ours, _ = self.environments("ddprun", job)
        for (g, l), (env, host, _) in ours.items():
            self.assertEqual({k: env[k] for k in expected_plain(g, l, 2, 2)},
                             expected_plain(g, l, 2, 2))
            self.assertEqual(env["TORCHELASTIC_RUN_ID"], "ddprun-elastic")
            self.assertEqual(env["TORCHELASTIC_MAX_RESTARTS"], "3")
        self.assertEqual(ours[(0, 0)][1], "ddprun-elastic-worker-0", "the endpoint's pod first")
        theirs = self.compare_with_torchrun(job, ours, by_form=("MASTER_PORT",))
        for who, found in (("ddprun", ours), ("torchrun", theirs or {})):
            # One store for the group on the pod of group rank 0, named by its
            # host name, on a port of its own (not the rendezvous port).
            masters = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e, _, _ in found.values()}
            self.assertEqual(len(masters), 1, "%s: %s" % (who, masters))
            addr, port = masters.pop()
            self.assertEqual(addr, "ddprun-elastic-worker-0", who)
            self.assertNotEqual(port, str(kubeflow.DEFAULT_PORT), who)

    def test_plain_manifest_job_runs_pytorch_ddp(self):
        python = VPYTHON if have_torch2() else "/usr/bin/python3"
        probe = subprocess.run([python, "-c", "import torch"], capture_output=True)
        if probe.returncode != 0:
            self.skipTest("no PyTorch for the workers (%s, or Debian's python3-torch)" % VENV)
        job = manifest(PLAIN)
        _, _, _, agents = self.run_job("ddprun", job, python)
        master = read(agents[0][1])
        results = [json.loads(line) for line in master.splitlines() if line.startswith("{")]
        self.assertEqual(len(results), 1, self.logs(agents))
        self.assertEqual(results[0]["world"], 4)
        self.assertEqual(len(results[0]["losses"]), 2, "one loss per epoch (--epochs 2)")
        self.assertNotIn("{", read(agents[1][1]), "only rank 0 reports")


if __name__ == "__main__":
    from testmain import main  # noqa: E402
    main()
