"""A real 2-rank gloo process group whose rendezvous goes through ddprun-store,
the way torchrun's agent store serves workers (TORCHELASTIC_USE_AGENT_STORE)."""
import os
import subprocess
import sys

from storeutil import DdprunStore, check

WORKER = r'''
import datetime, os, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
r, w = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(r + 1)] * 4)
dist.all_reduce(t)
assert t.tolist() == [3.0] * 4, t
b = torch.tensor([r * 10 + 5])
dist.broadcast(b, src=1)
assert b.item() == 15, b
out = [torch.zeros(2) for _ in range(w)]
dist.all_gather(out, torch.tensor([float(r), float(r) * 2]))
assert [o.tolist() for o in out] == [[0.0, 0.0], [1.0, 2.0]], out
dist.barrier()
dist.destroy_process_group()
print("rank", r, "ok", flush=True)
'''


def main():
    with DdprunStore() as st:
        procs = []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                       LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(st.port),
                       TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                       GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=120)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                check(False, "gloo ranks hung")
        for rank, (p, out) in enumerate(zip(procs, outs)):
            check(p.returncode == 0 and ("rank %d ok" % rank) in out,
                  "rank %d exited %s:\n%s" % (rank, p.returncode, out))
    print("test_gloo_agent_store: 2-rank gloo all_reduce/broadcast/all_gather through ddprun-store passed")


if __name__ == "__main__":
    main()
