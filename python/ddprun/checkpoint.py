"""train's checkpoints and --save files (safetensors) for PyTorch.

    from ddprun import checkpoint
    state_dict, optimizer_state, metadata = checkpoint.load("ckpt-run-120.safetensors")
    model.load_state_dict(state_dict)               # PyTorch's names, strict loads work
    checkpoint.load_into(path, model, optimizer)    # the same, and the optimizer's state

    python -m ddprun.checkpoint FILE                # metadata and tensors (no torch needed)

The format is read here directly (no `safetensors` package): an 8-byte
little-endian header length, a JSON header {name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the raw
little-endian bytes. Every entry is checked against the file before any tensor
is made. `train` names parameters and buffers as the PyTorch module's
state_dict does, and the optimizer state `optim.<param>.momentum_buffer`
(SGD), `optim.<param>.exp_avg` and `optim.<param>.exp_avg_sq` (Adam). A `--save`
file has metadata {"format": "ddprun-train-model", "model"}; a checkpoint has
"format": "ddprun-train-1" and the run's position (epoch, step, global_step,
optimizer_steps, ...).

Reading the header needs only the standard library; making tensors needs
PyTorch (any 1.13 or 2.x): without it load() raises TorchMissing, and the
command line exits 2 naming the fix.
"""
import argparse
import collections
import json
import os
import struct
import sys

# The reference implementation refuses larger headers; so does train.
MAX_HEADER_BYTES = 100000000
OPTIM_PREFIX = "optim."

# safetensors dtype -> (bytes per element, torch dtype name)
DTYPES = {"F64": (8, "float64"), "F32": (4, "float32"), "F16": (2, "float16"),
          "BF16": (2, "bfloat16"), "I64": (8, "int64"), "I32": (4, "int32"),
          "I16": (2, "int16"), "I8": (1, "int8"), "U8": (1, "uint8"), "BOOL": (1, "bool")}

TORCH_MISSING = ("loading tensors needs PyTorch, which is not installed for %s: "
                 "pip install torch (the metadata and tensor list need no torch: "
                 "python -m ddprun.checkpoint FILE)")


class CheckpointError(ValueError):
    """The file is not a well-formed safetensors file; the message names the
    file and what is wrong."""


class TorchMissing(ImportError):
    """PyTorch is not importable; the message says how to get it."""


Entry = collections.namedtuple("Entry", "name dtype shape begin end")


def _fail(path, what):
    raise CheckpointError("%s: %s" % (path, what))


def _entry(path, name, info, data_bytes):
    if not isinstance(info, dict):
        _fail(path, "header entry %r is not a JSON object" % name)
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPES:
        _fail(path, "tensor %r has dtype %r (known: %s)" % (name, dtype, ", ".join(DTYPES)))
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        _fail(path, "tensor %r has shape %r, not a list of sizes >= 0" % (name, shape))
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        _fail(path, "tensor %r has data_offsets %r, not [begin, end]" % (name, offsets))
    begin, end = offsets
    if not 0 <= begin <= end <= data_bytes:
        _fail(path, "tensor %r lies outside the file (bytes %d..%d of a %d-byte data section)"
              % (name, begin, end, data_bytes))
    count = 1
    for d in shape:
        count *= d
    if end - begin != count * DTYPES[dtype][0]:
        _fail(path, "tensor %r has %d bytes for shape %s %s" % (name, end - begin, shape, dtype))
    return Entry(name, dtype, tuple(shape), begin, end)


def read_header(path):
    """(entries, metadata, data_start): entries the list of Entry in header
    order (the optimizer's too), metadata the {str: str} of "__metadata__".
    Raises CheckpointError for a malformed file, OSError when it cannot be read."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) != 8:
            _fail(path, "not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > MAX_HEADER_BYTES:
            _fail(path, "not a safetensors file (header length %d, file size %d)" % (n, size))
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except ValueError as e:
            _fail(path, "the header is not JSON (%s)" % e)
    if not isinstance(header, dict):
        _fail(path, "the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        _fail(path, '"__metadata__" is not an object of strings')
    entries = [_entry(path, k, v, size - 8 - n) for k, v in header.items()]
    return entries, metadata, 8 + n


def _torch():
    try:
        import torch
    except ImportError:
        raise TorchMissing(TORCH_MISSING % sys.executable) from None
    return torch


def load(path, device="cpu"):
    """(state_dict, optimizer_state, metadata) of a train checkpoint or --save file.

    state_dict: an OrderedDict {name: tensor} of the parameters and buffers,
    under PyTorch's names, in the file's order (`model.load_state_dict(sd)`;
    its dtypes are the file's: cast where the module keeps another, as
    load_into does). optimizer_state: {param name: {"momentum_buffer": t}} for
    SGD with momentum, {"exp_avg": t, "exp_avg_sq": t} for Adam, {} when the
    file has none (a --save file). metadata: the file's {str: str}.
    """
    torch = _torch()
    if sys.byteorder != "little":
        raise CheckpointError("%s: safetensors holds little-endian bytes; this host is big-endian"
                              % path)
    entries, metadata, start = read_header(path)
    with open(path, "rb") as f:
        f.seek(start)
        data = bytearray(f.read())
    state, optim = collections.OrderedDict(), {}
    for e in entries:
        dtype = getattr(torch, DTYPES[e.dtype][1])
        if e.end > e.begin:
            t = torch.frombuffer(data, dtype=dtype, count=(e.end - e.begin) // DTYPES[e.dtype][0],
                                 offset=e.begin).clone()
        else:
            t = torch.empty(0, dtype=dtype)
        t = t.reshape(e.shape).to(device)
        if e.name.startswith(OPTIM_PREFIX):
            param, _, kind = e.name[len(OPTIM_PREFIX):].rpartition(".")
            if not param:
                _fail(path, "optimizer entry %r names no parameter" % e.name)
            optim.setdefault(param, {})[kind] = t
        else:
            state[e.name] = t
    return state, optim, metadata


def load_into(path, model, optimizer=None, strict=True):
    """Loads a file into a torch.nn.Module (load_state_dict, strict by
    default; each tensor cast to the dtype and device the module keeps), and
    with `optimizer` (a torch.optim.SGD or Adam over model.parameters()) the
    optimizer's per-parameter state by name; Adam's step count comes from the
    metadata's optimizer_steps. Returns (load_state_dict's result, metadata)."""
    state, optim, metadata = load(path)
    own = model.state_dict()
    for k, v in state.items():
        if k in own:
            state[k] = v.to(dtype=own[k].dtype, device=own[k].device)
    result = model.load_state_dict(state, strict=strict)
    if optimizer is not None:
        _load_optimizer(path, model, optimizer, optim, metadata)
    return result, metadata


def _load_optimizer(path, model, optimizer, optim, metadata):
    torch = _torch()
    params = dict(model.named_parameters())
    unknown = sorted(set(optim) - set(params))
    if unknown:
        _fail(path, "optimizer state for %s, which the model does not have" % ", ".join(unknown))
    steps = metadata.get("optimizer_steps")
    for name, kinds in optim.items():
        p = params[name]
        st = {k: v.to(dtype=p.dtype, device=p.device) for k, v in kinds.items()}
        if "exp_avg" in st and steps is not None:
            st["step"] = torch.tensor(float(int(steps)))
        optimizer.state[p] = st


def describe(path, out=sys.stdout):
    """Prints the metadata and each tensor's name, dtype and shape (no torch)."""
    entries, metadata, _ = read_header(path)
    out.write("%s\n" % path)
    if metadata:
        out.write("metadata:\n")
        width = max(len(k) for k in metadata)
        for k in sorted(metadata):
            v = metadata[k]
            out.write("  %-*s  %s\n" % (width, k, v if len(v) <= 100 else v[:97] + "..."))
    total = sum(e.end - e.begin for e in entries)
    model = [e for e in entries if not e.name.startswith(OPTIM_PREFIX)]
    optim = [e for e in entries if e.name.startswith(OPTIM_PREFIX)]
    for title, group in (("tensors", model), ("optimizer state", optim)):
        if not group:
            continue
        out.write("%s (%d):\n" % (title, len(group)))
        width = max(len(e.name) for e in group)
        for e in group:
            out.write("  %-*s  %-4s %s\n" % (width, e.name, e.dtype, list(e.shape)))
    out.write("%d tensors, %d bytes of data\n" % (len(entries), total))


def main(argv=None, prog="python -m ddprun.checkpoint"):
    ap = argparse.ArgumentParser(
        prog=prog, description="Shows a train checkpoint or --save file (safetensors): its "
        "metadata and tensors. Exit 0, or 2 for a file that cannot be read or is malformed.")
    ap.add_argument("file")
    ap.add_argument("--load", action="store_true",
                    help="also load every tensor with PyTorch (needs torch) and print its norm")
    a = ap.parse_args(argv)
    try:
        describe(a.file)
        if a.load:
            state, optim, _ = load(a.file)
            for name, t in list(state.items()) + [("%s%s.%s" % (OPTIM_PREFIX, p, k), t)
                                                  for p, kinds in optim.items()
                                                  for k, t in kinds.items()]:
                norm = t.double().norm().item() if t.numel() else 0.0
                print("  %s  norm %.6g" % (name, norm))
            print("loaded with torch: %d tensors" % (len(state) + sum(map(len, optim.values()))))
    except (CheckpointError, TorchMissing) as e:
        print("%s: %s" % (prog.split()[-1], e), file=sys.stderr)
        return 2
    except OSError as e:
        print("%s: %s: %s" % (prog.split()[-1], a.file, e.strerror or e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
