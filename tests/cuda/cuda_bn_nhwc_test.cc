// The NHWC batch norm kernels (src/train/cuda/bn_nhwc.h) on the GPU against a
// float64 host reference computed from the same stored (rounded) inputs, for
// float32, bfloat16 and float16 storage, with and without the residual and
// the ReLU, at mean 0 and at mean 100 (variance cancellation); plus bitwise
// repeatability, the independence of the sums from the vector width, the
// empty shapes, the SyncBatchNorm path (sums of two halves added) and the
// unsupported storage types. Bounds as kernel_math_test.cc's host check of
// the same algorithm: y and dx within the storage's rounding u * |want|
// (u = 2^-24, 2^-8, 2^-11) plus 1e-5 of the tensor's scale; dz exact;
// statistics 1e-6 relative; the double sums 1e-5 of sum |g| (1 + |xhat|).
//
// Without a GPU the tests skip (DDPRUN_REQUIRE_GPU), except the argument
// checks, which throw before any CUDA call.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/bn_nhwc.h"
#include "cuda/bn_nchw.h"
#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda_check.h"
#include "ddprun/runtime/types.h"
#include "kernel_math.h"
#include "require_gpu.h"
#include "train/expect_bounded.h"
#include "train/random_vector.h"

namespace ddprun::train {
namespace {

using ddprun::testing::randomVector;
using runtime::DType;
namespace tc = ::ddprun::train::cuda;

// ---------------------------------------------------------------- helpers
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    if (bytes) DDPRUN_CUDA_OK(cudaMalloc(&p, bytes));
  }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { DDPRUN_CUDA_OK(cudaStreamCreate(&s)); }
  ~Stream() { cudaStreamDestroy(s); }
  void sync() { DDPRUN_CUDA_OK(cudaStreamSynchronize(s)); }
};
template <class T>
void upload(const DevBuf& d, const std::vector<T>& v, size_t offsetBytes = 0) {
  DDPRUN_CUDA_OK(cudaMemcpy(static_cast<char*>(d.p) + offsetBytes, v.data(), v.size() * sizeof(T),
                            cudaMemcpyHostToDevice));
}
template <class T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(n);
  if (n) DDPRUN_CUDA_OK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

size_t elemBytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }
double unitRoundoff(DType t) {
  return t == DType::kBFloat16 ? std::ldexp(1.0, -8)
         : t == DType::kFloat16 ? std::ldexp(1.0, -11)
                                : std::ldexp(1.0, -24);
}
// Host bytes of v in storage t (round to nearest even), and back.
std::vector<uint8_t> encode(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * elemBytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kFloat32) {
      std::memcpy(&b[4 * i], &v[i], 4);
    } else {
      const uint16_t h =
          t == DType::kBFloat16 ? runtime::floatToBf16(v[i]) : runtime::floatToHalf(v[i]);
      std::memcpy(&b[2 * i], &h, 2);
    }
  }
  return b;
}
std::vector<float> decode(DType t, const std::vector<uint8_t>& b) {
  std::vector<float> v(b.size() / elemBytes(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kFloat32) {
      std::memcpy(&v[i], &b[4 * i], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &b[2 * i], 2);
      v[i] = t == DType::kBFloat16 ? runtime::bf16ToFloat(h) : runtime::halfToFloat(h);
    }
  }
  return v;
}
std::vector<float> stored(DType t, const std::vector<float>& v) { return decode(t, encode(t, v)); }

using ddprun::testing::expectBounded;

// ------------------------------------------------------- one training step
struct Case {
  int64_t rows, c;
  DType t;
  bool residual, relu;
  float xMean;
};
std::string describe(const Case& k) {
  return "[" + std::to_string(k.rows) + ", " + std::to_string(k.c) + "] " +
         runtime::dtypeName(k.t) + (k.residual ? " +z" : "") + (k.relu ? " relu" : "") +
         " mean " + std::to_string(k.xMean);
}
struct Inputs {
  std::vector<float> x, z, dy, gamma, beta, rm0, rv0;  // x, z, dy as stored
};
Inputs makeInputs(const Case& k) {
  const size_t n = static_cast<size_t>(k.rows * k.c), c = static_cast<size_t>(k.c);
  Inputs in;
  in.x = stored(k.t, randomVector(n, 51, k.xMean - 1.7f, k.xMean + 1.7f));
  in.z = stored(k.t, randomVector(n, 52));
  in.dy = stored(k.t, randomVector(n, 53));
  in.gamma = randomVector(c, 54, 0.5f, 1.5f);
  in.beta = randomVector(c, 55, -0.5f, 0.5f);
  in.rm0 = randomVector(c, 56);
  in.rv0 = randomVector(c, 57, 0.5f, 2.0f);
  return in;
}
// Everything the kernels produce in one forward and backward.
struct Outputs {
  std::vector<double> fwdSums, bwdSums;
  std::vector<float> mean, invstd, rm, rv, dgamma, dbeta;
  std::vector<uint8_t> y, dz, dx, dxRecomputed;
};
constexpr double kEps = 1e-5, kMomentum = 0.1;

// counters: the statistics' finish and the parameter gradients folded into
// the sums' launches (BnFold), else the unfolded launches.
// `pdl`: the launches under programmatic dependent launch (launch_stream.h).
Outputs runOnGpu(const Case& k, const Inputs& in, Stream& st, unsigned* counters = nullptr,
                 bool pdl = false) {
  const tc::LaunchStream ls(st.s, pdl);
  const size_t n = static_cast<size_t>(k.rows * k.c), c = static_cast<size_t>(k.c);
  const size_t bytes = n * elemBytes(k.t);
  DevBuf x(bytes), z(bytes), y(bytes), dy(bytes), dz(bytes), dx(bytes), dx2(bytes);
  DevBuf ws(tc::bnNhwcWorkspaceBytes(k.rows, k.c));
  DevBuf fwd((2 * c + 1) * 8), bwd((2 * c + 1) * 8);
  DevBuf gamma(c * 4), beta(c * 4), mean(c * 4), invstd(c * 4), rm(c * 4), rv(c * 4),
      dgamma(c * 4), dbeta(c * 4);
  upload(x, encode(k.t, in.x));
  upload(z, encode(k.t, in.z));
  upload(dy, encode(k.t, in.dy));
  upload(gamma, in.gamma);
  upload(beta, in.beta);
  upload(rm, in.rm0);
  upload(rv, in.rv0);
  tc::BnFold fold;
  fold.counters = counters;
  fold.finish = {kEps, kMomentum, mean.as<float>(), invstd.as<float>(), rm.as<float>(),
                 rv.as<float>()};
  tc::launchBnNhwcStats(x.p, k.t, k.rows, k.c, ws.p, fwd.as<double>(), ls, &fold);
  tc::launchBnNhwcForward(x.p, k.residual ? z.p : nullptr, y.p, k.t, k.rows, k.c,
                          mean.as<float>(), invstd.as<float>(), gamma.as<float>(),
                          beta.as<float>(), k.relu, ls);
  fold.finish = {};
  fold.grads = {dgamma.as<float>(), dbeta.as<float>(), true, true};
  tc::launchBnNhwcBackwardSums(x.p, y.p, dy.p, dz.p, k.t, k.rows, k.c, mean.as<float>(),
                               invstd.as<float>(), k.relu, ws.p, bwd.as<double>(), ls, &fold);
  tc::launchBnNhwcBackwardData(x.p, nullptr, nullptr, dz.p, dx.p, k.t, k.rows, k.c,
                               bwd.as<double>(), gamma.as<float>(), mean.as<float>(),
                               invstd.as<float>(), k.relu, ls);
  tc::launchBnNhwcBackwardData(x.p, y.p, dy.p, nullptr, dx2.p, k.t, k.rows, k.c,
                               bwd.as<double>(), gamma.as<float>(), mean.as<float>(),
                               invstd.as<float>(), k.relu, ls);
  st.sync();
  Outputs o;
  o.fwdSums = download<double>(fwd.p, 2 * c + 1);
  o.bwdSums = download<double>(bwd.p, 2 * c + 1);
  o.mean = download<float>(mean.p, c);
  o.invstd = download<float>(invstd.p, c);
  o.rm = download<float>(rm.p, c);
  o.rv = download<float>(rv.p, c);
  o.dgamma = download<float>(dgamma.p, c);
  o.dbeta = download<float>(dbeta.p, c);
  o.y = download<uint8_t>(y.p, bytes);
  o.dz = download<uint8_t>(dz.p, bytes);
  o.dx = download<uint8_t>(dx.p, bytes);
  o.dxRecomputed = download<uint8_t>(dx2.p, bytes);
  return o;
}

// Every output of two runs bit for bit.
void expectSameOutputs(const Outputs& got, const Outputs& want) {
  EXPECT_EQ(got.fwdSums, want.fwdSums);
  EXPECT_EQ(got.bwdSums, want.bwdSums);
  EXPECT_EQ(got.mean, want.mean);
  EXPECT_EQ(got.invstd, want.invstd);
  EXPECT_EQ(got.rm, want.rm);
  EXPECT_EQ(got.rv, want.rv);
  EXPECT_EQ(got.dgamma, want.dgamma);
  EXPECT_EQ(got.dbeta, want.dbeta);
  EXPECT_EQ(got.y, want.y);
  EXPECT_EQ(got.dz, want.dz);
  EXPECT_EQ(got.dx, want.dx);
  EXPECT_EQ(got.dxRecomputed, want.dxRecomputed);
}

// The float64 reference (the ReLU's mask from the GPU's stored y, as
// PyTorch's backward takes it from the output).
void checkAgainstFloat64(const Case& k, const Inputs& in, const Outputs& o) {
  SCOPED_TRACE(describe(k));
  const int64_t rows = k.rows, c = k.c;
  const size_t n = static_cast<size_t>(rows * c);
  const double m = static_cast<double>(rows), u = unitRoundoff(k.t);
  const auto y = decode(k.t, o.y), dz = decode(k.t, o.dz), dx = decode(k.t, o.dx);
  EXPECT_EQ(o.fwdSums[2 * c], m);
  EXPECT_EQ(o.bwdSums[2 * c], m);
  EXPECT_EQ(o.dx, o.dxRecomputed) << "dx from g and dx from (y, dy) differ";
  std::vector<double> yd(n), dxd(n);
  auto at = [c](int64_t r, int64_t ch) { return static_cast<size_t>(r * c + ch); };
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0, q = 0, t1 = 0, t2 = 0, cond = 0, sx = 0, sxx = 0;
    for (int64_t r = 0; r < rows; ++r) s += in.x[at(r, ch)];
    const double md = s / m;
    for (int64_t r = 0; r < rows; ++r) {
      const double xv = in.x[at(r, ch)];
      q += (xv - md) * (xv - md);
      sx += std::fabs(xv);
      sxx += xv * xv;
    }
    const double vd = q / m, isd = 1.0 / std::sqrt(vd + kEps);
    EXPECT_NEAR(o.fwdSums[ch], s, 1e-10 * sx) << "sum x " << ch;
    EXPECT_NEAR(o.fwdSums[c + ch], sxx, 1e-10 * sxx) << "sum x^2 " << ch;
    EXPECT_NEAR(o.mean[ch], md, 1e-6 * (std::fabs(md) + std::sqrt(vd))) << "mean " << ch;
    EXPECT_NEAR(o.invstd[ch], isd, 1e-6 * isd) << "invstd " << ch;
    const double rmd = (1 - kMomentum) * in.rm0[ch] + kMomentum * md;
    const double rvd = (1 - kMomentum) * in.rv0[ch] + kMomentum * vd * m / (m - 1);
    EXPECT_NEAR(o.rm[ch], rmd, 1e-6 * (std::fabs(rmd) + 1)) << "running mean " << ch;
    EXPECT_NEAR(o.rv[ch], rvd, 1e-6 * rvd) << "running var " << ch;
    std::vector<double> gd(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = at(r, ch);
      const double xh = (in.x[i] - md) * isd;
      const double v = xh * in.gamma[ch] + in.beta[ch] + (k.residual ? in.z[i] : 0.0);
      yd[i] = k.relu ? std::max(v, 0.0) : v;
      gd[r] = k.relu && !(y[i] > 0.0f) ? 0.0 : in.dy[i];
      ASSERT_EQ(dz[i], gd[r]) << "dz at row " << r << ", channel " << ch;
      t1 += gd[r];
      t2 += gd[r] * xh;
      cond += std::fabs(gd[r]) * (1 + std::fabs(xh));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const double xh = (in.x[at(r, ch)] - md) * isd;
      dxd[at(r, ch)] = in.gamma[ch] * isd * (gd[r] - t1 / m - xh * t2 / m);
    }
    EXPECT_NEAR(o.bwdSums[ch], t1, 1e-5 * cond) << "sum g " << ch;
    EXPECT_NEAR(o.bwdSums[c + ch], t2, 1e-5 * cond) << "sum g xhat " << ch;
    EXPECT_NEAR(o.dbeta[ch], t1, 1e-5 * cond) << "dbeta " << ch;
    EXPECT_NEAR(o.dgamma[ch], t2, 1e-5 * cond) << "dgamma " << ch;
  }
  expectBounded(y, yd, u, 1e-5, "y");
  expectBounded(dx, dxd, u, 1e-5, "dx");
}

const DType kStorages[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

TEST(CudaBnNhwc, MatchesFloat64Reference) {
  DDPRUN_REQUIRE_GPU("NHWC batch norm");
  Stream st;
  for (const DType t : kStorages)
    for (const bool residual : {false, true})
      for (const bool relu : {false, true}) {
        for (const Case& k : {Case{2 * 5 * 7, 64, t, residual, relu, 0.0f},
                              Case{3 * 4 * 4, 3, t, residual, relu, 0.0f},
                              Case{2 * 3 * 3, 6, t, residual, relu, 0.0f},
                              Case{2 * 5 * 7, 64, t, residual, relu, 100.0f}}) {
          const Inputs in = makeInputs(k);
          checkAgainstFloat64(k, in, runOnGpu(k, in, st));
        }
      }
  // Many row chunks (the second reduction stage) and channel tiles.
  for (const DType t : kStorages)
    for (const Case& k : {Case{16 * 40 * 40, 64, t, true, true, 0.0f},
                          Case{4 * 7 * 7, 520, t, false, true, 0.0f}}) {
      const Inputs in = makeInputs(k);
      checkAgainstFloat64(k, in, runOnGpu(k, in, st));
    }
}

TEST(CudaBnNhwc, RepeatsBitwise) {
  DDPRUN_REQUIRE_GPU("NHWC batch norm");
  Stream st;
  for (const DType t : kStorages) {
    const Case k{8 * 28 * 28, 64, t, true, true, 0.0f};
    const Inputs in = makeInputs(k);
    const Outputs a = runOnGpu(k, in, st), b = runOnGpu(k, in, st);
    SCOPED_TRACE(describe(k));
    EXPECT_EQ(a.fwdSums, b.fwdSums);
    EXPECT_EQ(a.bwdSums, b.bwdSums);
    EXPECT_EQ(a.mean, b.mean);
    EXPECT_EQ(a.invstd, b.invstd);
    EXPECT_EQ(a.rm, b.rm);
    EXPECT_EQ(a.rv, b.rv);
    EXPECT_EQ(a.y, b.y);
    EXPECT_EQ(a.dz, b.dz);
    EXPECT_EQ(a.dx, b.dx);
  }
}

// The folded launches (BnFold: the chunk reduction, the finish and the
// parameter gradients done by each channel tile's last block) give the
// unfolded launches' results bit for bit, against float64 too; the counters
// are left zero, so a second run on the same counters folds again. Under
// programmatic dependent launch (DDPRUN_CUDA_PDL=1, sm_90+: each kernel may
// be scheduled while the one before it finishes and waits for it at its
// start) the unfolded and the folded launches give the same bits too.
// Shapes: one chunk, many chunks and tiles, channels not a multiple of a
// tile, V = 1.
TEST(CudaBnNhwc, FoldedLaunchesEqualUnfolded) {
  DDPRUN_REQUIRE_GPU("NHWC batch norm");
  int device = 0, major = 0;
  DDPRUN_CUDA_OK(cudaGetDevice(&device));
  DDPRUN_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  const bool pdl = major >= 9;
  Stream st;
  for (const DType t : kStorages)
    for (const Case& k : {Case{5, 64, t, false, true, 0.0f},
                          Case{2 * 5 * 7, 40, t, true, true, 0.0f},
                          Case{3 * 4 * 4, 3, t, false, false, 0.0f},
                          Case{16 * 40 * 40, 64, t, true, true, 0.0f},
                          Case{4 * 7 * 7, 520, t, false, true, 100.0f},
                          Case{32 * 28 * 28, 128, t, true, false, 0.0f}}) {
      SCOPED_TRACE(describe(k));
      const Inputs in = makeInputs(k);
      const size_t nc = tc::bnNhwcFoldCounters(k.c);
      DevBuf counters(nc * sizeof(unsigned));
      DDPRUN_CUDA_OK(cudaMemsetAsync(counters.p, 0, nc * sizeof(unsigned), st.s));
      const Outputs want = runOnGpu(k, in, st);
      for (int run = 0; run < 2; ++run) {
        const Outputs got = runOnGpu(k, in, st, counters.as<unsigned>());
        expectSameOutputs(got, want);
        EXPECT_EQ(download<unsigned>(counters.p, nc), std::vector<unsigned>(nc, 0u));
        if (run == 0) checkAgainstFloat64(k, in, got);
      }
      if (!pdl) continue;
      for (const bool folded : {false, true}) {
        SCOPED_TRACE(folded ? "folded under PDL" : "unfolded under PDL");
        expectSameOutputs(
            runOnGpu(k, in, st, folded ? counters.as<unsigned>() : nullptr, true), want);
      }
    }
  if (!pdl)
    std::printf("note: programmatic dependent launch not checked: it needs compute capability "
                "9.0 (this device: %d)\n", major);
}

// An x one element off its allocation's alignment forces scalar loads (V = 1);
// the sums keep their order, so they are bitwise those of the vector loads,
// and the element-wise results are identical too.
TEST(CudaBnNhwc, VectorWidthDoesNotChangeResults) {
  DDPRUN_REQUIRE_GPU("NHWC batch norm");
  Stream st;
  for (const DType t : kStorages) {
    SCOPED_TRACE(runtime::dtypeName(t));
    const int64_t rows = 3 * 9 * 9, c = 64;
    const size_t n = static_cast<size_t>(rows * c), e = elemBytes(t);
    const auto x = encode(t, randomVector(n, 61, -2.0f, 3.0f));
    DevBuf xa(n * e), xm((n + 1) * e), ya(n * e), ym((n + 1) * e);
    DevBuf ws(tc::bnNhwcWorkspaceBytes(rows, c)), sa((2 * c + 1) * 8), sm((2 * c + 1) * 8);
    DevBuf mean(c * 4), invstd(c * 4), gamma(c * 4), beta(c * 4);
    upload(xa, x);
    upload(xm, x, e);
    upload(gamma, randomVector(c, 62));
    upload(beta, randomVector(c, 63));
    void* xmp = static_cast<char*>(xm.p) + e;
    void* ymp = static_cast<char*>(ym.p) + e;
    tc::launchBnNhwcStats(xa.p, t, rows, c, ws.p, sa.as<double>(), st.s);
    tc::launchBnNhwcStats(xmp, t, rows, c, ws.p, sm.as<double>(), st.s);
    tc::launchBnNhwcFinish(sa.as<double>(), c, kEps, kMomentum, mean.as<float>(),
                           invstd.as<float>(), nullptr, nullptr, st.s);
    tc::launchBnNhwcForward(xa.p, nullptr, ya.p, t, rows, c, mean.as<float>(),
                            invstd.as<float>(), gamma.as<float>(), beta.as<float>(), true, st.s);
    tc::launchBnNhwcForward(xmp, nullptr, ymp, t, rows, c, mean.as<float>(), invstd.as<float>(),
                            gamma.as<float>(), beta.as<float>(), true, st.s);
    st.sync();
    EXPECT_EQ(download<double>(sa.p, 2 * c + 1), download<double>(sm.p, 2 * c + 1));
    EXPECT_EQ(download<uint8_t>(ya.p, n * e), download<uint8_t>(ymp, n * e));
  }
}

// SyncBatchNorm: the sums of two halves of the batch, added (the all-reduce),
// give the statistics and dx of the whole batch.
TEST(CudaBnNhwc, SummedHalvesMatchTheWholeBatch) {
  DDPRUN_REQUIRE_GPU("NHWC batch norm");
  Stream st;
  const DType t = DType::kBFloat16;
  const Case k{2 * 6 * 6, 32, t, false, true, 0.0f};
  const Inputs in = makeInputs(k);
  const Outputs whole = runOnGpu(k, in, st);
  const int64_t c = k.c, half = k.rows / 2;
  const size_t e = elemBytes(t), hn = static_cast<size_t>(half * c);
  DevBuf x(2 * hn * e), ws(tc::bnNhwcWorkspaceBytes(half, c)), s0((2 * c + 1) * 8),
      s1((2 * c + 1) * 8), sum((2 * c + 1) * 8), mean(c * 4), invstd(c * 4);
  upload(x, encode(t, in.x));
  // One workspace for both: the launches are ordered on the stream.
  tc::launchBnNhwcStats(x.p, t, half, c, ws.p, s0.as<double>(), st.s);
  tc::launchBnNhwcStats(static_cast<char*>(x.p) + hn * e, t, half, c, ws.p, s1.as<double>(),
                        st.s);
  st.sync();
  auto a = download<double>(s0.p, 2 * c + 1), b = download<double>(s1.p, 2 * c + 1);
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  EXPECT_EQ(a[2 * c], static_cast<double>(k.rows));
  upload(sum, a);
  tc::launchBnNhwcFinish(sum.as<double>(), c, kEps, kMomentum, mean.as<float>(),
                         invstd.as<float>(), nullptr, nullptr, st.s);
  st.sync();
  const auto m = download<float>(mean.p, c), is = download<float>(invstd.p, c);
  for (int64_t ch = 0; ch < c; ++ch) {
    EXPECT_NEAR(m[ch], whole.mean[ch], 1e-6 * (std::fabs(whole.mean[ch]) + 1));
    EXPECT_NEAR(is[ch], whole.invstd[ch], 1e-6 * whole.invstd[ch]);
  }
}

// Empty shapes and evaluation's invstd.
TEST(CudaBnNhwc, EmptyShapesAndEvalInvStd) {
  DDPRUN_REQUIRE_GPU("NHWC batch norm");
  Stream st;
  const int64_t c = 5;
  EXPECT_EQ(tc::bnNhwcWorkspaceBytes(0, c), 0u);
  EXPECT_EQ(tc::bnNhwcWorkspaceBytes(7, 0), 0u);
  DevBuf out((2 * c + 1) * 8), out0(8), mean(c * 4), invstd(c * 4), rm(c * 4), rv(c * 4),
      var(c * 4);
  upload(out, std::vector<double>(2 * c + 1, 42.0));
  tc::launchBnNhwcStats(nullptr, DType::kBFloat16, 0, c, nullptr, out.as<double>(), st.s);
  tc::launchBnNhwcStats(nullptr, DType::kBFloat16, 7, 0, nullptr, out0.as<double>(), st.s);
  st.sync();
  EXPECT_EQ(download<double>(out.p, 2 * c + 1), std::vector<double>(2 * c + 1, 0.0));
  EXPECT_EQ(download<double>(out0.p, 1), std::vector<double>{7.0});
  // A count of 0: mean 0, invstd 1/sqrt(eps), running statistics unchanged.
  const auto rm0 = randomVector(c, 71), rv0 = randomVector(c, 72, 0.5f, 2.0f);
  upload(rm, rm0);
  upload(rv, rv0);
  tc::launchBnNhwcFinish(out.as<double>(), c, kEps, kMomentum, mean.as<float>(),
                         invstd.as<float>(), rm.as<float>(), rv.as<float>(), st.s);
  st.sync();
  EXPECT_EQ(download<float>(mean.p, c), std::vector<float>(c, 0.0f));
  EXPECT_EQ(download<float>(invstd.p, c), std::vector<float>(c, kmath::bnInvStd(0.0, kEps)));
  EXPECT_EQ(download<float>(rm.p, c), rm0);
  EXPECT_EQ(download<float>(rv.p, c), rv0);
  // Evaluation: invstd from the running variance.
  upload(var, rv0);
  tc::launchBnNhwcInvStd(var.as<float>(), c, kEps, invstd.as<float>(), st.s);
  st.sync();
  const auto is = download<float>(invstd.p, c);
  for (int64_t ch = 0; ch < c; ++ch) EXPECT_EQ(is[ch], kmath::bnInvStd(rv0[ch], kEps));
}

// Argument checks throw before any CUDA call: these run without a GPU.
TEST(CudaBnNhwc, RejectsUnsupportedStorageAndShapes) {
  double out[3] = {};
  for (const DType t : {DType::kFloat64, DType::kInt32, DType::kUInt8}) {
    try {
      tc::launchBnNhwcStats(nullptr, t, 4, 1, nullptr, out, nullptr);
      ADD_FAILURE() << "no error for " << runtime::dtypeName(t);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(runtime::dtypeName(t)), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(tc::launchBnNhwcForward(nullptr, nullptr, nullptr, t, 4, 1, nullptr, nullptr,
                                         nullptr, nullptr, false, nullptr),
                 InvalidArgument);
    EXPECT_THROW(tc::launchBnNhwcBackwardSums(nullptr, nullptr, nullptr, nullptr, t, 4, 1,
                                              nullptr, nullptr, false, nullptr, out, nullptr),
                 InvalidArgument);
    EXPECT_THROW(tc::launchBnNhwcBackwardData(nullptr, nullptr, nullptr, nullptr, nullptr, t, 4,
                                              1, nullptr, nullptr, nullptr, nullptr, false,
                                              nullptr),
                 InvalidArgument);
  }
  EXPECT_THROW(tc::launchBnNhwcStats(nullptr, DType::kBFloat16, -1, 1, nullptr, out, nullptr),
               InvalidArgument);
  EXPECT_THROW(tc::launchBnNhwcBackwardSums(nullptr, nullptr, nullptr, nullptr, DType::kBFloat16,
                                            4, 1, nullptr, nullptr, true, nullptr, out, nullptr),
               InvalidArgument);
  float m = 0;
  EXPECT_THROW(tc::launchBnNhwcFinish(nullptr, 1, kEps, kMomentum, &m, &m, &m, nullptr, nullptr),
               InvalidArgument);
}

}  // namespace
}  // namespace ddprun::train
