"""Writes small CIFAR-10/100 directories laid out exactly as the downloads
(and torchvision.datasets.CIFAR10/100(root, download=True)) leave them:

  <root>/cifar-10-batches-py/   data_batch_1..5, test_batch, batches.meta
  <root>/cifar-100-python/      train, test, meta
  <root>/cifar-10-batches-bin/  data_batch_1.bin..5, test_batch.bin, batches.meta.txt
  <root>/cifar-100-binary/      train.bin, test.bin, fine_label_names.txt, coarse_label_names.txt

The python versions are pickled dicts with str keys (what Python 2's cPickle
wrote and torchvision reads with encoding='latin1'): 'data' a numpy uint8
array N x 3072 (R, G, B planes of 32x32 per row), 'labels' (CIFAR-10) or
'fine_labels' + 'coarse_labels' (CIFAR-100) lists of ints, 'batch_label',
'filenames'. Python 3's pickle writes them (protocol 2 by default, as the
originals; 2..5 on request). The binary versions are records of a label byte
(CIFAR-100: coarse then fine) and the 3072 pixel bytes.

Each writer returns the arrays it wrote, for comparison with what a reader
returns: {"train": (data, labels), "test": (data, labels)}, the train split
being the train files concatenated in order. Needs numpy.

Usable as a script too:
  cifar_files.py ROOT {cifar10,cifar100,cifar10-bin,cifar100-bin} [--per-batch N] [--test N]
"""
import argparse
import hashlib
import os
import pickle

import numpy as np

CIFAR10_PY = "cifar-10-batches-py"
CIFAR100_PY = "cifar-100-python"
CIFAR10_BIN = "cifar-10-batches-bin"
CIFAR100_BIN = "cifar-100-binary"
LAYOUT_DIRS = {"cifar10": CIFAR10_PY, "cifar100": CIFAR100_PY,
               "cifar10-bin": CIFAR10_BIN, "cifar100-bin": CIFAR100_BIN}
CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                 "ship", "truck"]


def _images(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def _labels(n, classes, seed):
    rng = np.random.default_rng(seed + 1)
    return [int(x) for x in rng.integers(0, classes, size=n)]


def _dump(path, obj, protocol):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def _split(parts):
    data = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, 3072), np.uint8)
    labels = [l for p in parts for l in p[1]]
    return data, labels


def write_cifar10_py(root, per_batch=64, test=32, protocol=2, seed=10):
    d = os.path.join(root, CIFAR10_PY)
    os.makedirs(d, exist_ok=True)
    parts = []
    for b in range(1, 6):
        data, labels = _images(per_batch, seed + b), _labels(per_batch, 10, seed + b)
        _dump(os.path.join(d, "data_batch_%d" % b),
              {"batch_label": "training batch %d of 5" % b, "labels": labels, "data": data,
               "filenames": ["img_%d_%d.png" % (b, i) for i in range(per_batch)]}, protocol)
        parts.append((data, labels))
    tdata, tlabels = _images(test, seed), _labels(test, 10, seed)
    _dump(os.path.join(d, "test_batch"),
          {"batch_label": "testing batch 1 of 1", "labels": tlabels, "data": tdata,
           "filenames": ["test_%d.png" % i for i in range(test)]}, protocol)
    _dump(os.path.join(d, "batches.meta"),
          {"num_cases_per_batch": per_batch, "label_names": CIFAR10_NAMES, "num_vis": 3072},
          protocol)
    return {"train": _split(parts), "test": (tdata, tlabels)}


def write_cifar100_py(root, per_batch=64, test=32, protocol=2, seed=100):
    d = os.path.join(root, CIFAR100_PY)
    os.makedirs(d, exist_ok=True)
    out = {}
    for split, n, s in (("train", 5 * per_batch, seed + 1), ("test", test, seed)):
        data, fine = _images(n, s), _labels(n, 100, s)
        _dump(os.path.join(d, split),
              {"filenames": ["%s_%d.png" % (split, i) for i in range(n)],
               "batch_label": "%sing batch 1 of 1" % split, "fine_labels": fine,
               "coarse_labels": [l // 5 for l in fine], "data": data}, protocol)
        out[split] = (data, fine)
    _dump(os.path.join(d, "meta"),
          {"fine_label_names": ["fine_%d" % i for i in range(100)],
           "coarse_label_names": ["coarse_%d" % i for i in range(20)]}, protocol)
    return out


def _records(data, labels, classes):
    n = len(labels)
    lab = np.array(labels, dtype=np.uint8).reshape(n, 1)
    if classes == 100:
        lab = np.concatenate([lab // 5, lab], axis=1)
    return np.concatenate([lab, data], axis=1).tobytes()


def write_cifar10_bin(root, per_batch=64, test=32, seed=10):
    d = os.path.join(root, CIFAR10_BIN)
    os.makedirs(d, exist_ok=True)
    parts = []
    for b in range(1, 6):
        data, labels = _images(per_batch, seed + b), _labels(per_batch, 10, seed + b)
        with open(os.path.join(d, "data_batch_%d.bin" % b), "wb") as f:
            f.write(_records(data, labels, 10))
        parts.append((data, labels))
    tdata, tlabels = _images(test, seed), _labels(test, 10, seed)
    with open(os.path.join(d, "test_batch.bin"), "wb") as f:
        f.write(_records(tdata, tlabels, 10))
    with open(os.path.join(d, "batches.meta.txt"), "w") as f:
        f.write("\n".join(CIFAR10_NAMES) + "\n")
    return {"train": _split(parts), "test": (tdata, tlabels)}


def write_cifar100_bin(root, per_batch=64, test=32, seed=100):
    d = os.path.join(root, CIFAR100_BIN)
    os.makedirs(d, exist_ok=True)
    out = {}
    for split, n, s in (("train", 5 * per_batch, seed + 1), ("test", test, seed)):
        data, fine = _images(n, s), _labels(n, 100, s)
        with open(os.path.join(d, split + ".bin"), "wb") as f:
            f.write(_records(data, fine, 100))
        out[split] = (data, fine)
    for name, k in (("fine_label_names.txt", 100), ("coarse_label_names.txt", 20)):
        with open(os.path.join(d, name), "w") as f:
            f.write("\n".join("label_%d" % i for i in range(k)) + "\n")
    return out


def write(root, layout, per_batch=64, test=32, protocol=2):
    """Writes `layout` (a key of LAYOUT_DIRS) under root; returns the arrays."""
    if layout == "cifar10":
        return write_cifar10_py(root, per_batch, test, protocol)
    if layout == "cifar100":
        return write_cifar100_py(root, per_batch, test, protocol)
    if layout == "cifar10-bin":
        return write_cifar10_bin(root, per_batch, test)
    if layout == "cifar100-bin":
        return write_cifar100_bin(root, per_batch, test)
    raise ValueError("unknown layout %r" % layout)


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root")
    ap.add_argument("layout", choices=sorted(LAYOUT_DIRS))
    ap.add_argument("--per-batch", type=int, default=64)
    ap.add_argument("--test", type=int, default=32)
    ap.add_argument("--protocol", type=int, default=2, choices=[2, 3, 4, 5])
    a = ap.parse_args()
    write(a.root, a.layout, a.per_batch, a.test, a.protocol)
    print(os.path.join(a.root, LAYOUT_DIRS[a.layout]))


if __name__ == "__main__":
    main()
