// The image decoders (image_decode.h) and torchvision's ImageFolder layout
// (image_folder.h): JPEG and PNG files written here with libjpeg and libpng,
// decoded back (every PNG colour type PIL's .convert("RGB") handles), folders
// listed in make_dataset's order, the val split and caps, every error, and
// --skip-bad-images. Bit-exactness against PIL and the listing against
// torchvision itself: tests/interop/test_image_folder_vs_torchvision.py.
#include "temp_dir.h"
#include "ddprun/train/image_decode.h"
#include "ddprun/train/image_folder.h"
#include "work_pool.h"

#include <gtest/gtest.h>
#include <jpeglib.h>
#include <png.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace ddprun::train {
namespace {

using ddprun::testing::TempDir;
namespace fs = std::filesystem;

// ---- writing test images -------------------------------------------------------

std::string jpegBytes(int w, int h, int comps, const std::vector<uint8_t>& hwc, int quality = 90) {
  jpeg_compress_struct c{};
  jpeg_error_mgr err{};
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = comps;
  c.in_color_space = comps == 3 ? JCS_RGB : JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(hwc.data()) + size_t(c.next_scanline) * w * comps;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::string out(reinterpret_cast<char*>(buf), size);
  std::free(buf);
  return out;
}

struct PngSpec {
  int w = 4, h = 3, colour = PNG_COLOR_TYPE_RGB, depth = 8;
  bool interlace = false;
  std::vector<png_color> palette;
  std::vector<uint8_t> trns;  // palette alpha, or one gray/RGB 16-bit value (as 2/6 bytes)
};

void pngWrite(png_structp png, png_bytep data, size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<char*>(data), n);
}

// `rows`: the packed rows as the PNG holds them (h rows of rowbytes each).
std::string pngBytes(const PngSpec& s, const std::vector<uint8_t>& rows) {
  std::string out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    ADD_FAILURE() << "libpng write failed";
    return {};
  }
  png_set_write_fn(png, &out, pngWrite, nullptr);
  png_set_IHDR(png, info, s.w, s.h, s.depth, s.colour,
               s.interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!s.palette.empty())
    png_set_PLTE(png, info, s.palette.data(), static_cast<int>(s.palette.size()));
  if (!s.trns.empty() && s.colour == PNG_COLOR_TYPE_PALETTE)
    png_set_tRNS(png, info, s.trns.data(), static_cast<int>(s.trns.size()), nullptr);
  png_write_info(png, info);
  const size_t rowBytes = rows.size() / s.h;
  for (int pass = 0, n = s.interlace ? png_set_interlace_handling(png) : 1; pass < n; ++pass)
    for (int y = 0; y < s.h; ++y) png_write_row(png, rows.data() + y * rowBytes);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

void writeFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

// A w x h RGB image whose pixel (x, y) is (x*10+c, y*20+c, x+y+c) (c: a shade).
std::vector<uint8_t> rgbPattern(int w, int h, int shade = 0) {
  std::vector<uint8_t> px;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      px.push_back(static_cast<uint8_t>(x * 10 + shade));
      px.push_back(static_cast<uint8_t>(y * 20 + shade));
      px.push_back(static_cast<uint8_t>(x + y + shade));
    }
  return px;
}

std::string smallPng(int shade = 0, int w = 4, int h = 3) {
  PngSpec s;
  s.w = w;
  s.h = h;
  return pngBytes(s, rgbPattern(w, h, shade));
}

std::string smallJpeg(int shade = 0, int w = 16, int h = 8) {
  return jpegBytes(w, h, 3, rgbPattern(w, h, shade));
}

ImageU8 decode(const std::string& bytes, int channels = 3, const DecodeLimits& l = {}) {
  return decodeImageBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), channels,
                          "mem.png", l);
}

// The message of the DataError `f` throws ("" when it throws none).
template <typename F>
std::string dataError(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.message();
  }
  return "";
}

// ---- decoding --------------------------------------------------------------------

TEST(ImageDecode, RgbPngExact) {
  ImageU8 im = decode(smallPng());
  ASSERT_EQ(im.c, 3);
  ASSERT_EQ(im.h, 3);
  ASSERT_EQ(im.w, 4);
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 4; ++x) {
      EXPECT_EQ(im.at(0, y, x), x * 10);
      EXPECT_EQ(im.at(1, y, x), y * 20);
      EXPECT_EQ(im.at(2, y, x), x + y);
    }
}

TEST(ImageDecode, InterlacedPngEqualsPlain) {
  PngSpec s;
  s.w = 13;
  s.h = 11;
  const auto px = rgbPattern(13, 11, 3);
  s.interlace = true;
  const ImageU8 a = decode(pngBytes(s, px));
  s.interlace = false;
  const ImageU8 b = decode(pngBytes(s, px));
  EXPECT_EQ(a.px, b.px);
  EXPECT_EQ(a.at(0, 10, 12), 123);
}

TEST(ImageDecode, GrayPngIsReplicated) {
  PngSpec s;
  s.colour = PNG_COLOR_TYPE_GRAY;
  const std::vector<uint8_t> rows = {0, 50, 100, 255, 1, 2, 3, 4, 9, 8, 7, 6};
  const ImageU8 im = decode(pngBytes(s, rows));
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 12; ++i) EXPECT_EQ(im.px[c * 12 + i], rows[i]);
  EXPECT_EQ(decode(pngBytes(s, rows), 1).px, rows);  // L of gray is the gray
}

TEST(ImageDecode, LowBitGrayIsScaled) {
  PngSpec s;
  s.colour = PNG_COLOR_TYPE_GRAY;
  s.depth = 2;
  s.h = 1;
  // 4 pixels of 2 bits: 0, 1, 2, 3 -> 0, 85, 170, 255 (PIL's L;2).
  const ImageU8 im = decode(pngBytes(s, {0b00011011}));
  EXPECT_EQ(im.px, (std::vector<uint8_t>{0, 85, 170, 255, 0, 85, 170, 255, 0, 85, 170, 255}));
  s.depth = 1;
  s.w = 8;
  const ImageU8 bw = decode(pngBytes(s, {0b10100000}));
  EXPECT_EQ(bw.at(0, 0, 0), 255);
  EXPECT_EQ(bw.at(1, 0, 1), 0);
  EXPECT_EQ(bw.at(2, 0, 2), 255);
}

TEST(ImageDecode, PaletteWithTransparencyKeepsColours) {
  PngSpec s;
  s.colour = PNG_COLOR_TYPE_PALETTE;
  s.w = 2;
  s.h = 1;
  s.palette = {{10, 20, 30}, {200, 100, 0}};
  s.trns = {0, 255};  // entry 0 transparent: PIL keeps its colour
  const ImageU8 im = decode(pngBytes(s, {1, 0}));
  EXPECT_EQ(im.px, (std::vector<uint8_t>{200, 10, 100, 20, 0, 30}));
}

TEST(ImageDecode, AlphaIsDroppedNotComposited) {
  PngSpec s;
  s.colour = PNG_COLOR_TYPE_RGB_ALPHA;
  s.w = 1;
  s.h = 1;
  EXPECT_EQ(decode(pngBytes(s, {10, 20, 30, 0})).px, (std::vector<uint8_t>{10, 20, 30}));
  s.colour = PNG_COLOR_TYPE_GRAY_ALPHA;
  EXPECT_EQ(decode(pngBytes(s, {77, 5})).px, (std::vector<uint8_t>{77, 77, 77}));
}

TEST(ImageDecode, SixteenBit) {
  PngSpec s;
  s.w = 1;
  s.h = 1;
  s.depth = 16;
  // RGB 16-bit: the high byte of each sample.
  EXPECT_EQ(decode(pngBytes(s, {0x12, 0xff, 0xab, 0x00, 0x00, 0x7f})).px,
            (std::vector<uint8_t>{0x12, 0xab, 0x00}));
  // Gray 16-bit (PIL's I;16): min(value, 255).
  s.colour = PNG_COLOR_TYPE_GRAY;
  s.w = 3;
  EXPECT_EQ(decode(pngBytes(s, {0x00, 0x64, 0x01, 0x2c, 0xff, 0xff})).px,
            (std::vector<uint8_t>{100, 255, 255, 100, 255, 255, 100, 255, 255}));
}

TEST(ImageDecode, OneChannelIsPilsL) {
  PngSpec s;
  s.w = 1;
  s.h = 1;
  const ImageU8 im = decode(pngBytes(s, {255, 0, 0}), 1);
  ASSERT_EQ(im.c, 1);
  EXPECT_EQ(im.px[0], (19595 * 255 + 0x8000) >> 16);  // 76
}

TEST(ImageDecode, JpegColourAndGray) {
  const ImageU8 im = decode(smallJpeg(5, 16, 8));
  ASSERT_EQ(im.c, 3);
  EXPECT_EQ(im.h, 8);
  EXPECT_EQ(im.w, 16);
  // Lossy, but close to what was written.
  EXPECT_NEAR(im.at(0, 4, 8), 85, 12);
  EXPECT_NEAR(im.at(1, 4, 8), 85, 12);
  std::vector<uint8_t> gray(32 * 16);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i % 32 * 8);
  const ImageU8 g = decode(jpegBytes(32, 16, 1, gray));
  const size_t plane = 32 * 16;
  for (size_t i = 0; i < plane; ++i) {
    EXPECT_EQ(g.px[i], g.px[plane + i]);
    EXPECT_EQ(g.px[i], g.px[2 * plane + i]);
  }
}

TEST(ImageDecode, FormatFromBytesNotName) {
  TempDir t;
  writeFile(t.file("really_a_png.jpg"), smallPng());
  EXPECT_EQ(decodeImage(t.file("really_a_png.jpg"), 3).w, 4);
  writeFile(t.file("really_a_jpeg.png"), smallJpeg());
  EXPECT_EQ(decodeImage(t.file("really_a_jpeg.png"), 3).w, 16);
}

TEST(ImageDecode, ErrorsNameTheFileAndTheProblem) {
  TempDir t;
  const std::string png = smallPng(), jpg = smallJpeg();
  struct Case {
    std::string name, bytes, expect;
  };
  std::string corruptJpg = jpg;
  for (size_t i = jpg.size() / 2; i < jpg.size() - 2; ++i) corruptJpg[i] = '\xff';
  std::string corruptPng = png;
  corruptPng[20] ^= 0x55;  // IHDR's CRC no longer matches
  const std::vector<Case> cases = {
      {"empty.jpg", "", "empty file"},
      {"text.jpg", "hello, not an image", "not a JPEG or PNG"},
      {"bmp.jpg", "BM\x36\x00\x00\x00", "unsupported image format BMP"},
      {"gif.png", "GIF89a.....", "unsupported image format GIF"},
      {"webp.png", std::string("RIFF\0\0\0\0WEBPVP8 ", 16), "unsupported image format WebP"},
      {"cut.jpg", jpg.substr(0, jpg.size() / 2), "truncated JPEG"},
      {"header_only.jpg", jpg.substr(0, 20), "JPEG"},
      {"cut.png", png.substr(0, png.size() - 20), "PNG"},
      {"header_cut.png", png.substr(0, 12), "truncated PNG"},
      {"crc.png", corruptPng, "corrupt PNG data"},
  };
  for (const Case& c : cases) {
    writeFile(t.file(c.name), c.bytes);
    const std::string msg = dataError([&] { decodeImage(t.file(c.name), 3); });
    EXPECT_NE(msg.find(t.file(c.name)), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // Corrupt entropy data: libjpeg decodes what it can, PIL too; it must not crash.
  writeFile(t.file("corrupt.jpg"), corruptJpg);
  try {
    decodeImage(t.file("corrupt.jpg"), 3);
  } catch (const DataError&) {
  }
  EXPECT_NE(dataError([&] { decodeImage(t.file("missing.jpg"), 3); }).find("no such file"),
            std::string::npos);
  EXPECT_NE(dataError([&] { decodeImage(t.path(), 3); }).find("not a regular file"),
            std::string::npos);
  EXPECT_THROW(decode(png, 2), InvalidArgument);
}

TEST(ImageDecode, LimitsRefuseBeforeDecoding) {
  DecodeLimits l;
  l.maxSide = 15;
  EXPECT_NE(dataError([&] { decode(smallJpeg(0, 16, 8), 3, l); }).find("over the limit"),
            std::string::npos);
  l = {};
  l.maxPixels = 11;
  EXPECT_NE(dataError([&] { decode(smallPng(), 3, l); }).find("4 x 3 pixels is over the limit (65535 per side, 11 in all)"),
            std::string::npos)
      << dataError([&] { decode(smallPng(), 3, l); });
  l = {};
  l.maxFileBytes = 10;
  TempDir t;
  writeFile(t.file("a.png"), smallPng());
  EXPECT_NE(dataError([&] { decodeImage(t.file("a.png"), 3, l); }).find("over the limit"),
            std::string::npos);
  // A PNG header claiming 2^31-1 x 2^31-1 pixels: refused by the header.
  std::string huge = smallPng();
  huge[16] = huge[20] = 0x7f;
  huge[17] = huge[18] = huge[19] = huge[21] = huge[22] = huge[23] = '\xff';
  EXPECT_FALSE(dataError([&] { decode(huge); }).empty());
}

// ---- the folder layout -----------------------------------------------------------

std::vector<std::string> relative(const ImageFolderListing& l) {
  std::vector<std::string> out;
  for (const auto& p : l.paths) out.push_back(p.substr(l.root.size() + 1));
  return out;
}

TEST(ImageFolder, ClassesAndSamplesInTorchvisionsOrder) {
  TempDir t;
  const std::string r = t.file("root");
  for (const char* f : {"b/1.png", "a/z.jpg", "a/A.PNG", "a/sub/x.jpeg", "a/sub-x/y.png",
                        "a/sub/deep/w.png", "B/q.Png", ".hidden/h.png", "a_x/k.webp"})
    writeFile(r + "/" + f, smallPng());
  writeFile(r + "/a/readme.txt", "not an image");
  writeFile(r + "/a/noext", "not an image");
  writeFile(r + "/top.jpg", smallJpeg());  // a file at the top: not a class
  fs::create_directories(t.file("elsewhere/c"));
  writeFile(t.file("elsewhere/c/e.jpg"), smallJpeg());
  fs::create_directory_symlink(t.file("elsewhere/c"), r + "/linked");
  const ImageFolderListing l = listImageFolder(r);
  EXPECT_EQ(l.classes,
            (std::vector<std::string>{".hidden", "B", "a", "a_x", "b", "linked"}));
  // sorted(os.walk): "a" < "a/sub" < "a/sub-x" < "a/sub/deep" ('-' < '/').
  EXPECT_EQ(relative(l), (std::vector<std::string>{
                             ".hidden/h.png", "B/q.Png", "a/A.PNG", "a/z.jpg", "a/sub/x.jpeg",
                             "a/sub-x/y.png", "a/sub/deep/w.png", "a_x/k.webp", "b/1.png",
                             "linked/e.jpg"}));
  EXPECT_EQ(l.labels, (std::vector<int32_t>{0, 1, 2, 2, 2, 2, 2, 3, 4, 5}));
  // os.path.join on a root given with a trailing slash.
  EXPECT_EQ(listImageFolder(r + "/").paths[0], r + "/.hidden/h.png");
}

TEST(ImageFolder, SymlinkCycleIsNotFollowedTwice) {
  TempDir t;
  writeFile(t.file("r/c/x.png"), smallPng());
  fs::create_directory_symlink(t.file("r/c"), t.file("r/c/loop"));
  const ImageFolderListing l = listImageFolder(t.file("r"));
  EXPECT_EQ(relative(l), (std::vector<std::string>{"c/x.png"}));
}

TEST(ImageFolder, Errors) {
  TempDir t;
  const auto msg = [](const std::string& root, int64_t maxFiles = kMaxImageFolderFiles,
                      int64_t maxClasses = kMaxImageFolderClasses) {
    return dataError([&] { listImageFolder(root, maxFiles, maxClasses); });
  };
  EXPECT_NE(msg(t.file("nope")).find("no such directory"), std::string::npos);
  writeFile(t.file("file"), "x");
  EXPECT_NE(msg(t.file("file")).find("not a directory"), std::string::npos);
  fs::create_directories(t.file("flat"));
  writeFile(t.file("flat/a.jpg"), smallJpeg());
  EXPECT_NE(msg(t.file("flat")).find("no class folder"), std::string::npos);
  writeFile(t.file("r/full/a.png"), smallPng());
  writeFile(t.file("r/full/b.png"), smallPng());
  writeFile(t.file("r/full/c.png"), smallPng());
  writeFile(t.file("r/empty1/notes.txt"), "x");
  fs::create_directories(t.file("r/empty2"));
  const std::string empty = msg(t.file("r"));
  EXPECT_NE(empty.find("found no valid file for the classes empty1, empty2"), std::string::npos)
      << empty;
  EXPECT_NE(empty.find(t.file("r")), std::string::npos);
  fs::remove_all(t.file("r/empty1"));
  fs::remove_all(t.file("r/empty2"));
  EXPECT_EQ(msg(t.file("r")), "");
  EXPECT_NE(msg(t.file("r"), 2).find("more than 2 image files"), std::string::npos);
  writeFile(t.file("r/other/a.png"), smallPng());
  EXPECT_NE(msg(t.file("r"), 100, 1).find("more than 1 class folders"), std::string::npos);
  for (const auto& s : {msg(t.file("nope")), msg(t.file("file")), empty})
    EXPECT_EQ(s.find('\n'), std::string::npos);
}

TEST(ImageFolder, LooksLikeImageFolder) {
  TempDir t;
  writeFile(t.file("r/cat/1.JPG"), smallJpeg());
  EXPECT_TRUE(looksLikeImageFolder(t.file("r")));
  EXPECT_FALSE(looksLikeImageFolder(t.file("r/cat")));  // files, no class folders
  EXPECT_FALSE(looksLikeImageFolder(t.file("missing")));
  writeFile(t.file("cifar/cifar-10-batches-py/data_batch_1"), "x");
  EXPECT_FALSE(looksLikeImageFolder(t.file("cifar")));
}

// A folder of `classes` classes x `perClass` PNGs, pixel shade = class*40 + index.
std::string makeFolder(const TempDir& t, const std::string& name, int classes, int perClass) {
  for (int c = 0; c < classes; ++c)
    for (int i = 0; i < perClass; ++i)
      writeFile(t.file(name + "/class" + std::to_string(c) + "/img" + std::to_string(i) + ".png"),
                smallPng(c * 40 + i, 6, 5));
  return t.file(name);
}

TEST(ImageFolder, LoadsADataset) {
  TempDir t;
  ImageFolderOptions o;
  o.trainRoot = makeFolder(t, "train", 3, 4);
  o.valRoot = makeFolder(t, "val", 3, 2);
  const DataSplit s = loadImageFolder(o);
  EXPECT_EQ(s.source, "ImageFolder (" + o.trainRoot + ", 3 classes)");
  EXPECT_EQ(s.train.size, 12);
  EXPECT_EQ(s.test.size, 6);
  EXPECT_EQ(s.train.height, 224);
  EXPECT_EQ(s.train.width, 224);
  EXPECT_EQ(s.train.channels, 3);
  EXPECT_EQ(s.train.numClasses, 3);
  EXPECT_TRUE(s.train.pixels.empty());
  EXPECT_EQ(s.train.labels, (std::vector<int32_t>{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(s.test.labels, (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_FLOAT_EQ(s.train.mean[1], 0.456f);
  EXPECT_FLOAT_EQ(s.train.std[2], 0.225f);
  EXPECT_EQ(s.train.load(5).at(0, 0, 0), 41);  // class1/img1.png: shade 41
  EXPECT_EQ(s.test.load(5).at(0, 0, 0), 81);
  EXPECT_EQ(s.skipped, nullptr);
  EXPECT_EQ(skippedImages(s), 0);

  // A batch of 4 at 32x32 with random-resized-crop over two threads equals
  // the single-thread one.
  o.imageSize = 32;
  const DataSplit small = loadImageFolder(o);
  const int64_t idx[4] = {0, 5, 7, 11};
  std::vector<float> x1(4 * 3 * 32 * 32), x2(x1.size());
  int32_t y1[4], y2[4];
  SampleTransform tr{Augment::kRandomResizedCrop, 7, 1};
  WorkPool pool(2);
  gatherBatch(small.train, idx, 4, x1.data(), y1, tr, nullptr);
  gatherBatch(small.train, idx, 4, x2.data(), y2, tr, &pool);
  EXPECT_EQ(x1, x2);
  EXPECT_EQ(y1[1], 1);
  EXPECT_EQ(y2[3], 2);

  // Val classes must be the train classes.
  writeFile(t.file("val/class9/a.png"), smallPng());
  const std::string msg = dataError([&] { loadImageFolder(o); });
  EXPECT_NE(msg.find("differ from the train folder " + o.trainRoot), std::string::npos) << msg;
  EXPECT_NE(msg.find(o.valRoot), std::string::npos) << msg;
}

TEST(ImageFolder, ValFractionSplitIsStratifiedFixedAndDisjoint) {
  TempDir t;
  ImageFolderOptions o;
  o.trainRoot = makeFolder(t, "r", 4, 10);
  o.valFraction = 0.25;
  const DataSplit a = loadImageFolder(o), b = loadImageFolder(o);
  EXPECT_EQ(a.train.size, 4 * 7);  // round(2.5) = 3 of each 10 held out
  EXPECT_EQ(a.test.size, 4 * 3);
  EXPECT_EQ(a.test.labels, b.test.labels);
  std::set<std::vector<uint8_t>> train, test;
  for (int64_t i = 0; i < a.train.size; ++i) train.insert(a.train.load(i).px);
  for (int64_t i = 0; i < a.test.size; ++i) {
    test.insert(a.test.load(i).px);
    EXPECT_EQ(a.test.load(i).px, b.test.load(i).px);  // the same files every time
  }
  EXPECT_EQ(train.size() + test.size(), 40u);
  for (const auto& p : test) EXPECT_EQ(train.count(p), 0u);
  // Labels stay in folder order (class-contiguous) in both splits.
  EXPECT_TRUE(std::is_sorted(a.train.labels.begin(), a.train.labels.end()));
  EXPECT_TRUE(std::is_sorted(a.test.labels.begin(), a.test.labels.end()));
  // No split: the test split is empty.
  o.valFraction = 0;
  EXPECT_EQ(loadImageFolder(o).test.size, 0);
  o.valFraction = 1;
  EXPECT_THROW(loadImageFolder(o), InvalidArgument);
  o.valFraction = 0.5;
  o.valRoot = o.trainRoot;
  EXPECT_THROW(loadImageFolder(o), InvalidArgument);
}

TEST(ImageFolder, CapsKeepEveryClass) {
  TempDir t;
  ImageFolderOptions o;
  o.trainRoot = makeFolder(t, "r", 3, 4);
  o.maxTrain = 5;
  const DataSplit s = loadImageFolder(o);
  // Round robin: class 0, 1, 2 first samples, then class 0, 1 second ones.
  EXPECT_EQ(s.train.labels, (std::vector<int32_t>{0, 0, 1, 1, 2}));
  EXPECT_EQ(s.train.load(1).at(0, 0, 0), 1);
  EXPECT_EQ(s.train.load(3).at(0, 0, 0), 41);
  o.maxTrain = 100;
  EXPECT_EQ(loadImageFolder(o).train.size, 12);
}

TEST(ImageFolder, SkipBadReplacesWithTheNextGoodSampleOfTheClass) {
  TempDir t;
  ImageFolderOptions o;
  o.trainRoot = makeFolder(t, "r", 2, 4);
  writeFile(t.file("r/class0/img1.png"), "garbage");
  writeFile(t.file("r/class0/img2.png"), smallPng().substr(0, 30));
  writeFile(t.file("r/class1/img3.png"), "BM not supported");
  // Without skipBad: the DataError names the file.
  {
    const DataSplit s = loadImageFolder(o);
    EXPECT_NE(dataError([&] { s.train.load(1); }).find(t.file("r/class0/img1.png")),
              std::string::npos);
    std::vector<float> x(8 * s.train.sampleElems());
    int32_t y[8];
    const int64_t idx[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    WorkPool pool(2);
    EXPECT_THROW(gatherBatch(s.train, idx, 8, x.data(), y, SampleTransform{}, &pool), DataError);
  }
  o.skipBad = true;
  const DataSplit s = loadImageFolder(o);
  ASSERT_NE(s.skipped, nullptr);
  EXPECT_EQ(s.train.load(0).at(0, 0, 0), 0);
  EXPECT_EQ(skippedImages(s), 0);
  EXPECT_EQ(s.train.load(1).at(0, 0, 0), 3);  // img1, img2 bad: img3
  EXPECT_EQ(skippedImages(s), 2);
  EXPECT_EQ(s.train.load(2).at(0, 0, 0), 3);  // known bad: not counted again
  EXPECT_EQ(skippedImages(s), 2);
  EXPECT_EQ(s.train.load(7).at(0, 0, 0), 40);  // the last wraps to class1's first
  EXPECT_EQ(skippedImages(s), 3);
  // Threads do not change what a batch holds.
  const DataSplit fresh = loadImageFolder(o);
  std::vector<float> x1(8 * s.train.sampleElems()), x2(x1.size());
  int32_t y1[8], y2[8];
  const int64_t idx[8] = {7, 6, 5, 4, 3, 2, 1, 0};
  WorkPool pool(2);
  gatherBatch(fresh.train, idx, 8, x1.data(), y1, SampleTransform{}, &pool);
  gatherBatch(s.train, idx, 8, x2.data(), y2, SampleTransform{}, nullptr);
  EXPECT_EQ(x1, x2);
  EXPECT_EQ(skippedImages(fresh), 3);
  // A class with no image that decodes.
  for (int i = 0; i < 4; ++i)
    writeFile(t.file("r/class1/img" + std::to_string(i) + ".png"), "bad");
  const DataSplit dead = loadImageFolder(o);
  const std::string msg = dataError([&] { dead.train.load(5); });
  EXPECT_NE(msg.find("no image of class class1 decodes"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ddprun::train
