// Decoding one image file (JPEG or PNG) into the trainer's CHW uint8 layout,
// the way torchvision's default loader sees it: PIL's
//   Image.open(path).convert("RGB")
// pixel for pixel. JPEG goes through libjpeg-turbo's libjpeg API with the
// settings PIL uses by default (JDCT_ISLOW, fancy upsampling: PIL links the
// same library), PNG through libpng. The format is recognised by the file's
// first bytes, never by its name; any other format (BMP, GIF, WebP, TIFF,
// PNM, ...) is refused as unsupported.
//
// What .convert("RGB") does, and so what we do:
//   JPEG  colour: as decoded (YCbCr -> RGB by libjpeg); grayscale: the gray
//         value in all three channels; CMYK/YCCK (Adobe): PIL's CMYK -> RGB,
//         r = 255 - k' - c*(255-k')/255 rounded as PIL does (after undoing
//         Adobe's inversion, as PIL's "CMYK;I" raw mode does).
//   PNG   palette: looked up (a transparent entry keeps its colour); gray
//         1/2/4-bit: scaled to 0..255 (x255, x85, x17); alpha (RGBA, LA,
//         tRNS): dropped, never composited; 16-bit RGB(A)/LA: the high byte
//         of each sample; 16-bit gray (PIL's mode "I;16"): min(value, 255),
//         as PIL's I;16 -> RGB conversion clamps. Gamma, sRGB, iCCP and
//         background chunks are ignored (PIL ignores them too).
// With channels = 1 the RGB image is reduced as PIL's .convert("L") does
// (L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16; a gray source comes back
// unchanged).
//
// Limits, checked from the header before any pixel memory is set aside: at
// most DecodeLimits::maxSide pixels per side and maxPixels in all (the
// defaults take any photograph; a bomb of a header is refused), at most
// maxFileBytes read from a file, and a progressive JPEG of more than
// maxScans scans is refused (libjpeg-turbo's own guard against
// decompression-time blowups). Errors are DataError, one line: the file,
// what is wrong (libjpeg's or libpng's message for corrupt data), and what
// to do. A truncated file is an error (PIL refuses one too), as is a JPEG
// whose data ends early; libjpeg's other warnings (extraneous bytes, ...)
// are ignored, as PIL ignores them.
//
// Thread-safety: the functions keep no state; any number of threads may
// decode at once. libjpeg's and libpng's errors are caught with setjmp in
// code that holds no C++ objects with destructors (they never exit() and
// never unwind through C frames).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ddprun/train/data.h"
#include "ddprun/train/transforms.h"

namespace ddprun::train {

// The limits a decode applies (see above). The defaults are used by the
// trainer; tests and the fuzz target lower them.
struct DecodeLimits {
  int64_t maxPixels = int64_t{1} << 28;   // width * height
  int maxSide = 65535;                    // width and height each
  int64_t maxFileBytes = int64_t{1} << 30;
  int maxScans = 500;                     // progressive JPEG scans
};

// Which decoder a file's first bytes ask for.
enum class ImageFormat { kUnknown, kJpeg, kPng, kBmp, kGif, kWebp, kTiff, kPnm };
ImageFormat sniffImageFormat(const uint8_t* data, size_t size);
const char* imageFormatName(ImageFormat f);

// The advice appended to every image DataError.
inline constexpr const char* kImageHint =
    "replace or delete the file (ddprun decodes JPEG and PNG), or pass --skip-bad-images "
    "to train on without the files that do not decode";

// Decodes the file at `path` into a CHW image of `channels` channels (3:
// RGB, 1: gray; see above). Throws DataError naming `path` for a missing or
// unreadable file, an unsupported format, corrupt or truncated data, or an
// image over `limits`; InvalidArgument when channels is neither 1 nor 3.
ImageU8 decodeImage(const std::string& path, int channels, const DecodeLimits& limits = {});

// The same on bytes in memory; `nameForErrors` stands for the file in
// messages. `data` may be null when size is 0.
ImageU8 decodeImageBytes(const uint8_t* data, size_t size, int channels,
                         const std::string& nameForErrors, const DecodeLimits& limits = {});

}  // namespace ddprun::train
