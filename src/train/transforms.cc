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

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// sumTaps rounds some products and fuses others on purpose: a compiler
// free to contract a*b+c into an FMA by itself (GCC's default where the
// target has FMA: -march=native, or the resize's own AVX2 + FMA build below)
// would change the sums.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
// 32-byte vectors passed between the (internal, inlined) helpers of the
// baseline build: GCC notes that their ABI differs without AVX.
#pragma GCC diagnostic ignored "-Wpsabi"
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

// The filter taps of every output index along one dimension, computed once
// per call and shared by every row, column and channel: output i reads the
// inputs [start[i], start[i] + size[i]) with the weights
// w[i*stride .. i*stride + size[i]).
struct AxisTaps {
  int64_t stride = 0;  // ATen's max_interp_size: no output has more taps
  std::vector<int64_t> start, size;
  std::vector<float> w;
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
void aaTaps(int64_t in, int64_t out, AxisTaps& t) {
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  const float support = (scale >= 1.0) ? static_cast<float>((2 * 0.5) * scale)
                                       : static_cast<float>(2 * 0.5);
  const int64_t maxInterp = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const float invscale = (scale >= 1.0) ? static_cast<float>(1.0 / scale) : 1.0f;
  t.stride = maxInterp;
  t.start.resize(static_cast<size_t>(out));
  t.size.resize(static_cast<size_t>(out));
  t.w.assign(static_cast<size_t>(out * maxInterp), 0.0f);
  for (int64_t i = 0; i < out; ++i) {
    const float center = static_cast<float>(scale * (i + 0.5));
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    int64_t xsize = std::min(static_cast<int64_t>(center + support + 0.5), in) - xmin;
    xsize = std::clamp(xsize, int64_t{0}, maxInterp);
    // centre lies in (0, in) and support >= 1, so every output has a tap.
    DDPRUN_CHECK(xsize >= 1, "resize: no filter tap for output ", i, " of ", in, " -> ", out);
    float* w = &t.w[static_cast<size_t>(i * maxInterp)];
    float total = 0.0f;
    for (int64_t j = 0; j < xsize; ++j) {
      const float pos = static_cast<float>(j + xmin) - center;  // int64 - float: float
      const float wj = triangle(static_cast<float>((pos + 0.5) * invscale));
      w[j] = wj;
      total += wj;
    }
    if (total != 0.0f)
      for (int64_t j = 0; j < xsize; ++j) w[j] /= total;
    t.start[static_cast<size_t>(i)] = xmin;
    t.size[static_cast<size_t>(i)] = xsize;
  }
}

// ---- Resize kernels ----------------------------------------------------------
//
// One output sample is the sum of in[k] * w[k] over its taps in float32,
// rounded as PyTorch's x86 builds round it. ATen's loop
// (interpolate_aa_single_dim) is
//   out = t[0]*w[0]; for k in 1..n-1: out += t[k]*w[k]
// and its AVX2 and AVX-512 kernels, the ones dispatched on any x86-64 CPU
// with AVX2, are compiled with contraction on: the compiler vectorises the
// loop four taps at a time (products rounded to float, then added in order)
// and leaves the last (n-1) % 4 taps to a scalar tail, where each += is a
// fused multiply-add. Measured against torch 2.x on AVX2 and AVX-512
// (tests/interop/test_transforms_vs_torchvision.py); ATen's DEFAULT kernel
// (no AVX2) rounds every product, which changes the float result in the
// last bit for some pixels and, rarely, a uint8 pixel by 1.
//
// sumTaps keeps exactly that order for each output but computes 8 outputs
// at once, one per vector lane, all with the same taps: the width pass puts
// 8 image rows in the lanes (the rows transposed into an x-major buffer),
// the height pass 8 neighbouring columns (plain rows of the intermediate
// image). Lanes never mix, so each lane's float operations are those of the
// scalar loop above.
//
// The kernels are built twice from the same templates: with AVX2 + FMA
// (OpsAvx2, picked at run time: the fused tail is one vfmadd per 8 outputs)
// and for baseline x86-64 (OpsBase: SSE2, the fused tail through std::fma
// lane by lane). Both give the same bits. The entry points are flattened
// (every helper inlined), so each build's helpers compile for its target.

// The AVX2 kernels rely on every helper being inlined into their entry
// point (gnu::flatten). Without optimisation GCC inlines nothing, and 32-byte
// vectors then cross calls between functions of different targets, whose
// ABIs differ (wrong pixels). An unoptimised build (Debug: the sanitizer
// pass) keeps to the baseline kernels, which give the same bits.
#if !defined(__OPTIMIZE__) && !defined(DDPRUN_RESIZE_BASELINE_ONLY)
#define DDPRUN_RESIZE_BASELINE_ONLY
#endif

// Aligned as their elements: a V8 may sit anywhere a float may (a stack
// frame that is not realigned to 32 bytes, as under the sanitizers' Debug
// build); every access is an unaligned load or store, as fast as an aligned
// one on the CPUs that run this.
typedef float V8 __attribute__((vector_size(32), aligned(4)));
typedef int32_t V8i __attribute__((vector_size(32), aligned(4)));
using V8u8 = uint8_t __attribute__((vector_size(8)));

// A float sum rounded as torchvision's _cast_squeeze_out rounds it:
// torch.round (half to even), then the cast to uint8. The clamp only guards
// a float sum a hair above 255.
inline uint8_t roundToU8(float x) {
  return static_cast<uint8_t>(std::clamp(std::nearbyint(x), 0.0f, 255.0f));
}

// Generic vectors: any x86-64 (and any other target GCC supports).
struct OpsBase {
  static V8 load(const float* p) {
    V8 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(float* p, const V8& v) { std::memcpy(p, &v, sizeof v); }
  static V8 splat(const float* p) {
    const float s = *p;
    return V8{s, s, s, s, s, s, s, s};
  }
  static V8 fromU8(const uint8_t* p) {  // 8 bytes as floats
    V8u8 b;
    std::memcpy(&b, p, sizeof b);
    return __builtin_convertvector(__builtin_convertvector(b, V8i), V8);
  }
  // acc = fma(a, b, acc), lane by lane, each rounded once.
  static void fmaAcc(V8& acc, const V8& a, const V8& b) {
    for (int i = 0; i < 8; ++i) acc[i] = std::fma(a[i], b[i], acc[i]);
  }
  static void storeU8(uint8_t* d, const V8& v) {
    for (int i = 0; i < 8; ++i) d[i] = roundToU8(v[i]);
  }
  // Transposes the 8x8 block r (r[i][j] becomes r[j][i]).
  static void transpose8(V8* r) {
    V8 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
      t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4) {
      u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
      u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
      u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
    }
    for (int i = 0; i < 4; ++i) {
      r[i] = __builtin_shufflevector(u[i], u[i + 4], 0, 1, 2, 3, 8, 9, 10, 11);
      r[i + 4] = __builtin_shufflevector(u[i], u[i + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
  }
};

#if defined(__x86_64__)
#define DDPRUN_AVX2 [[gnu::target("avx2,fma")]]
// The same operations in AVX2 + FMA intrinsics (GCC's code for the generic
// vectors above is poor in an AVX2 function: splats and conversions come
// out element by element).
struct OpsAvx2 {
  DDPRUN_AVX2 static V8 load(const float* p) { return _mm256_loadu_ps(p); }
  DDPRUN_AVX2 static void store(float* p, const V8& v) { _mm256_storeu_ps(p, v); }
  DDPRUN_AVX2 static V8 splat(const float* p) { return _mm256_broadcast_ss(p); }
  DDPRUN_AVX2 static V8 fromU8(const uint8_t* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  }
  DDPRUN_AVX2 static void fmaAcc(V8& acc, const V8& a, const V8& b) { acc = _mm256_fmadd_ps(a, b, acc); }
  // Clamp to [0, 255] (integers: the same as clamping after rounding), then
  // vcvtps2dq rounds in the current mode, to nearest with ties to even, as
  // std::nearbyint does; the packs saturate nothing left to saturate.
  DDPRUN_AVX2 static void storeU8(uint8_t* d, const V8& v) {
    const __m256 c = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
    const __m256i i = _mm256_cvtps_epi32(c);
    const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(d), _mm_packus_epi16(w16, w16));
  }
  DDPRUN_AVX2 static void transpose8(V8* r) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
      u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
      r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
      r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
  }
};
#undef DDPRUN_AVX2
#endif

// 8 outputs (lanes) from the n taps at p, p + step, ...: ATen's order (above).
template <class Ops>
V8 sumTaps(const float* p, int64_t step, const float* w, int64_t n) {
  V8 acc = Ops::load(p) * Ops::splat(w);
  const int64_t vectorEnd = 1 + (n - 1) / 4 * 4;
  int64_t k = 1;
  for (; k < vectorEnd; ++k) {
    const V8 product = Ops::load(p + k * step) * Ops::splat(w + k);
    acc += product;
  }
  for (; k < n; ++k) Ops::fmaAcc(acc, Ops::load(p + k * step), Ops::splat(w + k));
  return acc;
}

// One output, the same order (rows narrower than a vector).
inline float sumTaps1(const float* p, int64_t step, const float* w, int64_t n) {
  float acc = p[0] * w[0];
  const int64_t vectorEnd = 1 + (n - 1) / 4 * 4;
  int64_t k = 1;
  for (; k < vectorEnd; ++k) {
    const float product = p[k * step] * w[k];
    acc += product;
  }
  for (; k < n; ++k) acc = std::fma(p[k * step], w[k], acc);
  return acc;
}

template <class Ops>
void store8(float* d, const V8& v) {
  Ops::store(d, v);
}
template <class Ops>
void store8(uint8_t* d, const V8& v) {
  Ops::storeU8(d, v);
}
inline void put1(float* d, float x) { *d = x; }
inline void put1(uint8_t* d, float x) { *d = roundToU8(x); }

// One call's work: the crop of src, sized outH x outW, and where it goes.
template <typename Out>
struct ResizeJob {
  ImageView src;
  CropBox box;
  int64_t outH = 0, outW = 0;
  const AxisTaps* tw = nullptr;  // null: the width does not change
  const AxisTaps* th = nullptr;  // null: the height does not change
  float* mid = nullptr;          // c*h rows of outW: after the width pass
  float* rowsT = nullptr;        // box.width * 8: 8 input rows, x-major
  float* outT = nullptr;         // outW * 8: their 8 output rows, x-major
  Out* dst = nullptr;            // c x outH x outW
};

// Row r of the crop, counting the rows of every channel in turn (c*h).
inline const uint8_t* cropRow(ImageView src, const CropBox& box, int64_t r) {
  const int64_t ch = r / box.height, y = r % box.height;
  return src.px + (ch * src.h + box.top + y) * src.w + box.left;
}

// The width pass: the c*h crop rows, 8 at a time, into job.mid. All rows
// share the taps, so 8 rows of any channels go through together.
template <class Ops, typename Out>
void resampleWidth(const ResizeJob<Out>& job) {
  const AxisTaps& t = *job.tw;
  const int64_t rows = int64_t{job.src.c} * job.box.height, w = job.box.width;
  const int64_t outW = job.outW;
  float* rowsT = job.rowsT;
  float* outT = job.outT;
  for (int64_t r0 = 0; r0 < rows; r0 += 8) {
    const int64_t nr = std::min<int64_t>(8, rows - r0);
    const uint8_t* row[8];
    for (int64_t r = 0; r < 8; ++r)  // past the last row: repeat it (lanes unused)
      row[r] = cropRow(job.src, job.box, r0 + std::min(r, nr - 1));
    // rowsT[x*8 + r] = row r's pixel x, in float.
    int64_t x = 0;
    for (; x + 8 <= w; x += 8) {
      V8 v[8];
      for (int r = 0; r < 8; ++r) v[r] = Ops::fromU8(row[r] + x);
      Ops::transpose8(v);
      for (int j = 0; j < 8; ++j) Ops::store(rowsT + (x + j) * 8, v[j]);
    }
    for (; x < w; ++x)
      for (int r = 0; r < 8; ++r) rowsT[x * 8 + r] = static_cast<float>(row[r][x]);
    for (int64_t o = 0; o < outW; ++o)
      Ops::store(outT + o * 8, sumTaps<Ops>(rowsT + t.start[static_cast<size_t>(o)] * 8, 8,
                                            &t.w[static_cast<size_t>(o * t.stride)],
                                            t.size[static_cast<size_t>(o)]));
    // Back to rows: mid[(r0 + r)*outW + o] = outT[o*8 + r].
    float* mid = job.mid + r0 * outW;
    int64_t o = 0;
    for (; o + 8 <= outW; o += 8) {
      V8 v[8];
      for (int j = 0; j < 8; ++j) v[j] = Ops::load(outT + (o + j) * 8);
      Ops::transpose8(v);
      for (int64_t r = 0; r < nr; ++r) Ops::store(mid + r * outW + o, v[r]);
    }
    for (; o < outW; ++o)
      for (int64_t r = 0; r < nr; ++r) mid[r * outW + o] = outT[o * 8 + r];
  }
}

// The height pass: job.mid (c planes of h x outW) into job.dst.
template <class Ops, typename Out>
void resampleHeight(const ResizeJob<Out>& job) {
  const AxisTaps& t = *job.th;
  const int64_t c = job.src.c, h = job.box.height, w = job.outW, outH = job.outH;
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t y = 0; y < outH; ++y) {
      const float* in = job.mid + (ch * h + t.start[static_cast<size_t>(y)]) * w;
      const float* wy = &t.w[static_cast<size_t>(y * t.stride)];
      const int64_t n = t.size[static_cast<size_t>(y)];
      Out* d = job.dst + (ch * outH + y) * w;
      if (w < 8) {
        for (int64_t x = 0; x < w; ++x) put1(d + x, sumTaps1(in + x, w, wy, n));
        continue;
      }
      // The last vector may overlap the one before: it writes the same values.
      for (int64_t x = 0;; x += 8) {
        if (x + 8 > w) x = w - 8;
        store8<Ops>(d + x, sumTaps<Ops>(in + x, w, wy, n));
        if (x + 8 >= w) break;
      }
    }
}

// ATen: the width pass first, then the height pass, each only when that
// size changes (an unchanged size is a copy, not a filter at scale 1).
template <class Ops, typename Out>
void resampleBoth(const ResizeJob<Out>& job) {
  const int64_t rows = int64_t{job.src.c} * job.box.height, outW = job.outW;
  if (job.tw != nullptr) {
    resampleWidth<Ops>(job);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* in = cropRow(job.src, job.box, r);
      for (int64_t x = 0; x < outW; ++x) job.mid[r * outW + x] = static_cast<float>(in[x]);
    }
  }
  if (job.th != nullptr) {
    resampleHeight<Ops>(job);
  } else {
    const int64_t n = rows * outW;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store8<Ops>(job.dst + i, Ops::load(job.mid + i));
    for (; i < n; ++i) put1(job.dst + i, job.mid[i]);
  }
}

// -DDDPRUN_RESIZE_BASELINE_ONLY builds without the AVX2 kernels (to test the
// baseline ones on an AVX2 machine).
#if defined(__x86_64__) && !defined(DDPRUN_RESIZE_BASELINE_ONLY)
template <typename Out>
[[gnu::target("avx2,fma"), gnu::flatten]] void resampleAvx2(const ResizeJob<Out>& job) {
  resampleBoth<OpsAvx2>(job);
}
bool haveAvx2Fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

template <typename Out>
[[gnu::flatten]] void resampleBaseline(const ResizeJob<Out>& job) {
  resampleBoth<OpsBase>(job);
}

// Per-thread scratch, reused from call to call (grown, never shrunk).
struct ResizeScratch {
  AxisTaps tw, th;
  std::vector<float> mid, rowsT, outT;
};

template <typename Out>
void resizeInto(ImageView src, const CropBox& box, int outH, int outW, Out* dst) {
  const int64_t c = src.c, h = box.height, w = box.width;
  if (outW == w && outH == h) {  // neither pass: the crop itself
    for (int64_t r = 0; r < c * h; ++r) {
      const uint8_t* in = cropRow(src, box, r);
      for (int64_t x = 0; x < w; ++x) dst[r * w + x] = static_cast<Out>(in[x]);
    }
    return;
  }
  thread_local ResizeScratch s;
  const auto grow = [](std::vector<float>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  };
  ResizeJob<Out> job;
  job.src = src;
  job.box = box;
  job.outH = outH;
  job.outW = outW;
  if (outW != w) {
    aaTaps(w, outW, s.tw);
    job.tw = &s.tw;
    grow(s.rowsT, w * 8);
    grow(s.outT, int64_t{outW} * 8);
  }
  if (outH != h) {
    aaTaps(h, outH, s.th);
    job.th = &s.th;
  }
  grow(s.mid, c * h * outW);
  job.mid = s.mid.data();
  job.rowsT = s.rowsT.data();
  job.outT = s.outT.data();
  job.dst = dst;
#if defined(__x86_64__) && !defined(DDPRUN_RESIZE_BASELINE_ONLY)
  if (haveAvx2Fma()) {
    resampleAvx2(job);
    return;
  }
#endif
  resampleBaseline(job);
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
  std::vector<float> out(static_cast<size_t>(int64_t{src.c} * outH * outW));
  resizeInto(src, box, outH, outW, out.data());
  return out;
}

void resizedCrop(ImageView src, const CropBox& box, int outH, int outW, uint8_t* dst) {
  checkBox(src, box, outH, outW);
  resizeInto(src, box, outH, outW, dst);
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
