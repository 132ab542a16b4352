"""The reference models, data and checkpoint format of the bundled `train`.

Imported by examples/pytorch/lenet_ddp.py (the same recipe in PyTorch DDP),
the benchmark (scripts/bench/train_bench.py) and the parity test
(tests/interop/test_train_parity.py). Works with PyTorch 1.13 and 2.x.

- Models: LeNet ("seed 000's LeNet"), LeNetBN (BatchNorm after each conv,
  optionally SyncBatchNorm) and MLP; their state_dict names are the names
  `train` writes in its safetensors files.
- Fashion-MNIST: an IDX(.gz) reader on numpy, normalised as
  ToTensor() + Normalize((0.2860,), (0.3530,)) would: x = (p/255 - 0.2860)/0.3530
  in float32.
- safetensors, written and read by hand (no safetensors package): an 8-byte
  little-endian header length, a JSON header
  {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}
  padded with spaces to a multiple of 8, then the raw little-endian bytes.
"""
import gzip
import hashlib
import json
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
MODELS = ("mlp", "lenet", "lenet-bn")


# ----------------------------------------------------------------------------- models

class LeNet(nn.Module):
    """conv(1->6, 5x5, pad 2) -> relu -> pool 2, conv(6->16, 5x5) -> relu -> pool 2,
    fc 400 -> 120 -> 84 -> 10 with relu between."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class LeNetBN(LeNet):
    """LeNet with conv -> BatchNorm -> relu -> pool."""

    def __init__(self):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(6)
        self.bn2 = nn.BatchNorm2d(16)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class MLP(nn.Module):
    """flatten -> 784 -> 256 -> 256 -> 10 with relu between."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def build_model(name, sync_bn=False):
    """A fresh model with PyTorch's default init from the current torch RNG."""
    if name not in MODELS:
        raise ValueError("unknown model %r (choices: %s)" % (name, ", ".join(MODELS)))
    model = {"mlp": MLP, "lenet": LeNet, "lenet-bn": LeNetBN}[name]()
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


# ----------------------------------------------------------------------------- data

FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def find_file(directory, stem):
    """DIR/stem.gz or DIR/stem; FileNotFoundError naming both when neither exists."""
    for name in (stem + ".gz", stem):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError("Fashion-MNIST file %s(.gz) not found in %s (run scripts/setup.sh, "
                            "or install Debian's dataset-fashion-mnist)" % (stem, directory))


def read_idx(path, count=None):
    """An IDX file (optionally gzip-compressed) as a numpy array; with `count`,
    only the first `count` items are read."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        head = f.read(4)
        if len(head) != 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_DTYPES:
            raise ValueError("%s: not an IDX file (magic %r)" % (path, head))
        ndim = head[3]
        dims = list(struct.unpack(">%dI" % ndim, f.read(4 * ndim)))
        if count is not None:
            dims[0] = min(dims[0], count)
        dtype = np.dtype(_IDX_DTYPES[head[2]])
        nbytes = int(np.prod(dims)) * dtype.itemsize
        data = f.read(nbytes)
        if len(data) != nbytes:
            raise ValueError("%s: truncated (%d of %d data bytes)" % (path, len(data), nbytes))
    return np.frombuffer(data, dtype=dtype).reshape(dims)


def normalize(pixels):
    """uint8 [N,28,28] -> float32 [N,1,28,28], as ToTensor() then
    Normalize((0.2860,), (0.3530,)) (float32 arithmetic throughout)."""
    x = pixels.astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(MEAN)) / np.float32(STD)
    return x.reshape(-1, 1, 28, 28)


def load_fashion_mnist(directory=DEFAULT_DATA, split="train", count=None):
    """(images float32 [N,1,28,28] normalised, labels int64 [N]) as torch
    tensors: the first `count` samples of the split (all when None)."""
    images_stem, labels_stem = FILES[split]
    pixels = read_idx(find_file(directory, images_stem), count)
    labels = read_idx(find_file(directory, labels_stem), count)
    if len(pixels) != len(labels):
        raise ValueError("%s split: %d images but %d labels" % (split, len(pixels), len(labels)))
    return torch.from_numpy(normalize(pixels)), torch.from_numpy(labels.astype(np.int64))


def have_fashion_mnist(directory=DEFAULT_DATA):
    try:
        for stems in FILES.values():
            for stem in stems:
                find_file(directory, stem)
    except FileNotFoundError:
        return False
    return True


def synthetic(count, seed, split):
    """A small separable stand-in (NOT the samples `train --data synthetic`
    generates): class templates plus noise, already normalised."""
    g = torch.Generator().manual_seed(1000 + seed)
    templates = torch.randn(10, 1, 28, 28, generator=g)
    g.manual_seed(2000 + seed + (0 if split == "train" else 1))
    labels = torch.randint(0, 10, (count,), generator=g)
    images = templates[labels] + 0.8 * torch.randn(count, 1, 28, 28, generator=g)
    return images.float(), labels


# ----------------------------------------------------------------------------- safetensors

_ST_TO_NP = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
             "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}
_TORCH_TO_ST = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def _raw_bytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: same bits as int16
        t = t.view(torch.int16)
    return t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} (torch tensors) as a safetensors file, atomically
    (temp file + rename). `metadata`: {str: str}."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if t.dtype not in _TORCH_TO_ST:
            raise TypeError("%s: dtype %s has no safetensors code" % (name, t.dtype))
        raw = _raw_bytes(t)
        header[name] = {"dtype": _TORCH_TO_ST[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


def read_safetensors_header(path):
    """(header dict without __metadata__, metadata dict, data start offset)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("%s: not a safetensors file (shorter than 8 bytes)" % path)
        (n,) = struct.unpack("<Q", head)
        size = os.fstat(f.fileno()).st_size
        if n > size - 8 or n > 100 << 20:
            raise ValueError("%s: header length %d exceeds the file" % (path, n))
        header = json.loads(f.read(n).decode())
    metadata = header.pop("__metadata__", {}) or {}
    return header, metadata, 8 + n


def load_safetensors(path):
    """{name: torch tensor} from a safetensors file, every entry validated
    against the file size and its dtype/shape."""
    header, _, start = read_safetensors_header(path)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        shape = [int(d) for d in info["shape"]]
        dtype = info["dtype"]
        if not 0 <= begin <= end <= len(data):
            raise ValueError("%s: tensor %s lies outside the file" % (path, name))
        itemsize = 2 if dtype == "BF16" else np.dtype(_ST_TO_NP[dtype]).itemsize
        if (end - begin) != int(np.prod(shape)) * itemsize:
            raise ValueError("%s: tensor %s has %d bytes for shape %s %s" %
                             (path, name, end - begin, shape, dtype))
        raw = data[begin:end]
        if dtype == "BF16":
            t = torch.from_numpy(np.frombuffer(raw, "<i2").astype(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(np.frombuffer(raw, _ST_TO_NP[dtype]).astype(
                np.dtype(_ST_TO_NP[dtype]).newbyteorder("=")))
        out[name] = t.reshape(shape).clone()
    return out


def save_state_dict(path, model, metadata=None):
    """A model's state_dict (parameters and buffers) as safetensors; the
    names are PyTorch's (a DDP wrapper's "module." prefix removed)."""
    model = getattr(model, "module", model)
    save_safetensors(path, dict(model.state_dict()), metadata)


def load_state_dict(path, model, strict=True):
    """Loads a safetensors file into `model` (load_state_dict, strict by
    default), converting each tensor to the dtype the model keeps."""
    model = getattr(model, "module", model)
    tensors = load_safetensors(path)
    own = model.state_dict()
    for k, v in tensors.items():
        if k in own and own[k].dtype != v.dtype:
            tensors[k] = v.to(own[k].dtype)
    return model.load_state_dict(tensors, strict=strict)


def params_sha256(model):
    """sha256 over the state_dict tensors' raw little-endian bytes in
    state_dict order: a fingerprint for comparing runs of the same script."""
    h = hashlib.sha256()
    for t in getattr(model, "module", model).state_dict().values():
        h.update(_raw_bytes(t))
    return h.hexdigest()
