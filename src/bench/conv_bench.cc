// conv_bench: which CPU library should the trainer's convolution layers use?
// Times one full LeNet training step (forward + backward of every layer,
// batch 64, NCHW float32, one thread) with
//   A  OpenBLAS: im2col + sgemm, hand-written relu / max-pool, fc as sgemm, in
//      three GEMM arrangements:
//        blas-batched   col[CKK][N*P]: Y'=W*col (NN), dW=dY'*col^T (NT),
//                       dcol=W^T*dY' (TN), permutes to/from NCHW; fc W[out][in]
//        blas-batchedT  colT[N*P][CKK]: Y^T=colT*W^T (NT), dW=dY^T^T*colT (TN),
//                       dcolT=dY^T*W (NN), transposes to/from NCHW; fc W[in][out]
//        blas-perimage  per image col[CKK][P]: Y_n=W*col_n (NN) straight into
//                       NCHW, dW+=dY_n*col_n^T (NT), dcol=W^T*dY_n (TN)
//   B  oneDNN primitives (convolution fwd-training / bwd-data / bwd-weights,
//      inner product with fused relu; relu / max pool hand-written on NCHW
//      unless the layouts are kept, then oneDNN eltwise / pooling):
//        dnnl-any       conv layouts chosen by oneDNN (format_tag::any), with the
//                       reorders that keep every layer boundary NCHW and every
//                       master weight OIHW (what a plain-tensor trainer needs)
//        dnnl-nhwc      the same with the conv activations forced to NHWC
//        dnnl-plain     conv layouts forced to nchw/oihw (no reorders at all)
//        dnnl-blocked   oneDNN's layouts kept end to end (reorders only where two
//                       primitives disagree; weights live in oneDNN's layout, so
//                       the optimizer must update them there)
//        dnnl-nhwc-e2e  NHWC end to end (oneDNN relu / pool / fc on NHWC)
//        dnnl-any-ops, dnnl-nhwc-ops (not run by default): dnnl-any / -nhwc with
//                       oneDNN relu / pooling on the NCHW boundary tensors
// Every variant is checked against a double-precision naive reference.
//
//   conv_bench [--reps 100] [--warmup 10] [--batch 64] [--threads 1] [--json]
//              [--clock cpu|wall] [--variants blas-batched,dnnl-nhwc,...]
//
// Times are medians over --reps steps, the variants interleaved step by step so
// that load from other processes hits them alike; per-phase times are this
// thread's CPU time unless --clock wall (see phaseClock).
#include <cblas.h>
#include <dnnl_debug.h>
#include <omp.h>
#include <time.h>
#include <CLI/CLI.hpp>
#include <dnnl.hpp>
#include <nlohmann/json.hpp>

#include <dirent.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double now() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}
double cpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double threadCpuNow() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
// The clock of the per-phase times: this thread's CPU time by default (the
// work runs on this one thread, which cpu_per_wall and thread_cpu_share check),
// so that other processes on the machine inflate the numbers less; --clock wall
// for wall time. The sub-timers (`aux`: time in sgemm, or in reorders) use the
// same clock but only with --breakdown: a CPU-time clock read is a system call
// (~0.3-0.7 us), and blas-perimage makes 320 sgemm calls a step.
double (*phaseClock)() = threadCpuNow;
bool breakdown = false;
template <class F>
void auxTimed(double& acc, F&& f) {
  if (!breakdown) return f();
  const double t0 = phaseClock();
  f();
  acc += phaseClock() - t0;
}

// ---------------------------------------------------------------- phases ---
enum Ph {
  C1F,
  R1F,
  P1F,
  C2F,
  R2F,
  P2F,
  F1F,
  F2F,
  F3F,
  F3B,
  F2B,
  F1B,
  P2B,
  R2B,
  C2B,
  P1B,
  R1B,
  C1B,
  NPH
};
const char* kPhName[NPH] = {"conv1 fwd",    "relu1 fwd",    "pool1 fwd",
                            "conv2 fwd",    "relu2 fwd",    "pool2 fwd",
                            "fc1+relu fwd", "fc2+relu fwd", "fc3 fwd",
                            "fc3 bwd",      "fc2+relu bwd", "fc1+relu bwd",
                            "pool2 bwd",    "relu2 bwd",    "conv2 bwd (dW,db,dX)",
                            "pool1 bwd",    "relu1 bwd",    "conv1 bwd (dW,db)"};

// Per step: time of each phase (phaseClock), `aux`: the part of it spent in
// sgemm (OpenBLAS variants) or in reorders (oneDNN variants), --breakdown only;
// the whole step's wall, process CPU and thread CPU time.
struct StepTimes {
  std::array<double, NPH> t{}, aux{};
  double total = 0, cpu = 0, tcpu = 0, pclock = 0;
};
struct Stamp {
  StepTimes& st;
  double last;
  explicit Stamp(StepTimes& s) : st(s), last(phaseClock()) {}
  void mark(Ph p) {
    const double t = phaseClock();
    st.t[p] = t - last;
    last = t;
  }
};

// ----------------------------------------------------------------- model ---
struct ConvShape {
  int N, C, H, W, OC, K, pad, OH, OW;
  int P() const { return OH * OW; }
  int CKK() const { return C * K * K; }
  double flops() const { return 2.0 * N * OC * P() * CKK(); }  // one of fwd / dW / dX
};

struct Model {
  int N;
  ConvShape c1, c2;
  static constexpr int F0 = 400, F1 = 120, F2 = 84, F3 = 10;
  explicit Model(int n)
      : N(n), c1{n, 1, 28, 28, 6, 5, 2, 28, 28}, c2{n, 6, 14, 14, 16, 5, 0, 10, 10} {}
  double phaseFlops(Ph p) const {
    const double f1 = 2.0 * N * F0 * F1, f2 = 2.0 * N * F1 * F2, f3 = 2.0 * N * F2 * F3;
    switch (p) {
      case C1F:
        return c1.flops();
      case C2F:
        return c2.flops();
      case F1F:
        return f1;
      case F2F:
        return f2;
      case F3F:
        return f3;
      case F3B:
        return 2 * f3;
      case F2B:
        return 2 * f2;
      case F1B:
        return 2 * f1;
      case C2B:
        return 2 * c2.flops();
      case C1B:
        return c1.flops();  // no data gradient for the input image
      default:
        return 0;
    }
  }
};

// Parameters in PyTorch layouts (conv OIHW, fc [out][in]), input, loss gradient.
struct Params {
  std::vector<float> w1, b1, w2, b2, wf1, bf1, wf2, bf2, wf3, bf3, x, dlogits;
};
Params makeParams(const Model& m, uint32_t seed) {
  std::mt19937 rng(seed);
  auto uni = [&](size_t n, float a) {
    std::uniform_real_distribution<float> d(-a, a);
    std::vector<float> v(n);
    for (auto& e : v) e = d(rng);
    return v;
  };
  Params p;
  p.w1 = uni(6 * 25, 1 / std::sqrt(25.f));
  p.b1 = uni(6, 1 / std::sqrt(25.f));
  p.w2 = uni(16 * 150, 1 / std::sqrt(150.f));
  p.b2 = uni(16, 1 / std::sqrt(150.f));
  p.wf1 = uni(120 * 400, 1 / std::sqrt(400.f));
  p.bf1 = uni(120, 1 / std::sqrt(400.f));
  p.wf2 = uni(84 * 120, 1 / std::sqrt(120.f));
  p.bf2 = uni(84, 1 / std::sqrt(120.f));
  p.wf3 = uni(10 * 84, 1 / std::sqrt(84.f));
  p.bf3 = uni(10, 1 / std::sqrt(84.f));
  std::uniform_real_distribution<float> px(0.f, 1.f);
  p.x.resize(size_t(m.N) * 784);
  for (auto& e : p.x) e = px(rng);
  p.dlogits = uni(size_t(m.N) * 10, 1.f / m.N);
  return p;
}

// What the check compares, in PyTorch layouts.
struct Grads {
  std::vector<float> logits, dw1, db1, dw2, db2, dwf1, dbf1, dwf2, dbf2, dwf3, dbf3;
  std::vector<std::pair<const char*, const std::vector<float>*>> list() const {
    return {{"logits", &logits}, {"dw1", &dw1},   {"db1", &db1},   {"dw2", &dw2},
            {"db2", &db2},       {"dwf1", &dwf1}, {"dbf1", &dbf1}, {"dwf2", &dwf2},
            {"dbf2", &dbf2},     {"dwf3", &dwf3}, {"dbf3", &dbf3}};
  }
};

struct Variant {
  std::string name;
  virtual ~Variant() = default;
  virtual void step(StepTimes& st) = 0;
  virtual Grads grads() = 0;
  virtual nlohmann::json info() const { return nlohmann::json::object(); }
};

// ------------------------------------------------- shared CPU kernels (A) ---
// im2col of one image (stride 1): row r=(c,kh,kw) of P values at col + r*ld.
void im2col(const ConvShape& s, const float* x, float* col, size_t ld) {
  for (int c = 0; c < s.C; ++c)
    for (int kh = 0; kh < s.K; ++kh)
      for (int kw = 0; kw < s.K; ++kw) {
        float* row = col + size_t((c * s.K + kh) * s.K + kw) * ld;
        const int ow0 = std::max(0, s.pad - kw), ow1 = std::min(s.OW, s.W + s.pad - kw);
        for (int oh = 0; oh < s.OH; ++oh) {
          float* r = row + oh * s.OW;
          const int ih = oh + kh - s.pad;
          if (ih < 0 || ih >= s.H || ow0 >= ow1) {
            std::memset(r, 0, sizeof(float) * s.OW);
            continue;
          }
          const float* xr = x + (size_t(c) * s.H + ih) * s.W;
          for (int ow = 0; ow < ow0; ++ow) r[ow] = 0;
          std::memcpy(r + ow0, xr + ow0 + kw - s.pad, sizeof(float) * (ow1 - ow0));
          for (int ow = ow1; ow < s.OW; ++ow) r[ow] = 0;
        }
      }
}
// dx (one image, pre-zeroed) += col2im(col).
void col2im(const ConvShape& s, const float* col, size_t ld, float* dx) {
  for (int c = 0; c < s.C; ++c)
    for (int kh = 0; kh < s.K; ++kh)
      for (int kw = 0; kw < s.K; ++kw) {
        const float* row = col + size_t((c * s.K + kh) * s.K + kw) * ld;
        const int ow0 = std::max(0, s.pad - kw), ow1 = std::min(s.OW, s.W + s.pad - kw);
        for (int oh = 0; oh < s.OH; ++oh) {
          const int ih = oh + kh - s.pad;
          if (ih < 0 || ih >= s.H) continue;
          const float* r = row + oh * s.OW;
          float* xr = dx + (size_t(c) * s.H + ih) * s.W + kw - s.pad;
          for (int ow = ow0; ow < ow1; ++ow) xr[ow] += r[ow];
        }
      }
}
// Transposed im2col of one image: row p=(oh,ow) of CKK values at colT + p*CKK.
void im2colT(const ConvShape& s, const float* x, float* colT) {
  const int CKK = s.CKK();
  for (int oh = 0; oh < s.OH; ++oh)
    for (int ow = 0; ow < s.OW; ++ow) {
      float* row = colT + size_t(oh * s.OW + ow) * CKK;
      for (int c = 0; c < s.C; ++c)
        for (int kh = 0; kh < s.K; ++kh) {
          float* r = row + (c * s.K + kh) * s.K;
          const int ih = oh + kh - s.pad;
          if (ih < 0 || ih >= s.H) {
            for (int kw = 0; kw < s.K; ++kw) r[kw] = 0;
            continue;
          }
          const float* xr = x + (size_t(c) * s.H + ih) * s.W;
          for (int kw = 0; kw < s.K; ++kw) {
            const int iw = ow + kw - s.pad;
            r[kw] = (iw >= 0 && iw < s.W) ? xr[iw] : 0.f;
          }
        }
    }
}
void col2imT(const ConvShape& s, const float* colT, float* dx) {
  const int CKK = s.CKK();
  for (int oh = 0; oh < s.OH; ++oh)
    for (int ow = 0; ow < s.OW; ++ow) {
      const float* row = colT + size_t(oh * s.OW + ow) * CKK;
      for (int c = 0; c < s.C; ++c)
        for (int kh = 0; kh < s.K; ++kh) {
          const int ih = oh + kh - s.pad;
          if (ih < 0 || ih >= s.H) continue;
          const float* r = row + (c * s.K + kh) * s.K;
          float* xr = dx + (size_t(c) * s.H + ih) * s.W;
          for (int kw = 0; kw < s.K; ++kw) {
            const int iw = ow + kw - s.pad;
            if (iw >= 0 && iw < s.W) xr[iw] += r[kw];
          }
        }
    }
}
void reluFwd(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
void reluBwd(const float* x, const float* dy, float* dx, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float d = dy[i];  // loaded unconditionally, so that the loop vectorises
    dx[i] = x[i] > 0.f ? d : 0.f;
  }
}
// 2x2 / stride 2 max pool over NC planes of HxW; idx = argmax in the window
// (first maximum in (kh,kw) order, as oneDNN).
void poolFwd(const float* x, float* y, uint8_t* idx, int NC, int H, int W) {
  const int OH = H / 2, OW = W / 2;
  for (int p = 0; p < NC; ++p)
    for (int oh = 0; oh < OH; ++oh) {
      const float* r0 = x + (size_t(p) * H + 2 * oh) * W;
      const float* r1 = r0 + W;
      float* yr = y + (size_t(p) * OH + oh) * OW;
      uint8_t* ir = idx + (size_t(p) * OH + oh) * OW;
      for (int ow = 0; ow < OW; ++ow) {
        float m = r0[2 * ow];
        uint8_t k = 0;
        if (r0[2 * ow + 1] > m) m = r0[2 * ow + 1], k = 1;
        if (r1[2 * ow] > m) m = r1[2 * ow], k = 2;
        if (r1[2 * ow + 1] > m) m = r1[2 * ow + 1], k = 3;
        yr[ow] = m;
        ir[ow] = k;
      }
    }
}
void poolBwd(const float* dy, const uint8_t* idx, float* dx, int NC, int H, int W) {
  const int OH = H / 2, OW = W / 2;
  std::memset(dx, 0, sizeof(float) * size_t(NC) * H * W);
  for (int p = 0; p < NC; ++p)
    for (int oh = 0; oh < OH; ++oh) {
      float* r = dx + (size_t(p) * H + 2 * oh) * W;
      const float* dyr = dy + (size_t(p) * OH + oh) * OW;
      const uint8_t* ir = idx + (size_t(p) * OH + oh) * OW;
      for (int ow = 0; ow < OW; ++ow)
        r[(ir[ow] >> 1) * W + 2 * ow + (ir[ow] & 1)] = dyr[ow];
    }
}

// ------------------------------------------------------ A: OpenBLAS ---------
enum class BlasMode { Batched, BatchedT, PerImage };

class BlasNet final : public Variant {
 public:
  BlasNet(const Model& m, const Params& p, BlasMode mode) : m_(m), mode_(mode), in_(p) {
    name = mode == BlasMode::Batched    ? "blas-batched"
           : mode == BlasMode::BatchedT ? "blas-batchedT"
                                        : "blas-perimage";
    const int N = m.N;
    w1_ = p.w1;
    b1_ = p.b1;
    w2_ = p.w2;
    b2_ = p.b2;
    bf1_ = p.bf1;
    bf2_ = p.bf2;
    bf3_ = p.bf3;
    const bool T = mode == BlasMode::BatchedT;  // fc weights stored [in][out]
    wf1_ = T ? transpose(p.wf1, 120, 400) : p.wf1;
    wf2_ = T ? transpose(p.wf2, 84, 120) : p.wf2;
    wf3_ = T ? transpose(p.wf3, 10, 84) : p.wf3;
    auto sz = [&](const ConvShape& s) { return size_t(s.CKK()) * N * s.P(); };
    col1_.resize(sz(m.c1));
    col2_.resize(sz(m.c2));
    dcol_.resize(mode == BlasMode::PerImage ? size_t(m.c2.CKK()) * m.c2.P() : sz(m.c2));
    tmp_.resize(std::max(size_t(6) * N * 784, size_t(16) * N * 100));
    a1_.resize(size_t(N) * 6 * 784);
    r1_ = a1_;
    da1_ = a1_;
    dr1_ = a1_;
    p1_.resize(size_t(N) * 6 * 196);
    dp1_ = p1_;
    idx1_.resize(p1_.size());
    a2_.resize(size_t(N) * 16 * 100);
    r2_ = a2_;
    da2_ = a2_;
    dr2_ = a2_;
    p2_.resize(size_t(N) * 400);
    dp2_ = p2_;
    idx2_.resize(p2_.size());
    h1_.resize(size_t(N) * 120);
    dh1_ = h1_;
    dz1_ = h1_;
    h2_.resize(size_t(N) * 84);
    dh2_ = h2_;
    dz2_ = h2_;
    logits_.resize(size_t(N) * 10);
    dw1_.resize(w1_.size());
    db1_.resize(6);
    dw2_.resize(w2_.size());
    db2_.resize(16);
    dwf1_.resize(wf1_.size());
    dbf1_.resize(120);
    dwf2_.resize(wf2_.size());
    dbf2_.resize(84);
    dwf3_.resize(wf3_.size());
    dbf3_.resize(10);
  }

  void step(StepTimes& st) override {
    st.aux.fill(0);
    Stamp s(st);
    const int N = m_.N;
    convFwd(m_.c1, in_.x.data(), w1_, b1_, col1_, a1_.data(), st.aux[C1F]);
    s.mark(C1F);
    reluFwd(a1_.data(), r1_.data(), a1_.size());
    s.mark(R1F);
    poolFwd(r1_.data(), p1_.data(), idx1_.data(), N * 6, 28, 28);
    s.mark(P1F);
    convFwd(m_.c2, p1_.data(), w2_, b2_, col2_, a2_.data(), st.aux[C2F]);
    s.mark(C2F);
    reluFwd(a2_.data(), r2_.data(), a2_.size());
    s.mark(R2F);
    poolFwd(r2_.data(), p2_.data(), idx2_.data(), N * 16, 10, 10);
    s.mark(P2F);
    fcFwd(p2_.data(), wf1_, bf1_, h1_.data(), 400, 120, true, st.aux[F1F]);
    s.mark(F1F);
    fcFwd(h1_.data(), wf2_, bf2_, h2_.data(), 120, 84, true, st.aux[F2F]);
    s.mark(F2F);
    fcFwd(h2_.data(), wf3_, bf3_, logits_.data(), 84, 10, false, st.aux[F3F]);
    s.mark(F3F);

    fcBwd(h2_.data(), wf3_, nullptr, in_.dlogits.data(), nullptr, dwf3_, dbf3_,
          dh2_.data(), 84, 10, st.aux[F3B]);
    s.mark(F3B);
    fcBwd(h1_.data(), wf2_, h2_.data(), dh2_.data(), dz2_.data(), dwf2_, dbf2_,
          dh1_.data(), 120, 84, st.aux[F2B]);
    s.mark(F2B);
    fcBwd(p2_.data(), wf1_, h1_.data(), dh1_.data(), dz1_.data(), dwf1_, dbf1_,
          dp2_.data(), 400, 120, st.aux[F1B]);
    s.mark(F1B);
    poolBwd(dp2_.data(), idx2_.data(), dr2_.data(), N * 16, 10, 10);
    s.mark(P2B);
    reluBwd(a2_.data(), dr2_.data(), da2_.data(), a2_.size());
    s.mark(R2B);
    convBwd(m_.c2, col2_, w2_, da2_.data(), dw2_, db2_, dp1_.data(), st.aux[C2B]);
    s.mark(C2B);
    poolBwd(dp1_.data(), idx1_.data(), dr1_.data(), N * 6, 28, 28);
    s.mark(P1B);
    reluBwd(a1_.data(), dr1_.data(), da1_.data(), a1_.size());
    s.mark(R1B);
    convBwd(m_.c1, col1_, w1_, da1_.data(), dw1_, db1_, nullptr, st.aux[C1B]);
    s.mark(C1B);
  }

  Grads grads() override {
    Grads g;
    const bool T = mode_ == BlasMode::BatchedT;
    g.logits = logits_;
    g.dw1 = dw1_;
    g.db1 = db1_;
    g.dw2 = dw2_;
    g.db2 = db2_;
    g.dwf1 = T ? transpose(dwf1_, 400, 120) : dwf1_;
    g.dwf2 = T ? transpose(dwf2_, 120, 84) : dwf2_;
    g.dwf3 = T ? transpose(dwf3_, 84, 10) : dwf3_;
    g.dbf1 = dbf1_;
    g.dbf2 = dbf2_;
    g.dbf3 = dbf3_;
    return g;
  }

  nlohmann::json info() const override {
    const char* d[] = {
        "conv: col[CKK][N*P] (one im2col for the batch); fwd sgemm NN then permute to "
        "NCHW; "
        "bwd permute dY, dW sgemm NT (K=N*P), dcol sgemm TN, col2im; fc W[out][in]: "
        "fwd NT, dW TN, dX NN",
        "conv: colT[N*P][CKK]; fwd sgemm NT then transpose to NCHW; bwd transpose dY, "
        "dW sgemm TN (K=N*P), dcolT sgemm NN, col2imT; fc W[in][out]: fwd NN, dW TN, dX "
        "NT",
        "conv: per image col[CKK][P]; fwd sgemm NN straight into NCHW; bwd dW += sgemm "
        "NT "
        "per image, dcol sgemm TN + col2im per image; fc W[out][in]: fwd NT, dW TN, dX "
        "NN"};
    return {{"layout", d[int(mode_)]}, {"aux", "sgemm time"}};
  }

 private:
  static std::vector<float> transpose(const std::vector<float>& a, int rows, int cols) {
    std::vector<float> t(a.size());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) t[size_t(c) * rows + r] = a[size_t(r) * cols + c];
    return t;
  }
  template <class F>
  static void gemmTimed(double& acc, F&& f) {
    auxTimed(acc, f);
  }

  void convFwd(const ConvShape& s, const float* x, const std::vector<float>& w,
               const std::vector<float>& b, std::vector<float>& col, float* y,
               double& g) {
    const int N = s.N, P = s.P(), CKK = s.CKK(), OC = s.OC;
    const size_t NP = size_t(N) * P, xs = size_t(s.C) * s.H * s.W;
    switch (mode_) {
      case BlasMode::Batched: {
        for (int n = 0; n < N; ++n) im2col(s, x + n * xs, col.data() + size_t(n) * P, NP);
        float* yt = tmp_.data();  // [OC][N*P]
        gemmTimed(g, [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, NP, CKK, 1.f,
                      w.data(), CKK, col.data(), NP, 0.f, yt, NP);
        });
        for (int n = 0; n < N; ++n)
          for (int oc = 0; oc < OC; ++oc) {
            const float* src = yt + size_t(oc) * NP + size_t(n) * P;
            float* dst = y + (size_t(n) * OC + oc) * P;
            const float bb = b[oc];
            for (int p = 0; p < P; ++p) dst[p] = src[p] + bb;
          }
        break;
      }
      case BlasMode::BatchedT: {
        for (int n = 0; n < N; ++n)
          im2colT(s, x + n * xs, col.data() + size_t(n) * P * CKK);
        float* yt = tmp_.data();  // [N*P][OC]
        gemmTimed(g, [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, NP, OC, CKK, 1.f,
                      col.data(), CKK, w.data(), CKK, 0.f, yt, OC);
        });
        for (int n = 0; n < N; ++n)
          for (int oc = 0; oc < OC; ++oc) {
            const float* src = yt + size_t(n) * P * OC + oc;
            float* dst = y + (size_t(n) * OC + oc) * P;
            const float bb = b[oc];
            for (int p = 0; p < P; ++p) dst[p] = src[size_t(p) * OC] + bb;
          }
        break;
      }
      case BlasMode::PerImage: {
        for (int n = 0; n < N; ++n) {
          float* cn = col.data() + size_t(n) * CKK * P;
          im2col(s, x + n * xs, cn, P);
          float* yn = y + size_t(n) * OC * P;
          gemmTimed(g, [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, OC, P, CKK, 1.f,
                        w.data(), CKK, cn, P, 0.f, yn, P);
          });
          for (int oc = 0; oc < OC; ++oc) {
            float* r = yn + size_t(oc) * P;
            const float bb = b[oc];
            for (int p = 0; p < P; ++p) r[p] += bb;
          }
        }
        break;
      }
    }
  }

  // dy: NCHW gradient of the conv output; col: saved from the forward pass.
  void convBwd(const ConvShape& s, const std::vector<float>& col,
               const std::vector<float>& w, const float* dy, std::vector<float>& dw,
               std::vector<float>& db, float* dx, double& g) {
    const int N = s.N, P = s.P(), CKK = s.CKK(), OC = s.OC;
    const size_t NP = size_t(N) * P, xs = size_t(s.C) * s.H * s.W;
    std::fill(db.begin(), db.end(), 0.f);
    for (int n = 0; n < N; ++n)
      for (int oc = 0; oc < OC; ++oc) {
        const float* r = dy + (size_t(n) * OC + oc) * P;
        float acc = 0;
        for (int p = 0; p < P; ++p) acc += r[p];
        db[oc] += acc;
      }
    if (dx) std::memset(dx, 0, sizeof(float) * N * xs);
    switch (mode_) {
      case BlasMode::Batched: {
        float* dyt = tmp_.data();  // [OC][N*P]
        for (int n = 0; n < N; ++n)
          for (int oc = 0; oc < OC; ++oc)
            std::memcpy(dyt + size_t(oc) * NP + size_t(n) * P,
                        dy + (size_t(n) * OC + oc) * P, sizeof(float) * P);
        gemmTimed(g, [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, CKK, NP, 1.f, dyt, NP,
                      col.data(), NP, 0.f, dw.data(), CKK);
        });
        if (!dx) break;
        gemmTimed(g, [&] {
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CKK, NP, OC, 1.f, w.data(),
                      CKK, dyt, NP, 0.f, dcol_.data(), NP);
        });
        for (int n = 0; n < N; ++n)
          col2im(s, dcol_.data() + size_t(n) * P, NP, dx + n * xs);
        break;
      }
      case BlasMode::BatchedT: {
        float* dyt = tmp_.data();  // [N*P][OC]
        for (int n = 0; n < N; ++n)
          for (int oc = 0; oc < OC; ++oc) {
            const float* src = dy + (size_t(n) * OC + oc) * P;
            float* dst = dyt + size_t(n) * P * OC + oc;
            for (int p = 0; p < P; ++p) dst[size_t(p) * OC] = src[p];
          }
        gemmTimed(g, [&] {
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, CKK, NP, 1.f, dyt, OC,
                      col.data(), CKK, 0.f, dw.data(), CKK);
        });
        if (!dx) break;
        gemmTimed(g, [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, NP, CKK, OC, 1.f, dyt,
                      OC, w.data(), CKK, 0.f, dcol_.data(), CKK);
        });
        for (int n = 0; n < N; ++n)
          col2imT(s, dcol_.data() + size_t(n) * P * CKK, dx + n * xs);
        break;
      }
      case BlasMode::PerImage: {
        for (int n = 0; n < N; ++n) {
          const float* cn = col.data() + size_t(n) * CKK * P;
          const float* dyn = dy + size_t(n) * OC * P;
          gemmTimed(g, [&] {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, OC, CKK, P, 1.f, dyn, P,
                        cn, P, n ? 1.f : 0.f, dw.data(), CKK);
          });
          if (!dx) continue;
          gemmTimed(g, [&] {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, CKK, P, OC, 1.f,
                        w.data(), CKK, dyn, P, 0.f, dcol_.data(), P);
          });
          col2im(s, dcol_.data(), P, dx + n * xs);
        }
        break;
      }
    }
  }

  // y = act(x W^T + b); W is [out][in] (or [in][out] in BatchedT).
  void fcFwd(const float* x, const std::vector<float>& w, const std::vector<float>& b,
             float* y, int in, int out, bool relu, double& g) {
    const int N = m_.N;
    gemmTimed(g, [&] {
      if (mode_ == BlasMode::BatchedT)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, out, in, 1.f, x, in,
                    w.data(), out, 0.f, y, out);
      else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, out, in, 1.f, x, in,
                    w.data(), in, 0.f, y, out);
    });
    for (int n = 0; n < N; ++n) {
      float* r = y + size_t(n) * out;
      for (int o = 0; o < out; ++o) {
        const float v = r[o] + b[o];
        r[o] = relu && v < 0.f ? 0.f : v;
      }
    }
  }
  // y: the (relu'd) output if the layer has a relu, else null; dy: gradient of y.
  void fcBwd(const float* x, const std::vector<float>& w, const float* y, const float* dy,
             float* dz, std::vector<float>& dw, std::vector<float>& db, float* dx, int in,
             int out, double& g) {
    const int N = m_.N;
    if (y) {
      reluBwd(y, dy, dz, size_t(N) * out);
      dy = dz;
    }
    std::fill(db.begin(), db.end(), 0.f);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < out; ++o) db[o] += dy[size_t(n) * out + o];
    gemmTimed(g, [&] {
      if (mode_ == BlasMode::BatchedT) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, N, 1.f, x, in, dy,
                    out, 0.f, dw.data(), out);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, in, out, 1.f, dy, out,
                    w.data(), out, 0.f, dx, in);
      } else {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, N, 1.f, dy, out, x,
                    in, 0.f, dw.data(), in);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, in, out, 1.f, dy, out,
                    w.data(), in, 0.f, dx, in);
      }
    });
  }

  const Model& m_;
  BlasMode mode_;
  const Params& in_;
  std::vector<float> w1_, b1_, w2_, b2_, wf1_, bf1_, wf2_, bf2_, wf3_, bf3_;
  std::vector<float> col1_, col2_, dcol_, tmp_;
  std::vector<float> a1_, r1_, da1_, dr1_, p1_, dp1_, a2_, r2_, da2_, dr2_, p2_, dp2_;
  std::vector<uint8_t> idx1_, idx2_;
  std::vector<float> h1_, dh1_, dz1_, h2_, dh2_, dz2_, logits_;
  std::vector<float> dw1_, db1_, dw2_, db2_, dwf1_, dbf1_, dwf2_, dbf2_, dwf3_, dbf3_;
};

// -------------------------------------------------------- B: oneDNN ---------
using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;
// A oneDNN configuration: the activation layout of the convolutions (any:
// oneDNN's choice; nchw; nhwc), whether weights are forced to plain OIHW, and
// whether the layouts are kept between layers (keep: reorders only where two
// primitives disagree; master weights live in oneDNN's layout) or every layer
// boundary and master weight is plain NCHW / OIHW (reorders around each conv).
struct DCfg {
  const char* name;
  tag act;
  bool plainWei, keep,
      ops;  // ops: relu/pool as oneDNN primitives (else hand-written NCHW)
};
const DCfg kDCfgs[] = {
    {"dnnl-any", tag::any, false, false, false},
    {"dnnl-nhwc", tag::nhwc, false, false, false},
    {"dnnl-plain", tag::nchw, true, false, false},
    {"dnnl-blocked", tag::any, false, true, true},
    {"dnnl-nhwc-e2e", tag::nhwc, false, true, true},
    {"dnnl-any-ops", tag::any, false, false, true},
    {"dnnl-nhwc-ops", tag::nhwc, false, false, true},
};

// oneDNN-style format string: outer dims by decreasing stride, then inner
// blocks ("abcd" = nchw/oihw, "aBcd8b" = nChw8c, "ABcd8b8a" = OIhw8i8o, ...).
std::string fmtStr(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked) return "?";
  const auto& b = d.format_desc.blocking;
  std::vector<int> order(d.ndims);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int i, int j) { return b.strides[i] > b.strides[j]; });
  std::vector<bool> blocked(d.ndims, false);
  for (int i = 0; i < b.inner_nblks; ++i) blocked[b.inner_idxs[i]] = true;
  std::string s;
  for (int i : order) s += char((blocked[i] ? 'A' : 'a') + i);
  for (int i = 0; i < b.inner_nblks; ++i)
    s += std::to_string(b.inner_blks[i]) + char('a' + b.inner_idxs[i]);
  return s;
}

memory::desc plainDesc(const memory::dims& d) {
  return memory::desc(d, dt::f32,
                      d.size() == 4   ? tag::abcd
                      : d.size() == 2 ? tag::ab
                                      : tag::a);
}
memory userMem(const memory::dims& d, const dnnl::engine& eng, const float* data) {
  memory m(plainDesc(d), eng);
  std::memcpy(m.get_data_handle(), data, m.get_desc().get_size());
  return m;
}
std::vector<float> toPlain(const memory& m, const memory::dims& d,
                           const dnnl::engine& eng, dnnl::stream& s) {
  memory p(plainDesc(d), eng);
  memory src = m;
  dnnl::reorder(src, p).execute(s, src, p);
  s.wait();
  const float* f = static_cast<const float*>(p.get_data_handle());
  return std::vector<float>(f, f + p.get_desc().get_size() / sizeof(float));
}

// `from` as `want`: a no-op when the descriptors agree, else a timed reorder
// into a buffer of its own.
struct Reo {
  bool needed = false;
  memory src, dst;
  dnnl::reorder prim;
  void init(const memory& from, const memory::desc& want, const dnnl::engine& eng) {
    src = from;
    needed = !(from.get_desc() == want);
    dst = needed ? memory(want, eng) : from;
    if (needed) prim = dnnl::reorder(src, dst);
  }
  memory& run(dnnl::stream& s, double& acc) {
    if (needed) auxTimed(acc, [&] { prim.execute(s, src, dst); });
    return dst;
  }
};

struct DCtx {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream s{eng};
  DCfg cfg;
  nlohmann::json info = nlohmann::json::object();
  int reorders = 0;  // reorders executed per step
  void count(const Reo& r) { reorders += r.needed; }
  memory::desc want(
      const memory::dims& d) const {  // layout for a descriptor's free tensor
    return cfg.plainWei ? plainDesc(d) : memory::desc(d, dt::f32, tag::any);
  }
  memory::desc act(const memory::dims& d) const {  // conv src / dst
    return memory::desc(d, dt::f32, cfg.act);
  }
  memory::desc boundary(const memory::desc& produced) const {  // layout between layers
    return cfg.keep ? produced : plainDesc(produced.dims());
  }
};

struct DConv {
  ConvShape sh;
  bool needDx = false;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_weights bww;
  dnnl::convolution_backward_data bwd;
  memory w, b, dw, db, dwRaw, y, out, dx, dxOut;
  Reo inR, wfR, outR, srcWR, ddWR, ddDR, wdR, dwR, dxR;

  void setup(DCtx& c, const char* name, const ConvShape& s, bool need_dx,
             const memory& in, const float* w0, const float* b0) {
    sh = s;
    needDx = need_dx;
    const memory::dims sd{s.N, s.C, s.H, s.W}, wd{s.OC, s.C, s.K, s.K}, bd{s.OC},
        dd{s.N, s.OC, s.OH, s.OW}, st{1, 1}, pad{s.pad, s.pad};
    const auto srcMd = c.act(sd), wMd = c.want(wd), dstMd = c.act(dd),
               bMd = plainDesc(bd);
    using namespace dnnl;
    convolution_forward::primitive_desc fpd(
        {prop_kind::forward_training, algorithm::convolution_direct, srcMd, wMd, bMd,
         dstMd, st, pad, pad},
        c.eng);
    convolution_backward_weights::primitive_desc wpd(
        {algorithm::convolution_direct, srcMd, wMd, bMd, dstMd, st, pad, pad}, c.eng,
        fpd);
    fwd = convolution_forward(fpd);
    bww = convolution_backward_weights(wpd);
    memory wPlain = userMem(wd, c.eng, w0);
    if (c.cfg.keep) {  // master weights kept in the forward's layout
      w = memory(fpd.weights_desc(), c.eng);
      reorder(wPlain, w).execute(c.s, wPlain, w);
      c.s.wait();
    } else {
      w = wPlain;
    }
    b = userMem(bd, c.eng, b0);
    inR.init(in, fpd.src_desc(), c.eng);
    wfR.init(w, fpd.weights_desc(), c.eng);
    y = memory(fpd.dst_desc(), c.eng);
    outR.init(y, c.boundary(fpd.dst_desc()), c.eng);
    out = outR.dst;
    srcWR.init(inR.dst, wpd.src_desc(), c.eng);
    dwRaw = memory(wpd.diff_weights_desc(), c.eng);
    dwR.init(dwRaw, w.get_desc(), c.eng);  // the optimizer updates w with dw
    dw = dwR.dst;
    db = memory(wpd.diff_bias_desc(), c.eng);
    nlohmann::json j = {{"fwd",
                         {{"impl", fpd.impl_info_str()},
                          {"src", fmtStr(fpd.src_desc())},
                          {"wei", fmtStr(fpd.weights_desc())},
                          {"dst", fmtStr(fpd.dst_desc())}}},
                        {"bwd_w",
                         {{"impl", wpd.impl_info_str()},
                          {"src", fmtStr(wpd.src_desc())},
                          {"diff_wei", fmtStr(wpd.diff_weights_desc())},
                          {"diff_dst", fmtStr(wpd.diff_dst_desc())}}}};
    if (needDx) {
      convolution_backward_data::primitive_desc dpd(
          {algorithm::convolution_direct, srcMd, wMd, dstMd, st, pad, pad}, c.eng, fpd);
      bwd = convolution_backward_data(dpd);
      wdR.init(wfR.dst, dpd.weights_desc(), c.eng);
      dx = memory(dpd.diff_src_desc(), c.eng);
      dxR.init(dx, c.boundary(dpd.diff_src_desc()), c.eng);
      dxOut = dxR.dst;
      ddD_ = dpd.diff_dst_desc();
      j["bwd_d"] = {{"impl", dpd.impl_info_str()},
                    {"wei", fmtStr(dpd.weights_desc())},
                    {"diff_dst", fmtStr(dpd.diff_dst_desc())},
                    {"diff_src", fmtStr(dpd.diff_src_desc())}};
    }
    ddW_ = wpd.diff_dst_desc();
    c.info[name] = j;
    for (const Reo* r : {&inR, &wfR, &outR, &srcWR, &dwR, &wdR, &dxR}) c.count(*r);
  }
  void bindBwd(DCtx& c, const memory& ddst) {
    ddWR.init(ddst, ddW_, c.eng);
    if (needDx) ddDR.init(ddWR.dst.get_desc() == ddD_ ? ddWR.dst : ddst, ddD_, c.eng);
    c.count(ddWR);
    c.count(ddDR);
  }
  void forward(dnnl::stream& s, double& reo) {
    memory& x = inR.run(s, reo);
    memory& wf = wfR.run(s, reo);
    fwd.execute(s, {{DNNL_ARG_SRC, x},
                    {DNNL_ARG_WEIGHTS, wf},
                    {DNNL_ARG_BIAS, b},
                    {DNNL_ARG_DST, y}});
    outR.run(s, reo);
  }
  void backward(dnnl::stream& s, double& reo) {
    memory& dd = ddWR.run(s, reo);
    memory& x = srcWR.run(s, reo);
    bww.execute(s, {{DNNL_ARG_SRC, x},
                    {DNNL_ARG_DIFF_DST, dd},
                    {DNNL_ARG_DIFF_WEIGHTS, dwRaw},
                    {DNNL_ARG_DIFF_BIAS, db}});
    dwR.run(s, reo);
    if (!needDx) return;
    memory& dd2 = ddDR.run(s, reo);
    memory& wd = wdR.run(s, reo);
    bwd.execute(
        s, {{DNNL_ARG_DIFF_DST, dd2}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dx}});
    dxR.run(s, reo);
  }

 private:
  memory::desc ddW_, ddD_;
};

float* ptr(const memory& m) { return static_cast<float*>(m.get_data_handle()); }
size_t numel(const memory& m) { return m.get_desc().get_size() / sizeof(float); }

// relu and max-pool: oneDNN primitives, or (hand) the NCHW loops the OpenBLAS
// variants use, which is what a plain-tensor trainer would call around oneDNN convs.
struct DRelu {
  bool hand = false;
  dnnl::eltwise_forward fwd;
  dnnl::eltwise_backward bwd;
  memory in, out, dxOut;
  Reo ddR;
  memory::desc dd_;
  void setup(DCtx& c, const char* name, const memory& x, bool hand_written) {
    using namespace dnnl;
    in = x;
    hand = hand_written;
    if (hand) {
      out = memory(x.get_desc(), c.eng);
      dxOut = memory(x.get_desc(), c.eng);
      dd_ = x.get_desc();
      c.info[name] = "hand-written NCHW loop";
      return;
    }
    eltwise_forward::primitive_desc fpd(
        {prop_kind::forward_training, algorithm::eltwise_relu, x.get_desc(), 0.f, 0.f},
        c.eng);
    eltwise_backward::primitive_desc bpd(
        {algorithm::eltwise_relu, x.get_desc(), x.get_desc(), 0.f, 0.f}, c.eng, fpd);
    fwd = eltwise_forward(fpd);
    bwd = eltwise_backward(bpd);
    out = memory(fpd.dst_desc(), c.eng);
    dxOut = memory(bpd.diff_src_desc(), c.eng);
    dd_ = bpd.diff_dst_desc();
    c.info[name] = {{"fwd", fpd.impl_info_str()},
                    {"bwd", bpd.impl_info_str()},
                    {"fmt", fmtStr(x.get_desc())}};
  }
  void bindBwd(DCtx& c, const memory& ddst) {
    ddR.init(ddst, dd_, c.eng);
    c.count(ddR);
  }
  void forward(dnnl::stream& s) {
    if (hand) return reluFwd(ptr(in), ptr(out), numel(in));
    fwd.execute(s, {{DNNL_ARG_SRC, in}, {DNNL_ARG_DST, out}});
  }
  void backward(dnnl::stream& s, double& reo) {
    memory& dd = ddR.run(s, reo);
    if (hand) return reluBwd(ptr(in), ptr(dd), ptr(dxOut), numel(in));
    bwd.execute(
        s, {{DNNL_ARG_SRC, in}, {DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_SRC, dxOut}});
  }
};

struct DPool {
  bool hand = false;
  int NC = 0, H = 0, W = 0;
  std::vector<uint8_t> idx;
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward bwd;
  memory in, out, ws, dxOut;
  Reo ddR;
  memory::desc dd_;
  void setup(DCtx& c, const char* name, const memory& x, bool hand_written) {
    using namespace dnnl;
    in = x;
    hand = hand_written;
    const auto d = x.get_desc().dims();
    const memory::dims od{d[0], d[1], d[2] / 2, d[3] / 2}, k{2, 2}, z{0, 0};
    if (hand) {
      NC = int(d[0] * d[1]), H = int(d[2]), W = int(d[3]);
      out = memory(plainDesc(od), c.eng);
      idx.resize(numel(out));
      dxOut = memory(x.get_desc(), c.eng);
      dd_ = plainDesc(od);
      c.info[name] = "hand-written NCHW loop";
      return;
    }
    const memory::desc dstMd =
        c.cfg.keep ? memory::desc(od, dt::f32, tag::any) : plainDesc(od);
    pooling_forward::primitive_desc fpd(
        {prop_kind::forward_training, algorithm::pooling_max, x.get_desc(), dstMd, k, k,
         z, z},
        c.eng);
    pooling_backward::primitive_desc bpd(
        {algorithm::pooling_max, x.get_desc(), fpd.dst_desc(), k, k, z, z}, c.eng, fpd);
    fwd = pooling_forward(fpd);
    bwd = pooling_backward(bpd);
    out = memory(fpd.dst_desc(), c.eng);
    ws = memory(fpd.workspace_desc(), c.eng);
    dxOut = memory(bpd.diff_src_desc(), c.eng);
    dd_ = bpd.diff_dst_desc();
    c.info[name] = {{"fwd", fpd.impl_info_str()},
                    {"bwd", bpd.impl_info_str()},
                    {"fmt", fmtStr(x.get_desc())}};
  }
  void bindBwd(DCtx& c, const memory& ddst) {
    ddR.init(ddst, dd_, c.eng);
    c.count(ddR);
  }
  void forward(dnnl::stream& s) {
    if (hand) return poolFwd(ptr(in), ptr(out), idx.data(), NC, H, W);
    fwd.execute(s, {{DNNL_ARG_SRC, in}, {DNNL_ARG_DST, out}, {DNNL_ARG_WORKSPACE, ws}});
  }
  void backward(dnnl::stream& s, double& reo) {
    memory& dd = ddR.run(s, reo);
    if (hand) return poolBwd(ptr(dd), idx.data(), ptr(dxOut), NC, H, W);
    bwd.execute(
        s,
        {{DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_SRC, dxOut}, {DNNL_ARG_WORKSPACE, ws}});
  }
};

// Inner product, relu fused into the forward as a post-op; its backward is an
// eltwise relu_use_dst_for_bwd.
struct DFc {
  bool relu = false;
  dnnl::inner_product_forward fwd;
  dnnl::inner_product_backward_data bwd;
  dnnl::inner_product_backward_weights bww;
  dnnl::eltwise_backward rbwd;
  memory w, b, dw, db, dwRaw, y, dz, dx;
  memory::dims wDims;
  Reo inR, wfR, wdR, srcWR, ddR, dwR;
  memory::desc dd_;

  // in: the layer input (2D nc, or 4D in whatever layout the pool left it).
  void setup(DCtx& c, const char* name, const memory& in, int out, bool has_relu,
             const float* w0, const float* b0) {
    using namespace dnnl;
    relu = has_relu;
    const auto sd = in.get_desc().dims();
    const memory::dim N = sd[0];
    wDims = sd;
    wDims[0] = out;
    const memory::desc srcMd = c.cfg.plainWei ? plainDesc(sd)
                               : sd.size() == 4
                                   ? in.get_desc()  // Blocked: keep the pool's layout
                                   : memory::desc(sd, dt::f32, tag::any);
    // Weights as oneDNN likes them when layouts are kept, else plain [out][in].
    const memory::desc wMd = c.cfg.keep ? c.want(wDims) : plainDesc(wDims);
    const memory::desc bMd = plainDesc({out}), dMd = plainDesc({N, out});
    post_ops po;
    if (relu) po.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
    primitive_attr attr;
    attr.set_post_ops(po);
    inner_product_forward::primitive_desc fpd(
        {prop_kind::forward_training, srcMd, wMd, bMd, dMd}, attr, c.eng);
    inner_product_backward_data::primitive_desc dpd({srcMd, wMd, dMd}, c.eng, fpd);
    inner_product_backward_weights::primitive_desc wpd({srcMd, wMd, bMd, dMd}, c.eng,
                                                       fpd);
    fwd = inner_product_forward(fpd);
    bwd = inner_product_backward_data(dpd);
    bww = inner_product_backward_weights(wpd);
    memory wPlain = userMem(wDims, c.eng, w0);
    if (c.cfg.keep) {
      w = memory(fpd.weights_desc(), c.eng);
      reorder(wPlain, w).execute(c.s, wPlain, w);
      c.s.wait();
    } else {
      w = wPlain;
    }
    b = userMem({out}, c.eng, b0);
    inR.init(in, fpd.src_desc(), c.eng);
    wfR.init(w, fpd.weights_desc(), c.eng);
    wdR.init(wfR.dst, dpd.weights_desc(), c.eng);
    srcWR.init(inR.dst, wpd.src_desc(), c.eng);
    y = memory(fpd.dst_desc(), c.eng);
    dz = memory(dpd.diff_dst_desc(), c.eng);
    dd_ = dpd.diff_dst_desc();
    dx = memory(dpd.diff_src_desc(), c.eng);
    dwRaw = memory(wpd.diff_weights_desc(), c.eng);
    dwR.init(dwRaw, w.get_desc(), c.eng);
    dw = dwR.dst;
    db = memory(wpd.diff_bias_desc(), c.eng);
    if (relu) {
      eltwise_forward::primitive_desc hint(
          {prop_kind::forward_training, algorithm::eltwise_relu_use_dst_for_bwd,
           y.get_desc(), 0.f, 0.f},
          c.eng);
      rbwd = eltwise_backward(eltwise_backward::primitive_desc(
          {algorithm::eltwise_relu_use_dst_for_bwd, dd_, y.get_desc(), 0.f, 0.f}, c.eng,
          hint));
    }
    c.info[name] = {
        {"fwd",
         {{"impl", fpd.impl_info_str()},
          {"src", fmtStr(fpd.src_desc())},
          {"wei", fmtStr(fpd.weights_desc())}}},
        {"bwd_d",
         {{"impl", dpd.impl_info_str()},
          {"wei", fmtStr(dpd.weights_desc())},
          {"diff_src", fmtStr(dpd.diff_src_desc())}}},
        {"bwd_w",
         {{"impl", wpd.impl_info_str()}, {"diff_wei", fmtStr(wpd.diff_weights_desc())}}}};
    for (const Reo* r : {&inR, &wfR, &wdR, &srcWR, &dwR}) c.count(*r);
  }
  void bindBwd(DCtx& c, const memory& ddst) {
    ddR.init(ddst, relu ? y.get_desc() : dd_, c.eng);
    c.count(ddR);
  }
  void forward(dnnl::stream& s, double& reo) {
    memory& x = inR.run(s, reo);
    memory& wf = wfR.run(s, reo);
    fwd.execute(s, {{DNNL_ARG_SRC, x},
                    {DNNL_ARG_WEIGHTS, wf},
                    {DNNL_ARG_BIAS, b},
                    {DNNL_ARG_DST, y}});
  }
  void backward(dnnl::stream& s, double& reo) {
    memory& dd = ddR.run(s, reo);
    memory g = dd;
    if (relu) {
      rbwd.execute(s,
                   {{DNNL_ARG_DST, y}, {DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_DIFF_SRC, dz}});
      g = dz;
    }
    memory& wd = wdR.run(s, reo);
    bwd.execute(
        s, {{DNNL_ARG_DIFF_DST, g}, {DNNL_ARG_WEIGHTS, wd}, {DNNL_ARG_DIFF_SRC, dx}});
    memory& x = srcWR.run(s, reo);
    bww.execute(s, {{DNNL_ARG_SRC, x},
                    {DNNL_ARG_DIFF_DST, g},
                    {DNNL_ARG_DIFF_WEIGHTS, dwRaw},
                    {DNNL_ARG_DIFF_BIAS, db}});
    dwR.run(s, reo);
  }
};

// Same memory under another plain shape (2D nc <-> 4D nchw flatten).
memory view(const memory& m, const memory::dims& d, const dnnl::engine& eng) {
  return memory(plainDesc(d), eng, m.get_data_handle());
}

class DnnlNet final : public Variant {
 public:
  // dnnl_ops: relu and pooling as oneDNN primitives too (always so when Blocked).
  DnnlNet(const Model& m, const Params& p, const DCfg& cfg) : m_(m) {
    name = cfg.name;
    c_.cfg = cfg;
    const bool dnnl_ops = cfg.ops;
    const double t0 = now(), tc0 = threadCpuNow();
    const auto& e = c_.eng;
    const memory::dim N = m.N;
    x_ = memory(plainDesc({N, 1, 28, 28}), e, const_cast<float*>(p.x.data()));
    dl_ = memory(plainDesc({N, 10}), e, const_cast<float*>(p.dlogits.data()));
    conv1_.setup(c_, "conv1", m.c1, false, x_, p.w1.data(), p.b1.data());
    relu1_.setup(c_, "relu1", conv1_.out, !dnnl_ops);
    pool1_.setup(c_, "pool1", relu1_.out, !dnnl_ops);
    conv2_.setup(c_, "conv2", m.c2, true, pool1_.out, p.w2.data(), p.b2.data());
    relu2_.setup(c_, "relu2", conv2_.out, !dnnl_ops);
    pool2_.setup(c_, "pool2", relu2_.out, !dnnl_ops);
    const bool blocked = cfg.keep;
    const memory fc1in = blocked ? pool2_.out : view(pool2_.out, {N, 400}, e);
    fc1_.setup(c_, "fc1", fc1in, 120, true, p.wf1.data(), p.bf1.data());
    fc2_.setup(c_, "fc2", fc1_.y, 84, true, p.wf2.data(), p.bf2.data());
    fc3_.setup(c_, "fc3", fc2_.y, 10, false, p.wf3.data(), p.bf3.data());
    fc3_.bindBwd(c_, dl_);
    fc2_.bindBwd(c_, fc3_.dx);
    fc1_.bindBwd(c_, fc2_.dx);
    pool2_.bindBwd(c_, blocked ? fc1_.dx : view(fc1_.dx, {N, 16, 5, 5}, e));
    relu2_.bindBwd(c_, pool2_.dxOut);
    conv2_.bindBwd(c_, relu2_.dxOut);
    pool1_.bindBwd(c_, conv2_.dxOut);
    relu1_.bindBwd(c_, pool1_.dxOut);
    conv1_.bindBwd(c_, relu1_.dxOut);
    setupUs_ = (now() - t0) * 1e6;
    setupCpuUs_ = (threadCpuNow() - tc0) * 1e6;
  }
  double setupUs() const { return setupUs_; }
  double setupCpuUs() const { return setupCpuUs_; }

  void step(StepTimes& st) override {
    st.aux.fill(0);
    auto& s = c_.s;
    Stamp t(st);
    conv1_.forward(s, st.aux[C1F]);
    t.mark(C1F);
    relu1_.forward(s);
    t.mark(R1F);
    pool1_.forward(s);
    t.mark(P1F);
    conv2_.forward(s, st.aux[C2F]);
    t.mark(C2F);
    relu2_.forward(s);
    t.mark(R2F);
    pool2_.forward(s);
    t.mark(P2F);
    fc1_.forward(s, st.aux[F1F]);
    t.mark(F1F);
    fc2_.forward(s, st.aux[F2F]);
    t.mark(F2F);
    fc3_.forward(s, st.aux[F3F]);
    t.mark(F3F);
    fc3_.backward(s, st.aux[F3B]);
    t.mark(F3B);
    fc2_.backward(s, st.aux[F2B]);
    t.mark(F2B);
    fc1_.backward(s, st.aux[F1B]);
    t.mark(F1B);
    pool2_.backward(s, st.aux[P2B]);
    t.mark(P2B);
    relu2_.backward(s, st.aux[R2B]);
    t.mark(R2B);
    conv2_.backward(s, st.aux[C2B]);
    t.mark(C2B);
    pool1_.backward(s, st.aux[P1B]);
    t.mark(P1B);
    relu1_.backward(s, st.aux[R1B]);
    t.mark(R1B);
    conv1_.backward(s, st.aux[C1B]);
    s.wait();
    t.mark(C1B);
  }

  Grads grads() override {
    auto& e = c_.eng;
    auto& s = c_.s;
    const memory::dim N = m_.N;
    Grads g;
    g.logits = toPlain(fc3_.y, {N, 10}, e, s);
    g.dw1 = toPlain(conv1_.dw, {6, 1, 5, 5}, e, s);
    g.db1 = toPlain(conv1_.db, {6}, e, s);
    g.dw2 = toPlain(conv2_.dw, {16, 6, 5, 5}, e, s);
    g.db2 = toPlain(conv2_.db, {16}, e, s);
    g.dwf1 = toPlain(fc1_.dw, fc1_.wDims, e, s);
    g.dbf1 = toPlain(fc1_.db, {120}, e, s);
    g.dwf2 = toPlain(fc2_.dw, {84, 120}, e, s);
    g.dbf2 = toPlain(fc2_.db, {84}, e, s);
    g.dwf3 = toPlain(fc3_.dw, {10, 84}, e, s);
    g.dbf3 = toPlain(fc3_.db, {10}, e, s);
    return g;
  }

  nlohmann::json info() const override {
    nlohmann::json j = c_.info;
    j["reorders_per_step"] = c_.reorders;
    j["aux"] = "reorder time";
    return j;
  }

 private:
  const Model& m_;
  DCtx c_;
  memory x_, dl_;
  DConv conv1_, conv2_;
  DRelu relu1_, relu2_;
  DPool pool1_, pool2_;
  DFc fc1_, fc2_, fc3_;
  double setupUs_ = 0, setupCpuUs_ = 0;
};

// ----------------------------------------------------- double reference ---
std::vector<double> toD(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<float> toF(const std::vector<double>& v) { return {v.begin(), v.end()}; }

void refConvFwd(const ConvShape& s, const std::vector<double>& x,
                const std::vector<double>& w, const std::vector<double>& b,
                std::vector<double>& y) {
  y.assign(size_t(s.N) * s.OC * s.P(), 0);
  for (int n = 0; n < s.N; ++n)
    for (int oc = 0; oc < s.OC; ++oc)
      for (int oh = 0; oh < s.OH; ++oh)
        for (int ow = 0; ow < s.OW; ++ow) {
          double acc = b[oc];
          for (int c = 0; c < s.C; ++c)
            for (int kh = 0; kh < s.K; ++kh)
              for (int kw = 0; kw < s.K; ++kw) {
                const int ih = oh + kh - s.pad, iw = ow + kw - s.pad;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                acc += x[((size_t(n) * s.C + c) * s.H + ih) * s.W + iw] *
                       w[((size_t(oc) * s.C + c) * s.K + kh) * s.K + kw];
              }
          y[((size_t(n) * s.OC + oc) * s.OH + oh) * s.OW + ow] = acc;
        }
}
void refConvBwd(const ConvShape& s, const std::vector<double>& x,
                const std::vector<double>& w, const std::vector<double>& dy,
                std::vector<double>& dw, std::vector<double>& db,
                std::vector<double>* dx) {
  dw.assign(w.size(), 0);
  db.assign(s.OC, 0);
  if (dx) dx->assign(x.size(), 0);
  for (int n = 0; n < s.N; ++n)
    for (int oc = 0; oc < s.OC; ++oc)
      for (int oh = 0; oh < s.OH; ++oh)
        for (int ow = 0; ow < s.OW; ++ow) {
          const double g = dy[((size_t(n) * s.OC + oc) * s.OH + oh) * s.OW + ow];
          db[oc] += g;
          for (int c = 0; c < s.C; ++c)
            for (int kh = 0; kh < s.K; ++kh)
              for (int kw = 0; kw < s.K; ++kw) {
                const int ih = oh + kh - s.pad, iw = ow + kw - s.pad;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                const size_t xi = ((size_t(n) * s.C + c) * s.H + ih) * s.W + iw;
                const size_t wi = ((size_t(oc) * s.C + c) * s.K + kh) * s.K + kw;
                dw[wi] += g * x[xi];
                if (dx) (*dx)[xi] += g * w[wi];
              }
        }
}
void refPool(const std::vector<double>& x, std::vector<double>& y, std::vector<int>& arg,
             int NC, int H, int W) {
  const int OH = H / 2, OW = W / 2;
  y.assign(size_t(NC) * OH * OW, 0);
  arg.assign(y.size(), 0);
  for (int p = 0; p < NC; ++p)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        size_t best = (size_t(p) * H + 2 * oh) * W + 2 * ow;
        for (int k = 1; k < 4; ++k) {
          const size_t i = (size_t(p) * H + 2 * oh + k / 2) * W + 2 * ow + k % 2;
          if (x[i] > x[best]) best = i;
        }
        const size_t o = (size_t(p) * OH + oh) * OW + ow;
        y[o] = x[best];
        arg[o] = int(best);
      }
}
void refFcFwd(const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<double>& b, std::vector<double>& y, int N, int in,
              int out, bool relu) {
  y.assign(size_t(N) * out, 0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      double acc = b[o];
      for (int i = 0; i < in; ++i) acc += x[size_t(n) * in + i] * w[size_t(o) * in + i];
      y[size_t(n) * out + o] = relu && acc < 0 ? 0 : acc;
    }
}
// dy is the gradient of the (relu'd) output y.
void refFcBwd(const std::vector<double>& x, const std::vector<double>& w,
              const std::vector<double>& y, std::vector<double> dy,
              std::vector<double>& dw, std::vector<double>& db, std::vector<double>& dx,
              int N, int in, int out, bool relu) {
  if (relu)
    for (size_t i = 0; i < dy.size(); ++i)
      if (!(y[i] > 0)) dy[i] = 0;
  dw.assign(size_t(out) * in, 0);
  db.assign(out, 0);
  dx.assign(size_t(N) * in, 0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < out; ++o) {
      const double g = dy[size_t(n) * out + o];
      db[o] += g;
      for (int i = 0; i < in; ++i) {
        dw[size_t(o) * in + i] += g * x[size_t(n) * in + i];
        dx[size_t(n) * in + i] += g * w[size_t(o) * in + i];
      }
    }
}

Grads reference(const Model& m, const Params& p) {
  const int N = m.N;
  std::vector<double> a1, r1, p1, a2, r2, p2, h1, h2, lg;
  std::vector<int> g1, g2;
  auto relu = [](const std::vector<double>& a) {
    std::vector<double> r(a);
    for (auto& v : r) v = v > 0 ? v : 0;
    return r;
  };
  refConvFwd(m.c1, toD(p.x), toD(p.w1), toD(p.b1), a1);
  r1 = relu(a1);
  refPool(r1, p1, g1, N * 6, 28, 28);
  refConvFwd(m.c2, p1, toD(p.w2), toD(p.b2), a2);
  r2 = relu(a2);
  refPool(r2, p2, g2, N * 16, 10, 10);
  refFcFwd(p2, toD(p.wf1), toD(p.bf1), h1, N, 400, 120, true);
  refFcFwd(h1, toD(p.wf2), toD(p.bf2), h2, N, 120, 84, true);
  refFcFwd(h2, toD(p.wf3), toD(p.bf3), lg, N, 84, 10, false);
  std::vector<double> dwf3, dbf3, dh2, dwf2, dbf2, dh1, dwf1, dbf1, dp2, dw2, db2, dp1,
      dw1, db1;
  refFcBwd(h2, toD(p.wf3), lg, toD(p.dlogits), dwf3, dbf3, dh2, N, 84, 10, false);
  refFcBwd(h1, toD(p.wf2), h2, dh2, dwf2, dbf2, dh1, N, 120, 84, true);
  refFcBwd(p2, toD(p.wf1), h1, dh1, dwf1, dbf1, dp2, N, 400, 120, true);
  std::vector<double> da2(a2.size(), 0), da1(a1.size(), 0);
  for (size_t o = 0; o < dp2.size(); ++o) da2[g2[o]] = a2[g2[o]] > 0 ? dp2[o] : 0;
  refConvBwd(m.c2, p1, toD(p.w2), da2, dw2, db2, &dp1);
  for (size_t o = 0; o < dp1.size(); ++o) da1[g1[o]] = a1[g1[o]] > 0 ? dp1[o] : 0;
  refConvBwd(m.c1, toD(p.x), toD(p.w1), da1, dw1, db1, nullptr);
  Grads g;
  g.logits = toF(lg);
  g.dw1 = toF(dw1);
  g.db1 = toF(db1);
  g.dw2 = toF(dw2);
  g.db2 = toF(db2);
  g.dwf1 = toF(dwf1);
  g.dbf1 = toF(dbf1);
  g.dwf2 = toF(dwf2);
  g.dbf2 = toF(dbf2);
  g.dwf3 = toF(dwf3);
  g.dbf3 = toF(dbf3);
  return g;
}

// max over tensors of max|a-b| / max|b| (relative to each tensor's scale).
std::pair<double, std::string> maxRelDiff(const Grads& a, const Grads& b) {
  double worst = 0;
  std::string which = "-";
  const auto la = a.list(), lb = b.list();
  for (size_t t = 0; t < la.size(); ++t) {
    const auto& x = *la[t].second;
    const auto& y = *lb[t].second;
    if (x.size() != y.size()) return {INFINITY, std::string(la[t].first) + " (size)"};
    double d = 0, s = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      d = std::max(d, double(std::fabs(x[i] - y[i])));
      s = std::max(s, double(std::fabs(y[i])));
    }
    const double r = s > 0 ? d / s : d;
    if (!(r <= worst)) worst = r, which = la[t].first;
  }
  return {worst, which};
}

// ------------------------------------------------------------- reporting ---
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[size_t(q * (v.size() - 1) + 0.5)];
}
int threadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}
std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "conv_bench: LeNet training step, OpenBLAS im2col+sgemm vs oneDNN, one thread"};
  int reps = 100, warmup = 10, batch = 64, threads = 1;
  bool json = false, noCheck = false;
  std::string clock = "cpu";
  std::string variants =
      "blas-batched,blas-batchedT,blas-perimage,dnnl-any,dnnl-nhwc,dnnl-plain,dnnl-"
      "blocked,"
      "dnnl-nhwc-e2e";
  app.add_option("--reps", reps, "timed steps per variant (median reported)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "untimed steps per variant first");
  app.add_option("--batch", batch, "batch size")->check(CLI::Range(1, 4096));
  app.add_option("--threads", threads, "threads for OpenBLAS and oneDNN (OpenMP)");
  app.add_option("--variants", variants, "comma-separated subset of the variants");
  app.add_option("--clock", clock,
                 "per-phase clock: cpu (this thread's CPU time) or wall")
      ->check(CLI::IsMember({"cpu", "wall"}));
  app.add_flag(
      "--breakdown", breakdown,
      "also time the sgemm calls / reorders inside each phase (adds clock reads)");
  app.add_flag("--json", json, "print one JSON object instead of the table");
  app.add_flag("--no-check", noCheck, "skip the comparison with the double reference");
  CLI11_PARSE(app, argc, argv);
  if (clock == "wall") phaseClock = now;

  // Before any oneDNN or OpenBLAS work. Debian's libdnnl uses the OpenMP (libgomp)
  // runtime: omp_set_num_threads fixes the team size it queries via
  // omp_get_max_threads, whatever OMP_NUM_THREADS says.
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);

  const Model m(batch);
  const Params p = makeParams(m, 12345);
  const std::string load0 = loadavg();

  std::vector<std::unique_ptr<Variant>> vs;
  nlohmann::json setup = nlohmann::json::object();
  std::stringstream ss(variants);
  for (std::string v; std::getline(ss, v, ',');) {
    if (v.rfind("blas-", 0) == 0) {
      const BlasMode bm = v == "blas-batched"    ? BlasMode::Batched
                          : v == "blas-batchedT" ? BlasMode::BatchedT
                          : v == "blas-perimage"
                              ? BlasMode::PerImage
                              : throw CLI::ValidationError("--variants", v);
      vs.push_back(std::make_unique<BlasNet>(m, p, bm));
    } else {
      const DCfg* cfg = nullptr;
      for (const auto& c : kDCfgs)
        if (v == c.name) cfg = &c;
      if (!cfg) throw CLI::ValidationError("--variants", v);
      // First construction: descriptor dispatch + JIT; the second hits oneDNN's
      // primitive cache. The second one is benchmarked.
      auto first = std::make_unique<DnnlNet>(m, p, *cfg);
      auto second = std::make_unique<DnnlNet>(m, p, *cfg);
      setup[v] = {{"first_us", first->setupUs()},
                  {"cached_us", second->setupUs()},
                  {"first_cpu_us", first->setupCpuUs()},
                  {"cached_cpu_us", second->setupCpuUs()}};
      vs.push_back(std::move(second));
    }
  }

  // Correctness: one step each from the same parameters, against a double reference.
  nlohmann::json check = nlohmann::json::object();
  bool checkOk = true;
  if (!noCheck) {
    const Grads ref = reference(m, p);
    std::vector<Grads> gs;
    for (auto& v : vs) {
      StepTimes st;
      v->step(st);
      gs.push_back(v->grads());
    }
    for (size_t i = 0; i < vs.size(); ++i) {
      const auto [r, w] = maxRelDiff(gs[i], ref);
      const auto [r0, w0] = maxRelDiff(gs[i], gs[0]);
      check[vs[i]->name] = {{"vs_reference", r},
                            {"worst_tensor", w},
                            {"vs_" + vs[0]->name, r0},
                            {"worst_tensor_vs_first", w0}};
      checkOk = checkOk && r < 1e-4;
    }
  }

  for (auto& v : vs) {
    StepTimes st;
    for (int i = 0; i < warmup; ++i) v->step(st);
  }
  std::vector<std::vector<StepTimes>> times(vs.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < vs.size(); ++i) {
      StepTimes st;
      const double t0 = now(), c0 = cpuNow(), tc0 = threadCpuNow(), p0 = phaseClock();
      vs[i]->step(st);
      st.pclock = phaseClock() - p0;
      st.total = now() - t0;
      st.cpu = cpuNow() - c0;
      st.tcpu = threadCpuNow() - tc0;
      times[i].push_back(st);
    }
  const int nthreads = threadCount();

  // Summaries.
  nlohmann::json out;
  out["config"] = {
      {"batch", batch},
      {"reps", reps},
      {"warmup", warmup},
      {"threads", threads},
      {"clock", clock},
      {"breakdown", breakdown},
      {"omp_max_threads", omp_get_max_threads()},
      {"openblas_threads", openblas_get_num_threads()},
      {"openblas_core", openblas_get_corename()},
      {"dnnl_version", std::to_string(dnnl_version()->major) + "." +
                           std::to_string(dnnl_version()->minor) + "." +
                           std::to_string(dnnl_version()->patch)},
      {"dnnl_isa", dnnl_cpu_isa2str(dnnl_cpu_isa_t(dnnl::get_effective_cpu_isa()))},
      {"process_threads", nthreads},
      {"loadavg_before", load0},
      {"loadavg_after", loadavg()},
      {"step_mflop", 0.0}};
  double stepFlops = 0;
  for (int ph = 0; ph < NPH; ++ph) stepFlops += m.phaseFlops(Ph(ph));
  out["config"]["step_mflop"] = stepFlops * 1e-6;
  out["check"] = check;
  out["dnnl_setup"] = setup;
  out["variants"] = nlohmann::json::array();
  for (size_t i = 0; i < vs.size(); ++i) {
    const auto& T = times[i];
    auto col = [&](auto f) {
      std::vector<double> v;
      for (const auto& st : T) v.push_back(f(st));
      return v;
    };
    nlohmann::json phases = nlohmann::json::object();
    for (int ph = 0; ph < NPH; ++ph) {
      const double med = median(col([&](const StepTimes& s) { return s.t[ph]; })) * 1e6;
      const double aux = median(col([&](const StepTimes& s) { return s.aux[ph]; })) * 1e6;
      const double fl = m.phaseFlops(Ph(ph));
      phases[kPhName[ph]] = {{"median_us", med},
                             {"aux_us", aux},
                             {"gflops", fl > 0 && med > 0 ? fl / (med * 1e3) : 0.0}};
    }
    auto sumPh = [&](int a, int b) {
      return median(col([&](const StepTimes& s) {
               double x = 0;
               for (int ph = a; ph < b; ++ph) x += s.t[ph];
               return x;
             })) *
             1e6;
    };
    auto sumAux = median(col([&](const StepTimes& s) {
                    double x = 0;
                    for (double a : s.aux) x += a;
                    return x;
                  })) *
                  1e6;
    auto convSum = median(col([&](const StepTimes& s) {
                     return s.t[C1F] + s.t[C2F] + s.t[C2B] + s.t[C1B];
                   })) *
                   1e6;
    const auto tot = col([](const StepTimes& s) { return s.total; });
    const double step = median(col([](const StepTimes& s) { return s.pclock; })) * 1e6;
    out["variants"].push_back(
        {{"name", vs[i]->name},
         {"phases", phases},
         {"fwd_us", sumPh(0, F3B)},
         {"bwd_us", sumPh(F3B, NPH)},
         {"conv_us", convSum},
         {"aux_step_us", sumAux},
         {"step_us", step},
         {"step_gflops", stepFlops / (step * 1e3)},
         {"step_wall_us", median(tot) * 1e6},
         {"step_wall_p10_us", quantile(tot, 0.1) * 1e6},
         {"step_wall_p90_us", quantile(tot, 0.9) * 1e6},
         {"step_cpu_p10_us",
          quantile(col([](const StepTimes& s) { return s.pclock; }), 0.1) * 1e6},
         {"step_cpu_p90_us",
          quantile(col([](const StepTimes& s) { return s.pclock; }), 0.9) * 1e6},
         {"cpu_per_wall",
          median(col([](const StepTimes& s) { return s.cpu / s.total; }))},
         {"thread_cpu_share",
          median(col([](const StepTimes& s) { return s.tcpu / s.cpu; }))},
         {"info", vs[i]->info()}});
  }

  if (json) {
    std::printf("%s\n", out.dump(1).c_str());
    return checkOk ? 0 : 1;
  }

  const auto& cfg = out["config"];
  std::printf(
      "LeNet training step, batch %d, %d thread(s); median of %d steps after %d warm-up; "
      "clock: %s\n",
      batch, threads, reps, warmup, clock == "cpu" ? "this thread's CPU time" : "wall");
  std::printf(
      "OpenBLAS core %s, %d thread(s); oneDNN %s, OpenMP max threads %d, isa %s; "
      "process threads %d; loadavg %s -> %s\n",
      openblas_get_corename(), openblas_get_num_threads(),
      cfg["dnnl_version"].get<std::string>().c_str(), omp_get_max_threads(),
      cfg["dnnl_isa"].get<std::string>().c_str(), nthreads, load0.c_str(),
      loadavg().c_str());
  std::printf("cells: median us (GFLOP/s)%s\n\n",
              breakdown ? " [us in sgemm for blas-*, in reorders for dnnl-*]" : "");
  std::printf("%-21s", "phase");
  for (auto& v : vs) std::printf(" %22s", v->name.c_str());
  std::printf("\n");
  for (int ph = 0; ph < NPH; ++ph) {
    std::printf("%-21s", kPhName[ph]);
    for (const auto& v : out["variants"]) {
      const auto& c = v["phases"][kPhName[ph]];
      char buf[64];
      const double g = c["gflops"], a = c["aux_us"];
      if (g > 0 && breakdown)
        std::snprintf(buf, sizeof buf, "%.0f (%.1f) [%.0f]", double(c["median_us"]), g,
                      a);
      else if (g > 0)
        std::snprintf(buf, sizeof buf, "%.0f (%.1f)", double(c["median_us"]), g);
      else if (a > 0)
        std::snprintf(buf, sizeof buf, "%.0f [%.0f]", double(c["median_us"]), a);
      else
        std::snprintf(buf, sizeof buf, "%.0f", double(c["median_us"]));
      std::printf(" %22s", buf);
    }
    std::printf("\n");
  }
  auto row = [&](const char* label, auto f) {
    std::printf("%-21s", label);
    for (const auto& v : out["variants"]) std::printf(" %22s", f(v).c_str());
    std::printf("\n");
  };
  auto num = [](double x, const char* fmt = "%.0f") {
    char b[64];
    std::snprintf(b, sizeof b, fmt, x);
    return std::string(b);
  };
  std::printf("\n");
  row("forward", [&](const auto& v) { return num(v["fwd_us"]); });
  row("backward", [&](const auto& v) { return num(v["bwd_us"]); });
  row("conv layers fwd+bwd", [&](const auto& v) { return num(v["conv_us"]); });
  if (breakdown)
    row("sgemm / reorders", [&](const auto& v) { return num(v["aux_step_us"]); });
  row("STEP", [&](const auto& v) {
    return num(v["step_us"]) + " (" + num(v["step_gflops"], "%.1f") + ")";
  });
  row("step p10..p90", [&](const auto& v) {
    return num(v["step_cpu_p10_us"]) + ".." + num(v["step_cpu_p90_us"]);
  });
  row("step wall median", [&](const auto& v) { return num(v["step_wall_us"]); });
  row("wall p10..p90", [&](const auto& v) {
    return num(v["step_wall_p10_us"]) + ".." + num(v["step_wall_p90_us"]);
  });
  row("process cpu / wall",
      [&](const auto& v) { return num(v["cpu_per_wall"], "%.2f"); });
  row("thread cpu / process",
      [&](const auto& v) { return num(v["thread_cpu_share"], "%.2f"); });
  std::printf("\nstep = %.1f MFLOP (conv fwd/dW/dX + fc GEMMs)\n", stepFlops * 1e-6);
  if (!setup.empty()) {
    std::printf(
        "oneDNN net setup (descriptors + primitives + buffers), CPU us first / cached: ");
    for (auto& [k, v] : setup.items())
      std::printf("%s %.0f / %.0f; ", k.c_str(), double(v["first_cpu_us"]),
                  double(v["cached_cpu_us"]));
    std::printf("\n");
  }
  for (const auto& v : out["variants"]) {
    const auto& inf = v["info"];
    if (!inf.contains("reorders_per_step")) continue;
    std::printf("%s: %d reorders/step;", v["name"].get<std::string>().c_str(),
                inf["reorders_per_step"].get<int>());
    for (const char* l : {"pool1", "relu1"})
      std::printf(" %s %s;", l,
                  inf[l].is_string() ? inf[l].get<std::string>().c_str()
                                     : inf[l]["fwd"].get<std::string>().c_str());
    for (const char* l : {"conv1", "conv2", "fc1"}) {
      const auto& c = inf[l];
      std::printf(
          " %s fwd %s src %s wei %s%s%s;", l, c["fwd"]["impl"].get<std::string>().c_str(),
          c["fwd"]["src"].get<std::string>().c_str(),
          c["fwd"]["wei"].get<std::string>().c_str(),
          c["fwd"].contains("dst")
              ? (" dst " + c["fwd"]["dst"].get<std::string>()).c_str()
              : "",
          (" bwd_w " + c["bwd_w"]["impl"].get<std::string>() +
           (c.contains("bwd_d") ? " bwd_d " + c["bwd_d"]["impl"].get<std::string>() : ""))
              .c_str());
    }
    std::printf("\n");
  }
  if (!noCheck) {
    std::printf("check (max over tensors of max|diff| / max|ref|):");
    for (auto& [k, v] : check.items())
      std::printf(" %s %.1e vs ref (%s), %.1e vs %s;", k.c_str(),
                  double(v["vs_reference"]), v["worst_tensor"].get<std::string>().c_str(),
                  double(v["vs_" + vs[0]->name]), vs[0]->name.c_str());
    std::printf("\n%s\n", checkOk ? "check OK" : "CHECK FAILED (> 1e-4)");
  }
  return checkOk ? 0 : 1;
}
