// Training-time image transforms for the bundled trainer, each equal to the
// torchvision transform a PyTorch recipe uses, on one image of raw uint8
// pixels in CHW layout (channels, height, width: one sample of a Dataset):
//
//   padCropFlip        RandomCrop(size, padding=pad) + RandomHorizontalFlip()
//                      (zero padding), bit for bit
//   randomResizedCropParams
//                      RandomResizedCrop.get_params(img, scale, ratio): the
//                      same algorithm, drawing from our own generator
//   resizedCrop/resize F.resized_crop / F.resize(tensor_uint8, [outH, outW],
//                      BILINEAR, antialias=True) on CPU, bit for bit
//   hflip              F.hflip
//   normalizeToFloat   ToTensor() + Normalize(mean, std) in float32, bit for bit
//
// How a transform is split: a function draws its parameters from a SampleRng,
// and a pure function applies them. The random part never depends on which
// thread runs it or which batch a sample lands in: SampleRng's stream is a
// function of (seed, epoch, sample index) alone.
//
// Thread-safety: every function is pure (no shared state) and may be called
// from any number of threads at once; a SampleRng is a plain value owned by
// one caller. Preconditions are checked and reported as InvalidArgument.
// tests/interop/test_transforms_vs_torchvision.py checks the equalities above
// against the installed torchvision.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ddprun::train {

// A read-only view of one image: c*h*w bytes, CHW (row-major planes).
struct ImageView {
  const uint8_t* px = nullptr;
  int c = 0, h = 0, w = 0;
  int64_t elems() const { return int64_t{c} * h * w; }
};

// One image that owns its pixels (CHW, px.size() == c*h*w).
struct ImageU8 {
  int c = 0, h = 0, w = 0;
  std::vector<uint8_t> px;
  ImageU8() = default;
  ImageU8(int channels, int height, int width, uint8_t fill = 0);
  ImageView view() const { return {px.data(), c, h, w}; }
  uint8_t at(int ch, int y, int x) const {
    return px[(static_cast<size_t>(ch) * h + y) * w + x];
  }
};

// ---- The per-sample random stream -------------------------------------------

// A counter-based generator whose stream depends only on (seed, epoch,
// index), so an augmentation drawn for sample `index` in `epoch` is the same
// whatever the thread count, the batch it falls in or the order samples are
// processed. The recipe (fixed: checkpoints and reproducibility rely on it):
//   mix(z) = SplitMix64's finaliser (z ^= z>>30; z *= 0xbf58476d1ce4e5b9;
//            z ^= z>>27; z *= 0x94d049bb133111eb; z ^= z>>31)
//   key    = mix(mix(mix(seed + G) + epoch + G) + index + G),  G = 0x9e3779b97f4a7c15
//   next() = SplitMix64 from state `key`: state += G; return mix(state)
// Not the generator torch uses: the random numbers differ from a PyTorch
// run's, the distributions do not.
class SampleRng {
 public:
  SampleRng(uint64_t seed, int64_t epoch, int64_t index);
  uint64_t next();
  // Uniform in [0, 1): the top 24 bits of next() as a float.
  float uniform01();
  // lo + (hi - lo) * uniform01(), in float32 (as torch's uniform_ on a
  // float32 tensor).
  float uniform(float lo, float hi);
  // Uniform integer in [lo, hiExclusive), unbiased (rejection).
  // Precondition: lo < hiExclusive.
  int64_t randint(int64_t lo, int64_t hiExclusive);
  // True with probability 1/2.
  bool coin();

 private:
  uint64_t state_;
};

// ---- Crop + flip (CIFAR's recipe) ---------------------------------------------

struct CropFlipParams {
  int top = 0, left = 0;  // offsets into the padded image, each in [0, 2*pad]
  bool flip = false;
};

// RandomCrop(padding=pad)'s offsets (uniform in [0, 2*pad] each, top first)
// and RandomHorizontalFlip()'s coin (p = 0.5). Precondition: pad >= 0.
CropFlipParams drawCropFlip(SampleRng& rng, int pad);

// F.pad(img, pad, fill=0) then F.crop(top, left, h, w) (the original size)
// then F.hflip when p.flip. Writes src.elems() bytes to dst (which must not
// overlap src). Preconditions: pad >= 0, 0 <= top, left <= 2*pad.
void padCropFlip(ImageView src, int pad, const CropFlipParams& p, uint8_t* dst);
ImageU8 padCropFlip(ImageView src, int pad, const CropFlipParams& p);

// F.hflip: mirrors every row. dst holds src.elems() bytes, no overlap.
void hflip(ImageView src, uint8_t* dst);
ImageU8 hflip(ImageView src);

// ---- RandomResizedCrop -------------------------------------------------------

// A crop box inside an image: rows [top, top+height), columns [left, left+width).
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
  bool operator==(const CropBox&) const = default;
};

// Where randomResizedCropParams takes its random numbers from: uniform(lo, hi)
// for torch.empty(1).uniform_(lo, hi) (a float32), randint(lo, hiExclusive)
// for torch.randint(lo, hiExclusive, (1,)). A SampleRng, or recorded values
// in tests.
struct RrcDraws {
  std::function<float(float lo, float hi)> uniform;
  std::function<int64_t(int64_t lo, int64_t hiExclusive)> randint;
};

inline constexpr std::array<double, 2> kRrcScale = {0.08, 1.0};
inline constexpr std::array<double, 2> kRrcRatio = {3.0 / 4.0, 4.0 / 3.0};

// torchvision's RandomResizedCrop.get_params, step for step (and its float32
// where torch computes in float32: the log-ratio bounds and exp):
//   up to 10 tries: target_area = H*W * uniform(scale), aspect = exp(uniform(
//   log ratio)), w = round(sqrt(target_area*aspect)), h = round(sqrt(
//   target_area/aspect)) (round half to even, as Python's round); accept when
//   0 < w <= W and 0 < h <= H, with top = randint(0, H-h+1), left =
//   randint(0, W-w+1). Else the central crop, its aspect clamped to `ratio`.
// The box is always inside the image. Preconditions: height, width >= 1;
// 0 < scale[0] <= scale[1]; 0 < ratio[0] <= ratio[1]; draws set.
CropBox randomResizedCropParams(int height, int width, const RrcDraws& draws,
                                std::array<double, 2> scale = kRrcScale,
                                std::array<double, 2> ratio = kRrcRatio);
CropBox randomResizedCropParams(int height, int width, SampleRng& rng,
                                std::array<double, 2> scale = kRrcScale,
                                std::array<double, 2> ratio = kRrcRatio);

// ---- Resize ------------------------------------------------------------------

// F.resized_crop(img, top, left, h, w, [outH, outW], BILINEAR, antialias=True)
// on a CPU uint8 tensor, bit for bit. torchvision computes it in float32:
// the crop is cast to float, resized by aten::_upsample_bilinear2d_aa
// (separable: the width pass first, then the height pass, a dimension of
// unchanged size skipped; per output index the PIL-style triangle filter
// with support max(1, in/out) around the half-pixel centre, weights
// normalised to sum 1, all in float32), then rounded half to even and cast
// to uint8. The float sums are rounded as ATen's AVX2 and AVX-512 kernels
// round them (what PyTorch runs on any x86-64 CPU with AVX2; see applyTaps in
// transforms.cc); against ATen's DEFAULT kernel (no AVX2) a pixel can differ
// by 1 (measured: 139 of 1.1M). Not reproduced: ATen's height pass when the
// output width is 1 gives every output row the first row's weights (a
// PyTorch bug; RandomResizedCrop never asks for width 1).
// Writes c*outH*outW bytes to dst. Preconditions: the box lies inside src
// and is not empty; outH, outW >= 1.
void resizedCrop(ImageView src, const CropBox& box, int outH, int outW, uint8_t* dst);
ImageU8 resizedCrop(ImageView src, int top, int left, int h, int w, int outH, int outW);
// The whole image: resizedCrop with the full box (F.resize, antialias=True).
ImageU8 resize(ImageView src, int outH, int outW);
// The float32 values resizedCrop rounds: what
// F.interpolate(crop.float()[None], [outH, outW], mode="bilinear",
// align_corners=False, antialias=True) returns (for tests and diagnosis).
std::vector<float> resizedCropFloat(ImageView src, const CropBox& box, int outH, int outW);

// ---- Normalisation -----------------------------------------------------------

// Per-channel ToTensor + Normalize constants, as float32 (torch's tensors).
struct NormalizeSpec {
  std::vector<float> mean, std;
};

// "cifar10", "cifar100", "imagenet" (3 channels) or "fashion-mnist" (1);
// empty for any other name.
std::optional<NormalizeSpec> normalizePreset(const std::string& name);

// A preset name (above) or explicit values: "M1,M2,M3,S1,S2,S3" for three
// channels, "M,S" for one (2*channels numbers, means first). Refuses a wrong
// count, a preset of another channel count, non-finite values and std <= 0:
// InvalidArgument naming the accepted forms. Precondition: channels >= 1.
NormalizeSpec parseNormalize(const std::string& text, int channels);

// x = (float(p) / 255.0f - mean[c]) / std[c] in float32 for every pixel of
// channel c (ToTensor + Normalize bit for bit; the same expression as
// Dataset's gatherBatch). Writes img.elems() floats. Preconditions: one mean
// and one std per channel.
void normalizeToFloat(ImageView img, std::span<const float> mean, std::span<const float> std,
                      float* out);

// ---- Which augmentation ------------------------------------------------------

enum class Augment {
  kNone,               // the image as stored
  kCropFlip,           // padCropFlip (pad 4 for 32x32 CIFAR)
  kRandomResizedCrop,  // randomResizedCropParams + resizedCrop + hflip coin
};

// How augment() applies an Augment.
struct AugmentOptions {
  int pad = 4;           // kCropFlip: RandomCrop's padding
  int outH = 0, outW = 0;  // kRandomResizedCrop: the output size; 0 = the input's
};

// One sample's augmentation, its random numbers from `rng` in a fixed order:
//   kNone               a copy
//   kCropFlip           drawCropFlip(rng, pad) then padCropFlip (same size)
//   kRandomResizedCrop  RandomResizedCrop(size=(outH, outW)) + RandomHorizontalFlip():
//                       randomResizedCropParams(h, w, rng), resizedCrop to
//                       outH x outW, then hflip when rng.coin()
// Writes augmentedElems() bytes to dst (no overlap with src).
void augment(Augment a, ImageView src, SampleRng& rng, const AugmentOptions& opt, uint8_t* dst);
// The size augment() writes: src.elems(), or c*outH*outW for kRandomResizedCrop.
int64_t augmentedElems(Augment a, ImageView src, const AugmentOptions& opt);

// "none", "crop-flip", "random-resized-crop" (also "rrc"); empty otherwise.
std::optional<Augment> parseAugment(const std::string& name);
// The canonical spelling parseAugment accepts.
const char* augmentName(Augment a);

}  // namespace ddprun::train
