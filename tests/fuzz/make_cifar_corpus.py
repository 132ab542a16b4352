"""Writes the CIFAR fuzz target's seed corpus (tests/fuzz/cifar_corpus): one
small batch file per layout and pickle protocol, each prefixed by the
selector byte cifar_fuzz.cc reads (reader in bits 0-1, cap + 1 in bits 2-7).
Run once with numpy installed; the files are committed."""
import os
import pickle
import sys

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cifar_corpus")


def selector(mode, cap=-1):
    return bytes([mode | ((cap + 1) << 2)])


def main():
    os.makedirs(HERE, exist_ok=True)
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, size=(2, 3072), dtype=np.uint8)
    seeds = {}
    for proto in (2, 3, 4, 5):
        seeds["cifar10_p%d" % proto] = selector(0) + pickle.dumps(
            {"batch_label": "b", "labels": [3, 9], "data": data, "filenames": ["a", "b"]},
            protocol=proto)
    seeds["cifar100_p2"] = selector(1, 1) + pickle.dumps(
        {"fine_labels": [42, 99], "coarse_labels": [8, 19], "data": data}, protocol=2)
    seeds["cifar10_bin"] = selector(2) + b"".join(
        bytes([l]) + data[i].tobytes() for i, l in enumerate([1, 7]))
    seeds["cifar100_bin"] = selector(3, 1) + b"".join(
        bytes([l // 5, l]) + data[i].tobytes() for i, l in enumerate([55, 99]))
    for name, b in seeds.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(b)
    print("wrote %d seeds to %s" % (len(seeds), HERE), file=sys.stderr)


if __name__ == "__main__":
    main()
