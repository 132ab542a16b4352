#include "ddprun/train/image_folder.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

namespace ddprun::train {

// File-local names are spelt to be unique in ddprun_train: its unity build
// (cmake/build_speed.cmake) compiles all its files as one source.
namespace {

[[noreturn]] void folderFail(const std::string& path, const std::string& what) {
  DDPRUN_THROW(DataError, path, ": ", what, "; ", kImageFolderHint);
}

// os.path.osPathJoin(a, b).
std::string osPathJoin(const std::string& a, const std::string& b) {
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

struct DirEntry {
  std::string name;
  bool dir = false;
};

// os.scandir(dir) with entry.is_dir() (following symlinks; false for a broken
// one). `limit` entries at most (-1: all); nullopt-like `ok` false with errno
// when the directory cannot be read.
bool scanDir(const std::string& dir, std::vector<DirEntry>& out, int64_t limit, int* err) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    *err = errno;
    return false;
  }
  struct Closer {
    DIR* d;
    ~Closer() { ::closedir(d); }
  } closer{d};
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (limit >= 0 && static_cast<int64_t>(out.size()) >= limit) break;
    DirEntry entry{e->d_name, e->d_type == DT_DIR};
    if (e->d_type == DT_LNK || e->d_type == DT_UNKNOWN) {
      struct stat st {};
      entry.dir = ::stat(osPathJoin(dir, entry.name).c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    }
    out.push_back(std::move(entry));
  }
  if (errno != 0) {
    *err = errno;
    return false;
  }
  return true;
}

std::vector<DirEntry> scanDirOrFail(const std::string& dir) {
  std::vector<DirEntry> out;
  int err = 0;
  if (!scanDir(dir, out, -1, &err))
    folderFail(dir, std::string("cannot read the directory: ") + std::strerror(err));
  return out;
}

// One class folder's walk: sorted(os.walk(top, followlinks=True)), each
// directory's image files sorted, appended to `paths`. `ancestors` holds the
// (device, inode) of the directories being walked (cycle guard).
struct ClassWalk {
  const ImageFolderListing& listing;
  int64_t maxFiles;
  std::vector<std::pair<std::string, std::vector<std::string>>> dirs;  // (path, image files)
  int64_t files = 0;

  void visit(const std::string& dir, std::vector<std::pair<dev_t, ino_t>>& ancestors) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0)
      folderFail(dir, std::string("cannot stat the directory: ") + std::strerror(errno));
    const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
    if (std::find(ancestors.begin(), ancestors.end(), id) != ancestors.end()) return;  // a cycle
    ancestors.push_back(id);
    std::vector<std::string> images, subdirs;
    for (DirEntry& e : scanDirOrFail(dir)) {
      if (e.dir) {
        subdirs.push_back(std::move(e.name));
      } else if (hasImageExtension(e.name)) {
        if (++files + static_cast<int64_t>(listing.paths.size()) > maxFiles)
          folderFail(listing.root, "more than " + std::to_string(maxFiles) +
                                 " image files (the cap; raise it or use a smaller folder)");
        images.push_back(std::move(e.name));
      }
    }
    std::sort(images.begin(), images.end());
    dirs.emplace_back(dir, std::move(images));
    for (const std::string& s : subdirs) visit(osPathJoin(dir, s), ancestors);
    ancestors.pop_back();
  }
};

// Appends class `label`'s samples (folder `top`) to the listing; false when
// it has none.
bool listFolderClass(ImageFolderListing& l, const std::string& top, int32_t label, int64_t maxFiles) {
  ClassWalk w{l, maxFiles, {}, 0};
  std::vector<std::pair<dev_t, ino_t>> ancestors;
  w.visit(top, ancestors);
  std::sort(w.dirs.begin(), w.dirs.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [dir, names] : w.dirs)
    for (const std::string& n : names) {
      l.paths.push_back(osPathJoin(dir, n));
      l.labels.push_back(label);
    }
  return w.files > 0;
}

// SplitMix64's finaliser.
uint64_t splitMix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xbf58476d1ce4e5b9ull;
  z ^= z >> 27;
  z *= 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64Path(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// [begin, end) of each class's samples in a listing (classes are contiguous).
std::vector<std::pair<int64_t, int64_t>> folderClassRanges(const std::vector<int32_t>& labels,
                                                     size_t numClasses) {
  std::vector<std::pair<int64_t, int64_t>> r(numClasses, {0, 0});
  for (int64_t i = 0; i < static_cast<int64_t>(labels.size()); ++i) {
    auto& [b, e] = r[labels[i]];
    if (e == b) b = i;
    e = i + 1;
  }
  return r;
}

// The indices (into l) of the --val-fraction split: val when `val`, else train.
std::vector<int64_t> valFractionSplit(const ImageFolderListing& l, double fraction, bool val) {
  std::vector<int64_t> out;
  const size_t prefix = osPathJoin(l.root, "").size();
  for (auto [b, e] : folderClassRanges(l.labels, l.classes.size())) {
    const int64_t n = e - b;
    const int64_t nVal = std::min<int64_t>(std::llround(n * fraction), std::max<int64_t>(n - 1, 0));
    std::vector<std::pair<uint64_t, int64_t>> keys;
    for (int64_t i = b; i < e; ++i)
      keys.emplace_back(splitMix64(fnv1a64Path(std::string_view(l.paths[i]).substr(prefix)) ^
                            kImageFolderSplitSeed), i);
    std::sort(keys.begin(), keys.end());
    std::vector<char> isVal(static_cast<size_t>(n), 0);
    for (int64_t k = 0; k < nVal; ++k) isVal[keys[k].second - b] = 1;
    for (int64_t i = b; i < e; ++i)
      if (static_cast<bool>(isVal[i - b]) == val) out.push_back(i);
  }
  return out;
}

// The class-balanced cap (see ImageFolderOptions::maxTrain) of `idx`.
std::vector<int64_t> capClassBalanced(const ImageFolderListing& l, std::vector<int64_t> idx,
                                 int64_t cap) {
  if (cap <= 0 || cap >= static_cast<int64_t>(idx.size())) return idx;
  std::vector<std::vector<int64_t>> perClass(l.classes.size());
  for (int64_t i : idx) perClass[l.labels[i]].push_back(i);
  std::vector<int64_t> kept;
  for (size_t round = 0; static_cast<int64_t>(kept.size()) < cap; ++round)
    for (const auto& c : perClass)
      if (round < c.size() && static_cast<int64_t>(kept.size()) < cap) kept.push_back(c[round]);
  std::sort(kept.begin(), kept.end());
  return kept;
}

// What a Dataset's `load` shares between its copies and threads.
struct ImageFolderState {
  std::vector<std::string> paths;
  std::vector<int32_t> labels;
  std::vector<std::pair<int64_t, int64_t>> classRange;  // per class, in this split
  std::unique_ptr<std::atomic<uint8_t>[]> bad;          // skipBad: known not to decode
  std::shared_ptr<std::atomic<int64_t>> skipped;
  std::vector<std::string> classes;
  DecodeLimits limits;
  bool skipBad = false;

  ImageU8 load(int64_t i) const {
    if (!skipBad) return decodeImage(paths[i], 3, limits);
    const auto [b, e] = classRange[labels[i]];
    std::string first;
    for (int64_t k = 0; k < e - b; ++k) {
      const int64_t j = b + (i - b + k) % (e - b);
      if (bad[j].load(std::memory_order_relaxed) != 0) continue;
      try {
        return decodeImage(paths[j], 3, limits);
      } catch (const DataError& err) {
        uint8_t was = 0;
        if (bad[j].compare_exchange_strong(was, 1)) skipped->fetch_add(1);
        if (first.empty()) first = err.message();
      }
    }
    DDPRUN_THROW(DataError, "no image of class ", classes[labels[i]],
                 " decodes (--skip-bad-images skipped all ", e - b, " of them)",
                 first.empty() ? std::string() : "; first: " + first);
  }
};

Dataset makeFolderDataset(const ImageFolderListing& l, const std::vector<int64_t>& idx,
                    const ImageFolderOptions& opt, int side,
                    const std::shared_ptr<std::atomic<int64_t>>& skipped) {
  auto st = std::make_shared<ImageFolderState>();
  for (int64_t i : idx) {
    st->paths.push_back(l.paths[i]);
    st->labels.push_back(l.labels[i]);
  }
  st->classRange = folderClassRanges(st->labels, l.classes.size());
  st->classes = l.classes;
  st->limits = opt.limits;
  st->skipBad = opt.skipBad;
  st->skipped = skipped;
  if (opt.skipBad) {
    st->bad = std::make_unique<std::atomic<uint8_t>[]>(st->paths.size());
    for (size_t i = 0; i < st->paths.size(); ++i) st->bad[i].store(0);
  }
  Dataset d;
  d.size = static_cast<int64_t>(idx.size());
  d.channels = 3;
  d.height = d.width = side;
  d.numClasses = static_cast<int>(l.classes.size());
  d.labels = st->labels;
  d.mean.assign(std::begin(kImageNetMean), std::end(kImageNetMean));
  d.std.assign(std::begin(kImageNetStd), std::end(kImageNetStd));
  d.load = [st](int64_t i) { return st->load(i); };
  return d;
}

std::vector<int64_t> allSamples(const ImageFolderListing& l) {
  std::vector<int64_t> idx(l.paths.size());
  std::iota(idx.begin(), idx.end(), int64_t{0});
  return idx;
}

void checkSameFolderClasses(const ImageFolderListing& train, const ImageFolderListing& val) {
  if (train.classes == val.classes) return;
  size_t k = 0;
  while (k < train.classes.size() && k < val.classes.size() &&
         train.classes[k] == val.classes[k])
    ++k;
  const auto name = [&](const ImageFolderListing& l) {
    return k < l.classes.size() ? "'" + l.classes[k] + "'" : std::string("none");
  };
  folderFail(val.root, "its classes differ from the train folder " + train.root + "'s (" +
                     std::to_string(val.classes.size()) + " against " +
                     std::to_string(train.classes.size()) + "; class " + std::to_string(k) +
                     " is " + name(val) + " here and " + name(train) +
                     " there): give both folders the same class folders");
}

}  // namespace

bool hasImageExtension(std::string_view name) {
  for (const char* ext : kImageExtensions) {
    const size_t n = std::strlen(ext);
    if (name.size() < n) continue;
    bool same = true;
    for (size_t i = 0; i < n && same; ++i) {
      char c = name[name.size() - n + i];
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      same = c == ext[i];
    }
    if (same) return true;
  }
  return false;
}

ImageFolderListing listImageFolder(const std::string& root, int64_t maxFiles,
                                   int64_t maxClasses) {
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0)
    folderFail(root, errno == ENOENT ? std::string("no such directory")
                               : std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) folderFail(root, "not a directory");
  ImageFolderListing l;
  l.root = root;
  for (DirEntry& e : scanDirOrFail(root))
    if (e.dir) {
      if (static_cast<int64_t>(l.classes.size()) >= maxClasses)
        folderFail(root, "more than " + std::to_string(maxClasses) + " class folders (the cap)");
      l.classes.push_back(std::move(e.name));
    }
  if (l.classes.empty()) folderFail(root, "no class folder in it (expected root/<class>/<images>)");
  std::sort(l.classes.begin(), l.classes.end());
  std::vector<std::string> empty;
  for (size_t c = 0; c < l.classes.size(); ++c)
    if (!listFolderClass(l, osPathJoin(root, l.classes[c]), static_cast<int32_t>(c), maxFiles))
      empty.push_back(l.classes[c]);
  if (!empty.empty()) {
    std::string names, exts;
    for (const auto& n : empty) names += (names.empty() ? "" : ", ") + n;
    for (const char* e : kImageExtensions) exts += (exts.empty() ? "" : ", ") + std::string(e);
    folderFail(root, "found no valid file for the classes " + names +
                   " (supported extensions are: " + exts + ")");
  }
  return l;
}

bool looksLikeImageFolder(const std::string& path) {
  std::vector<DirEntry> top;
  int err = 0;
  if (!scanDir(path, top, -1, &err)) return false;
  std::vector<std::string> dirs;
  for (const DirEntry& e : top)
    if (e.dir) dirs.push_back(e.name);
  std::sort(dirs.begin(), dirs.end());
  if (dirs.size() > 64) dirs.resize(64);
  for (const std::string& d : dirs) {
    std::vector<DirEntry> inside;
    scanDir(osPathJoin(path, d), inside, 4096, &err);
    for (const DirEntry& e : inside)
      if (!e.dir && hasImageExtension(e.name)) return true;
  }
  return false;
}

DataSplit loadImageFolder(const ImageFolderOptions& opt) {
  DDPRUN_CHECK(opt.valRoot.empty() || opt.valFraction == 0,
               "give a val folder or a val fraction, not both");
  DDPRUN_CHECK(opt.valFraction >= 0 && opt.valFraction < 1, "the val fraction must be in [0, 1), not ",
               opt.valFraction);
  DDPRUN_CHECK(opt.channels == 3, "an image folder is read as RGB (3 channels), not ",
               opt.channels);
  DDPRUN_CHECK(opt.imageSize >= 0 && opt.imageSize <= 65535, "image size ", opt.imageSize,
               " outside [1, 65535] (0: ", kDefaultImageFolderSize, ")");
  const int side = opt.imageSize == 0 ? kDefaultImageFolderSize : static_cast<int>(opt.imageSize);
  const ImageFolderListing train = listImageFolder(opt.trainRoot, opt.maxFiles, opt.maxClasses);
  auto skipped = opt.skipBad ? std::make_shared<std::atomic<int64_t>>(0) : nullptr;
  DataSplit s;
  if (!opt.valRoot.empty()) {
    const ImageFolderListing val = listImageFolder(opt.valRoot, opt.maxFiles, opt.maxClasses);
    checkSameFolderClasses(train, val);
    s.train = makeFolderDataset(train, capClassBalanced(train, allSamples(train), opt.maxTrain), opt, side, skipped);
    s.test = makeFolderDataset(val, capClassBalanced(val, allSamples(val), opt.maxTest), opt, side, skipped);
  } else {
    const bool split = opt.valFraction > 0;
    const auto trainIdx = split ? valFractionSplit(train, opt.valFraction, false) : allSamples(train);
    const auto testIdx = split ? valFractionSplit(train, opt.valFraction, true) : std::vector<int64_t>{};
    s.train = makeFolderDataset(train, capClassBalanced(train, trainIdx, opt.maxTrain), opt, side, skipped);
    s.test = makeFolderDataset(train, capClassBalanced(train, testIdx, opt.maxTest), opt, side, skipped);
  }
  s.source = "ImageFolder (" + opt.trainRoot + ", " + std::to_string(train.classes.size()) +
             " classes)";
  s.skipped = skipped;
  return s;
}

int64_t skippedImages(const DataSplit& split) {
  return split.skipped ? split.skipped->load() : 0;
}

}  // namespace ddprun::train
