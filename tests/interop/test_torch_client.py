"""PyTorch's own TCPStore client against ddprun-store."""
import datetime
import multiprocessing as mp
import sys
import time

import torch
import torch.distributed as dist

from storeutil import DdprunStore, check, torch_major

TIMEOUT = datetime.timedelta(seconds=20)


def client(port, world_size=None):
    if world_size is None:
        return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    return dist.TCPStore("127.0.0.1", port, world_size, False, timeout=TIMEOUT)


def waiter(port, key, ready, q):
    s = client(port)
    ready.put(1)
    t0 = time.time()
    q.put((s.get(key), time.time() - t0))


def basic(port):
    s = client(port, 1)  # world_size given: ADDs the internal init/ key
    s.set("k", "v")
    check(s.get("k") == b"v", "get after set")
    s.set("bin", b"\x00\xff\x00")
    check(s.get("bin") == b"\x00\xff\x00", "binary value")
    s.set("empty", b"")
    check(s.get("empty") == b"", "empty value")
    check(s.add("n", 5) == 5 and s.add("n", -7) == -2 and s.add("n", 0) == -2, "add")
    check(s.get("n") == b"-2", "add stores decimal text")
    check(s.compare_set("cas", "expected", "x") == b"expected", "cas on missing key, non-empty expected")
    check(s.compare_set("cas", "", "first") == b"first", "cas creates with empty expected")
    check(s.compare_set("cas", "wrong", "second") == b"first", "cas mismatch")
    check(s.compare_set("cas", "first", "second") == b"second", "cas match")
    t0 = time.time()
    try:
        s.wait(["never"], datetime.timedelta(milliseconds=500))
        check(False, "wait did not time out")
    except Exception as e:  # DistStoreError on 2.x, RuntimeError on 1.13
        took = time.time() - t0
        check(0.45 < took < 5, "wait timeout took %.2fs" % took)
        check("imeout" in str(e), "timeout message: %s" % e)
    if torch_major() >= 2:
        # 1.13's client sends no CANCEL_WAIT, so its connection is out of step
        # after a timeout (PyTorch's own behaviour); 2.x stays usable.
        s.set("after", "ok")
        check(s.get("after") == b"ok", "store usable after a wait timeout")
    else:
        s = client(port)
    check(s.delete_key("k") is True and s.delete_key("k") is False, "delete_key")
    # init/, /bin, /empty, /n, /cas (+ /after on 2.x)
    expected = 6 if torch_major() >= 2 else 5
    check(s.num_keys() == expected, "num_keys %d != %d" % (s.num_keys(), expected))
    if hasattr(s, "check"):
        check(s.check(["bin", "n"]) and not s.check(["bin", "absent"]), "check")


def wakeups(port):
    ctx = mp.get_context("spawn")
    q, ready = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=waiter, args=(port, "go", ready, q)) for _ in range(3)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    time.sleep(1.0)  # they are now blocked in get()
    check(q.empty(), "a waiter returned before the key was set")
    client(port).set("go", "now")
    results = [q.get(timeout=20) for _ in procs]
    for p in procs:
        p.join(10)
    check(all(v == b"now" for v, _ in results), "waiters got %r" % results)
    check(all(t >= 0.8 for _, t in results), "waiters blocked until set: %r" % results)


def v2_only(port):
    s = client(port)
    s.append("log", "a")
    s.append("log", "bc")
    check(s.get("log") == b"abc", "append")
    s.multi_set(["m1", "m2"], ["1", b"\x002"])
    check(s.multi_get(["m2", "m1"]) == [b"\x002", b"1"], "multi_get")
    if hasattr(s, "queue_push"):
        s.queue_push("q", "x")
        s.queue_push("q", "y")
        check(s.queue_len("q") == 2, "queue_len")
        check(s.queue_pop("q") == b"x" and s.queue_pop("q") == b"y", "queue_pop order")
        check(s.queue_len("q") == 0, "queue drained")
    if hasattr(s, "list_keys"):
        keys = set(s.list_keys())
        check({"log", "m1", "m2"} <= keys, "list_keys %r" % keys)


def main():
    print("PyTorch", torch.__version__)
    with DdprunStore() as st:
        basic(st.port)
        wakeups(st.port)
        if torch_major() >= 2:
            v2_only(st.port)
    print("test_torch_client: all checks passed")


if __name__ == "__main__":
    main()
