// Test tool for tests/integration/train_cifar_test.py: reads a CIFAR
// directory with the trainer's reader (cifar.h) and writes what it got, so
// the test can compare it byte for byte with the generator's arrays and with
// torchvision's.
//   cifar_dump PATH FORMAT OUTDIR [MAX_TRAIN MAX_TEST]
// FORMAT is a --data-format name (auto, cifar10, ...). Writes
// OUTDIR/train_pixels and OUTDIR/test_pixels (raw NCHW bytes) and prints one
// JSON line: source, dir, format, sizes, labels, classes, mean, std.
// A DataError prints "cifar_dump: error: <message>" and exits 2.
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "ddprun/train/cifar.h"

using namespace ddprun::train;

namespace {

nlohmann::json describe(const Dataset& d, const std::string& pixelsPath) {
  std::ofstream f(pixelsPath, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(d.pixels.data()),
          static_cast<std::streamsize>(d.pixels.size()));
  return {{"size", d.size},       {"labels", d.labels},
          {"classes", d.numClasses}, {"shape", {d.channels, d.height, d.width}},
          {"mean", d.mean},       {"std", d.std}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 6) {
    std::fprintf(stderr, "usage: cifar_dump PATH FORMAT OUTDIR [MAX_TRAIN MAX_TEST]\n");
    return 2;
  }
  try {
    const auto format = parseDataFormat(argv[2]);
    if (!format) throw DataError(std::string("unknown format ") + argv[2]);
    const auto loc = findCifar(argv[1], *format);
    if (!loc) throw DataError(std::string(argv[1]) + " holds no CIFAR");
    const int64_t maxTrain = argc == 6 ? std::stoll(argv[4]) : -1;
    const int64_t maxTest = argc == 6 ? std::stoll(argv[5]) : -1;
    const DataSplit s = loadCifar(*loc, maxTrain, maxTest);
    const std::string out = argv[3];
    nlohmann::json j = {{"source", s.source},
                        {"dir", loc->dir},
                        {"format", dataFormatName(loc->format)},
                        {"train", describe(s.train, out + "/train_pixels")},
                        {"test", describe(s.test, out + "/test_pixels")}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  } catch (const ddprun::InvalidArgument& e) {
    std::fprintf(stderr, "cifar_dump: error: %s\n", e.message().c_str());
    return 2;
  }
}
