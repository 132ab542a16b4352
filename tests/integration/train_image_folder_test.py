"""`train --data <dir>` on an image folder in torchvision's ImageFolder layout.

A small folder of PNG files written here with zlib alone (no PIL needed):
3 classes of 8 images of various sizes, each class a colour, so the set is
learnable.
- recognised without --data-format; resnet18 trains on it at --image-size
  32 with --val-fraction and --augment random-resized-crop (and crop-flip),
  the final JSON names the folder and its classes, the test split is the
  fraction held out;
- without a test split the accuracy is null (nothing was measured);
- a file that does not decode: exit 2 with one line naming the file; with
  --skip-bad-images the run goes on and the final JSON counts it;
- --val-data, --val-fraction and --skip-bad-images with another set: exit 2.
The decoders, the listing order against torchvision and the transforms
against torchvision are tested elsewhere (ImageDecode.*, ImageFolder.*,
tests/interop/test_image_folder_vs_torchvision.py,
tests/interop/test_transforms_vs_torchvision.py)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "pyutil"))

BIN = os.environ.get("DDPRUN_BIN_DIR", os.path.join(HERE, "../../build/bin"))
TRAIN = os.path.join(BIN, "train")
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
               "DDPRUN_PROGRESS_FILE")
COLOURS = {"cat": (200, 40, 40), "dog": (40, 200, 40), "fox": (40, 40, 200)}


def png(path, w, h, rgb, seed):
    """An 8-bit RGB PNG of w x h: the colour with a little per-pixel noise."""
    rows = bytearray()
    x = seed
    for _ in range(h):
        rows.append(0)  # filter: none
        for _ in range(w):
            for c in rgb:
                x = (x * 1103515245 + 12345) & 0x7FFFFFFF
                rows.append(max(0, min(255, c + (x >> 16) % 31 - 15)))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(bytes(rows))))
        f.write(chunk(b"IEND", b""))


class TrainImageFolder(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="train_imgf_")
        self.root = os.path.join(self.tmp, "images")
        for k, (name, rgb) in enumerate(sorted(COLOURS.items())):
            d = os.path.join(self.root, name)
            os.makedirs(d)
            for i in range(8):
                png(os.path.join(d, "%02d.png" % i), 24 + 5 * i, 20 + 3 * i, rgb, 100 * k + i)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def train(self, *args):
        env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
        return subprocess.run([TRAIN, "--device", "cpu", "--model", "resnet18", "--stem", "cifar",
                               "--image-size", "32", "--batch-size", "6", "--epochs", "1",
                               "--quiet", *args], capture_output=True, text=True, timeout=300,
                              cwd=self.tmp, env=env)

    def final(self, p):
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])
        return json.loads(p.stdout.strip().splitlines()[-1])

    def test_trains_with_a_held_out_fraction_and_each_augmentation(self):
        for augment in ("random-resized-crop", "crop-flip", "none"):
            res = self.final(self.train("--data", self.root, "--val-fraction", "0.25",
                                        "--augment", augment))
            self.assertEqual(res["data"], "ImageFolder (%s, 3 classes)" % self.root, augment)
            self.assertEqual(res["test_total"], 6, augment)  # 2 of each class's 8
            self.assertEqual(res["steps"], 3, augment)       # 18 training images / 6
            self.assertIsNotNone(res["test_accuracy"])
            self.assertNotIn("skipped_images", res)

    def test_a_second_folder_is_the_test_split_and_none_means_no_accuracy(self):
        val = os.path.join(self.tmp, "val")
        shutil.copytree(self.root, val)
        res = self.final(self.train("--data", self.root, "--val-data", val))
        self.assertEqual(res["test_total"], 24)
        p = self.train("--data", self.root)
        res = self.final(p)
        self.assertIsNone(res["test_accuracy"])
        self.assertEqual(res["test_total"], 0)
        self.assertIn("no test split", p.stderr)

    def test_an_undecodable_image_is_named_or_skipped_and_counted(self):
        bad = os.path.join(self.root, "dog", "03.png")
        with open(bad, "r+b") as f:
            f.truncate(60)  # a PNG cut inside its image data
        p = self.train("--data", self.root, "--val-fraction", "0.25")
        self.assertEqual(p.returncode, 2, p.stderr[-3000:])
        lines = [l for l in p.stderr.splitlines() if l.startswith("train: error")]
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn(bad, lines[0])
        res = self.final(self.train("--data", self.root, "--val-fraction", "0.25",
                                    "--skip-bad-images"))
        self.assertEqual(res["skipped_images"], 1)

    def test_image_folder_flags_with_another_set_are_refused(self):
        for flags in (["--val-fraction", "0.2"], ["--val-data", self.root],
                      ["--skip-bad-images"]):
            p = subprocess.run([TRAIN, "--data", "synthetic", "--max-steps", "1", *flags],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 2, flags)
            self.assertIn("image folder", p.stderr, flags)
        p = subprocess.run([TRAIN, "--val-fraction", "1"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--val-fraction", p.stderr)


if __name__ == "__main__":
    if not os.access(TRAIN, os.X_OK):
        # The sanitizer pass builds no train (scripts/test.sh): skipped, saying why.
        print("SKIPPED: no train binary in %s" % BIN)
        sys.exit(77)
    from testmain import main  # noqa: E402
    main()
