#!/usr/bin/env python3
"""Beyond one GPU, on paper: our one-GPU profile replayed through a
latency-bandwidth model of the gradient all-reduce. A MODEL, never a
measurement.

    python3 scripts/bench/comm_model.py [--bench-json docs/resnet_bench_cuda.json] \
        [--case resnet18-224-tf32] [--allreduce-jsonl FILE ...] \
        [--out-json docs/comm_model.json] [--out-md docs/comm_model.md]

Input: the "profile" of `train` (docs/resnet_bench_cuda.json, written by
scripts/bench/resnet_bench.py): step_ms, reducer_ms, backward_end_ms and
"buckets" (each gradient bucket's bytes and its ready time in ms from the step
start, GPU timestamps, launch order).

The model: every rank computes as the measured GPU does (weak scaling, the same
batch per GPU). The buckets are all-reduced in launch order on one channel,
each starting at max(its ready time, the previous bucket's end) and taking
  ring (n ranks):        t = alpha + 2(n-1)/n * bytes / busbw
  hierarchical (g GPUs per node, m nodes, one NIC per GPU):
                         t = alpha + 2(g-1)/g * bytes / busbw_nvlink
                                   + 2(m-1)/m * (bytes / g) / busbw_nic
(a reduce-scatter and an all-gather inside the node, and between the nodes an
all-reduce of each GPU's 1/g shard through its own NIC). The communication
that ends after backward is exposed: exposed = max(0, end of the last bucket -
backward_end_ms); hidden fraction = 1 - exposed / (sum of bucket times);
projected step = (step_ms - reducer_ms) + exposed. Not modelled: the
all-reduce kernels slowing the compute they overlap (SMs, memory bandwidth),
the optimizer overlapping the last buckets, stragglers, and the reducer's
own finalize.

The check: the two-rank run on one GPU (case resnet18-224-tf32-2ranks) is fed
to the same model with its own bucket ready times and the all-reduce times
allreduce_perf measured on that transport (--allreduce-jsonl nccl=FILE
--allreduce-jsonl ipc=FILE: allreduce_perf --json lines, 2 ranks, CUDA, one
file per DDPRUN_CUDA_TRANSPORT), and set against what that run measured (its
profile's "comm": hidden fraction and bucket times; its step).

Two refinements per configuration (issue 44 item 8):
- a tiny last bucket: the last bucket to launch (the stem's gradients, ready
  at the end of backward) split so that only its final TAIL bytes wait for
  backward's end. ASSUMPTION: a bucket's bytes become ready evenly between
  the previous bucket's ready time and its own (the profile has ready times
  per bucket, not per parameter). The best TAIL of TAIL_CANDIDATES is
  reported where it exposes less than the measured layout.
- jitter: the profile's per-step device times (step_ms_each) give the
  spread of one GPU's step; a synchronous all-reduce waits for the slowest
  of n ranks, modelled as n independent normal samples: the step grows by
  sigma * E[max of n standard normals] (Blom's approximation). A MODEL of
  straggling, from the one GPU's own spread; other ranks' noise is not known.

Every bandwidth and latency below is an input, with its source or marked
ASSUMPTION; change them with --config NAME:KIND:key=value,... (see CONFIGS).
"""
import argparse
import bisect
import json
import math
import os
import statistics
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))

SOURCES = {
    "busbw": "NCCL tests' bus bandwidth: an all-reduce of S bytes on n ranks with per-rank "
             "bandwidth B takes at best S/B * 2(n-1)/n (github.com/NVIDIA/nccl-tests, "
             "doc/PERFORMANCE.md)",
    "nvlink": "H100 SXM: NVLink 4, 900 GB/s per GPU both directions, 450 GB/s each way "
              "(NVIDIA H100 Tensor Core GPU datasheet); the NCCL all-reduce busbw reached on 8 of "
              "them is an ASSUMPTION: 360-450 GB/s (80-100 % of the link), not measured here",
    "nic": "400 Gb/s per GPU = 50 GB/s line rate each way (one ConnectX-7 400 Gb/s NIC per GPU, as "
           "in a DGX H100: NVIDIA DGX H100 user guide); 45 GB/s reached is an ASSUMPTION (90 %)",
    "alpha": "per all-reduce latency: ASSUMPTION, 10-20 us inside a node, 30 us across nodes "
             "(typical small-message NCCL times; not measured here)",
    "flat_ring": "the pessimistic bound: a ring whose every hop runs at one NIC's 45 GB/s (what "
                 "one NIC per node, or rings not spread over the NICs, would give)",
}

# name, kind, parameters. ring: n, busbw (GB/s), alpha_us. hier: g, m, nvl, nic, alpha_us.
CONFIGS = [
    ("8xH100 NVLink, busbw 360 GB/s, alpha 20 us", "ring",
     dict(n=8, busbw=360.0, alpha_us=20.0), ("busbw", "nvlink", "alpha")),
    ("8xH100 NVLink, busbw 450 GB/s, alpha 10 us", "ring",
     dict(n=8, busbw=450.0, alpha_us=10.0), ("busbw", "nvlink", "alpha")),
    ("2 nodes x 8 H100, 400 Gb/s per GPU, hierarchical", "hier",
     dict(g=8, m=2, nvl=360.0, nic=45.0, alpha_us=30.0), ("busbw", "nvlink", "nic", "alpha")),
    ("8 nodes x 8 H100, 400 Gb/s per GPU, hierarchical", "hier",
     dict(g=8, m=8, nvl=360.0, nic=45.0, alpha_us=30.0), ("busbw", "nvlink", "nic", "alpha")),
    ("2 nodes x 8 H100, flat ring at 45 GB/s (bound)", "ring",
     dict(n=16, busbw=45.0, alpha_us=30.0), ("busbw", "nic", "flat_ring", "alpha")),
    ("8 nodes x 8 H100, flat ring at 45 GB/s (bound)", "ring",
     dict(n=64, busbw=45.0, alpha_us=30.0), ("busbw", "nic", "flat_ring", "alpha")),
]


# ----------------------------------------------------------------------------- the model

def ring_ms(nbytes, n, busbw, alpha_us):
    """A ring all-reduce of nbytes on n ranks: alpha + 2(n-1)/n * bytes / busbw (GB/s)."""
    if n < 2:
        return 0.0
    return alpha_us / 1e3 + 2.0 * (n - 1) / n * nbytes / (busbw * 1e9) * 1e3


def hier_ms(nbytes, g, m, nvl, nic, alpha_us):
    """Reduce-scatter + all-gather over NVLink inside each node (g GPUs), and
    an all-reduce of each GPU's bytes/g shard between m nodes over its NIC."""
    if g * m < 2:
        return 0.0
    intra = 2.0 * (g - 1) / g * nbytes / (nvl * 1e9) if g > 1 else 0.0
    inter = 2.0 * (m - 1) / m * (nbytes / g) / (nic * 1e9) if m > 1 else 0.0
    return alpha_us / 1e3 + (intra + inter) * 1e3


def ranks_of(kind, p):
    return p["n"] if kind == "ring" else p["g"] * p["m"]


def time_fn(kind, p):
    if kind == "ring":
        return lambda b: ring_ms(b, p["n"], p["busbw"], p["alpha_us"])
    if kind == "hier":
        return lambda b: hier_ms(b, p["g"], p["m"], p["nvl"], p["nic"], p["alpha_us"])
    raise ValueError("unknown kind %r (ring or hier)" % kind)


def replay(buckets, fn):
    """Buckets all-reduced in order on one channel: start = max(ready,
    previous end), end = start + fn(bytes). Returns the timeline."""
    out, prev = [], 0.0
    for b in buckets:
        start = max(float(b["ready_ms"]), prev)
        dur = fn(b["bytes"])
        out.append({"bytes": b["bytes"], "ready_ms": b["ready_ms"], "start_ms": start,
                    "end_ms": start + dur, "comm_ms": dur})
        prev = start + dur
    return out


def project(profile, fn):
    """The profile's step with the all-reduce fn(bytes) added: exposed comm,
    hidden fraction, projected step (see the module's description)."""
    buckets = profile.get("buckets") or []
    if not buckets:
        raise ValueError("the profile has no buckets (ready times) to replay")
    bwd_end = float(profile["backward_end_ms"])
    step = float(profile["step_ms"])
    compute = step - float(profile.get("reducer_ms") or 0.0)
    tl = replay(buckets, fn)
    total = sum(b["comm_ms"] for b in tl)
    exposed = max(0.0, tl[-1]["end_ms"] - bwd_end)
    return {"compute_step_ms": compute, "backward_end_ms": bwd_end, "comm_total_ms": total,
            "comm_end_ms": tl[-1]["end_ms"], "exposed_ms": exposed,
            "hidden_fraction": 1.0 - exposed / total if total > 0 else None,
            "projected_step_ms": compute + exposed,
            "scaling_efficiency": compute / (compute + exposed), "buckets": tl}


TAIL_CANDIDATES = [256 << 10, 1 << 20, 4 << 20, 16 << 20]


def split_last(buckets, tail_bytes):
    """The buckets with the last one split into (rest, tail): the tail keeps
    its ready time, the rest is ready where the even-readiness ASSUMPTION puts
    its last byte (between the previous bucket's ready time, or 0, and the
    last's). A tail not smaller than the last bucket: the buckets unchanged."""
    if not buckets or tail_bytes <= 0 or tail_bytes >= buckets[-1]["bytes"]:
        return list(buckets)
    last = buckets[-1]
    prev = float(buckets[-2]["ready_ms"]) if len(buckets) > 1 else 0.0
    end = float(last["ready_ms"])
    rest = last["bytes"] - tail_bytes
    rest_ready = prev + (end - prev) * rest / last["bytes"]
    return list(buckets[:-1]) + [dict(last, bytes=rest, ready_ms=rest_ready),
                                 dict(last, bytes=tail_bytes, ready_ms=end)]


def best_tail(profile, fn, candidates=TAIL_CANDIDATES):
    """The tail of `candidates` that exposes the least communication, when it
    exposes less than the measured layout: {tail_bytes, exposed_ms,
    projected_step_ms}; else None."""
    base = project(profile, fn)["exposed_ms"]
    best = None
    for t in candidates:
        r = project(dict(profile, buckets=split_last(profile["buckets"], t)), fn)
        if r["exposed_ms"] < base - 1e-9 and (best is None or r["exposed_ms"] < best["exposed_ms"]):
            best = {"tail_bytes": t, "exposed_ms": r["exposed_ms"],
                    "projected_step_ms": r["projected_step_ms"]}
    return best


def expected_max_normal(n):
    """E[max of n independent standard normals], Blom's approximation
    Phi^-1((n - 0.375) / (n + 0.25)); 0 for one sample."""
    if n < 2:
        return 0.0
    return statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def jitter(profile):
    """The spread of the profile's per-step device times (step_ms_each):
    {steps, mean_ms, stdev_ms, max_ms}; None with fewer than 2 steps."""
    each = [float(x) for x in profile.get("step_ms_each") or []]
    if len(each) < 2:
        return None
    return {"steps": len(each), "mean_ms": statistics.fmean(each),
            "stdev_ms": statistics.stdev(each), "max_ms": max(each)}


def effective_busbw(kind, p, nbytes):
    """The bus bandwidth the model's time for nbytes amounts to (alpha aside)."""
    n = ranks_of(kind, p)
    t = time_fn(kind, p)(nbytes) - p["alpha_us"] / 1e3
    return 2.0 * (n - 1) / n * nbytes / (t / 1e3) / 1e9 if t > 0 else None


def model_table_rows(profile, batch, configs=CONFIGS):
    rows = []
    total_bytes = sum(b["bytes"] for b in profile.get("buckets") or [])
    jit = jitter(profile)
    for name, kind, p, srcs in configs:
        fn = time_fn(kind, p)
        r = project(profile, fn)
        n = ranks_of(kind, p)
        straggle = jit["stdev_ms"] * expected_max_normal(n) if jit else None
        rows.append(dict(r, config=name, kind=kind, params=p, ranks=n, sources=list(srcs),
                         effective_busbw_gbps=effective_busbw(kind, p, total_bytes or 1),
                         projected_samples_per_second=n * batch * 1e3 / r["projected_step_ms"],
                         tiny_last_bucket=best_tail(profile, fn),
                         straggler_ms=straggle,
                         projected_step_with_jitter_ms=r["projected_step_ms"] + straggle
                         if straggle is not None else None))
    return rows


# ----------------------------------------------------------------------------- measured all-reduce

def split_label(spec):
    """"nccl=/tmp/ar.jsonl" -> ("nccl", "/tmp/ar.jsonl"); a plain path -> (None, path)."""
    label, sep, path = spec.partition("=")
    if sep and label and "/" not in label:
        return label, path
    return None, spec


def load_allreduce(specs, ranks=2):
    """allreduce_perf --json lines of `ranks` ranks on CUDA, grouped by the
    CUDA path they took: the LABEL of a LABEL=FILE argument (allreduce_perf
    names only the host transport: give each DDPRUN_CUDA_TRANSPORT's run its
    own file and label), else the line's "cuda_transport", "path" or
    "transport": {group: [(bytes, mean time_us)]} sorted by size."""
    groups = {}
    for spec in specs:
        label, path = split_label(spec)
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                d = json.loads(line)
                if d.get("ranks") != ranks or d.get("device") != "cuda" or "time_us" not in d:
                    continue
                key = label or str(d.get("cuda_transport") or d.get("path") or d.get("transport"))
                groups.setdefault(key, {}).setdefault(int(d["bytes"]), []).append(float(d["time_us"]))
    return {k: sorted((b, sum(v) / len(v)) for b, v in g.items()) for k, g in groups.items()}


def interp_ms(points):
    """time(bytes) in ms from measured (bytes, us) points: log-log between
    them, the smallest time below, proportional to size above the largest."""
    xs = [b for b, _ in points]
    ys = [t for _, t in points]

    def fn(nbytes):
        if nbytes <= xs[0]:
            return ys[0] / 1e3
        if nbytes >= xs[-1]:
            return ys[-1] * nbytes / xs[-1] / 1e3
        i = bisect.bisect_left(xs, nbytes)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        f = (math.log(nbytes) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0))) / 1e3
    return fn


def fit_alpha_busbw(points, n=2, min_bytes=1 << 16):
    """Least squares time = alpha + 2(n-1)/n * bytes / busbw over the points
    of at least min_bytes (all of them when fewer than two are that large)."""
    pts = [(b, t) for b, t in points if b >= min_bytes]
    if len(pts) < 2:
        pts = list(points)
    if len(pts) < 2:
        return None
    xs = [2.0 * (n - 1) / n * b for b, _ in pts]
    ys = [t / 1e6 for _, t in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    alpha = my - slope * mx
    return {"alpha_us": alpha * 1e6, "busbw_gbps": 1.0 / slope / 1e9 if slope > 0 else None,
            "points": len(pts)}


def pick_group(groups, transport):
    if not groups:
        return None, None
    want = (transport or "").lower()
    for key in groups:
        if want and want in key.lower():
            return key, groups[key]
    if len(groups) == 1:
        return next(iter(groups.items()))
    return None, None


def check_two_ranks(entry, groups):
    """The model against each two-rank ours variant of the case entry."""
    out = []
    for key in sorted(k for k in entry if k.startswith("ours") and isinstance(entry[k], dict)):
        v = entry[key]
        prof = v.get("profile") or {}
        row = {"variant": key, "comm_transport": v.get("comm_transport")}
        gkey, points = pick_group(groups, v.get("comm_transport") or ("ipc" if "ipc" in key else "nccl"))
        if not prof.get("buckets"):
            row["skipped"] = "no buckets in its profile"
        elif not points:
            row["skipped"] = "no allreduce_perf lines for its transport (groups: %s)" % (
                ", ".join(groups) or "none")
        else:
            m = project(prof, interp_ms(points))
            comm = prof.get("comm") or {}
            meas = comm.get("buckets") or []
            row.update(allreduce_group=gkey, fit=fit_alpha_busbw(points),
                       model_hidden_fraction=m["hidden_fraction"],
                       measured_hidden_fraction=comm.get("hidden_fraction"),
                       model_exposed_ms=m["exposed_ms"], measured_reducer_ms=prof.get("reducer_ms"),
                       model_step_ms=m["projected_step_ms"], measured_step_ms=prof.get("step_ms"),
                       model_comm_total_ms=m["comm_total_ms"],
                       measured_comm_total_ms=sum(b["end_ms"] - b["start_ms"] for b in meas)
                       if meas else None,
                       buckets=[dict(b, measured_start_ms=mb.get("start_ms"),
                                     measured_end_ms=mb.get("end_ms"))
                                for b, mb in zip(m["buckets"], meas + [{}] * len(m["buckets"]))])
        out.append(row)
    return out


# ----------------------------------------------------------------------------- output

def f(x, spec="%.2f"):
    return spec % x if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def markdown(result):
    lines = ["**MODEL, not a measurement**: the measured one-GPU profile of %s (%s) replayed "
             "through a latency-bandwidth all-reduce model (scripts/bench/comm_model.py)." % (
                 result["case"], result.get("gpu") or "GPU"),
             "",
             "| configuration (MODEL) | ranks | busbw eff. GB/s | comm ms/step | exposed ms | "
             "hidden | step ms (1 GPU compute %s) | efficiency | samples/s (all GPUs) |" % f(
                 result["rows"][0]["compute_step_ms"] if result["rows"] else None),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
            r["config"], r["ranks"], f(r["effective_busbw_gbps"], "%.0f"), f(r["comm_total_ms"]),
            f(r["exposed_ms"]), f(100 * r["hidden_fraction"], "%.0f%%")
            if r["hidden_fraction"] is not None else "-",
            f(r["projected_step_ms"]), f(100 * r["scaling_efficiency"], "%.0f%%"),
            f(r["projected_samples_per_second"], "%.0f")))
    lines += ["", "Refinements (MODEL): a tiny last bucket (its best tail, where it exposes less) "
              "and the slowest of n ranks from this GPU's own per-step spread%s:" % (
                  " (%d steps, sigma %s ms)" % (result["jitter"]["steps"],
                                                f(result["jitter"]["stdev_ms"], "%.3f"))
                  if result.get("jitter") else " (no per-step times in the profile)"), "",
              "| configuration (MODEL) | tail MiB | exposed ms with it | step ms with it | "
              "straggler ms | step ms with jitter |", "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        t = r.get("tiny_last_bucket")
        lines.append("| %s | %s | %s | %s | %s | %s |" % (
            r["config"], f(t["tail_bytes"] / (1 << 20), "%.2f") if t else "no gain",
            f(t["exposed_ms"]) if t else "-", f(t["projected_step_ms"]) if t else "-",
            f(r.get("straggler_ms"), "%.3f"), f(r.get("projected_step_with_jitter_ms"))))
    lines += ["", "Inputs:"] + ["- %s: %s" % (k, v) for k, v in SOURCES.items()]
    checks = result.get("two_rank_check") or []
    if checks:
        lines += ["", "Check against the measured two-rank run on one GPU (%s; the model fed that "
                  "run's bucket ready times and allreduce_perf's times on its transport):"
                  % result.get("two_rank_case"), "",
                  "| variant | transport | fit alpha us / busbw GB/s | hidden MODEL / measured | "
                  "exposed MODEL ms / measured reducer ms | step MODEL ms / measured ms |",
                  "|---|---|---:|---:|---:|---:|"]
        for c in checks:
            if "skipped" in c:
                lines.append("| %s | %s | skipped: %s ||||" % (c["variant"], c.get("comm_transport"),
                                                              c["skipped"]))
                continue
            fit = c.get("fit") or {}
            lines.append("| %s | %s | %s / %s | %s / %s | %s / %s | %s / %s |" % (
                c["variant"], c.get("comm_transport") or c.get("allreduce_group"),
                f(fit.get("alpha_us"), "%.0f"), f(fit.get("busbw_gbps"), "%.0f"),
                f(100 * c["model_hidden_fraction"], "%.0f%%") if c["model_hidden_fraction"]
                is not None else "-",
                f(100 * c["measured_hidden_fraction"], "%.0f%%")
                if isinstance(c.get("measured_hidden_fraction"), (int, float)) else "-",
                f(c["model_exposed_ms"]), f(c.get("measured_reducer_ms")),
                f(c["model_step_ms"]), f(c.get("measured_step_ms"))))
    return "\n".join(lines)


def parse_config(spec):
    """NAME:KIND:key=value,... (KIND ring: n, busbw, alpha_us; hier: g, m, nvl, nic, alpha_us)."""
    name, kind, params = spec.split(":", 2)
    p = {k: float(v) for k, v in (kv.split("=", 1) for kv in params.split(",") if kv)}
    for k in ("n", "g", "m"):
        if k in p:
            p[k] = int(p[k])
    need = ("n", "busbw", "alpha_us") if kind == "ring" else ("g", "m", "nvl", "nic", "alpha_us")
    missing = [k for k in need if k not in p]
    if kind not in ("ring", "hier") or missing:
        raise ValueError("--config %s: KIND ring or hier, missing %s" % (spec, missing))
    return (name, kind, p, ("command line",))


def run(args):
    with open(args.bench_json) as fh:
        bench = json.load(fh)
    entries = {r["case"]["name"]: r for r in bench.get("results", [])}
    if args.case not in entries:
        raise SystemExit("%s has no case %s (cases: %s)" % (args.bench_json, args.case,
                                                            ", ".join(entries)))
    entry = entries[args.case]
    prof = (entry.get("ours") or {}).get("profile")
    if not prof or not prof.get("buckets"):
        raise SystemExit("case %s has no ours profile with buckets" % args.case)
    configs = CONFIGS + [parse_config(s) for s in args.config]
    result = {"model": True, "note": "MODEL, not a measurement", "case": args.case,
              "gpu": bench.get("gpu"), "date": bench.get("date"), "commit": bench.get("commit"),
              "profile_inputs": {k: prof.get(k) for k in ("step_ms", "reducer_ms", "backward_end_ms",
                                                          "buckets", "step_ms_each")},
              "jitter": jitter(prof),
              "sources": SOURCES, "rows": model_table_rows(prof, entry["case"].get("batch", 1), configs)}
    two = entries.get(args.two_rank_case)
    if two is not None:
        result["two_rank_case"] = args.two_rank_case
        result["allreduce_inputs"] = args.allreduce_jsonl
        result["two_rank_check"] = check_two_ranks(two, load_allreduce(args.allreduce_jsonl))
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench-json", default=os.path.join(ROOT, "docs/resnet_bench_cuda.json"))
    ap.add_argument("--case", default="resnet18-224-tf32")
    ap.add_argument("--two-rank-case", default="resnet18-224-tf32-2ranks")
    ap.add_argument("--allreduce-jsonl", action="append", default=[], metavar="[TRANSPORT=]FILE",
                    help="allreduce_perf --json output of a two-rank transport, labelled with it "
                         "(nccl=FILE, ipc=FILE; repeatable)")
    ap.add_argument("--config", action="append", default=[], metavar="NAME:KIND:k=v,...",
                    help="another configuration (ring: n,busbw,alpha_us; hier: g,m,nvl,nic,alpha_us)")
    ap.add_argument("--out-json")
    ap.add_argument("--out-md")
    args = ap.parse_args(argv)
    result = run(args)
    md = markdown(result)
    if args.out_json:
        with open(args.out_json, "w") as fh:
            json.dump(result, fh, indent=1)
            fh.write("\n")
    if args.out_md:
        with open(args.out_md, "w") as fh:
            fh.write(md + "\n")
    print(md)
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
