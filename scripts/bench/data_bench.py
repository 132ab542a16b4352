#!/usr/bin/env python3
"""The trainer's input pipeline against PyTorch's DataLoader, per core.

Two pipelines on generated data (cached in --workdir):
  folder  an ImageFolder of --folder-images JPEGs (500x375, quality 90, 10
          classes): ours = loadImageFolder + gatherBatch (random-resized-crop
          to 224, flip, normalise) on a WorkPool of N threads (build/bin/
          data_bench); PyTorch = ImageFolder + RandomResizedCrop(224) +
          RandomHorizontalFlip + ToTensor + Normalize (ImageNet) in a
          DataLoader with num_workers = N.
  cifar   --cifar-images images in CIFAR-10's binary layout: ours = loadCifar
          + gatherBatch (crop-flip, normalise); PyTorch = the same pixels as a
          numpy array served as torchvision's CIFAR10 serves them
          (Image.fromarray) + RandomCrop(32, padding=4) + RandomHorizontalFlip
          + ToTensor + Normalize, DataLoader with num_workers = N.
Both: batch 64, shuffled, one warm-up epoch (PyTorch: persistent workers,
so worker start-up is not timed) then --epochs timed epochs. Reported:
images/s, images/s per core (divided by N), and ours / PyTorch, as JSON
lines (stdout, and --out) and a Markdown table.

  python3 scripts/bench/data_bench.py [--threads 1,2] [--kinds folder,cifar]
          [--python /opt/ddprun-test/venv-torch2/bin/python]

The PyTorch side runs in --python (torch, torchvision, PIL); this script
re-executes itself there with --torch-side.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)


def generate_folder(path, n, classes=10, size=(500, 375)):
    import numpy as np
    from PIL import Image
    done = os.path.join(path, ".complete")
    if os.path.exists(done):
        return
    rng = np.random.default_rng(0)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    for i in range(n):
        c = i % classes
        d = os.path.join(path, f"class{c:02d}")
        os.makedirs(d, exist_ok=True)
        # Smooth gradients, a few shapes and sensor-like noise: a photograph's
        # mix of flat and busy areas (what a JPEG codec's cost depends on).
        f = rng.uniform(0.005, 0.03, 3)
        img = np.stack([127 + 100 * np.sin(xx * f[k] + yy * f[(k + 1) % 3] + k) for k in range(3)], -1)
        for _ in range(4):
            x0, y0 = rng.integers(0, w - 60), rng.integers(0, h - 60)
            img[y0:y0 + rng.integers(20, 120), x0:x0 + rng.integers(20, 160)] = rng.integers(0, 256, 3)
        img += rng.normal(0, 8, img.shape)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
            os.path.join(d, f"img{i:05d}.jpg"), quality=90)
    open(done, "w").close()


def generate_cifar(path, n):
    """CIFAR-10's binary layout: data_batch_1..5 (n/5 images each), test_batch."""
    import numpy as np
    d = os.path.join(path, "cifar-10-batches-bin")
    done = os.path.join(d, ".complete")
    if os.path.exists(done):
        return d
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(1)
    per = n // 5
    for name, count in [(f"data_batch_{k}.bin", per) for k in range(1, 6)] + [("test_batch.bin", 1000)]:
        labels = rng.integers(0, 10, (count, 1), dtype=np.uint8)
        pixels = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        np.concatenate([labels, pixels], 1).tofile(os.path.join(d, name))
    open(done, "w").close()
    return d


def cifar_arrays(d):
    """The training images as torchvision's CIFAR10 holds them: N x 32 x 32 x 3 (HWC)."""
    import numpy as np
    recs = [np.fromfile(os.path.join(d, f"data_batch_{k}.bin"), np.uint8).reshape(-1, 3073)
            for k in range(1, 6)]
    r = np.concatenate(recs)
    return r[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), r[:, 0].astype(np.int64)


def torch_side(args):
    import torch
    import torchvision.transforms as T
    from torch.utils.data import DataLoader, Dataset
    from torchvision.datasets import ImageFolder
    from PIL import Image

    if args.kind == "folder":
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
        ds = ImageFolder(args.data, transform=tf)
    else:
        class Cifar(Dataset):  # torchvision.datasets.CIFAR10.__getitem__, minus the download check
            def __init__(self, d, transform):
                self.data, self.targets = cifar_arrays(d)
                self.transform = transform

            def __len__(self):
                return len(self.data)

            def __getitem__(self, i):
                return self.transform(Image.fromarray(self.data[i])), int(self.targets[i])

        tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))])
        ds = Cifar(args.data, tf)
    torch.manual_seed(0)
    dl = DataLoader(ds, batch_size=64, shuffle=True, num_workers=args.threads,
                    persistent_workers=True, prefetch_factor=2)
    images, timed = 0, 0.0
    for e in range(args.epochs + 1):
        t0 = time.perf_counter()
        for x, y in dl:
            if e > 0:
                images += x.shape[0]
        if e > 0:
            timed += time.perf_counter() - t0
    rate = images / timed
    print(json.dumps({"pipeline": "pytorch", "kind": args.kind, "threads": args.threads,
                      "batch": 64, "images": images, "seconds": round(timed, 4),
                      "images_per_s": round(rate, 2),
                      "images_per_s_per_core": round(rate / args.threads, 2),
                      "torch": torch.__version__}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--kinds", default="folder,cifar")
    ap.add_argument("--folder-images", type=int, default=2000)
    ap.add_argument("--cifar-images", type=int, default=10000)
    ap.add_argument("--folder-epochs", type=int, default=2)
    ap.add_argument("--cifar-epochs", type=int, default=3)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build", "bench-data"))
    ap.add_argument("--bin", default=os.environ.get("DDPRUN_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--python", default="/opt/ddprun-test/venv-torch2/bin/python")
    ap.add_argument("--out", help="also append the JSON lines to this file")
    ap.add_argument("--torch-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--kind", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--epochs", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_side:
        args.threads = int(args.threads)
        return torch_side(args)

    from benchutil import cpu_model
    folder = os.path.join(args.workdir, f"folder-{args.folder_images}")
    cifar = os.path.join(args.workdir, f"cifar-{args.cifar_images}")
    kinds = args.kinds.split(",")
    gen = ("import sys; sys.path.insert(0, %r); import data_bench as b; " % HERE)
    if "folder" in kinds:
        subprocess.run([args.python, "-c", gen + f"b.generate_folder({folder!r}, {args.folder_images})"],
                       check=True)
    if "cifar" in kinds:
        subprocess.run([args.python, "-c", gen + f"b.generate_cifar({cifar!r}, {args.cifar_images})"],
                       check=True)
    cifar_dir = os.path.join(cifar, "cifar-10-batches-bin")
    rows, lines = [], []
    for kind in kinds:
        data = folder if kind == "folder" else cifar_dir
        epochs = args.folder_epochs if kind == "folder" else args.cifar_epochs
        for n in [int(t) for t in args.threads.split(",")]:
            ours = json.loads(subprocess.run(
                [os.path.join(args.bin, "data_bench"), "--kind", kind, "--data", data, "--threads",
                 str(n), "--epochs", str(epochs), "--profile"],
                check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            theirs = json.loads(subprocess.run(
                [args.python, os.path.abspath(__file__), "--torch-side", "--kind", kind, "--data", data,
                 "--threads", str(n), "--epochs", str(epochs)],
                check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
            ratio = ours["images_per_s_per_core"] / theirs["images_per_s_per_core"]
            for r in (ours, theirs):
                r["cpu"] = cpu_model()
                lines.append(json.dumps(r))
                print(lines[-1], flush=True)
            rows.append((kind, n, ours, theirs, ratio))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    print(f"\nCPU: {cpu_model()}, {os.cpu_count()} cores\n")
    print("| pipeline | N (threads = workers) | ddprun img/s/core | DataLoader img/s/core | ratio |")
    print("|---|---|---|---|---|")
    for kind, n, ours, theirs, ratio in rows:
        name = "ImageFolder JPEG, RRC 224 + flip" if kind == "folder" else "CIFAR bytes, crop 32 pad 4 + flip"
        print(f"| {name} | {n} | {ours['images_per_s_per_core']:.0f} | "
              f"{theirs['images_per_s_per_core']:.0f} | {ratio:.2f}x |")
    for kind, n, ours, _, _ in rows:
        if ours.get("stages"):
            print(f"\nddprun {kind}, N={n}, single-thread cost per image (us): {json.dumps(ours['stages'])}")


if __name__ == "__main__":
    main()
