"""An unmodified PyTorch DDP script gives the same result under ddprun as
under torchrun (python -m torch.distributed.run), 2 workers, gloo on CPU.
Where this PyTorch's torchrun is broken, the reference is a hand launch of
the same two ranks instead, and the test says so."""
import json
import os
import subprocess
import sys

from storeutil import BIN, check

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
SCRIPT = os.path.join(ROOT, "examples/pytorch/ddp_train.py")


def result(cmd):
    env = dict(os.environ, PYTHON_EXEC=sys.executable, GLOO_SOCKET_IFNAME="lo")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    check(p.returncode == 0, "%s exited %d:\n%s\n%s" % (cmd[0], p.returncode, p.stdout, p.stderr))
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    check(len(lines) == 1, "expected one result line from %s, got:\n%s" % (cmd[0], p.stdout))
    return json.loads(lines[0])


def torchrun_works():
    """Debian's torchrun 1.13 crashes under Python 3.11 before starting any
    worker (AttributeError in elastic/multiprocessing/api.py to_map)."""
    probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "storeutil.py")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=1", probe], capture_output=True, text=True,
                       timeout=120)
    return "'NoneType' object has no attribute 'get'" not in p.stderr


def manual_launch():
    """The reference without torchrun: two ranks started by hand with the env
    contract, rank 0 hosting the store (init_method env://)."""
    from storeutil import reserved_port
    reserved = reserved_port()  # held until rank 0's store listens on it
    port = reserved.port
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-u", SCRIPT], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    reserved.close()
    for p, (out, err) in zip(procs, outs):
        check(p.returncode == 0, "manual rank failed:\n" + err)
    lines = [l for l in outs[0][0].splitlines() if l.startswith("{")]
    return json.loads(lines[0])


def two_nodes():
    """Two agents on this machine (--nnodes 2 --node_rank 0/1), one worker each."""
    from storeutil import reserved_port
    reserved = reserved_port()  # held until node 0's store listens on it
    port = reserved.port
    env = dict(os.environ, PYTHON_EXEC=sys.executable, GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([os.path.join(BIN, "ddprun"), "--nnodes=2", "--node_rank=%d" % n,
                               "--master_addr=127.0.0.1", "--master_port=%d" % port,
                               "--nproc_per_node=1", SCRIPT],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for n in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    reserved.close()
    for n, (p, (out, err)) in enumerate(zip(procs, outs)):
        check(p.returncode == 0, "node %d exited %d:\n%s" % (n, p.returncode, err))
    lines = [l for l in outs[0][0].splitlines() if l.startswith("{")]
    check(len(lines) == 1, "expected one result line from node 0:\n" + outs[0][0])
    return json.loads(lines[0])


def main():
    ours = result([os.path.join(BIN, "ddprun"), "--standalone", "--nproc_per_node=2", SCRIPT])
    nodes = two_nodes()
    print("ddprun 2 nodes x 1:", nodes)
    check(nodes == ours, "2-node static launch differs from the 1-node launch")
    if torchrun_works():
        reference = "torchrun"
        theirs = result([sys.executable, "-m", "torch.distributed.run", "--standalone",
                         "--nproc_per_node=2", SCRIPT])
    else:
        reference = "a hand launch (torchrun broken here)"
        print("note: this PyTorch's torchrun is broken here (Debian 1.13 on Python 3.11); "
              "comparing with a hand launch of the same two ranks instead")
        theirs = manual_launch()
        theirs["restart"] = ours["restart"]  # TORCHELASTIC_RESTART_COUNT is a launcher's
    print("ddprun  :", ours)
    print("reference (%s):" % reference, theirs)
    check(ours["world"] == 2, "world size under ddprun")
    check(ours == theirs, "results differ between ddprun and %s" % reference)
    print("test_ddp_under_ddprun: same result under ddprun and %s" % reference)


if __name__ == "__main__":
    main()
