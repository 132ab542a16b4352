"""The environment the Kubeflow training operator gives each pod of a
PyTorchJob, computed from the job's manifest as the operator computes it.

A transcription of kubeflow/training-operator release-1.9 (v1.9.0, Feb 2025):
pkg/controller.v1/pytorch/envvar.go (setPodEnv), master.go, elastic.go and the
defaults of pkg/apis/kubeflow.org/v1/pytorch_defaults.go. What it sets:

- every pod: PYTHONUNBUFFERED=1; PET_NPROC_PER_NODE = spec.nprocPerNode
  (a string: a number, "auto", "cpu", "gpu"; defaults to "auto"), or the
  deprecated elasticPolicy.nProcPerNode (an integer) instead.
- with a Master replica: MASTER_ADDR = PET_MASTER_ADDR = <job>-master-0,
  MASTER_PORT = PET_MASTER_PORT = the master container's port named
  pytorchjob-port (default 23456), RANK = PET_NODE_RANK = the pod index
  (master 0, worker i -> i + 1), WORLD_SIZE = replicas x nprocPerNode (1 when
  nprocPerNode is not a number).
- no elasticPolicy: PET_NNODES = all replicas (master + workers).
- elasticPolicy: PET_RDZV_ENDPOINT = rdzvHost (default <job>-worker-0) :
  rdzvPort (default the worker container's pytorchjob-port),
  PET_RDZV_BACKEND (default c10d), PET_NNODES = min:max (each defaulting to
  the other, both to the worker replicas), PET_MAX_RESTARTS, PET_RDZV_ID,
  PET_RDZV_CONF = "k=v,k=v" when given, PET_STANDALONE="" when standalone.

The operator declares PET_MONITOR_INTERVAL and PET_START_METHOD but never sets
them. The newer kubeflow/trainer (TrainJob, torch plugin) sets only
PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and
PET_MASTER_PORT (29500)."""

DEFAULT_PORT = 23456
PORT_NAME = "pytorchjob-port"
CONTAINER = "pytorch"


def _replicas(job):
    return job["spec"]["pytorchReplicaSpecs"]


def _count(spec):
    return int(spec.get("replicas", 1))


def _port(job, rtype):
    for c in _replicas(job)[rtype]["template"]["spec"]["containers"]:
        if c.get("name") == CONTAINER:
            for p in c.get("ports", []):
                if p.get("name") == PORT_NAME:
                    return int(p["containerPort"])
    return DEFAULT_PORT  # the defaulting webhook adds this port


def _nproc(job):
    """spec.nprocPerNode after defaulting (None: only the elastic one)."""
    spec, elastic = job["spec"], job["spec"].get("elasticPolicy")
    if "nprocPerNode" in spec:
        return str(spec["nprocPerNode"])
    if elastic is not None and "nProcPerNode" in elastic:
        return None
    return "auto"


def pod_name(job, rtype, index):
    return "%s-%s-%d" % (job["metadata"]["name"], rtype.lower(), index)


def pods(job):
    """[(replica type, index)] of every pod, master first."""
    out = []
    for rtype in ("Master", "Worker"):
        if rtype in _replicas(job):
            out += [(rtype, i) for i in range(_count(_replicas(job)[rtype]))]
    return out


def pod_env(job, rtype, index):
    """{name: value} the operator adds to the pytorch container of pod
    (rtype, index), in the order it appends them."""
    env = {"PYTHONUNBUFFERED": "1"}
    total = sum(_count(s) for s in _replicas(job).values())
    nproc = _nproc(job)
    world = total * (int(nproc) if nproc is not None and nproc.isdigit() else 1)
    if "Master" in _replicas(job):
        port, addr = str(_port(job, "Master")), pod_name(job, "Master", 0)
        env.update(MASTER_PORT=port, PET_MASTER_PORT=port, MASTER_ADDR=addr, PET_MASTER_ADDR=addr)
        rank = index + (1 if rtype == "Worker" else 0)
        env.update(WORLD_SIZE=str(world), RANK=str(rank), PET_NODE_RANK=str(rank))
    if nproc is not None:
        env["PET_NPROC_PER_NODE"] = nproc
    elastic = job["spec"].get("elasticPolicy")
    if elastic is None:
        env["PET_NNODES"] = str(total)
    else:
        env.update(_elastic_env(job, elastic))
    return env


def _elastic_env(job, p):
    workers = _count(_replicas(job)["Worker"])
    host = p.get("rdzvHost", "%s-worker-0" % job["metadata"]["name"])
    port = p.get("rdzvPort", _port(job, "Worker"))
    lo = p.get("minReplicas", p.get("maxReplicas", workers))
    hi = p.get("maxReplicas", p.get("minReplicas", workers))
    env = {"PET_RDZV_ENDPOINT": "%s:%d" % (host, int(port)),
           "PET_RDZV_BACKEND": p.get("rdzvBackend", "c10d"),
           "PET_NNODES": "%d:%d" % (int(lo), int(hi))}
    if "maxRestarts" in p:
        env["PET_MAX_RESTARTS"] = str(int(p["maxRestarts"]))
    if "nProcPerNode" in p:
        env["PET_NPROC_PER_NODE"] = str(int(p["nProcPerNode"]))
    if "rdzvId" in p:
        env["PET_RDZV_ID"] = p["rdzvId"]
    if p.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join("%s=%s" % (c["key"], c["value"]) for c in p["rdzvConf"])
    if p.get("standalone"):
        env["PET_STANDALONE"] = ""
    return env


def container(job, rtype):
    """The pytorch container of replica type rtype."""
    for c in _replicas(job)[rtype]["template"]["spec"]["containers"]:
        if c.get("name") == CONTAINER:
            return c
    raise KeyError("no container named %s in the %s replica" % (CONTAINER, rtype))
