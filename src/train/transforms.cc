// Image transforms equal to torchvision's (see transforms.h for the list).
// The resize reproduces ATen's CPU kernel for _upsample_bilinear2d_aa on
// float32 (UpSampleKernel.cpp: HelperInterpBase::_compute_index_ranges_weights
// with HelperInterpLinear::aa_filter, then separable_upsample_generic_Nd_
// kernel_impl), including where it rounds to float and where to double.
#include "ddprun/train/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "ddprun/common/error.h"
#include "ddprun/train/data.h"

// applyTaps rounds some products and fuses others on purpose: a compiler
// free to contract a*b+c into an FMA by itself (GCC's default where the
// target has FMA, e.g. -march=native) would change the sums.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace ddprun::train {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void checkImage(ImageView img, const char* what) {
  DDPRUN_CHECK(img.c >= 1 && img.h >= 1 && img.w >= 1 && img.px != nullptr, what,
               ": an image needs c, h, w >= 1 and pixels (got ", img.c, "x", img.h, "x", img.w,
               ")");
}

// ---- Resize weights (ATen, float32 path) ------------------------------------

// The filter taps of one output index along one dimension.
struct Taps {
  int64_t xmin = 0, xsize = 0;
  std::vector<float> w;  // xsize normalised weights
};

// HelperInterpLinear::aa_filter<float>: the triangle, 1 - |x| inside (-1, 1).
float triangle(float x) {
  x = std::abs(x);
  if (x < 1.0) return static_cast<float>(1.0 - x);
  return 0.0f;
}

// _compute_index_ranges_weights<float>(antialias=true) for one dimension of
// `in` samples resized to `out`: scale = in/out in float, support =
// max(1, scale), for output i the taps [xmin, xmin+xsize) around the centre
// scale*(i+0.5), weights triangle((j + xmin - centre + 0.5) / max(1, scale))
// divided by their float sum. The mixed float/double expressions are ATen's.
std::vector<Taps> aaTaps(int64_t in, int64_t out) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  const float support = (scale >= 1.0) ? static_cast<float>((2 * 0.5) * scale)
                                       : static_cast<float>(2 * 0.5);
  const int64_t maxInterp = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const float invscale = (scale >= 1.0) ? static_cast<float>(1.0 / scale) : 1.0f;
  std::vector<Taps> taps(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i) {
    Taps& t = taps[static_cast<size_t>(i)];
    const float center = static_cast<float>(scale * (i + 0.5));
    t.xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    t.xsize = std::min(static_cast<int64_t>(center + support + 0.5), in) - t.xmin;
    t.xsize = std::clamp(t.xsize, int64_t{0}, maxInterp);
    t.w.resize(static_cast<size_t>(t.xsize));
    float total = 0.0f;
    for (int64_t j = 0; j < t.xsize; ++j) {
      const float pos = static_cast<float>(j + t.xmin) - center;  // int64 - float: float
      const float wj = triangle(static_cast<float>((pos + 0.5) * invscale));
      t.w[static_cast<size_t>(j)] = wj;
      total += wj;
    }
    if (total != 0.0f)
      for (float& wj : t.w) wj /= total;
  }
  return taps;
}

// One output sample: the sum of src[k*stride] * w[k] in float32, rounded as
// PyTorch's x86 builds round it. ATen's loop (interpolate_aa_single_dim) is
//   out = t[0]*w[0]; for k in 1..n-1: out += t[k]*w[k]
// and its AVX2 and AVX-512 kernels, the ones dispatched on any x86-64 CPU
// with AVX2, are compiled with contraction on: the compiler vectorises the
// loop four taps at a time (products rounded to float, then added in order)
// and leaves the last (n-1) % 4 taps to a scalar tail, where each += is a
// fused multiply-add. Measured against torch 2.x on AVX2 and AVX-512
// (tests/interop/test_transforms_vs_torchvision.py); ATen's DEFAULT kernel
// (no AVX2) rounds every product, which changes the float result in the
// last bit for some pixels and, rarely, a uint8 pixel by 1.
float applyTaps(const float* src, int64_t stride, const Taps& t) {
  float acc = src[0] * t.w[0];
  const int64_t n = t.xsize;
  const int64_t vectorEnd = 1 + (n - 1) / 4 * 4;
  int64_t k = 1;
  for (; k < vectorEnd; ++k) {
    const float product = src[k * stride] * t.w[static_cast<size_t>(k)];
    acc += product;
  }
  for (; k < n; ++k) acc = std::fma(src[k * stride], t.w[static_cast<size_t>(k)], acc);
  return acc;
}

// Resamples along the width: in is rows x inW, out rows x outW.
std::vector<float> resampleRows(const std::vector<float>& in, int64_t rows, int64_t inW,
                                int64_t outW) {
  const std::vector<Taps> taps = aaTaps(inW, outW);
  std::vector<float> out(static_cast<size_t>(rows * outW));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t x = 0; x < outW; ++x) {
      const Taps& t = taps[static_cast<size_t>(x)];
      out[static_cast<size_t>(r * outW + x)] = applyTaps(&in[static_cast<size_t>(r * inW + t.xmin)], 1, t);
    }
  return out;
}

// Resamples along the height: in is planes x inH x w, out planes x outH x w.
std::vector<float> resampleColumns(const std::vector<float>& in, int64_t planes, int64_t inH,
                                   int64_t outH, int64_t w) {
  const std::vector<Taps> taps = aaTaps(inH, outH);
  std::vector<float> out(static_cast<size_t>(planes * outH * w));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t y = 0; y < outH; ++y) {
      const Taps& t = taps[static_cast<size_t>(y)];
      const float* base = &in[static_cast<size_t>((p * inH + t.xmin) * w)];
      float* dst = &out[static_cast<size_t>((p * outH + y) * w)];
      for (int64_t x = 0; x < w; ++x) dst[x] = applyTaps(base + x, w, t);
    }
  return out;
}

void checkBox(ImageView src, const CropBox& box, int outH, int outW) {
  checkImage(src, "resizedCrop");
  DDPRUN_CHECK(box.height >= 1 && box.width >= 1 && box.top >= 0 && box.left >= 0 &&
                   box.top + box.height <= src.h && box.left + box.width <= src.w,
               "resizedCrop: the box (top ", box.top, ", left ", box.left, ", ", box.height,
               "x", box.width, ") must be non-empty and inside the ", src.h, "x", src.w,
               " image");
  DDPRUN_CHECK(outH >= 1 && outW >= 1, "resizedCrop: the output size must be at least 1x1 (got ",
               outH, "x", outW, ")");
}

// Python's round() then int(): half to even (the default rounding mode).
int roundHalfEven(double x) { return static_cast<int>(std::nearbyint(x)); }

std::vector<std::string> splitCommas(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, ',')) parts.push_back(cur);
  if (!s.empty() && s.back() == ',') parts.emplace_back();
  return parts;
}

}  // namespace

// ---- ImageU8, SampleRng ----------------------------------------------------

ImageU8::ImageU8(int channels, int height, int width, uint8_t fill)
    : c(channels), h(height), w(width) {
  DDPRUN_CHECK(channels >= 0 && height >= 0 && width >= 0, "image sizes must be >= 0");
  px.assign(static_cast<size_t>(channels) * height * width, fill);
}

SampleRng::SampleRng(uint64_t seed, int64_t epoch, int64_t index) {
  uint64_t k = mix64(seed + kGolden);
  k = mix64(k + static_cast<uint64_t>(epoch) + kGolden);
  state_ = mix64(k + static_cast<uint64_t>(index) + kGolden);
}

uint64_t SampleRng::next() { return mix64(state_ += kGolden); }

float SampleRng::uniform01() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }

float SampleRng::uniform(float lo, float hi) { return lo + (hi - lo) * uniform01(); }

int64_t SampleRng::randint(int64_t lo, int64_t hiExclusive) {
  DDPRUN_CHECK(lo < hiExclusive, "randint needs lo < hi (got ", lo, ", ", hiExclusive, ")");
  const uint64_t n = static_cast<uint64_t>(hiExclusive) - static_cast<uint64_t>(lo);
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // accept [0, limit): a multiple of n
  uint64_t r = next();
  while (r >= limit) r = next();
  return lo + static_cast<int64_t>(r % n);
}

bool SampleRng::coin() { return (next() >> 63) != 0; }

// ---- Crop + flip -------------------------------------------------------------

CropFlipParams drawCropFlip(SampleRng& rng, int pad) {
  DDPRUN_CHECK(pad >= 0, "crop padding must be >= 0 (got ", pad, ")");
  CropFlipParams p;
  p.top = static_cast<int>(rng.randint(0, 2 * int64_t{pad} + 1));
  p.left = static_cast<int>(rng.randint(0, 2 * int64_t{pad} + 1));
  p.flip = rng.coin();
  return p;
}

void padCropFlip(ImageView src, int pad, const CropFlipParams& p, uint8_t* dst) {
  checkImage(src, "padCropFlip");
  DDPRUN_CHECK(pad >= 0 && p.top >= 0 && p.left >= 0 && p.top <= 2 * pad && p.left <= 2 * pad,
               "padCropFlip: offsets (", p.top, ", ", p.left, ") must lie in [0, 2*pad] = [0, ",
               2 * pad, "]");
  // Output (y, x) reads padded (y + top, x' + left) with x' = x or w-1-x;
  // padded (Y, X) is src (Y - pad, X - pad) inside the image, else 0.
  for (int ch = 0; ch < src.c; ++ch) {
    const uint8_t* plane = src.px + static_cast<size_t>(ch) * src.h * src.w;
    uint8_t* out = dst + static_cast<size_t>(ch) * src.h * src.w;
    for (int y = 0; y < src.h; ++y) {
      const int sy = y + p.top - pad;
      for (int x = 0; x < src.w; ++x) {
        const int xc = p.flip ? src.w - 1 - x : x;
        const int sx = xc + p.left - pad;
        const bool inside = sy >= 0 && sy < src.h && sx >= 0 && sx < src.w;
        out[static_cast<size_t>(y) * src.w + x] =
            inside ? plane[static_cast<size_t>(sy) * src.w + sx] : 0;
      }
    }
  }
}

ImageU8 padCropFlip(ImageView src, int pad, const CropFlipParams& p) {
  ImageU8 out(src.c, src.h, src.w);
  padCropFlip(src, pad, p, out.px.data());
  return out;
}

void hflip(ImageView src, uint8_t* dst) {
  checkImage(src, "hflip");
  for (int64_t row = 0; row < int64_t{src.c} * src.h; ++row) {
    const uint8_t* in = src.px + row * src.w;
    uint8_t* out = dst + row * src.w;
    for (int x = 0; x < src.w; ++x) out[x] = in[src.w - 1 - x];
  }
}

ImageU8 hflip(ImageView src) {
  ImageU8 out(src.c, src.h, src.w);
  hflip(src, out.px.data());
  return out;
}

// ---- RandomResizedCrop -------------------------------------------------------

CropBox randomResizedCropParams(int height, int width, const RrcDraws& draws,
                                std::array<double, 2> scale, std::array<double, 2> ratio) {
  DDPRUN_CHECK(height >= 1 && width >= 1, "randomResizedCropParams: image ", height, "x", width,
               " is empty");
  DDPRUN_CHECK(scale[0] > 0 && scale[0] <= scale[1] && ratio[0] > 0 && ratio[0] <= ratio[1],
               "randomResizedCropParams: needs 0 < scale[0] <= scale[1] and 0 < ratio[0] <= "
               "ratio[1]");
  DDPRUN_CHECK(draws.uniform && draws.randint, "randomResizedCropParams: draws not set");
  const double area = static_cast<double>(height) * width;
  // torch.log(torch.tensor(ratio)): float32.
  const float logLo = std::log(static_cast<float>(ratio[0]));
  const float logHi = std::log(static_cast<float>(ratio[1]));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double targetArea =
        area * draws.uniform(static_cast<float>(scale[0]), static_cast<float>(scale[1]));
    const double aspect = std::exp(draws.uniform(logLo, logHi));  // float32 exp
    const int w = roundHalfEven(std::sqrt(targetArea * aspect));
    const int h = roundHalfEven(std::sqrt(targetArea / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      CropBox box{0, 0, h, w};
      box.top = static_cast<int>(draws.randint(0, height - h + 1));
      box.left = static_cast<int>(draws.randint(0, width - w + 1));
      return box;
    }
  }
  // Fallback: the central crop, its aspect clamped to the ratio range.
  const double inRatio = static_cast<double>(width) / static_cast<double>(height);
  int w = width, h = height;
  if (inRatio < ratio[0]) {
    h = roundHalfEven(w / ratio[0]);
  } else if (inRatio > ratio[1]) {
    w = roundHalfEven(h * ratio[1]);
  }
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

CropBox randomResizedCropParams(int height, int width, SampleRng& rng,
                                std::array<double, 2> scale, std::array<double, 2> ratio) {
  RrcDraws draws;
  draws.uniform = [&rng](float lo, float hi) { return rng.uniform(lo, hi); };
  draws.randint = [&rng](int64_t lo, int64_t hi) { return rng.randint(lo, hi); };
  return randomResizedCropParams(height, width, draws, scale, ratio);
}

// ---- Resize ------------------------------------------------------------------

std::vector<float> resizedCropFloat(ImageView src, const CropBox& box, int outH, int outW) {
  checkBox(src, box, outH, outW);
  const int64_t c = src.c, h = box.height, w = box.width;
  std::vector<float> cur(static_cast<size_t>(c * h * w));
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t y = 0; y < h; ++y) {
      const uint8_t* row = src.px + (ch * src.h + box.top + y) * src.w + box.left;
      float* dst = &cur[static_cast<size_t>((ch * h + y) * w)];
      for (int64_t x = 0; x < w; ++x) dst[x] = static_cast<float>(row[x]);
    }
  // ATen: the width pass first, then the height pass, each only when that
  // size changes (an unchanged size is a copy, not a filter at scale 1).
  if (outW != w) cur = resampleRows(cur, c * h, w, outW);
  if (outH != h) cur = resampleColumns(cur, c, h, outH, outW);
  return cur;
}

void resizedCrop(ImageView src, const CropBox& box, int outH, int outW, uint8_t* dst) {
  const std::vector<float> f = resizedCropFloat(src, box, outH, outW);
  // torchvision's _cast_squeeze_out: torch.round (half to even), then the
  // cast to uint8. The clamp only guards a float sum a hair above 255.
  for (size_t i = 0; i < f.size(); ++i)
    dst[i] = static_cast<uint8_t>(std::clamp(std::nearbyint(f[i]), 0.0f, 255.0f));
}

ImageU8 resizedCrop(ImageView src, int top, int left, int h, int w, int outH, int outW) {
  ImageU8 out(src.c, outH, outW);
  resizedCrop(src, CropBox{top, left, h, w}, outH, outW, out.px.data());
  return out;
}

ImageU8 resize(ImageView src, int outH, int outW) {
  return resizedCrop(src, 0, 0, src.h, src.w, outH, outW);
}

// ---- Normalisation -----------------------------------------------------------

std::optional<NormalizeSpec> normalizePreset(const std::string& name) {
  // The constants of data.h's table.
  const auto three = [](const float* m, const float* sd) {
    return NormalizeSpec{{m, m + 3}, {sd, sd + 3}};
  };
  if (name == "cifar10") return three(kCifarMean, kCifarStd);
  if (name == "cifar100") return three(kCifar100Mean, kCifar100Std);
  if (name == "imagenet") return three(kImageNetMean, kImageNetStd);
  if (name == "fashion-mnist") return NormalizeSpec{{kFashionMnistMean}, {kFashionMnistStd}};
  return std::nullopt;
}

NormalizeSpec parseNormalize(const std::string& text, int channels) {
  DDPRUN_CHECK(channels >= 1, "parseNormalize: channels must be >= 1");
  const std::string forms = channels == 1
      ? "a preset (fashion-mnist) or \"M,S\" (mean and std of the one channel)"
      : "a preset (cifar10, cifar100, imagenet) or " + std::to_string(2 * channels) +
            " comma-separated numbers, the " + std::to_string(channels) +
            " means then the " + std::to_string(channels) + " stds (e.g. \"0.485,0.456,0.406,"
            "0.229,0.224,0.225\")";
  if (std::optional<NormalizeSpec> p = normalizePreset(text)) {
    if (p->mean.size() != static_cast<size_t>(channels))
      DDPRUN_THROW(InvalidArgument, "--normalize ", text, " is for ", p->mean.size(),
                   "-channel images, these have ", channels, ": give ", forms);
    return *p;
  }
  const std::vector<std::string> parts = splitCommas(text);
  if (parts.size() != static_cast<size_t>(2 * channels))
    DDPRUN_THROW(InvalidArgument, "--normalize \"", text, "\" is neither a preset nor ",
                 2 * channels, " numbers (found ", parts.size(), "): give ", forms);
  NormalizeSpec spec;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& s = parts[i];
    size_t used = 0;
    float v = 0;
    try {
      v = std::stof(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != s.size() || !std::isfinite(v))
      DDPRUN_THROW(InvalidArgument, "--normalize: \"", s, "\" is not a finite number: give ",
                   forms);
    const bool isStd = i >= static_cast<size_t>(channels);
    if (isStd && !(v > 0))
      DDPRUN_THROW(InvalidArgument, "--normalize: std ", s, " must be > 0: give ", forms);
    (isStd ? spec.std : spec.mean).push_back(v);
  }
  return spec;
}

void normalizeToFloat(ImageView img, std::span<const float> mean, std::span<const float> std,
                      float* out) {
  checkImage(img, "normalizeToFloat");
  DDPRUN_CHECK(mean.size() == static_cast<size_t>(img.c) && std.size() == mean.size(),
               "normalizeToFloat: one mean and one std per channel (", img.c, " channels, ",
               mean.size(), " means, ", std.size(), " stds)");
  const int64_t plane = int64_t{img.h} * img.w;
  for (int ch = 0; ch < img.c; ++ch) {
    // Not folded into one multiply-add: that would round differently.
    float table[256];
    for (int p = 0; p < 256; ++p) table[p] = (static_cast<float>(p) / 255.0f - mean[ch]) / std[ch];
    const uint8_t* in = img.px + ch * plane;
    float* o = out + ch * plane;
    for (int64_t i = 0; i < plane; ++i) o[i] = table[in[i]];
  }
}

// ---- Augment -----------------------------------------------------------------

std::optional<Augment> parseAugment(const std::string& name) {
  if (name == "none") return Augment::kNone;
  if (name == "crop-flip") return Augment::kCropFlip;
  if (name == "random-resized-crop" || name == "rrc") return Augment::kRandomResizedCrop;
  return std::nullopt;
}

namespace {
std::pair<int, int> rrcOutSize(ImageView src, const AugmentOptions& opt) {
  return {opt.outH > 0 ? opt.outH : src.h, opt.outW > 0 ? opt.outW : src.w};
}
}  // namespace

int64_t augmentedElems(Augment a, ImageView src, const AugmentOptions& opt) {
  if (a != Augment::kRandomResizedCrop) return src.elems();
  const auto [oh, ow] = rrcOutSize(src, opt);
  return int64_t{src.c} * oh * ow;
}

void augment(Augment a, ImageView src, SampleRng& rng, const AugmentOptions& opt, uint8_t* dst) {
  checkImage(src, "augment");
  switch (a) {
    case Augment::kNone:
      std::memcpy(dst, src.px, static_cast<size_t>(src.elems()));
      return;
    case Augment::kCropFlip:
      padCropFlip(src, opt.pad, drawCropFlip(rng, opt.pad), dst);
      return;
    case Augment::kRandomResizedCrop: {
      const auto [oh, ow] = rrcOutSize(src, opt);
      const CropBox box = randomResizedCropParams(src.h, src.w, rng);
      resizedCrop(src, box, oh, ow, dst);
      if (rng.coin()) {
        const ImageU8 flipped = hflip(ImageView{dst, src.c, oh, ow});
        std::memcpy(dst, flipped.px.data(), flipped.px.size());
      }
      return;
    }
  }
}

const char* augmentName(Augment a) {
  switch (a) {
    case Augment::kNone: return "none";
    case Augment::kCropFlip: return "crop-flip";
    case Augment::kRandomResizedCrop: return "random-resized-crop";
  }
  return "?";
}

}  // namespace ddprun::train
