// data_bench: the trainer's input pipeline alone (no model): a data set read
// as `train` reads it, batches assembled by gatherBatch on a WorkPool of N
// threads (decode, augment, normalise to float32), as many epochs as asked,
// each over a fresh shuffle. scripts/bench/data_bench.py runs it against
// PyTorch's DataLoader (docs/benchmarks.md, "Data pipeline").
//
//   data_bench --kind folder|cifar --data DIR [--threads N] [--batch 64]
//              [--epochs 2] [--image-size 224] [--augment NAME] [--profile]
//
// folder: loadImageFolder(DIR) (JPEG/PNG decoded per sample), default
// --augment random-resized-crop; cifar: a CIFAR-10/100 directory (cifar.h),
// default --augment crop-flip. The first epoch is a warm-up (page cache,
// allocator); the others are timed. Prints one JSON line:
//   {"pipeline":"ddprun","kind":...,"threads":N,"images":n,"seconds":s,
//    "images_per_s":r,"images_per_s_per_core":r/N, "stages": {...}}
// With --profile, "stages" holds the single-thread cost per image of each
// step (decode, crop+resize, flip, normalise), measured on up to 200 samples
// outside the timed epochs: where the time goes.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ddprun/common/main_guard.h"
#include "ddprun/train/cifar.h"
#include "ddprun/train/data.h"
#include "ddprun/train/image_folder.h"
#include "ddprun/train/transforms.h"
#include "work_pool.h"

namespace bench {

using namespace ddprun::train;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Options {
  std::string kind = "folder", data, augment;
  int threads = 1, batch = 64, epochs = 2;
  int64_t imageSize = 224;
  bool profile = false;
};

Dataset load(const Options& o) {
  if (o.kind == "folder") {
    ImageFolderOptions f;
    f.trainRoot = o.data;
    f.imageSize = o.imageSize;
    return loadImageFolder(f).train;
  }
  auto loc = findCifar(o.data, DataFormat::kAuto);
  if (!loc) throw ddprun::InvalidArgument("no CIFAR set in " + o.data);
  return loadCifar(*loc).train;
}

// Seconds for `epochs` shuffled epochs (after one untimed), in batches.
double run(const Dataset& d, const Options& o, Augment aug, WorkPool& pool, int64_t* images) {
  std::vector<int64_t> order(static_cast<size_t>(d.size));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::mt19937_64 gen(1);
  std::vector<float> x(static_cast<size_t>(o.batch * d.sampleElems()));
  std::vector<int32_t> y(static_cast<size_t>(o.batch));
  double timed = 0;
  *images = 0;
  for (int e = 0; e <= o.epochs; ++e) {
    std::shuffle(order.begin(), order.end(), gen);
    const auto t0 = Clock::now();
    for (int64_t b = 0; b < d.size; b += o.batch) {
      const auto n = static_cast<size_t>(std::min<int64_t>(o.batch, d.size - b));
      gatherBatch(d, order.data() + b, n, x.data(), y.data(), SampleTransform{aug, 7, e}, &pool);
      if (e > 0) *images += static_cast<int64_t>(n);
    }
    if (e > 0) timed += since(t0);
  }
  return timed;
}

// Single-thread cost per image of each step, in microseconds.
std::string profile(const Dataset& d, Augment aug) {
  const int64_t n = std::min<int64_t>(d.size, 200);
  double decode = 0, crop = 0, flip = 0, norm = 0;
  std::vector<uint8_t> a(static_cast<size_t>(d.sampleElems())), b(a.size());
  std::vector<float> out(a.size());
  for (int64_t j = 0; j < n; ++j) {
    auto t = Clock::now();
    ImageU8 file;
    ImageView src{nullptr, d.channels, d.height, d.width};
    if (d.load) {
      file = d.load(j);
      src = file.view();
    } else {
      src.px = d.pixels.data() + j * d.sampleElems();
    }
    decode += since(t);
    SampleRng rng(7, 0, j);
    t = Clock::now();
    if (aug == Augment::kRandomResizedCrop)
      resizedCrop(src, randomResizedCropParams(src.h, src.w, rng), d.height, d.width, a.data());
    else
      padCropFlip(src, kCropFlipPad, drawCropFlip(rng, kCropFlipPad), a.data());
    crop += since(t);
    const ImageView img{a.data(), d.channels, d.height, d.width};
    t = Clock::now();
    hflip(img, b.data());
    flip += since(t);
    t = Clock::now();
    normalizeToFloat(img, d.mean, d.std, out.data());
    norm += since(t);
  }
  const auto us = [&](double s) { return std::to_string(s / static_cast<double>(n) * 1e6); };
  return "{\"decode_us\":" + us(decode) + ",\"crop_resize_us\":" + us(crop) +
         ",\"flip_us\":" + us(flip) + ",\"normalise_us\":" + us(norm) + ",\"samples\":" +
         std::to_string(n) + "}";
}

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"data_bench: the trainer's input pipeline (decode, augment, normalise)"};
  app.add_option("--kind", o.kind, "folder (an ImageFolder) or cifar")
      ->check(CLI::IsMember({"folder", "cifar"}));
  app.add_option("--data", o.data, "the data directory")->required();
  app.add_option("--threads", o.threads, "WorkPool threads")->check(CLI::Range(1, 256));
  app.add_option("--batch", o.batch, "batch size")->check(CLI::Range(1, 4096));
  app.add_option("--epochs", o.epochs, "timed epochs (after one warm-up)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--image-size", o.imageSize, "folder: the batch's image side");
  app.add_option("--augment", o.augment, "none | crop-flip | random-resized-crop");
  app.add_flag("--profile", o.profile, "also time each step on one thread");
  CLI11_PARSE(app, argc, argv);
  if (o.augment.empty()) o.augment = o.kind == "folder" ? "random-resized-crop" : "crop-flip";
  const auto aug = parseAugment(o.augment);
  if (!aug) throw ddprun::InvalidArgument("unknown --augment " + o.augment);
  const Dataset d = load(o);
  WorkPool pool(o.threads);
  int64_t images = 0;
  const double s = run(d, o, *aug, pool, &images);
  const double rate = static_cast<double>(images) / s;
  std::printf(
      "{\"pipeline\":\"ddprun\",\"kind\":\"%s\",\"augment\":\"%s\",\"threads\":%d,\"batch\":%d,"
      "\"images\":%lld,\"seconds\":%.4f,\"images_per_s\":%.2f,\"images_per_s_per_core\":%.2f,"
      "\"stages\":%s}\n",
      o.kind.c_str(), augmentName(*aug), o.threads, o.batch, static_cast<long long>(images), s,
      rate, rate / o.threads, o.profile ? profile(d, *aug).c_str() : "null");
  return 0;
}

}  // namespace bench

int main(int argc, char** argv) {
  return ddprun::runMain("data_bench", 2, [&] { return bench::main(argc, argv); });
}
