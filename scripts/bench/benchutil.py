"""Helpers shared by the benchmark scripts of this folder (and by
examples/pytorch/ddp_bench.py, the PyTorch side of resnet_bench.py).

- cpu_model(), git_commit(), write_json_atomic(), last_json_line()
- Mt19937_64 and sampler_indices(): `train`'s DistributedSampler order
  (src/runtime/sampler.cc: std::mt19937_64 seeded with seed + epoch, a
  Fisher-Yates shuffle with rejection sampling; PyTorch's padding and
  striding), so a PyTorch run can visit the samples `train` visits, in the
  same order. Pure Python.
- synthetic_mnist(): `train --data synthetic` (src/train/data.cc,
  makeSynthetic) in numpy: the same 28x28 pixels, labels and normalised
  float32 images LeNet trains on.
- synthetic_cifar_samples(): `train --data synthetic-cifar` for chosen
  sample indices, vectorised over the samples (tests/interop/synthetic_cifar.py
  is the reference port, one sample at a time; this gives the same bytes).
"""
import json
import os
import subprocess

MASK64 = (1 << 64) - 1


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (recorded beside every figure)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def git_commit(root, override=None):
    """The commit a figure was measured at: `override` (a flag), else
    $DDPRUN_COMMIT, else `git rev-parse HEAD` in root (with "-dirty" when the
    tracked files differ from it), else None (not a git checkout)."""
    if override:
        return override
    if os.environ.get("DDPRUN_COMMIT"):
        return os.environ["DDPRUN_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def write_json_atomic(path, obj):
    """Writes obj as indented JSON to path through a temporary file and a
    rename, so that an interrupted run never leaves half a file."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, allow_nan=True)
        f.write("\n")
    os.replace(tmp, path)


def last_json_line(text):
    """The last line of text that parses as a JSON object, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


# ----------------------------------------------------------------- the sampler

class Mt19937_64:
    """std::mt19937_64 (the C++ standard's parameters and seeding)."""
    N, M = 312, 156
    MATRIX_A = 0xB5026F5AA96619E9
    UPPER, LOWER = 0xFFFFFFFF80000000, 0x7FFFFFFF

    def __init__(self, seed):
        mt = [seed & MASK64]
        for i in range(1, self.N):
            prev = mt[-1]
            mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64)
        self.mt, self.index = mt, self.N

    def _twist(self):
        mt, n, m = self.mt, self.N, self.M
        for i in range(n):
            y = (mt[i] & self.UPPER) | (mt[(i + 1) % n] & self.LOWER)
            mt[i] = mt[(i + m) % n] ^ (y >> 1) ^ (self.MATRIX_A if y & 1 else 0)
        self.index = 0

    def __call__(self):
        if self.index >= self.N:
            self._twist()
        x = self.mt[self.index]
        self.index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        x ^= x >> 43
        return x & MASK64


def sampler_permutation(n, seed):
    """runtime::samplerPermutation: 0..n-1 shuffled by Fisher-Yates driven by
    mt19937_64(seed); j uniform in [0, i] by rejecting the lowest
    2^64 mod (i + 1) draws."""
    v = list(range(n))
    g = Mt19937_64(seed)
    for i in range(n - 1, 0, -1):
        bound = i + 1
        reject = (1 << 64) % bound
        x = g()
        while x < reject:
            x = g()
        j = x % bound
        v[i], v[j] = v[j], v[i]
    return v


def sampler_indices(n, world, rank, seed=0, epoch=0, shuffle=True):
    """runtime::DistributedSampler (Mode::kPadded, dropLast false): the
    dataset indices rank `rank` of `world` reads in `epoch`, in order."""
    if world < 1 or not 0 <= rank < world or n < 1:
        raise ValueError("sampler: n=%d world=%d rank=%d" % (n, world, rank))
    base = sampler_permutation(n, seed + epoch) if shuffle else list(range(n))
    count = (n + world - 1) // world
    return [base[(rank + k * world) % n] for k in range(count)]


# ----------------------------------------------------- train --data synthetic

GAMMA = 0x9E3779B97F4A7C15
TRAIN_TAG, TEST_TAG = 0x747261696E000000, 0x7465737400000000
MISLABEL_TAG = 0x6D69736C6162656C  # "mislabel": the training split's shown-class stream
MISLABELLED_ONE_IN = 20
MNIST_SIDE, MNIST_CELLS, MNIST_CELL = 28, 7, 4
MNIST_BYTES = MNIST_SIDE * MNIST_SIDE
MNIST_DRAWS = 1 + MNIST_BYTES // 8  # the contrast, then 8 noise bytes per draw
MNIST_MEAN, MNIST_STD = 0.2860, 0.3530  # kFashionMnistMean, kFashionMnistStd


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def _mix_array(z):
    import numpy as np
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _mul_high(d, bound):
    """(d * bound) >> 64 for a uint64 array d and a small bound (< 2^31),
    exactly: the product's high word from its two 32-bit halves."""
    import numpy as np
    lo = ((d & np.uint64(0xFFFFFFFF)) * np.uint64(bound)) >> np.uint64(32)
    return ((d >> np.uint64(32)) * np.uint64(bound) + lo) >> np.uint64(32)


def _draw(state, k):
    """The k-th draw (k >= 1) of a splitmix64 whose state is `state`."""
    return _mix((state + k * GAMMA) & MASK64)


def _mnist_prototypes(seed):
    import numpy as np
    protos = np.zeros((10, MNIST_SIDE, MNIST_SIDE), dtype=np.int64)
    k = 0
    for p in range(10):
        for cy in range(MNIST_CELLS):
            for cx in range(MNIST_CELLS):
                k += 1
                r = _draw(seed & MASK64, k)
                v = 96 + (r >> 8) % 160 if r & 1 else 0
                protos[p, cy * MNIST_CELL:(cy + 1) * MNIST_CELL,
                       cx * MNIST_CELL:(cx + 1) * MNIST_CELL] = v
    return protos


def synthetic_mnist_raw(count, seed=0, split="train"):
    """makeSynthetic's `split`: uint8 pixels [count, 28, 28] and int64 labels.

    One splitmix64 stream per split (seed ^ tag): count - 1 draws shuffle
    the labels i % 10 (Fisher-Yates from the last position down, j =
    below(i + 1)), then each sample in order takes a contrast draw
    (128 + below(129)) and 98 noise draws (8 bytes each, little-endian);
    pixel = clamp((proto * contrast >> 8) + (noise * 161 >> 8) - 80, 0, 255).
    The prototype is the label's, except in the training split, where draw
    i + 1 of the stream seed ^ MISLABEL_TAG gives v = below(20 * 9), and
    v < 9 shows class (label + 1 + v) % 10 instead (one sample in 20)."""
    import numpy as np
    protos = _mnist_prototypes(seed).reshape(10, MNIST_BYTES)
    state = (seed ^ (TRAIN_TAG if split == "train" else TEST_TAG)) & MASK64
    labels = [i % 10 for i in range(count)]
    k = 0
    for i in range(count - 1, 0, -1):
        k += 1
        j = (_draw(state, k) * (i + 1)) >> 64
        labels[i], labels[j] = labels[j], labels[i]
    out = np.zeros((count, MNIST_BYTES), dtype=np.uint8)
    shown = np.array(labels, dtype=np.int64)
    if split == "train" and count:
        m = (seed ^ MISLABEL_TAG) & MASK64
        with np.errstate(over="ignore"):
            z = _mix_array(np.uint64(m) + np.arange(1, count + 1, dtype=np.uint64)
                           * np.uint64(GAMMA))
        v = _mul_high(z, MISLABELLED_ONE_IN * 9).astype(np.int64)
        shown = np.where(v < 9, (shown + 1 + v) % 10, shown)
    protos_by_sample = protos[shown] if count else protos[:0]
    shifts = np.arange(8, dtype=np.uint64) * np.uint64(8)
    g = np.uint64(GAMMA)
    for lo in range(0, count, 2048):  # chunks bound the temporaries (~40 MB)
        idx = np.arange(lo, min(count, lo + 2048), dtype=np.uint64)
        with np.errstate(over="ignore"):
            # Sample i's draws are draws k + 99 i + 1 ... k + 99 i + 99 of the stream.
            first = (np.uint64((state + k * GAMMA) & MASK64)
                     + idx * np.uint64(MNIST_DRAWS * GAMMA & MASK64))
            z = first[:, None] + np.arange(1, MNIST_DRAWS + 1, dtype=np.uint64)[None, :] * g
            z = _mix_array(z)
        contrast = (128 + _mul_high(z[:, 0], 129)).astype(np.int64)  # 128 + below(129)
        noise = ((z[:, 1:, None] >> shifts[None, None, :]) & np.uint64(255)).astype(np.int64)
        noise = noise.reshape(len(idx), MNIST_BYTES)
        v = (protos_by_sample[lo:lo + len(idx)] * contrast[:, None] >> 8) + (noise * 161 >> 8) - 80
        out[lo:lo + len(idx)] = np.clip(v, 0, 255).astype(np.uint8)
    return out.reshape(count, MNIST_SIDE, MNIST_SIDE), np.array(labels, dtype=np.int64)


def synthetic_mnist(count, seed=0, split="train"):
    """The normalised float32 images [count, 1, 28, 28] and int64 labels of
    `train --data synthetic --seed seed`, as numpy arrays: (p / 255 - mean) /
    std in float32, operation by operation as data.cc does."""
    import numpy as np
    pixels, labels = synthetic_mnist_raw(count, seed, split)
    x = pixels.astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(MNIST_MEAN)) / np.float32(MNIST_STD)
    return x.reshape(count, 1, MNIST_SIDE, MNIST_SIDE), labels


def synthetic_cifar_samples(indices, count, split="train"):
    """Samples `indices` of the first `count` of train's synthetic-cifar
    `split`: float32 [len, 3, 32, 32] normalised and int64 labels (numpy),
    the bytes tests/interop/synthetic_cifar.py renders one sample at a time."""
    import numpy as np
    import synthetic_cifar as sc  # tests/interop: the constants, labels, prototypes
    labels = sc.labels(count, split=split)
    protos = sc.prototypes().reshape(sc.CLASSES, sc.BYTES)
    stream = ~(sc.SEED ^ sc.SPLIT_TAGS[split]) & MASK64
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= count):
        raise ValueError("sample indices outside [0, %d)" % count)
    out = np.zeros((len(idx), sc.BYTES), dtype=np.uint8)
    shifts = np.arange(8, dtype=np.uint64) * np.uint64(8)
    draws = np.arange(1, sc.DRAWS + 1, dtype=np.uint64) * np.uint64(GAMMA)
    for lo in range(0, len(idx), 512):
        part = idx[lo:lo + 512].astype(np.uint64)
        with np.errstate(over="ignore"):
            # Sample i's stream starts at draw i * DRAWS: state + i * DRAWS * GAMMA.
            first = np.uint64(stream) + part * np.uint64(sc.DRAWS * GAMMA & MASK64)
            z = _mix_array(first[:, None] + draws[None, :])
        contrast = (128 + _mul_high(z[:, 0], 129)).astype(np.int64)  # 128 + below(129)
        noise = ((z[:, 1:, None] >> shifts[None, None, :]) & np.uint64(255)).astype(np.int64)
        noise = noise.reshape(len(part), sc.BYTES)
        proto = protos[labels[idx[lo:lo + 512]]]
        v = (proto * contrast[:, None] >> 8) + (noise * 161 >> 8) - 80
        out[lo:lo + len(part)] = np.clip(v, 0, 255).astype(np.uint8)
    pixels = out.reshape(len(idx), sc.CHANNELS, sc.SIDE, sc.SIDE)
    return sc.normalize(pixels), labels[idx]
