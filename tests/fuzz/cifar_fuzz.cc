// libFuzzer target for the CIFAR readers (cifar.h) and the pickle reader
// under them (pickle_reader.h).
//
// The first input byte picks what the rest is read as: bits 0-1 the reader
// (0: a CIFAR-10 pickle, 1: a CIFAR-100 pickle, 2: CIFAR-10 binary records,
// 3: CIFAR-100 binary records), bits 2-7 the cap on images (value - 1, so
// -1 = all). The rest is the file's bytes.
//
// (a) parsePickle on the bytes with small limits: it returns (never throws,
//     never reads out of bounds), a parsed doc's indexes all point into its
//     arena, and every array's data lies inside the input or the doc's own
//     storage with the size its shape and dtype say.
// (b) the chosen CIFAR reader either throws DataError (with a non-empty,
//     single-line message naming the file) or appends consistent images:
//     3072 bytes and one label in range per image, no more than the cap.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ddprun/train/cifar.h"
#include "ddprun/train/pickle_reader.h"

using namespace ddprun::train;

namespace {

void die(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

bool inside(std::string_view inner, std::string_view outer) {
  return inner.empty() || (inner.data() >= outer.data() &&
                           inner.data() + inner.size() <= outer.data() + outer.size());
}

void checkPickle(std::string_view bytes) {
  PickleLimits lim;
  lim.maxValues = 4096;
  lim.maxSlots = 8192;
  lim.maxStack = 1024;
  lim.maxMarks = 16;
  lim.maxMemo = 256;
  const PickleResult r = parsePickle(bytes, lim);
  if (!r.ok) {
    if (r.error.empty()) die("a refusal without a message");
    if (r.error.find('\n') != std::string::npos) die("a refusal message of several lines");
    return;
  }
  const PickleDoc& doc = r.doc;
  if (doc.values.size() > lim.maxValues) die("more values than the limit");
  if (doc.root >= doc.values.size()) die("root out of range");
  size_t slots = 0;
  for (const PickleValue& v : doc.values) {
    slots += v.items.size();
    for (uint32_t i : v.items)
      if (i >= doc.values.size()) die("item index out of range");
    if (v.kind == PickleKind::kNdarray &&
        (v.integer < 0 || static_cast<size_t>(v.integer) >= doc.arrays.size()))
      die("array index out of range");
    bool owned = false;
    for (const auto& o : doc.owned) owned = owned || inside(v.text, *o);
    if (!inside(v.text, bytes) && !owned) die("a str/bytes view outside the input");
  }
  if (slots > lim.maxSlots) die("more slots than the limit");
  for (const PickleArray& a : doc.arrays) {
    bool owned = false;
    for (const auto& o : doc.owned) owned = owned || inside(a.data, *o);
    if (!inside(a.data, bytes) && !owned) die("array data outside the input");
  }
}

void checkCifar(int mode, int64_t cap, std::string_view bytes) {
  const int classes = (mode & 1) ? 100 : 10;
  Dataset d;
  int64_t n = 0;
  try {
    n = mode < 2 ? appendCifarPickle(bytes, classes, cap, "fuzz.bin", d)
                 : appendCifarBinary(bytes, classes, cap, "fuzz.bin", d);
  } catch (const DataError& e) {
    const std::string& m = e.message();
    if (m.rfind("fuzz.bin: ", 0) != 0) die("a DataError that does not start with the file");
    if (m.find('\n') != std::string::npos) die("a DataError of several lines");
    return;
  }
  if (cap == 0 ? n != 0 : (n < 1 || (cap > 0 && n > cap))) die("image count outside the cap");
  if (d.size != n || d.labels.size() != static_cast<size_t>(n) ||
      d.pixels.size() != static_cast<size_t>(n * kCifarImageBytes))
    die("pixels and labels disagree with the count");
  for (int32_t l : d.labels)
    if (l < 0 || l >= classes) die("label out of range");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] & 3;
  const int64_t cap = static_cast<int64_t>(data[0] >> 2) - 1;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  checkPickle(bytes);
  checkCifar(mode, cap, bytes);
  return 0;
}
