// libFuzzer target for the image decoders (image_decode.h): JPEG through
// libjpeg-turbo, PNG through libpng, the format sniffed from the bytes.
//
// The first input byte picks the output channels (bit 0: 1 or 3); the rest
// is the file's bytes, decoded with small limits (4 Mpixels, 4096 per side,
// 64 progressive scans) so the limit paths are reached and no input can ask
// for more memory than -rss_limit_mb allows. decodeImageBytes either throws
// DataError (a non-empty, single-line message naming the file) or returns an
// image of the asked channels whose size agrees with its dimensions, within
// the limits. Anything else (a crash, a sanitizer report, a hang, an
// exit() from libjpeg or libpng) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ddprun/train/image_decode.h"

using namespace ddprun::train;

namespace {

void die(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int channels = (data[0] & 1) ? 1 : 3;
  DecodeLimits limits;
  limits.maxPixels = int64_t{1} << 22;
  limits.maxSide = 4096;
  limits.maxScans = 64;
  try {
    const ImageU8 im = decodeImageBytes(data + 1, size - 1, channels, "fuzz.img", limits);
    if (im.c != channels) die("wrong channel count");
    if (im.h < 1 || im.w < 1 || im.h > limits.maxSide || im.w > limits.maxSide ||
        int64_t{im.h} * im.w > limits.maxPixels)
      die("image outside the limits");
    if (im.px.size() != size_t(im.c) * im.h * im.w) die("pixel count differs from c*h*w");
  } catch (const DataError& e) {
    const std::string& m = e.message();
    if (m.empty() || m.find('\n') != std::string::npos) die("bad error message");
    if (m.rfind("fuzz.img: ", 0) != 0) die("message does not name the file first");
  }
  return 0;
}
