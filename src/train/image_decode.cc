#include "ddprun/train/image_decode.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

namespace ddprun::train {

// File-local names are spelt to be unique in ddprun_train: its unity build
// (cmake/build_speed.cmake) compiles all its files as one source.
namespace {

[[noreturn]] void decodeFail(const std::string& name, const std::string& what) {
  DDPRUN_THROW(DataError, name, ": ", what, "; ", kImageHint);
}

// A decoder's outcome, filled in by the setjmp-guarded C-style functions
// below (which must not throw): the image, or why there is none.
struct ImageDecodeJob {
  const uint8_t* data = nullptr;
  size_t size = 0;
  DecodeLimits limits;
  ImageU8* out = nullptr;        // CHW, 3 channels (RGB)
  std::vector<uint8_t>* rows = nullptr;  // scratch: interleaved rows
  char error[JMSG_LENGTH_MAX + 128] = {};
};

void setDecodeError(ImageDecodeJob& job, const char* what) {
  std::snprintf(job.error, sizeof job.error, "%s", what);
}

// Empty when w x h is within the limits, else the complaint.
bool decodeSizeAllowed(ImageDecodeJob& job, int64_t w, int64_t h) {
  const auto& l = job.limits;
  if (w < 1 || h < 1) {
    setDecodeError(job, "the image has no pixels");
    return false;
  }
  if (w > l.maxSide || h > l.maxSide || w * h > l.maxPixels) {
    std::snprintf(job.error, sizeof job.error,
                  "image of %lld x %lld pixels is over the limit (%d per side, %lld in all)",
                  static_cast<long long>(w), static_cast<long long>(h), l.maxSide,
                  static_cast<long long>(l.maxPixels));
    return false;
  }
  return true;
}

// Sets aside the output (3 x h x w) and a scratch of `rowBytes` bytes;
// false (with the reason) when memory runs out. Never throws.
bool allocateDecoded(ImageDecodeJob& job, int h, int w, size_t scratchBytes) noexcept {
  try {
    job.out->c = 3;
    job.out->h = h;
    job.out->w = w;
    job.out->px.resize(size_t{3} * h * w);
    job.rows->resize(scratchBytes);
    return true;
  } catch (const std::bad_alloc&) {
    setDecodeError(job, "out of memory for the decoded image");
    return false;
  }
}

// ---- JPEG ---------------------------------------------------------------------

constexpr int kJpegRowsPerRead = 16;

struct JpegContext {
  jpeg_decompress_struct cinfo;
  JSAMPROW rowPtrs[kJpegRowsPerRead];
  jpeg_error_mgr err;
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  ImageDecodeJob* job;
};

JpegContext* jpegContextOf(j_common_ptr cinfo) {
  return reinterpret_cast<JpegContext*>(reinterpret_cast<char*>(cinfo) -
                                        offsetof(JpegContext, cinfo));
}

void jpegErrorExit(j_common_ptr cinfo) {
  JpegContext* ctx = jpegContextOf(cinfo);
  char msg[JMSG_LENGTH_MAX] = {};
  (*cinfo->err->format_message)(cinfo, msg);
  std::snprintf(ctx->job->error, sizeof ctx->job->error, "corrupt JPEG data (libjpeg: %s)", msg);
  std::longjmp(ctx->jump, 1);
}

// Warnings: a premature end of data is fatal (the file is truncated: PIL
// refuses it); the others are ignored, as PIL ignores them.
void jpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    JpegContext* ctx = jpegContextOf(cinfo);
    setDecodeError(*ctx->job, "truncated JPEG file (the data ends before the image does)");
    std::longjmp(ctx->jump, 1);
  }
}

void jpegProgress(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  JpegContext* ctx = jpegContextOf(cinfo);
  if (d->input_scan_number > ctx->job->limits.maxScans) {
    std::snprintf(ctx->job->error, sizeof ctx->job->error,
                  "progressive JPEG with more than %d scans (refused: a decompression bomb)",
                  ctx->job->limits.maxScans);
    std::longjmp(ctx->jump, 1);
  }
}

// PIL's MULDIV255: a * b / 255, rounded its way.
inline int mulDiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

// Scatters one decoded row (interleaved RGB or inverted CMYK) into the planes.
void storeJpegRow(const uint8_t* row, int comps, bool cmyk, ImageU8& out, int y) {
  const size_t plane = size_t(out.h) * out.w;
  uint8_t* r = out.px.data() + size_t(y) * out.w;
  uint8_t* g = r + plane;
  uint8_t* b = g + plane;
  if (!cmyk) {
    for (int x = 0; x < out.w; ++x, row += comps) {
      r[x] = row[0];
      g[x] = row[1];
      b[x] = row[2];
    }
    return;
  }
  // PIL reads CMYK JPEGs as "CMYK;I" (inverted, Adobe's convention), then
  // cmyk2rgb: v = nk - muldiv255(c, nk), nk = 255 - k.
  for (int x = 0; x < out.w; ++x, row += 4) {
    const int c = 255 - row[0], m = 255 - row[1], ye = 255 - row[2], nk = row[3];
    r[x] = static_cast<uint8_t>(nk - mulDiv255(c, nk));
    g[x] = static_cast<uint8_t>(nk - mulDiv255(m, nk));
    b[x] = static_cast<uint8_t>(nk - mulDiv255(ye, nk));
  }
}

// The setjmp frame: only C-style locals (no destructors), all state in
// `ctx` and `job`, which live in the caller's frame.
bool runJpeg(JpegContext& ctx, ImageDecodeJob& job) {
  j_decompress_ptr cinfo = &ctx.cinfo;
  cinfo->err = jpeg_std_error(&ctx.err);
  ctx.err.error_exit = jpegErrorExit;
  ctx.err.emit_message = jpegEmitMessage;
  ctx.job = &job;
  if (setjmp(ctx.jump) != 0) {
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  jpeg_create_decompress(cinfo);
  ctx.progress.progress_monitor = jpegProgress;
  cinfo->progress = &ctx.progress;
  jpeg_mem_src(cinfo, job.data, static_cast<unsigned long>(job.size));
  jpeg_read_header(cinfo, TRUE);
  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  jpeg_calc_output_dimensions(cinfo);
  if (!decodeSizeAllowed(job, cinfo->output_width, cinfo->output_height)) {
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  const int w = static_cast<int>(cinfo->output_width), h = static_cast<int>(cinfo->output_height);
  const int comps = cinfo->output_components;
  // Rows are read kJpegRowsPerRead at a time (one at a time makes libjpeg
  // upsample 2-row groups into a spare buffer and copy them out).
  if (!allocateDecoded(job, h, w, size_t(w) * comps * kJpegRowsPerRead)) {
    jpeg_destroy_decompress(cinfo);
    return false;
  }
  for (int k = 0; k < kJpegRowsPerRead; ++k)
    ctx.rowPtrs[k] = job.rows->data() + size_t(k) * w * comps;
  jpeg_start_decompress(cinfo);
  while (cinfo->output_scanline < cinfo->output_height) {
    const int y = static_cast<int>(cinfo->output_scanline);
    const JDIMENSION got = jpeg_read_scanlines(cinfo, ctx.rowPtrs, kJpegRowsPerRead);
    if (got == 0) {
      setDecodeError(job, "truncated JPEG file");
      jpeg_destroy_decompress(cinfo);
      return false;
    }
    for (JDIMENSION k = 0; k < got; ++k)
      storeJpegRow(ctx.rowPtrs[k], comps, cmyk, *job.out, y + static_cast<int>(k));
  }
  jpeg_finish_decompress(cinfo);
  jpeg_destroy_decompress(cinfo);
  return true;
}

// ---- PNG ----------------------------------------------------------------------

struct PngContext {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ImageDecodeJob* job = nullptr;
  size_t at = 0;  // read position in job->data
};

void pngError(png_structp png, png_const_charp msg) {
  auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(ctx->job->error, sizeof ctx->job->error, "corrupt PNG data (libpng: %s)", msg);
  png_longjmp(png, 1);
}

void pngWarning(png_structp, png_const_charp) {}

void pngRead(png_structp png, png_bytep out, size_t n) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (n > ctx->job->size - ctx->at) {
    setDecodeError(*ctx->job, "truncated PNG file (the data ends before the image does)");
    png_longjmp(png, 1);
  }
  std::memcpy(out, ctx->job->data + ctx->at, n);
  ctx->at += n;
}

// Converts `count` decoded interleaved rows (8-bit RGB, or 16-bit big-endian
// gray) into the planes, from row y on.
void storePngRows(const uint8_t* rows, bool gray16, ImageU8& out, int y, int count) {
  const size_t plane = size_t(out.h) * out.w, n = size_t(count) * out.w;
  uint8_t* r = out.px.data() + size_t(y) * out.w;
  uint8_t* g = r + plane;
  uint8_t* b = g + plane;
  if (gray16) {  // PIL's I;16 -> RGB: min(v, 255)
    for (size_t i = 0; i < n; ++i, rows += 2)
      r[i] = g[i] = b[i] = rows[0] != 0 ? 255 : rows[1];
    return;
  }
  for (size_t i = 0; i < n; ++i, rows += 3) {
    r[i] = rows[0];
    g[i] = rows[1];
    b[i] = rows[2];
  }
}

// Sets libpng's transforms so that rows come out as 8-bit RGB, or 16-bit
// gray (gray16) for PIL's clamping conversion. Returns gray16; *passes is
// the number of interlace passes (1 for a plain image).
bool setPngTransforms(png_structp png, png_infop info, int* passes) {
  const int colour = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
  const bool gray16 = colour == PNG_COLOR_TYPE_GRAY && depth == 16;
  if (colour == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (colour == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16 && !gray16) png_set_strip_16(png);  // the high byte, as PIL's ;16B modes
  // Alpha (and the alpha channel png_set_palette_to_rgb makes of a palette's
  // tRNS) is dropped: PIL's convert("RGB") ignores transparency.
  if ((colour & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS))
    png_set_strip_alpha(png);
  if ((colour == PNG_COLOR_TYPE_GRAY || colour == PNG_COLOR_TYPE_GRAY_ALPHA) && !gray16)
    png_set_gray_to_rgb(png);
  *passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  return gray16;
}

bool runPng(PngContext& ctx, ImageDecodeJob& job) {
  ctx.job = &job;
  ctx.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, pngError, pngWarning);
  if (ctx.png == nullptr) {
    setDecodeError(job, "out of memory (libpng)");
    return false;
  }
  if (setjmp(png_jmpbuf(ctx.png)) != 0) {
    png_destroy_read_struct(&ctx.png, &ctx.info, nullptr);
    return false;
  }
  ctx.info = png_create_info_struct(ctx.png);
  if (ctx.info == nullptr) png_error(ctx.png, "out of memory");
  png_set_read_fn(ctx.png, &ctx, pngRead);
  png_set_user_limits(ctx.png, static_cast<png_uint_32>(job.limits.maxSide),
                      static_cast<png_uint_32>(job.limits.maxSide));
  png_set_chunk_malloc_max(ctx.png, 64u << 20);  // one ancillary chunk (iCCP, text, ...)
  png_read_info(ctx.png, ctx.info);
  const int64_t w = png_get_image_width(ctx.png, ctx.info);
  const int64_t h = png_get_image_height(ctx.png, ctx.info);
  if (!decodeSizeAllowed(job, w, h)) {
    png_destroy_read_struct(&ctx.png, &ctx.info, nullptr);
    return false;
  }
  int passes = 1;
  const bool gray16 = setPngTransforms(ctx.png, ctx.info, &passes);
  const size_t rowBytes = png_get_rowbytes(ctx.png, ctx.info);
  if (rowBytes != size_t(w) * (gray16 ? 2 : 3)) png_error(ctx.png, "unexpected row size");
  // A plain image is converted row by row; an interlaced one is assembled
  // whole (its passes revisit every row) and converted at the end.
  if (!allocateDecoded(job, static_cast<int>(h), static_cast<int>(w),
                rowBytes * size_t(passes == 1 ? 1 : h))) {
    png_destroy_read_struct(&ctx.png, &ctx.info, nullptr);
    return false;
  }
  for (int pass = 0; pass < passes; ++pass)
    for (int y = 0; y < static_cast<int>(h); ++y) {
      uint8_t* row = job.rows->data() + (passes == 1 ? 0 : size_t(y) * rowBytes);
      png_read_row(ctx.png, row, nullptr);
      if (passes == 1) storePngRows(row, gray16, *job.out, y, 1);
    }
  // No png_read_end: the chunks after the image data are not needed, and a
  // file cut after its last row still opens in PIL.
  if (passes != 1) storePngRows(job.rows->data(), gray16, *job.out, 0, static_cast<int>(h));
  png_destroy_read_struct(&ctx.png, &ctx.info, nullptr);
  return true;
}

// PIL's RGB -> L: (19595 R + 38470 G + 7471 B + 0x8000) >> 16.
ImageU8 pilRgbToL(const ImageU8& rgb) {
  ImageU8 out;  // (fields set here: the fuzz target links this file alone)
  out.c = 1;
  out.h = rgb.h;
  out.w = rgb.w;
  out.px.resize(size_t(rgb.h) * rgb.w);
  const size_t plane = size_t(rgb.h) * rgb.w;
  const uint8_t *r = rgb.px.data(), *g = r + plane, *b = g + plane;
  for (size_t i = 0; i < plane; ++i)
    out.px[i] = static_cast<uint8_t>((19595u * r[i] + 38470u * g[i] + 7471u * b[i] + 0x8000u) >> 16);
  return out;
}

}  // namespace

ImageFormat sniffImageFormat(const uint8_t* d, size_t n) {
  auto starts = [&](const char* magic, size_t len, size_t at = 0) {
    return n >= at + len && std::memcmp(d + at, magic, len) == 0;
  };
  if (starts("\xFF\xD8\xFF", 3)) return ImageFormat::kJpeg;
  if (starts("\x89PNG\r\n\x1A\n", 8)) return ImageFormat::kPng;
  if (starts("BM", 2)) return ImageFormat::kBmp;
  if (starts("GIF87a", 6) || starts("GIF89a", 6)) return ImageFormat::kGif;
  if (starts("RIFF", 4) && starts("WEBP", 4, 8)) return ImageFormat::kWebp;
  if (starts("II*\0", 4) || starts("MM\0*", 4)) return ImageFormat::kTiff;
  if (n >= 2 && d[0] == 'P' && d[1] >= '1' && d[1] <= '7') return ImageFormat::kPnm;
  return ImageFormat::kUnknown;
}

const char* imageFormatName(ImageFormat f) {
  switch (f) {
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kBmp: return "BMP";
    case ImageFormat::kGif: return "GIF";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kTiff: return "TIFF";
    case ImageFormat::kPnm: return "PNM (PPM/PGM/PBM)";
    case ImageFormat::kUnknown: break;
  }
  return "unknown";
}

ImageU8 decodeImageBytes(const uint8_t* data, size_t size, int channels,
                         const std::string& nameForErrors, const DecodeLimits& limits) {
  DDPRUN_CHECK(channels == 1 || channels == 3, "decodeImage: channels must be 1 or 3, not ",
               channels);
  if (size == 0) decodeFail(nameForErrors, "empty file (not an image)");
  const ImageFormat format = sniffImageFormat(data, size);
  if (format != ImageFormat::kJpeg && format != ImageFormat::kPng)
    decodeFail(nameForErrors, format == ImageFormat::kUnknown
                            ? std::string("not a JPEG or PNG file (unrecognised first bytes)")
                            : std::string("unsupported image format ") + imageFormatName(format) +
                                  " (only JPEG and PNG are decoded)");
  ImageU8 out;
  std::vector<uint8_t> rows;
  ImageDecodeJob job;
  job.data = data;
  job.size = size;
  job.limits = limits;
  job.out = &out;
  job.rows = &rows;
  bool ok;
  if (format == ImageFormat::kJpeg) {
    auto ctx = std::make_unique<JpegContext>();
    ok = runJpeg(*ctx, job);
  } else {
    auto ctx = std::make_unique<PngContext>();
    ok = runPng(*ctx, job);
  }
  if (!ok) decodeFail(nameForErrors, job.error);
  return channels == 3 ? out : pilRgbToL(out);
}

ImageU8 decodeImage(const std::string& path, int channels, const DecodeLimits& limits) {
  DDPRUN_CHECK(channels == 1 || channels == 3, "decodeImage: channels must be 1 or 3, not ",
               channels);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    decodeFail(path, errno == ENOENT ? std::string("no such file (or a broken link)")
                               : std::string("cannot open: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) decodeFail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) decodeFail(path, "not a regular file");
  if (st.st_size > limits.maxFileBytes)
    decodeFail(path, "file of " + std::to_string(st.st_size) + " bytes is over the limit of " +
                   std::to_string(limits.maxFileBytes) + " bytes for one image");
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) decodeFail(path, std::string("read error: ") + std::strerror(errno));
    if (n == 0) break;  // shrank while read: decode what is there (truncated)
    got += static_cast<size_t>(n);
  }
  bytes.resize(got);
  return decodeImageBytes(bytes.data(), bytes.size(), channels, path, limits);
}

}  // namespace ddprun::train
