"""Waiting on conditions and looking at processes through /proc, for the
integration tests. Nothing here sleeps to synchronise: wait_for polls a
condition (a file, a process state) until it holds or a generous deadline
passes, and says which."""
import os
import signal
import time


def wait_for(cond, timeout=30.0, interval=0.01):
    """True as soon as cond() is true; False if it is still false after
    `timeout` seconds (a bound against hangs, never a timing assertion)."""
    end = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= end:
            return bool(cond())
        time.sleep(interval)


def _stat_fields(pid):
    """The fields of /proc/PID/stat after the command name, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def alive(pid):
    """Whether `pid` runs (a zombie counts as gone: it runs nothing)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def parent_of(pid):
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def state_of(pid):
    """The process state letter (R, S, Z, T, ...), or None if it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def children(pid):
    """The direct children of `pid` now, zombies included."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and parent_of(int(name)) == pid:
            found.append(int(name))
    return found


def descendants(pid):
    """Every live process whose chain of parents leads to `pid`, now."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid = parent_of(int(name))
            if ppid is not None:
                parents.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if alive(child):
                found.append(child)
            todo.append(child)
    return found


def kill_all(pids, sig=signal.SIGKILL):
    """Sends `sig` to each pid still there (test cleanup; errors ignored)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def status_kib(pid, field):
    """A size field of /proc/PID/status (VmRSS, VmHWM, ...) in KiB, or None
    if the process is gone."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def listening_inodes(port):
    """The socket inodes ("socket:[N]", as /proc/PID/fd links read) of the
    TCP sockets on this host listening on `port` (IPv4 or v6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":
                        inodes.add("socket:[%s]" % cols[9])
        except FileNotFoundError:
            pass
    return inodes


def listening(port):
    """Whether some TCP socket on this host listens on `port` (IPv4 or v6)."""
    return bool(listening_inodes(port))


def read_pids(path):
    """The integers in a file of pids (missing file: none)."""
    try:
        with open(path) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def signal_handled(pid, sig):
    """Whether the process catches or blocks `sig` (a handler installed by
    sigaction, or a signal taken through signalfd/sigwait): past that point a
    signal no longer kills it by default."""
    masks = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("SigCgt", "SigBlk"):
                    masks[key] = int(value.strip(), 16)
    except (FileNotFoundError, ProcessLookupError):
        return False
    bit = 1 << (int(sig) - 1)
    return any(m & bit for m in masks.values())
