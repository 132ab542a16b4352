#!/usr/bin/env python3
"""Node-loss benchmark: an elastic job loses a node to `kill -9`; ddprun
against torchrun, default settings, real PyTorch workers, in one run.

    /opt/ddprun-test/venv-torch2/bin/python scripts/bench/node_loss_bench.py [--reps N]

For each launcher (ddprun from build/bin or $DDPRUN_BIN_DIR; torchrun =
`python -m torch.distributed.run` of the torch2 venv), each repetition:
  1. 3 agents of one elastic job on loopback (--nnodes=2:3 --nproc-per-node=1
     --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:<port> --rdzv-id=<fresh>),
     nothing else: --max-restarts 0, default keep-alive, last call and close
     timeouts. Node 0 starts first and hosts the endpoint.
  2. The workers (the same PyTorch script under both, the venv's python):
     init_process_group("gloo") over lo, a start record (time.time() before
     `import torch` and after init_process_group, WORLD_SIZE, RANK,
     TORCHELASTIC_RESTART_COUNT, pid, node), then all_reduce of a small
     tensor every 50 ms until rank 0 sees the file "go"; barrier, destroy,
     os._exit(0).
  3. Once 3 workers of world size 3 have each done an all_reduce, node 2 (not
     the host) dies: SIGKILL of its agent and of every process under it, at
     once, as when the machine goes (torchrun's workers run in sessions of
     their own and would outlive their agent; ddprun's die with it).
  4. The figure: kill -> both survivors' new workers (world size 2) past
     init_process_group (the later of their stamps minus the time taken just
     before the kill). Recorded with it: the survivors' restart counts, then
     "go" is created and the survivors' exit codes and the host's time from
     "go" to its exit are taken. If the survivors never re-form, the outcome
     (their agents' exit codes, time from the kill to their exit) is recorded
     instead. Each phase is bounded (--timeout); everything is killed at the
     end of each run.
Writes docs/node_loss_bench.json (CPU model, load average: the machine may
be shared) and prints a markdown table. --max-restarts=N passes that flag to
both launchers instead (docs/node_loss_bench_restarts<N>.json).
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build/bin"))
TORCH_PY = os.environ.get("TORCH_PYTHON", "/opt/ddprun-test/venv-torch2/bin/python")
sys.path.insert(0, os.path.join(ROOT, "tests", "pyutil"))
from procs import alive, descendants, kill_all, listening, wait_for  # noqa: E402
from reserved_port import ReservedPort  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchutil import cpu_model  # noqa: E402

# argv: DIR. Writes DIR/exec_<pid> (JSON) before `import torch`,
# DIR/start_<pid> (JSON) after init_process_group and
# DIR/ar_<pid> after its first all_reduce; stops when rank 0 sees DIR/go.
WORKER_PY = r'''
import time
t_exec = time.time()
import json, os, sys
# An exec record first (a worker that fails in init_process_group leaves it).
d = sys.argv[1]
with open(os.path.join(d, ".exec_%d" % os.getpid()), "w") as f:
    json.dump({"t_exec": t_exec, "world": int(os.environ["WORLD_SIZE"]),
               "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "-1")),
               "pid": os.getpid(), "node": os.environ["BENCH_NODE"]}, f)
os.rename(os.path.join(d, ".exec_%d" % os.getpid()), os.path.join(d, "exec_%d" % os.getpid()))
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rec = {"t_exec": t_exec, "t_init": time.time(), "world": int(os.environ["WORLD_SIZE"]),
       "rank": int(os.environ["RANK"]),
       "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "-1")),
       "pid": os.getpid(), "node": os.environ["BENCH_NODE"]}
tmp = os.path.join(d, ".start_%d" % os.getpid())
with open(tmp, "w") as f:
    json.dump(rec, f)
os.rename(tmp, os.path.join(d, "start_%d" % os.getpid()))
flag = torch.zeros(1)
n = 0
while True:
    # Rank 0 decides when to stop, so that every rank leaves the loop after
    # the same collective.
    flag.fill_(1.0 if rec["rank"] == 0 and os.path.exists(os.path.join(d, "go")) else 0.0)
    dist.all_reduce(flag)
    if n == 0:
        open(os.path.join(d, "ar_%d" % os.getpid()), "w").close()
    n += 1
    if flag.item() > 0:
        break
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
# A gloo teardown race aborts some exits through interpreter finalisation
# (examples/pytorch/ddp_train.py): leave without it.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
'''


def launcher(name):
    if name == "ddprun":
        return [os.path.join(BIN, "ddprun")]
    return [TORCH_PY, "-m", "torch.distributed.run"]


def records(d, kind="start_"):
    """The workers' start (or exec_) records so far."""
    out = []
    for name in os.listdir(d):
        if name.startswith(kind):
            with open(os.path.join(d, name)) as f:
                out.append(json.load(f))
    return out


def did_all_reduce(d, rec):
    return os.path.exists(os.path.join(d, "ar_%d" % rec["pid"]))


class Job:
    """3 agents of one launcher on a fresh run id; node i has BENCH_NODE=i.
    Each agent leads a session of its own (its process group: kill_all)."""

    def __init__(self, name, worker, tmp, max_restarts):
        self.name = name
        self.dir = tempfile.mkdtemp(dir=tmp)
        self.port = ReservedPort()  # node 0 binds it (the store sets SO_REUSEADDR)
        self.cmd = launcher(name) + [
            "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:%d" % self.port.port,
            "--rdzv-id=nodeloss-%s" % uuid.uuid4().hex[:12]]
        if max_restarts is not None:
            self.cmd.append("--max-restarts=%d" % max_restarts)
        self.cmd += [worker, self.dir]
        self.procs, self.logs, self.exit_at = [], [], {}
        self.pids = set()  # every agent and worker seen, for the final kill

    def start(self, node):
        log = open(os.path.join(self.dir, "agent_%d.log" % node), "w+")
        env = dict(os.environ, BENCH_NODE=str(node), GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1", PYTHON_EXEC=TORCH_PY)
        p = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(p)
        self.logs.append(log)
        self.pids.add(p.pid)
        return p

    def poll(self, i):
        """Agent i's exit code (None while it runs), with the time it was
        first seen gone."""
        rc = self.procs[i].poll()
        if rc is not None and i not in self.exit_at:
            self.exit_at[i] = time.time()
        return rc

    def watch(self, cond, timeout):
        """Waits for cond() while noting agents' exit times (10 ms polls)."""
        def step():
            for i in range(len(self.procs)):
                self.poll(i)
            return cond()
        return wait_for(step, timeout, 0.01)

    def note_workers(self):
        for r in records(self.dir) + records(self.dir, "exec_"):
            self.pids.add(r["pid"])
        for p in self.procs:
            self.pids.update(descendants(p.pid))

    def tail(self, i, n=1500):
        self.logs[i].flush()
        self.logs[i].seek(0)
        return self.logs[i].read()[-n:]

    def close(self):
        """Kills every agent (its process group) and every worker seen."""
        self.note_workers()
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_all(sorted(self.pids))
        for p in self.procs:
            p.wait()
        for log in self.logs:
            log.close()
        self.port.close()


def one_run(name, worker, tmp, timeout, keep_logs, max_restarts):
    job = Job(name, worker, tmp, max_restarts)
    r = {}
    try:
        t_start = time.time()
        host = job.start(0)
        if not wait_for(lambda: listening(job.port.port) or host.poll() is not None, timeout):
            raise RuntimeError("node 0 does not listen after %.0f s" % timeout)
        job.start(1)
        job.start(2)

        def first_round():
            got = [x for x in records(job.dir) if x["world"] == 3]
            return got if len(got) == 3 and all(did_all_reduce(job.dir, x) for x in got) \
                else None
        if not job.watch(lambda: first_round() or any(job.poll(i) is not None for i in range(3)),
                         timeout) or not first_round():
            raise RuntimeError("3 workers did not run an all_reduce in %.0f s" % timeout)
        first = first_round()
        r["formation_s"] = max(x["t_init"] for x in first) - t_start
        first_pids = {x["pid"] for x in first}
        victims = [job.procs[2].pid] + descendants(job.procs[2].pid)
        job.pids.update(victims)
        killed = time.time()
        kill_all(victims)

        def second_round():
            got = [x for x in records(job.dir) if x["world"] == 2 and x["pid"] not in first_pids
                   and x["node"] in ("0", "1")]
            return got if {x["node"] for x in got} == {"0", "1"} else None

        def survivors_gone():
            return job.poll(0) is not None and job.poll(1) is not None
        job.watch(lambda: second_round() or survivors_gone(), timeout)
        job.note_workers()
        second = second_round()
        r["reformed"] = bool(second)
        if second:
            r["kill_to_running_s"] = max(x["t_init"] for x in second) - killed
            r["kill_to_exec_s"] = max(x["t_exec"] for x in second) - killed
            r["restart_counts"] = {x["node"]: x["restart"] for x in second}
            job.watch(lambda: all(did_all_reduce(job.dir, x) for x in second) or
                      survivors_gone(), timeout)
            r["second_round_all_reduce"] = all(did_all_reduce(job.dir, x) for x in second)
            go = time.time()
            open(os.path.join(job.dir, "go"), "w").close()
            job.watch(survivors_gone, timeout)
            r["host_exit_after_go_s"] = job.exit_at[0] - go if 0 in job.exit_at else None
            r["survivor_exit_after_go_s"] = {str(i): job.exit_at[i] - go
                                             for i in (0, 1) if i in job.exit_at}
        else:
            r["survivors_exit_after_kill_s"] = {str(i): job.exit_at[i] - killed
                                                for i in (0, 1) if i in job.exit_at}
        # Every worker the survivors started after the kill, in order, with
        # whether it got past init_process_group.
        inited = {x["pid"] for x in records(job.dir)}
        r["survivor_workers_after_kill"] = [
            dict(node=x["node"], world=x["world"], restart=x["restart"],
                 exec_after_kill_s=round(x["t_exec"] - killed, 3), inited=x["pid"] in inited)
            for x in sorted(records(job.dir, "exec_"), key=lambda x: x["t_exec"])
            if x["pid"] not in first_pids and x["node"] in ("0", "1")]
        r["exit_codes"] = {str(i): job.poll(i) for i in (0, 1)}  # None: still running
        r["finished"] = all(job.poll(i) == 0 for i in (0, 1))
        if keep_logs or not r["finished"]:
            r["agent_output_tail"] = {str(i): job.tail(i) for i in (0, 1)}
        return r
    except RuntimeError as e:
        r["error"] = str(e)
        r["agent_output_tail"] = {str(i): job.tail(i) for i in range(len(job.procs))}
        return r
    finally:
        job.close()


def summarize(runs):
    s = {"runs": runs}
    times = [r["kill_to_running_s"] for r in runs if r.get("reformed")]
    if times:
        s["kill_to_running_median_s"] = statistics.median(times)
        s["kill_to_running_runs_s"] = times
        s["kill_to_exec_median_s"] = statistics.median(
            r["kill_to_exec_s"] for r in runs if r.get("reformed"))
    hosts = [r["host_exit_after_go_s"] for r in runs if r.get("host_exit_after_go_s") is not None]
    if hosts:
        s["host_exit_after_go_median_s"] = statistics.median(hosts)
    gone = [max(r["survivors_exit_after_kill_s"].values()) for r in runs
            if r.get("survivors_exit_after_kill_s")]
    if gone:
        s["no_reform_exit_after_kill_median_s"] = statistics.median(gone)
    return s


def restart_counts(r):
    """The survivors' new round's counts (node 0/node 1), or what their
    workers started after the kill saw when no round formed."""
    if r.get("restart_counts"):
        return "/".join(str(r["restart_counts"][n]) for n in ("0", "1"))
    tries = r.get("survivor_workers_after_kill", [])
    if not tries:
        return "no new workers"
    return "no round: %d workers started, none past init together (counts %s)" % (
        len(tries), "/".join(",".join(str(t["restart"]) for t in tries if t["node"] == n)
                             for n in ("0", "1")))


def after_kill(r, timeout):
    """What the survivors' agents of a run that never re-formed did."""
    gone = r.get("survivors_exit_after_kill_s", {})
    return "/".join("exit %s at %.1f s" % (r["exit_codes"][n], gone[n]) if n in gone
                    else "running at %.0f s" % timeout for n in ("0", "1"))


def fmt_runs(xs):
    return ", ".join("%.2f" % x for x in xs)


def report(res):
    settings = ("default settings" if res["max_restarts"] is None else
                "--max-restarts=%d, other settings default" % res["max_restarts"])
    lines = ["Node loss: 3 agents (--nnodes=2:3, c10d, loopback, %s), a PyTorch " % settings +
             "gloo worker each; node 2 (not the host) killed with SIGKILL (agent and worker); "
             "%d runs each, %s, %d CPUs, shared with other builds (load average %.1f -> %.1f); "
             "torch %s:" % (res["reps"], res["cpu_model"], res["cpus"], res["load_start"],
                            res["load_end"], res["torch_version"]), "",
             "| launcher | kill -9 -> survivors' workers running (s): median (runs) "
             "| kill -9 -> their exec, before import torch (s, median) "
             "| restart counts seen by survivors (node 0/node 1, per run) "
             "| survivors' exit codes (per run) | host exit after go (s) |",
             "|---|---|---|---|---|---|"]
    for name, s in res["launchers"].items():
        runs = s["runs"]
        bad = [r for r in runs if not r.get("reformed")]
        if "kill_to_running_median_s" in s:
            t = "%.2f (%s)" % (s["kill_to_running_median_s"], fmt_runs(s["kill_to_running_runs_s"]))
        else:
            t = "never (0 of %d)" % len(runs)
        if bad and len(bad) < len(runs):
            t += "; %d of %d never re-formed" % (len(bad), len(runs))
        if bad:
            t += "; survivors' agents %s" % "; ".join(after_kill(r, res["timeout"]) for r in bad)
        counts = "; ".join(restart_counts(r) for r in runs) or "-"
        codes = "; ".join("/".join("running at %.0f s" % res["timeout"]
                                   if r["exit_codes"][n] is None else
                                   str(r["exit_codes"][n]) for n in ("0", "1"))
                          for r in runs if "exit_codes" in r) or "-"
        if "host_exit_after_go_median_s" in s:
            hosts = [r["host_exit_after_go_s"] for r in runs
                     if r.get("host_exit_after_go_s") is not None]
            h = "%.2f (%s)" % (s["host_exit_after_go_median_s"], fmt_runs(hosts))
        else:
            h = "-"
        ex = "%.2f" % s["kill_to_exec_median_s"] if "kill_to_exec_median_s" in s else "-"
        lines.append("| %s | %s | %s | %s | %s | %s |"
                     % (name, t, ex, counts, codes, h))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--launchers", default="ddprun,torchrun")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="bound on each phase of a run (s)")
    ap.add_argument("--keep-logs", action="store_true",
                    help="put the survivors' agent output in the JSON even when all went well")
    ap.add_argument("--max-restarts", type=int, default=None,
                    help="pass --max-restarts=N to both launchers (default: not passed, 0); "
                    "the JSON is then node_loss_bench_restarts<N>.json")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--report-only", action="store_true",
                    help="print (and store) the table of the existing JSON, measuring nothing")
    args = ap.parse_args()
    out_json = os.path.join(args.out, "node_loss_bench%s.json" % (
        "" if args.max_restarts is None else "_restarts%d" % args.max_restarts))
    if args.report_only:
        with open(out_json) as f:
            res = json.load(f)["results"]
        save(res, out_json)
        return
    which = args.launchers.split(",")
    if "ddprun" in which and not os.access(os.path.join(BIN, "ddprun"), os.X_OK):
        sys.exit("no ddprun in %s: build it (cmake --build build --target ddprun) or set "
                 "DDPRUN_BIN_DIR" % BIN)
    torch_version = subprocess.run([TORCH_PY, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    tmp = tempfile.mkdtemp(prefix="node_loss_bench_")
    res = {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "torch_version": torch_version,
           "reps": args.reps, "load_start": os.getloadavg()[0], "launchers": {}}
    res["max_restarts"] = args.max_restarts
    res["timeout"] = args.timeout
    try:
        worker = os.path.join(tmp, "worker.py")
        with open(worker, "w") as f:
            f.write(WORKER_PY)
        for name in which:
            runs = []
            for i in range(args.reps):
                r = one_run(name, worker, tmp, args.timeout, args.keep_logs, args.max_restarts)
                runs.append(r)
                print(name, i, json.dumps({k: v for k, v in r.items()
                                           if k != "agent_output_tail"}), file=sys.stderr)
            res["launchers"][name] = summarize(runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    res["load_end"] = os.getloadavg()[0]
    save(res, out_json)


def save(res, path):
    """Prints the table and writes it with the results to `path`."""
    table = report(res)
    print(table)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"results": res, "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
