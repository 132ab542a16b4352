"""Real PyTorch DDP (gloo) across 3 elastic agents on this machine, one of
which is killed (issue 18): `--nnodes=2:3`, default settings (no restart
budget). kill -9 of agent c: its worker dies with it, the survivors' gloo
collectives fail, ddprun finds c gone (its connection to the rendezvous
store closed) and treats the failure as that membership change: a and b
re-form as a world of 2 without counting a restart, their new workers
all_reduce again, and the job finishes with exit 0 on both."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from storeutil import BIN, check, fail, reserved_port

PATIENCE = 180  # s: bounds against hangs only, never a measurement

# Records itself after init, then all_reduces until every rank has seen the
# go file (decided by an all_reduce too, so all stop in the same iteration).
WORKER = r'''
import json, os, sys, time
import torch
import torch.distributed as dist
d = sys.argv[1]
dist.init_process_group("gloo")
w = dist.get_world_size()
rec = {"node": os.environ["NODE"], "pid": os.getpid(), "world": w, "rank": dist.get_rank(),
       "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"])}
path = os.path.join(d, "start_%d" % os.getpid())
with open(path + ".tmp", "w") as f:
    json.dump(rec, f)
os.rename(path + ".tmp", path)
while True:
    x = torch.ones(1)
    dist.all_reduce(x)
    assert x.item() == w, x
    stop = torch.tensor([1.0 if os.path.exists(os.path.join(d, "go")) else 0.0])
    dist.all_reduce(stop)
    if stop.item() > 0:
        break
    time.sleep(0.05)
dist.barrier()
print(json.dumps(rec), flush=True)
sys.stdout.flush()
os._exit(0)  # see examples/pytorch/ddp_train.py: a gloo teardown race at exit
'''


def starts(d):
    out = []
    for name in os.listdir(d):
        if name.startswith("start_") and not name.endswith(".tmp"):
            with open(os.path.join(d, name)) as f:
                out.append(json.load(f))
    return out


def wait_until(cond, what, agents):
    deadline = time.monotonic() + PATIENCE
    while not cond():
        if time.monotonic() > deadline:
            fail("%s: not within %d s\n%s" % (what, PATIENCE, said(agents)))
        time.sleep(0.05)


def said(agents):
    return "\n".join("agent %s (%s):\n%s" % (n, p.poll(), open(err).read())
                     for n, (p, err) in agents.items())


def main():
    reserved = reserved_port()  # held until agent a's store listens on it
    run_id = "loss-" + uuid.uuid4().hex[:8]
    agents = {}
    with tempfile.TemporaryDirectory(prefix="ddprun_node_loss_") as d:
        script = os.path.join(d, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        try:
            for node in "abc":
                err = os.path.join(d, "agent_%s.err" % node)
                env = dict(os.environ, PYTHON_EXEC=sys.executable, GLOO_SOCKET_IFNAME="lo",
                           NODE=node, OMP_NUM_THREADS="1")
                cmd = [os.path.join(BIN, "ddprun"), "--nnodes=2:3", "--nproc_per_node=1",
                       "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:%d" % reserved.port,
                       "--rdzv_id=" + run_id, "--rdzv_conf=is_host=%d" % (node == "a"),
                       script, d]
                with open(err, "w") as e, open(os.path.join(d, "agent_%s.out" % node), "w") as o:
                    agents[node] = (subprocess.Popen(cmd, stdout=o, stderr=e,
                                                     stdin=subprocess.DEVNULL, env=env), err)
            wait_until(lambda: len([s for s in starts(d) if s["world"] == 3]) == 3,
                       "3 workers in a world of 3", agents)
            agents["c"][0].send_signal(signal.SIGKILL)
            wait_until(lambda: len([s for s in starts(d) if s["world"] == 2]) == 2,
                       "the survivors' 2 workers in a world of 2", agents)
            second = [s for s in starts(d) if s["world"] == 2]
            check(sorted(s["node"] for s in second) == ["a", "b"], "second round: %r" % second)
            check({s["restart"] for s in second} == {0},
                  "the loss of a node counted as a restart: %r" % second)
            open(os.path.join(d, "go"), "w").close()
            for node in "ab":
                p, _ = agents[node]
                try:
                    rc = p.wait(PATIENCE)
                except subprocess.TimeoutExpired:
                    fail("agent %s still running\n%s" % (node, said(agents)))
                check(rc == 0, "agent %s exited %d\n%s" % (node, rc, said(agents)))
                err = open(agents[node][1]).read()
                check("is gone: its connection to the rendezvous store closed" in err, err)
                check("not counted as a restart" in err, err)
            print("test_node_loss_ddp: after kill -9 of one of 3 agents, the survivors' gloo "
                  "DDP re-formed as a world of 2 (restart count 0) and finished")
        finally:
            for p, _ in agents.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            reserved.close()


if __name__ == "__main__":
    main()
