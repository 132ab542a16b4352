"""Training progress for the ddprun agent: one call per step.

    from ddprun import progress
    for step, batch in enumerate(loader, 1):
        loss = train_step(batch)
        progress.report(step, loss=loss.item(), epoch=epoch, total_steps=steps)

Under ddprun each worker has $DDPRUN_PROGRESS_FILE, a file in its own log
directory; report() replaces it atomically (a temporary file in the same
directory, then a rename) with one small JSON object, the format of
include/ddprun/common/progress_file.h:

    {"step": 41, "epoch": 2, "loss": 0.53, "samples_per_second": 812.5,
     "total_steps": 1000, "time": 1714564800.25}

The agent shows it in `ddprun status`, /status and /metrics (--status-port),
and with --progress-timeout S it fails the worker group when a rank that
reported once reports no new step for S seconds (docs/status.md).

Cheap enough for every step: outside ddprun (the variable unset) report() does
nothing, and it writes at most once per 0.5 s unless force=True (use it for the
last step of an epoch or of the run). It never raises: a report that cannot
be written is dropped (report() returns False), training goes on. A loss that
is not a finite number (a diverged run) is left out: NaN is not JSON.
"""
import json
import math
import os
import time as _time

ENV = "DDPRUN_PROGRESS_FILE"
WRITE_INTERVAL = 0.5  # seconds between writes unless forced

_last = {"path": None, "at": -math.inf}


def _number(value, name):
    """A finite float, or None (left out)."""
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _count(value, name, least):
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("%s must be an integer, not a bool" % name)
    v = int(value)
    if v != value or v < least:
        raise ValueError("%s must be an integer >= %d, got %r" % (name, least, value))
    return v


def _encode(step, loss, epoch, samples_per_second, total_steps, when):
    obj = {"step": _count(step, "step", 0)}
    fields = (("epoch", _count(epoch, "epoch", 0)),
              ("loss", _number(loss, "loss")),
              ("samples_per_second", _number(samples_per_second, "samples_per_second")),
              ("total_steps", _count(total_steps, "total_steps", 1)))
    for name, value in fields:
        if value is not None:
            obj[name] = value
    if obj.get("samples_per_second", 0) < 0:
        del obj["samples_per_second"]
    t = _number(when, "time")
    obj["time"] = t if t is not None and t > 0 else _time.time()
    return json.dumps(obj, allow_nan=False, separators=(",", ":"))


def report(step, loss=None, epoch=None, samples_per_second=None, total_steps=None,
           time=None, force=False):
    """Tells the agent that `step` steps are done (`time`: when the last one
    ended, unix seconds; default now). True when written, or skipped (no
    ddprun, or within 0.5 s of the last write); False when the file could not
    be written. Raises ValueError/TypeError only for a step, epoch or
    total_steps that is not a whole number in range (a bug in the caller)."""
    path = os.environ.get(ENV)
    if not path:
        return True
    now = _time.monotonic()
    if not force and _last["path"] == path and now - _last["at"] < WRITE_INTERVAL:
        return True
    text = _encode(step, loss, epoch, samples_per_second, total_steps, time) + "\n"
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            data = text.encode()
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    _last["path"], _last["at"] = path, now
    return True
