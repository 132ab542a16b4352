"""ddprun_runtime's ProcessGroup::fromEnv works under PyTorch's own launcher:
coll_check (our collectives, checked against a float64 reference) started by
torchrun (python -m torch.distributed.run) with 2 workers. Under torchrun 2.x
workers join the agent's store; under 1.13 (whose torchrun crashes on Python
3.11) the ranks are started by hand and rank 0 hosts the store."""
import os
import subprocess
import sys

from storeutil import BIN, check, reserved_port

CHECK = os.path.join(BIN, "coll_check")
ARGS = ["--sizes", "0,7,4097,100003", "--dtypes", "float32,int64,bfloat16"]


def by_torchrun():
    # underscore spellings: accepted by torchrun 1.13 and 2.x alike; --standalone:
    # a free port, so that parallel runs never meet on 29500
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--no_python", CHECK, *ARGS]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if "'NoneType' object has no attribute 'get'" in p.stderr:
        return None  # Debian's torchrun 1.13 on Python 3.11
    check(p.returncode == 0, "torchrun + coll_check failed:\n%s\n%s" % (p.stdout, p.stderr))
    return p.stdout


def by_hand():
    reserved = reserved_port()  # held until rank 0's store listens on it
    port = reserved.port
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen([CHECK, *ARGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    out = ""
    for p in procs:
        o, e = p.communicate(timeout=240)
        check(p.returncode == 0, "coll_check by hand failed:\n%s\n%s" % (o, e))
        out += o
    reserved.close()
    return out


def main():
    out = by_torchrun()
    how = "torchrun"
    if out is None:
        out, how = by_hand(), "by hand (torchrun 1.13 cannot start on Python 3.11)"
    check(out.count("checks passed") == 2, out)
    print("OK: coll_check passed on 2 ranks launched %s" % how)


if __name__ == "__main__":
    main()
