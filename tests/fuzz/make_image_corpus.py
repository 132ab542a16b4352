"""Writes the image fuzz target's seed corpus (tests/fuzz/image_corpus): small
JPEG and PNG files of the kinds image_decode.h handles, each prefixed by the
selector byte image_fuzz.cc reads (bit 0: 1 or 3 output channels). Run once
with PIL and numpy installed; the files are committed."""
import io
import os

import numpy as np
from PIL import Image

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "image_corpus")


def encoded(img, **save):
    b = io.BytesIO()
    img.save(b, **save)
    return b.getvalue()


def main():
    os.makedirs(HERE, exist_ok=True)
    rng = np.random.default_rng(3)
    rgb = Image.fromarray(rng.integers(0, 256, (9, 13, 3), dtype=np.uint8))
    rgba = rgb.copy()
    rgba.putalpha(128)
    pal = rgb.convert("P", palette=Image.ADAPTIVE, colors=5)
    seeds = {
        "jpeg_420": encoded(rgb, format="JPEG", quality=90),
        "jpeg_444": encoded(rgb, format="JPEG", quality=90, subsampling=0),
        "jpeg_progressive": encoded(rgb, format="JPEG", quality=50, progressive=True),
        "jpeg_gray": encoded(rgb.convert("L"), format="JPEG", quality=90),
        "jpeg_cmyk": encoded(rgb.convert("CMYK"), format="JPEG", quality=90),
        "png_rgb": encoded(rgb, format="PNG"),
        "png_rgba": encoded(rgba, format="PNG"),
        "png_l": encoded(rgb.convert("L"), format="PNG"),
        "png_la": encoded(rgba.convert("LA"), format="PNG"),
        "png_p_trns": encoded(pal, format="PNG", transparency=1),
        "png_p_2bit": encoded(pal, format="PNG", bits=2),
        "png_1bit": encoded(rgb.convert("1"), format="PNG"),
        "png_i16": encoded(Image.fromarray(rng.integers(0, 600, (5, 7), dtype=np.uint16)), format="PNG"),
    }
    for name, data in seeds.items():
        for sel in (0, 1):
            with open(os.path.join(HERE, f"{name}_c{3 if sel == 0 else 1}"), "wb") as f:
                f.write(bytes([sel]) + data)


if __name__ == "__main__":
    main()
