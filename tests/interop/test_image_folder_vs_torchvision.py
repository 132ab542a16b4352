"""train's image folders (ddprun/train/image_folder.h, image_decode.h)
against torchvision and PIL, through image_probe:

  1. our JPEG and PNG decode equals PIL's Image.open(f).convert("RGB") (what
     torchvision's default loader returns) bit for bit: JPEGs written by PIL
     at quality 90 in several sizes (odd ones too), chroma subsamplings,
     progressive, grayscale and CMYK; PNGs of every mode PIL writes (RGB,
     RGBA, L, LA, P with transparency, 1-bit, 16-bit gray);
  2. files PIL refuses (truncated JPEG and PNG, not an image) are refused by
     us too;
  3. the (path, class) list and the classes equal
     torchvision.datasets.ImageFolder(root)'s on a tree with nested
     directories, names that sort differently by path and by component,
     upper-case extensions, hidden and symlinked class folders, a symlinked
     file and files of other extensions; an empty class fails in both.

The PyTorch 2.x venv (it has torchvision); skipped (77) without
torchvision or PIL."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

from storeutil import BIN, SKIP

try:
    import numpy as np
    from PIL import Image
    import torchvision
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"SKIPPED: torchvision, PIL or numpy is not installed for {sys.executable}: {e}")
    sys.exit(SKIP)

PROBE = os.path.join(BIN, "image_probe")


def probe(*args):
    if not os.path.exists(PROBE):
        raise RuntimeError(f"{PROBE} is missing: build it (cmake --build build --target image_probe)")
    out = subprocess.run([PROBE, *args], check=True, capture_output=True, text=True, timeout=120).stdout
    return [json.loads(line) for line in out.splitlines()]


def pattern(w, h, seed):
    """A smooth image with edges and noise: what photographs give a codec."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256], -1)
    img = img.astype(np.int32) + rng.integers(-30, 30, (h, w, 3))
    img[h // 3: h // 2, w // 4: w // 2] = [250, 10, 40]
    return np.clip(img, 0, 255).astype(np.uint8)


class Decode(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.files = []

    def tearDown(self):
        self.tmp.cleanup()

    def add(self, name, img, **save):
        path = os.path.join(self.dir, name)
        img.save(path, **save)
        self.files.append(path)

    def check_all(self):
        out = os.path.join(self.dir, "out")
        os.makedirs(out, exist_ok=True)
        results = probe("decode", out, *self.files)
        self.assertEqual(len(results), len(self.files))
        for r in results:
            with self.subTest(file=os.path.basename(r["file"])):
                self.assertNotIn("error", r, r.get("error"))
                with Image.open(r["file"]) as im:
                    ref = np.asarray(im.convert("RGB")).transpose(2, 0, 1)
                ours = np.fromfile(r["raw"], np.uint8).reshape(r["c"], r["h"], r["w"])
                self.assertEqual(ours.shape, ref.shape)
                diff = np.argwhere(ours != ref)
                self.assertEqual(len(diff), 0,
                                 f"{len(diff)} of {ours.size} values differ, first at {diff[:3].tolist()}")

    def test_jpeg_bit_for_bit(self):
        sizes = [(1, 1), (7, 5), (33, 17), (64, 64), (500, 375), (375, 500), (257, 129)]
        for i, (w, h) in enumerate(sizes):
            img = Image.fromarray(pattern(w, h, i))
            self.add(f"q90_{w}x{h}.jpg", img, quality=90)
        big = Image.fromarray(pattern(301, 203, 99))
        self.add("444.jpg", big, quality=90, subsampling=0)
        self.add("422.jpg", big, quality=90, subsampling=1)
        self.add("progressive.jpg", big, quality=90, progressive=True)
        self.add("optimized.jpeg", big, quality=75, optimize=True)
        self.add("gray.jpg", big.convert("L"), quality=90)
        self.add("cmyk.jpg", big.convert("CMYK"), quality=90)
        self.add("named_png.png", big, format="JPEG", quality=90)  # the bytes decide
        self.check_all()

    def test_png_modes_bit_for_bit(self):
        rgb = Image.fromarray(pattern(45, 31, 7))
        self.add("rgb.png", rgb)
        rgba = rgb.copy()
        rgba.putalpha(Image.fromarray((pattern(45, 31, 8)[..., 0])))
        self.add("rgba.png", rgba)
        self.add("l.png", rgb.convert("L"))
        self.add("la.png", rgba.convert("LA"))
        pal = rgb.convert("P", palette=Image.ADAPTIVE, colors=17)
        self.add("p.png", pal)
        self.add("p_trns.png", pal, transparency=3)
        self.add("p_small.png", rgb.convert("P", palette=Image.ADAPTIVE, colors=4), bits=2)
        self.add("one_bit.png", rgb.convert("1"))
        self.add("l_trns.png", rgb.convert("L"), transparency=40)
        self.add("rgb_trns.png", rgb, transparency=(250, 10, 40))
        i16 = Image.fromarray((pattern(45, 31, 9)[..., 0].astype(np.uint16) * 3))  # some > 255
        self.add("i16.png", i16)
        self.add("named_jpg.jpg", rgb, format="PNG")
        self.check_all()

    def test_refused_like_pil(self):
        good = os.path.join(self.dir, "good.jpg")
        Image.fromarray(pattern(64, 48, 3)).save(good, quality=90)
        good_png = os.path.join(self.dir, "good.png")
        Image.fromarray(pattern(64, 48, 4)).save(good_png)
        with open(good, "rb") as f, open(good_png, "rb") as g:
            data, png = f.read(), g.read()
        bad = {"cut.jpg": data[: len(data) // 2], "cut.png": png[: len(png) // 2],
               "text.jpg": b"not an image at all"}
        for name, b in bad.items():
            with open(os.path.join(self.dir, name), "wb") as f:
                f.write(b)
        for r in probe("decode", self.dir, *[os.path.join(self.dir, n) for n in bad]):
            with self.subTest(file=r["file"]):
                with self.assertRaises(Exception), Image.open(r["file"]) as im:
                    im.convert("RGB")
                self.assertIn("error", r)
                self.assertIn(r["file"], r["error"])


class Listing(unittest.TestCase):
    def test_samples_and_classes_equal_torchvision(self):
        with tempfile.TemporaryDirectory() as d:
            root = os.path.join(d, "root")
            img = Image.fromarray(pattern(8, 6, 0))
            files = ["b/1.png", "a/z.jpg", "a/A.PNG", "a/sub/x.jpeg", "a/sub-x/y.png",
                     "a/sub/deep/w.png", "a/sub.d/v.JPG", "B/q.Png", ".hidden/h.png",
                     "a_x/k.webp", "a_x/k.bmp", "a_x/n.TIFF", "dog/10.jpg", "dog/2.jpg",
                     "dog/Zeta.jpg", "dog/alpha.jpg", "dog/_u.jpg", "dog/x y.jpg"]
            for f in files:
                path = os.path.join(root, f)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                img.save(path, format="PNG")
            for f in ["a/readme.txt", "dog/noext", "top.jpg"]:
                with open(os.path.join(root, f), "w") as fh:
                    fh.write("x")
            os.makedirs(os.path.join(d, "elsewhere", "c", "in"))
            img.save(os.path.join(d, "elsewhere", "c", "in", "e.jpg"), format="PNG")
            os.symlink(os.path.join(d, "elsewhere", "c"), os.path.join(root, "linked"))
            os.symlink(os.path.join(root, "b", "1.png"), os.path.join(root, "dog", "link.png"))
            for r in (root, root + "/"):
                with self.subTest(root=r):
                    ours = probe("list", r)[0]
                    self.assertNotIn("error", ours, ours.get("error"))
                    tv = torchvision.datasets.ImageFolder(r)
                    self.assertEqual(ours["classes"], tv.classes)
                    self.assertEqual([tuple(s) for s in ours["samples"]], [tuple(s) for s in tv.samples])

    def test_empty_class_fails_in_both(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "full"))
            os.makedirs(os.path.join(d, "empty"))
            Image.fromarray(pattern(4, 4, 0)).save(os.path.join(d, "full", "a.png"))
            with self.assertRaisesRegex(FileNotFoundError, "Found no valid file for the classes empty"):
                torchvision.datasets.ImageFolder(d)
            ours = probe("list", d)[0]
            self.assertIn("found no valid file for the classes empty", ours["error"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
