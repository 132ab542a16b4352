"""`train --data synthetic-cifar` in numpy: the same bytes, labels and
normalised float32 images the trainer sees (src/train/data.cc,
makeSyntheticCifar; the recipe is in docs/train.md).

    x, y = load("train", count)   # torch tensors [count, 3, 32, 32], [count]

Everything is splitmix64 over unsigned 64-bit integers: Python ints for the
few scalar draws, numpy uint64 arrays (which wrap, as C++ does) for the noise.
"""
import numpy as np

SEED = 0xC1FA  # kSyntheticCifarSeed
CLASSES, CHANNELS, SIDE, CELL = 10, 3, 32, 4
PLANE = SIDE * SIDE
BYTES = CHANNELS * PLANE
DRAWS = 1 + BYTES // 8  # the contrast, then 8 noise bytes per draw
GAMMA = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
SPLIT_TAGS = {"train": 0x747261696E000000, "test": 0x7465737400000000}
MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)  # kCifarMean
STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)   # kCifarStd


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


class Rng:
    """splitmix64: state += gamma, then the mix (data.cc's Rng)."""

    def __init__(self, state):
        self.state = state & MASK

    def next(self):
        self.state = (self.state + GAMMA) & MASK
        return _mix(self.state)

    def below(self, bound):
        return (self.next() * bound) >> 64


def _mix_array(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def prototypes(seed=SEED):
    rng = Rng(seed)
    protos = np.zeros((CLASSES, CHANNELS, SIDE, SIDE), dtype=np.int64)
    cells = SIDE // CELL
    for k in range(CLASSES):
        for c in range(CHANNELS):
            for cy in range(cells):
                for cx in range(cells):
                    r = rng.next()
                    v = 64 + (r >> 8) % 192 if r & 1 else 0
                    protos[k, c, cy * CELL:(cy + 1) * CELL, cx * CELL:(cx + 1) * CELL] = v
    return protos


def labels(count, classes=CLASSES, split="train", seed=SEED):
    rng = Rng(seed ^ SPLIT_TAGS[split])
    out = []
    while len(out) < count:
        block = list(range(classes))
        for k in range(classes - 1, 0, -1):
            j = rng.below(k + 1)
            block[k], block[j] = block[j], block[k]
        out.extend(block)
    return np.array(out[:count], dtype=np.int64)


def raw_images(count, classes=CLASSES, split="train", seed=SEED):
    """uint8 [count, 3, 32, 32] and int64 labels [count]."""
    protos = prototypes(seed).reshape(CLASSES, BYTES)
    y = labels(count, classes, split, seed)
    stream = ~(seed ^ SPLIT_TAGS[split]) & MASK
    out = np.zeros((count, BYTES), dtype=np.uint8)
    shifts = np.arange(8, dtype=np.uint64) * np.uint64(8)
    for i in range(count):
        rng = Rng(stream + i * DRAWS * GAMMA)
        contrast = 128 + rng.below(129)
        first = rng.state  # the state before the first noise draw
        steps = np.arange(1, BYTES // 8 + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            draws = _mix_array(np.uint64(first) + steps * np.uint64(GAMMA))
        noise = ((draws[:, None] >> shifts[None, :]) & np.uint64(255)).astype(np.int64).ravel()
        v = (protos[y[i]] * contrast >> 8) + (noise * 161 >> 8) - 80
        out[i] = np.clip(v, 0, 255).astype(np.uint8)
    return out.reshape(count, CHANNELS, SIDE, SIDE), y


def normalize(pixels):
    """ToTensor() + Normalize(MEAN, STD) in float32, channel by channel."""
    x = pixels.astype(np.float32) / np.float32(255.0)
    return (x - MEAN[None, :, None, None]) / STD[None, :, None, None]


def load(split, count, classes=CLASSES, seed=SEED):
    """The first `count` samples of the split as torch tensors (x float32
    [count, 3, 32, 32] normalised, y int64 [count])."""
    import torch
    pixels, y = raw_images(count, classes, split, seed)
    return torch.from_numpy(normalize(pixels)), torch.from_numpy(y)
