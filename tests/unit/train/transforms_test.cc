// Image transforms (transforms.h): hand-computed crops, flips and resizes,
// RandomResizedCrop's invariants and fallback, normalisation and parsing.
// tests/interop/test_transforms_vs_torchvision.py checks them against
// torchvision itself.
#include "ddprun/train/transforms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "ddprun/common/error.h"

namespace ddprun::train {
namespace {

ImageU8 image(int c, int h, int w, std::vector<uint8_t> px) {
  ImageU8 img(c, h, w);
  img.px = std::move(px);
  return img;
}

// 1x3x3 with pixels 1..9.
ImageU8 nine() { return image(1, 3, 3, {1, 2, 3, 4, 5, 6, 7, 8, 9}); }

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "<no error>";
}

// Draws that replay fixed values (RandomResizedCrop's uniform_ and randint).
RrcDraws fixedDraws(std::vector<float> uniform, std::vector<int64_t> randint) {
  auto u = std::make_shared<std::vector<float>>(std::move(uniform));
  auto r = std::make_shared<std::vector<int64_t>>(std::move(randint));
  auto ui = std::make_shared<size_t>(0), ri = std::make_shared<size_t>(0);
  RrcDraws d;
  d.uniform = [=](float, float) { return (*u)[(*ui)++ % u->size()]; };
  d.randint = [=](int64_t lo, int64_t hi) {
    const int64_t v = (*r)[(*ri)++ % r->size()];
    EXPECT_GE(v, lo);
    EXPECT_LT(v, hi);
    return v;
  };
  return d;
}

TEST(TransformsSampleRng, StreamDependsOnlyOnSeedEpochIndex) {
  SampleRng a(7, 3, 1000), b(7, 3, 1000);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.next(), b.next());
  const uint64_t first = SampleRng(7, 3, 1000).next();
  EXPECT_NE(first, SampleRng(8, 3, 1000).next());
  EXPECT_NE(first, SampleRng(7, 4, 1000).next());
  EXPECT_NE(first, SampleRng(7, 3, 1001).next());
  // (epoch, index) must not alias as a sum would: (3, 1001) vs (4, 1000).
  EXPECT_NE(SampleRng(7, 3, 1001).next(), SampleRng(7, 4, 1000).next());
}

TEST(TransformsSampleRng, RangesAndRoughUniformity) {
  SampleRng rng(1, 0, 0);
  std::vector<int> counts(9, 0);
  int heads = 0;
  for (int i = 0; i < 9000; ++i) {
    const int64_t v = rng.randint(0, 9);
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 9);
    ++counts[static_cast<size_t>(v)];
    const float u = rng.uniform01();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    const float x = rng.uniform(-2.0f, 3.0f);
    ASSERT_GE(x, -2.0f);
    ASSERT_LE(x, 3.0f);
    heads += rng.coin() ? 1 : 0;
  }
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
  EXPECT_NEAR(heads, 4500, 300);
  EXPECT_EQ(rng.randint(5, 6), 5);
  EXPECT_THROW(rng.randint(3, 3), InvalidArgument);
}

TEST(TransformsCropFlip, PaddedCropsByHand) {
  const ImageU8 img = nine();
  // Offsets (pad, pad) without flip: the image itself.
  EXPECT_EQ(padCropFlip(img.view(), 1, {1, 1, false}).px, img.px);
  // Top-left corner of the padded image: a zero row and column come in.
  EXPECT_EQ(padCropFlip(img.view(), 1, {0, 0, false}).px,
            (std::vector<uint8_t>{0, 0, 0, 0, 1, 2, 0, 4, 5}));
  EXPECT_EQ(padCropFlip(img.view(), 1, {2, 2, false}).px,
            (std::vector<uint8_t>{5, 6, 0, 8, 9, 0, 0, 0, 0}));
  EXPECT_EQ(padCropFlip(img.view(), 1, {0, 2, false}).px,
            (std::vector<uint8_t>{0, 0, 0, 2, 3, 0, 5, 6, 0}));
  // The flip comes after the crop (RandomCrop, then RandomHorizontalFlip).
  EXPECT_EQ(padCropFlip(img.view(), 1, {1, 1, true}).px,
            (std::vector<uint8_t>{3, 2, 1, 6, 5, 4, 9, 8, 7}));
  EXPECT_EQ(padCropFlip(img.view(), 1, {0, 0, true}).px,
            (std::vector<uint8_t>{0, 0, 0, 2, 1, 0, 5, 4, 0}));
  // Padding wider than the image: all zeros at the extreme offset.
  EXPECT_EQ(padCropFlip(img.view(), 4, {0, 0, false}).px, std::vector<uint8_t>(9, 0));
}

TEST(TransformsCropFlip, ChannelsMoveTogether) {
  ImageU8 img(2, 2, 2);
  img.px = {1, 2, 3, 4, 10, 20, 30, 40};
  EXPECT_EQ(padCropFlip(img.view(), 1, {0, 1, true}).px,
            (std::vector<uint8_t>{0, 0, 2, 1, 0, 0, 20, 10}));
}

TEST(TransformsCropFlip, DrawsStayInRangeAndRejectsBadOffsets) {
  std::set<int> tops, lefts;
  int flips = 0;
  for (int i = 0; i < 2000; ++i) {
    SampleRng rng(42, 0, i);
    const CropFlipParams p = drawCropFlip(rng, 4);
    ASSERT_GE(p.top, 0);
    ASSERT_LE(p.top, 8);
    ASSERT_GE(p.left, 0);
    ASSERT_LE(p.left, 8);
    tops.insert(p.top);
    lefts.insert(p.left);
    flips += p.flip;
  }
  EXPECT_EQ(tops.size(), 9u);
  EXPECT_EQ(lefts.size(), 9u);
  EXPECT_NEAR(flips, 1000, 150);
  SampleRng rng(1, 1, 1);
  const CropFlipParams none = drawCropFlip(rng, 0);
  EXPECT_EQ(none.top, 0);
  EXPECT_EQ(none.left, 0);
  const ImageU8 img = nine();
  EXPECT_NE(errorOf([&] { padCropFlip(img.view(), 1, {3, 0, false}); }).find("[0, 2*pad]"),
            std::string::npos);
  EXPECT_THROW(drawCropFlip(rng, -1), InvalidArgument);
}

TEST(TransformsFlip, MirrorsRows) {
  EXPECT_EQ(hflip(nine().view()).px, (std::vector<uint8_t>{3, 2, 1, 6, 5, 4, 9, 8, 7}));
}

TEST(TransformsRrc, AcceptedDrawGivesTheBox) {
  // 100x100, area fraction 0.25, log-ratio 0 (aspect 1): a 50x50 box at the
  // randint offsets.
  const CropBox b = randomResizedCropParams(100, 100, fixedDraws({0.25f, 0.0f}, {7, 31}));
  EXPECT_EQ(b, (CropBox{7, 31, 50, 50}));
}

TEST(TransformsRrc, RoundsHalfToEvenAsPython) {
  // 5x5 * 0.25 = 6.25: sqrt 2.5 rounds to 2 (Python's round), not 3.
  EXPECT_EQ(randomResizedCropParams(5, 5, fixedDraws({0.25f, 0.0f}, {0})),
            (CropBox{0, 0, 2, 2}));
  // 7x7 * 0.25 = 12.25: sqrt 3.5 rounds to 4.
  EXPECT_EQ(randomResizedCropParams(7, 7, fixedDraws({0.25f, 0.0f}, {0})),
            (CropBox{0, 0, 4, 4}));
}

TEST(TransformsRrc, FallbackIsTheCentralCropClampedToTheRatio) {
  // Area fraction 1 with aspect 4/3 never fits: w or h exceeds the image.
  const float logHi = std::log(4.0f / 3.0f);
  // Wide 10x100: h = 10, w = round(10 * 4/3) = 13, centred.
  EXPECT_EQ(randomResizedCropParams(10, 100, fixedDraws({1.0f, logHi}, {0})),
            (CropBox{0, 43, 10, 13}));
  // Tall 100x10 (with aspect 3/4 the box is too tall): w = 10, h = round(10 / 0.75) = 13.
  const float logLo = std::log(3.0f / 4.0f);
  EXPECT_EQ(randomResizedCropParams(100, 10, fixedDraws({1.0f, logLo}, {0})),
            (CropBox{43, 0, 13, 10}));
  // A square within the ratio range: the whole image.
  EXPECT_EQ(randomResizedCropParams(10, 10, fixedDraws({1.0f, logHi}, {0})),
            (CropBox{0, 0, 10, 10}));
}

TEST(TransformsRrc, RandomBoxesRespectTheBounds) {
  int fallbacks = 0;
  for (int i = 0; i < 3000; ++i) {
    SampleRng rng(3, 1, i);
    const int H = 20 + i % 50, W = 20 + (i * 7) % 70;
    const CropBox b = randomResizedCropParams(H, W, rng);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_GE(b.height, 1);
    ASSERT_GE(b.width, 1);
    ASSERT_LE(b.top + b.height, H);
    ASSERT_LE(b.left + b.width, W);
    const double frac = double(b.height) * b.width / (double(H) * W);
    const bool whole = b.height == H && b.width == W;
    if (whole) ++fallbacks;
    // Rounding w and h by up to half a pixel each moves area and ratio a little.
    const double slackH = 0.5 / b.height, slackW = 0.5 / b.width;
    // (1e-6: the float32 draws, log and exp.)
    ASSERT_GE(frac, 0.08 * (1 - slackH) * (1 - slackW) - 1e-6) << H << "x" << W;
    const double ratio = double(b.width) / b.height;
    ASSERT_GE(ratio, 0.75 * (1 - slackH) / (1 + slackW) - 1e-6) << b.height << "x" << b.width;
    ASSERT_LE(ratio, 4.0 / 3.0 * (1 + slackH) / (1 - slackW) + 1e-6)
        << b.height << "x" << b.width;
  }
  EXPECT_LT(fallbacks, 300);
}

TEST(TransformsRrc, SameSampleSameBox) {
  SampleRng a(9, 2, 77), b(9, 2, 77);
  EXPECT_EQ(randomResizedCropParams(40, 60, a), randomResizedCropParams(40, 60, b));
}

TEST(TransformsResize, ConstantImagesStayConstant) {
  ImageU8 img(3, 13, 17, 200);
  for (auto [oh, ow] : {std::pair{32, 32}, {5, 7}, {13, 40}, {1, 1}, {50, 3}}) {
    const ImageU8 out = resize(img.view(), oh, ow);
    ASSERT_EQ(out.px.size(), size_t(3) * oh * ow);
    for (uint8_t p : out.px) ASSERT_EQ(p, 200) << oh << "x" << ow;
  }
}

TEST(TransformsResize, UpscaleByHandWithHalfPixelCentres) {
  // [0, 255] to 4 samples: centres 0.25, 0.75, 1.25, 1.75 of the input grid;
  // the edges clamp, the middle two weigh 3:1 -> 63.75 and 191.25.
  EXPECT_EQ(resize(image(1, 1, 2, {0, 255}).view(), 1, 4).px,
            (std::vector<uint8_t>{0, 64, 191, 255}));
  // Rounded half to even (torch.round): 0.5 -> 0 and 1.5 -> 2.
  EXPECT_EQ(resize(image(1, 1, 2, {0, 2}).view(), 1, 4).px,
            (std::vector<uint8_t>{0, 0, 2, 2}));
  // The same along the height.
  EXPECT_EQ(resize(image(1, 2, 1, {0, 255}).view(), 4, 1).px,
            (std::vector<uint8_t>{0, 64, 191, 255}));
}

TEST(TransformsResize, DownscaleWidensTheTriangle) {
  // 4 -> 2: support 2 input pixels, taps weigh 3:3:1 / 7 (PIL's filter):
  // (0*3 + 100*3 + 200)/7 = 71.4, (100 + 200*3 + 255*3)/7 = 209.3.
  EXPECT_EQ(resize(image(1, 1, 4, {0, 100, 200, 255}).view(), 1, 2).px,
            (std::vector<uint8_t>{71, 209}));
  const std::vector<float> f =
      resizedCropFloat(image(1, 1, 4, {0, 100, 200, 255}).view(), {0, 0, 1, 4}, 1, 2);
  EXPECT_NEAR(f[0], 500.0 / 7, 1e-4);
  EXPECT_NEAR(f[1], 1465.0 / 7, 1e-4);
}

TEST(TransformsResize, CropAtItsOwnSizeIsTheCrop) {
  ImageU8 img(2, 6, 7);
  for (size_t i = 0; i < img.px.size(); ++i) img.px[i] = static_cast<uint8_t>(i * 37);
  const ImageU8 out = resizedCrop(img.view(), 1, 2, 4, 3, 4, 3);
  for (int c = 0; c < 2; ++c)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 3; ++x) EXPECT_EQ(out.at(c, y, x), img.at(c, y + 1, x + 2));
  EXPECT_EQ(resize(img.view(), 6, 7).px, img.px);
}

TEST(TransformsResize, RejectsBoxesOutsideTheImage) {
  ImageU8 img(1, 4, 4);
  EXPECT_NE(errorOf([&] { resizedCrop(img.view(), 1, 1, 4, 2, 8, 8); }).find("inside the 4x4"),
            std::string::npos);
  EXPECT_THROW(resizedCrop(img.view(), 0, 0, 0, 2, 8, 8), InvalidArgument);
  EXPECT_THROW(resizedCrop(img.view(), -1, 0, 2, 2, 8, 8), InvalidArgument);
  EXPECT_THROW(resize(img.view(), 0, 3), InvalidArgument);
}

TEST(TransformsNormalize, MatchesTheFloat32Formula) {
  ImageU8 img(3, 1, 256);
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 256; ++p) img.px[static_cast<size_t>(c * 256 + p)] = static_cast<uint8_t>(p);
  const NormalizeSpec spec = *normalizePreset("cifar10");
  std::vector<float> out(img.px.size());
  normalizeToFloat(img.view(), spec.mean, spec.std, out.data());
  for (int c = 0; c < 3; ++c)
    for (int p = 0; p < 256; ++p) {
      const float want = (static_cast<float>(p) / 255.0f - spec.mean[c]) / spec.std[c];
      ASSERT_EQ(out[static_cast<size_t>(c * 256 + p)], want) << c << " " << p;
    }
  EXPECT_THROW(normalizeToFloat(img.view(), std::vector<float>{0.5f}, std::vector<float>{0.5f},
                                out.data()),
               InvalidArgument);
}

TEST(TransformsNormalize, Presets) {
  EXPECT_EQ(normalizePreset("cifar10")->mean, (std::vector<float>{0.4914f, 0.4822f, 0.4465f}));
  EXPECT_EQ(normalizePreset("cifar10")->std, (std::vector<float>{0.2470f, 0.2435f, 0.2616f}));
  EXPECT_EQ(normalizePreset("cifar100")->mean, (std::vector<float>{0.5071f, 0.4865f, 0.4409f}));
  EXPECT_EQ(normalizePreset("cifar100")->std, (std::vector<float>{0.2673f, 0.2564f, 0.2762f}));
  EXPECT_EQ(normalizePreset("imagenet")->mean, (std::vector<float>{0.485f, 0.456f, 0.406f}));
  EXPECT_EQ(normalizePreset("imagenet")->std, (std::vector<float>{0.229f, 0.224f, 0.225f}));
  EXPECT_EQ(normalizePreset("fashion-mnist")->mean, (std::vector<float>{0.2860f}));
  EXPECT_EQ(normalizePreset("fashion-mnist")->std, (std::vector<float>{0.3530f}));
  EXPECT_FALSE(normalizePreset("mnist"));
}

TEST(TransformsNormalize, ParsesPresetsAndNumbers) {
  EXPECT_EQ(parseNormalize("imagenet", 3).std, normalizePreset("imagenet")->std);
  const NormalizeSpec s = parseNormalize("0.5,0.25,0.125,1,2,4", 3);
  EXPECT_EQ(s.mean, (std::vector<float>{0.5f, 0.25f, 0.125f}));
  EXPECT_EQ(s.std, (std::vector<float>{1.0f, 2.0f, 4.0f}));
  const NormalizeSpec one = parseNormalize("0.2860,0.3530", 1);
  EXPECT_EQ(one.mean, (std::vector<float>{0.2860f}));
  EXPECT_EQ(one.std, (std::vector<float>{0.3530f}));
}

TEST(TransformsNormalize, RefusesBadInputNamingTheForms) {
  const std::string three = "cifar10, cifar100, imagenet";
  for (const std::string bad : {"0.5,0.5", "1,2,3,4,5,6,7", "", "cifar-10", "1,2,3,4,5,"}) {
    const std::string msg = errorOf([&] { parseNormalize(bad, 3); });
    EXPECT_NE(msg.find(three), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find("6 comma-separated numbers"), std::string::npos) << msg;
  }
  EXPECT_NE(errorOf([] { parseNormalize("0.5,0.5,0.5,1,0,1", 3); }).find("must be > 0"),
            std::string::npos);
  EXPECT_NE(errorOf([] { parseNormalize("0.5,0.5,0.5,1,-1,1", 3); }).find("must be > 0"),
            std::string::npos);
  EXPECT_NE(errorOf([] { parseNormalize("nan,0.5,0.5,1,1,1", 3); }).find("not a finite number"),
            std::string::npos);
  EXPECT_NE(errorOf([] { parseNormalize("0.5,inf", 1); }).find("not a finite number"),
            std::string::npos);
  EXPECT_NE(errorOf([] { parseNormalize("0.5x,1", 1); }).find("not a finite number"),
            std::string::npos);
  EXPECT_NE(errorOf([] { parseNormalize("1e99,1", 1); }).find("not a finite number"),
            std::string::npos);
  const std::string mismatch = errorOf([] { parseNormalize("cifar10", 1); });
  EXPECT_NE(mismatch.find("3-channel"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("\"M,S\""), std::string::npos) << mismatch;
  EXPECT_NE(errorOf([] { parseNormalize("fashion-mnist", 3); }).find("1-channel"),
            std::string::npos);
}

TEST(TransformsAugment, AppliesEachKindFromTheSampleStream) {
  ImageU8 img(3, 32, 32);
  for (size_t i = 0; i < img.px.size(); ++i) img.px[i] = static_cast<uint8_t>(i * 7 + 3);
  AugmentOptions opt;
  std::vector<uint8_t> out(static_cast<size_t>(augmentedElems(Augment::kNone, img.view(), opt)));
  SampleRng r0(1, 2, 3);
  augment(Augment::kNone, img.view(), r0, opt, out.data());
  EXPECT_EQ(out, img.px);
  // kCropFlip: what drawCropFlip + padCropFlip give from the same stream.
  SampleRng a(1, 2, 3), b(1, 2, 3);
  augment(Augment::kCropFlip, img.view(), a, opt, out.data());
  EXPECT_EQ(out, padCropFlip(img.view(), 4, drawCropFlip(b, 4)).px);
  // kRandomResizedCrop to 16x24: the box, the resize, then the coin.
  opt.outH = 16;
  opt.outW = 24;
  ASSERT_EQ(augmentedElems(Augment::kRandomResizedCrop, img.view(), opt), 3 * 16 * 24);
  int flipped = 0;
  for (int i = 0; i < 20; ++i) {
    SampleRng c(5, 0, i), d(5, 0, i);
    std::vector<uint8_t> rrc(3 * 16 * 24);
    augment(Augment::kRandomResizedCrop, img.view(), c, opt, rrc.data());
    const CropBox box = randomResizedCropParams(32, 32, d);
    ImageU8 want(3, 16, 24);
    resizedCrop(img.view(), box, 16, 24, want.px.data());
    if (d.coin()) {
      want = hflip(want.view());
      ++flipped;
    }
    EXPECT_EQ(rrc, want.px) << i;
  }
  EXPECT_GT(flipped, 0);
  EXPECT_LT(flipped, 20);
}

TEST(TransformsAugment, ParseAndName) {
  for (Augment a : {Augment::kNone, Augment::kCropFlip, Augment::kRandomResizedCrop})
    EXPECT_EQ(parseAugment(augmentName(a)), a);
  EXPECT_EQ(parseAugment("rrc"), Augment::kRandomResizedCrop);
  EXPECT_FALSE(parseAugment("flip"));
  EXPECT_FALSE(parseAugment(""));
}

}  // namespace
}  // namespace ddprun::train
