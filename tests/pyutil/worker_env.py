"""A worker that records the environment its launcher gave it, for tests that
compare ddprun's worker environment with torchrun's (PyTorch needed in the
workers' interpreter)."""
import json
import os

# What a launcher may set; launcher_set() also keeps every variable that
# differs from the agents' environment, so one missing here is still caught.
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                 "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING",
                 "CUDA_VISIBLE_DEVICES", "LOGLEVEL")

# Records its environment (and host name) as JSON in
# $RECORDS/<group rank>_<local rank>.json, after meeting every other worker in
# the store at MASTER_ADDR:MASTER_PORT (a client only, as PyTorch's env:// is
# with TORCHELASTIC_USE_AGENT_STORE).
ENV_WORKER = r'''
import datetime, json, os, socket
import torch.distributed as dist
e = os.environ
out = {"env": dict(e), "host": socket.gethostname()}
try:
    s = dist.TCPStore(e["MASTER_ADDR"], int(e["MASTER_PORT"]), is_master=False,
                      timeout=datetime.timedelta(seconds=60))
    s.set("probe/" + e["RANK"], e["GROUP_RANK"])
    s.wait(["probe/%d" % r for r in range(int(e["WORLD_SIZE"]))])
    out["store"] = "met %s workers" % e["WORLD_SIZE"]
except Exception as x:  # recorded, and the test says what it was
    out["store"] = repr(x)
name = os.path.join(e["RECORDS"], "%s_%s" % (e["GROUP_RANK"], e["LOCAL_RANK"]))
with open(name + ".tmp", "w") as f:
    json.dump(out, f)
os.rename(name + ".tmp", name + ".json")
'''


def launcher_set(worker, agent):
    """The variables a launcher set, changed or removed in a worker's
    environment `worker`, against its agent's `agent` ({name: value}; a
    removed one maps to None). Launcher variables are kept even where the
    agent's environment held the same value (a pod-level RANK=0 is still
    the launcher's RANK for worker 0)."""
    names = set(worker) | set(agent)
    return {k: worker.get(k) for k in names
            if k in LAUNCHER_VARS or k.startswith("TORCHELASTIC_") or worker.get(k) != agent.get(k)}


def read_records(records):
    """{(group rank, local rank): record} of the ENV_WORKER records in `records`."""
    found = {}
    for name in sorted(os.listdir(records)):
        if name.endswith(".json"):
            with open(os.path.join(records, name)) as f:
                found[tuple(int(x) for x in name[:-len(".json")].split("_"))] = json.load(f)
    return found
