// conv_bench_blas.cc: conv_bench's OpenBLAS variants (A in conv_bench.cc):
// im2col + sgemm convolutions, hand-written relu / max pool, fc layers as sgemm,
// in the GEMM arrangements blas-batched, blas-batchedT and blas-perimage.
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "conv_bench.h"

namespace convbench {
namespace {

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

// ------------------------------------------------------ A: OpenBLAS ---------

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

}  // namespace

std::unique_ptr<Variant> makeBlasNet(const Model& m, const Params& p, BlasMode mode) {
  return std::make_unique<BlasNet>(m, p, mode);
}

}  // namespace convbench
