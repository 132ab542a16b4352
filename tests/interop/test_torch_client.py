"""PyTorch's own TCPStore client against ddprun-store."""
import datetime
import multiprocessing as mp
import os
import platform
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


# System calls in which a client blocks for a reply (/proc/PID/syscall
# numbers): 1.13 blocks in recv, 2.x polls the socket first.
_BLOCKING_READS = {
    "x86_64": {0, 7, 23, 45, 47, 232, 270, 271, 281},  # read poll select recvfrom recvmsg
                                                         # epoll_wait pselect6 ppoll epoll_pwait
    "aarch64": {22, 63, 72, 73, 207, 212},  # epoll_pwait read pselect6 ppoll recvfrom recvmsg
}


def blocked_reading(pid):
    """Whether the main thread of `pid` sleeps in a system call that waits
    for data. After a waiter announced itself its only such call is inside
    get(), which sends its WAIT before it blocks: so the WAIT is sent."""
    try:
        with open("/proc/%d/syscall" % pid) as f:
            fields = f.read().split()
    except OSError:
        return False
    if not fields or not fields[0].isdigit():  # "running"
        return False
    return int(fields[0]) in _BLOCKING_READS.get(platform.machine(), set())


def wait_for(cond, timeout=60.0):
    """True once cond() holds; False if it still does not after `timeout`
    seconds (a bound against hangs, never a timing assertion)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return cond()
        time.sleep(0.01)  # polling interval, not synchronisation
    return True


def waiter(port, key, ready, q):
    s = client(port)
    ready.put(os.getpid())
    q.put(s.get(key))


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
    t0 = time.monotonic()
    try:
        s.wait(["never"], datetime.timedelta(milliseconds=500))
        check(False, "wait did not time out")
    except Exception as e:  # DistStoreError on 2.x, RuntimeError on 1.13
        took = time.monotonic() - t0
        # Not before its timeout (a lower bound: load can only lengthen it).
        check(took > 0.45, "wait timed out after %.2fs, before its 0.5 s" % took)
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
    pids = [ready.get(timeout=60) for _ in procs]
    # Every waiter is blocked in get(), its WAIT sent; the SET below comes
    # on a new connection after a handshake, so the server has the WAITs
    # before it.
    check(wait_for(lambda: all(blocked_reading(pid) for pid in pids)),
          "the waiters did not block in get()")
    check(q.empty(), "a waiter returned before the key was set")
    client(port).set("go", "now")
    results = [q.get(timeout=20) for _ in procs]
    for p in procs:
        p.join(10)
    check(all(v == b"now" for v in results), "waiters got %r" % results)


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
