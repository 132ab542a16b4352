"""Real PyTorch under the elastic (c10d-style) rendezvous, 2 agents on this
machine with one worker each, gloo on loopback:

1. examples/pytorch/ddp_train.py gives the same result across 2 agents as
   with 2 workers on one node (endpoint: a separate ddprun-store);
2. after a failure on one node's first attempt, the worker on each node reads
   the same TORCHELASTIC_RESTART_COUNT, and the two exchange it through a
   gloo all_gather (endpoint: hosted by the first agent)."""
import json
import os
import subprocess
import sys
import tempfile
import uuid

from storeutil import BIN, DdprunStore, check, reserved_port

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
SCRIPT = os.path.join(ROOT, "examples/pytorch/ddp_train.py")
TIMEOUT = 240

# Fails on its first attempt on node b (after a collective, so both nodes'
# workers ran), waits to be stopped on node a; on the next attempt every
# worker gathers every worker's restart count and prints them.
RESTART_SCRIPT = r'''
import json, os, sys, time
import torch
import torch.distributed as dist

count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
seen = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
dist.all_gather(seen, torch.tensor([count], dtype=torch.int64))
if count == 0:
    if os.environ["NODE"] == "b":
        sys.exit(3)
    time.sleep(1000)  # stopped by the agent when node b's failure ends the round
print(json.dumps({"node": os.environ["NODE"], "rank": dist.get_rank(), "restart": count,
                  "seen": [int(t.item()) for t in seen]}), flush=True)
dist.barrier()
sys.stdout.flush()
os._exit(0)  # see ddp_train.py: a gloo teardown race at interpreter exit
'''


def env(node):
    return dict(os.environ, PYTHON_EXEC=sys.executable, GLOO_SOCKET_IFNAME="lo",
                NODE=node, OMP_NUM_THREADS="1")


def json_lines(text):
    return [json.loads(l) for l in text.splitlines() if l.startswith("{")]


def single_node():
    cmd = [os.path.join(BIN, "ddprun"), "--standalone", "--nproc_per_node=2", SCRIPT]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env("solo"))
    check(p.returncode == 0, "single node exited %d:\n%s\n%s" % (p.returncode, p.stdout, p.stderr))
    lines = json_lines(p.stdout)
    check(len(lines) == 1, "expected one result line, got:\n" + p.stdout)
    return lines[0]


def agents(endpoint, script, extra=(), confs=((), ())):
    """Runs agents a and b of one c10d job to their end: [(code, out, err)]."""
    run_id = "interop-" + uuid.uuid4().hex[:8]
    procs = []
    for node, conf in zip("ab", confs):
        cmd = [os.path.join(BIN, "ddprun"), "--nnodes=2", "--nproc_per_node=1",
               "--rdzv_backend=c10d", "--rdzv_endpoint=" + endpoint, "--rdzv_id=" + run_id,
               *(["--rdzv_conf=" + ",".join(conf)] if conf else []), *extra, script]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL, text=True, env=env(node)))
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=TIMEOUT)
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def two_agents_train():
    with DdprunStore() as store:
        res = agents("127.0.0.1:%d" % store.port, SCRIPT)
    for node, (rc, o, e) in zip("ab", res):
        check(rc == 0, "agent %s exited %d:\n%s\n%s" % (node, rc, o, e))
    lines = json_lines(res[0][1]) + json_lines(res[1][1])
    check(len(lines) == 1, "expected one result line from rank 0:\n%s\n%s" % (res[0][1], res[1][1]))
    return lines[0]


def restart_count_everywhere():
    reserved = reserved_port()  # held until agent a's store listens on it
    with tempfile.TemporaryDirectory(prefix="ddprun_elastic_") as tmp:
        script = os.path.join(tmp, "restart_check.py")
        with open(script, "w") as f:
            f.write(RESTART_SCRIPT)
        res = agents("127.0.0.1:%d" % reserved.port, script, extra=["--max_restarts=1"],
                     confs=(["is_host=1"], ["is_host=0"]))
    reserved.close()
    for node, (rc, o, e) in zip("ab", res):
        check(rc == 0, "agent %s exited %d:\n%s\n%s" % (node, rc, o, e))
    got = {}
    for rc, o, e in res:
        for line in json_lines(o):
            got[line["node"]] = line
    check(set(got) == {"a", "b"}, "expected one line from each node, got %r" % got)
    for node, line in sorted(got.items()):
        print("node %s: %s" % (node, line))
        check(line["restart"] == 1, "node %s read TORCHELASTIC_RESTART_COUNT=%s after one restart"
              % (node, line["restart"]))
        check(line["seen"] == [1, 1], "node %s gathered restart counts %r" % (node, line["seen"]))
    check(sorted(l["rank"] for l in got.values()) == [0, 1], "ranks %r" % got)


def main():
    ours = single_node()
    nodes = two_agents_train()
    print("ddprun 1 node x 2 :", ours)
    print("ddprun c10d 2 x 1 :", nodes)
    check(ours["world"] == 2, "world size under ddprun")
    check(nodes == ours, "the 2-agent c10d run differs from the 1-node run")
    restart_count_everywhere()
    print("test_elastic_ddp: same result across 2 c10d agents; the same restart count on each node")


if __name__ == "__main__":
    main()
