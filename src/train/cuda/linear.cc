// The linear layer on cuBLASLt.
//
// Row-major [N, in] activations and [out, in] weights are column-major
// matrices transposed, so (column-major throughout, ld = leading dimension):
//   forward   y^T (out x N)  = W_cm^T (out x in) * x^T (in x N)  + b  (bias epilogue)
//   dW        dW_cm (in x out) += x^T (in x N) * dy (N x out)     (beta = 1)
//   dx        dx^T (in x N)   = W_cm (in x out) * dy^T (out x N)
//   db        += column sums of dy (our kernel, in double)
// cuBLASLt's BGRAD epilogues write the bias gradient rather than add to it,
// and gradients here accumulate, hence the kernel for db. A gradient whose
// Param::overwriteGrad is set is written instead (dW with beta = 0, db by the
// kernel's "=" form); an empty batch then zeroes it.
//
// Precision: CUBLAS_COMPUTE_32F (strict fp32) or CUBLAS_COMPUTE_32F_FAST_TF32.
// bf16/fp16 (autocast): x, W and dy are cast to 16 bits (our kernel; W once
// per forward and reused by backward, x kept from forward for dW) and the
// GEMMs take 16-bit A and B with CUBLAS_COMPUTE_32F (tensor cores, float
// accumulation) and float C/D, which cuBLASLt supports: y (with the float bias
// epilogue), dx and dW come out in float directly, dW accumulating with
// beta = 1 into the float gradient (so, unlike autocast's 16-bit weight
// gradient, it is not rounded to 16 bits). db is the column sum of the float
// dy. Nothing is clamped: an fp16 dy beyond 65504 is inf after the cast and
// makes the gradients inf/NaN (the loss scaler's overflow signal).
// 16-bit activations (CudaBackendOptions::activations16): a 16-bit x is the
// GEMMs' B as it is (no cast); y stays float; dx is computed in float and
// rounded to x's type.
// Algorithms come from cuBLASLt's heuristic once per problem shape (cached);
// split-K schemes that reduce with atomics (CUBLASLT_REDUCTION_SCHEME_INPLACE)
// are excluded so results repeat bitwise.
#include <map>
#include <tuple>

#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "elementwise.h"

namespace ddprun::train::cuda {

namespace {
constexpr size_t kLtWorkspace = size_t{32} << 20;

// One column-major GEMM C (m x n) = alpha op(A) op(B) + beta C, planned once.
class LtGemm {
 public:
  struct Problem {
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    bool accumulate, bias;
    cudaDataType_t ab = CUDA_R_32F;  // A and B; C and D are float
    auto key() const { return std::tie(ta, tb, m, n, k, lda, ldb, ldc, accumulate, bias, ab); }
    bool operator<(const Problem& o) const { return key() < o.key(); }
  };

  void run(Context& ctx, const Problem& p, const void* a, const void* b, float* c,
           const float* bias) {
    Plan& plan = planFor(ctx, p);
    if (p.bias)
      DDPRUN_CUBLAS_OK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof(bias)));
    const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
    DDPRUN_CUBLAS_OK(cublasLtMatmul(ctx.lt(), plan.desc, &alpha, a, plan.a, b, plan.b, &beta, c,
                                    plan.c, c, plan.c, &plan.algo, ctx.workspace(kLtWorkspace),
                                    kLtWorkspace, ctx.stream()));
  }

 private:
  struct Plan {
    LtMatmulDesc desc;
    LtLayout a, b, c;
    cublasLtMatmulAlgo_t algo{};
  };
  static LtLayout layout(int64_t rows, int64_t cols, int64_t ld, cudaDataType_t type) {
    cublasLtMatrixLayout_t l = nullptr;
    DDPRUN_CUBLAS_OK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows),
                                                static_cast<uint64_t>(cols), ld));
    return LtLayout(l);
  }
  Plan& planFor(Context& ctx, const Problem& p) {
    auto it = plans_.find(p);
    if (it != plans_.end()) return it->second;
    Plan plan;
    cublasLtMatmulDesc_t d = nullptr;
    const cublasComputeType_t compute = ctx.precision() == Precision::kTf32
                                            ? CUBLAS_COMPUTE_32F_FAST_TF32
                                            : CUBLAS_COMPUTE_32F;
    DDPRUN_CUBLAS_OK(cublasLtMatmulDescCreate(&d, compute, CUDA_R_32F));
    plan.desc = LtMatmulDesc(d);
    const cublasOperation_t ta = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    DDPRUN_CUBLAS_OK(
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    DDPRUN_CUBLAS_OK(
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (p.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      DDPRUN_CUBLAS_OK(
          cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    }
    plan.a = p.ta ? layout(p.k, p.m, p.lda, p.ab) : layout(p.m, p.k, p.lda, p.ab);
    plan.b = p.tb ? layout(p.n, p.k, p.ldb, p.ab) : layout(p.k, p.n, p.ldb, p.ab);
    plan.c = layout(p.m, p.n, p.ldc, CUDA_R_32F);

    cublasLtMatmulPreference_t pref = nullptr;
    DDPRUN_CUBLAS_OK(cublasLtMatmulPreferenceCreate(&pref));
    LtPreference prefOwner(pref);
    const uint64_t ws = kLtWorkspace;
    DDPRUN_CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t schemes =
        CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    DDPRUN_CUBLAS_OK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    DDPRUN_CUBLAS_OK(cublasLtMatmulAlgoGetHeuristic(ctx.lt(), d, plan.a, plan.b, plan.c, plan.c,
                                                    pref, 1, &result, &found));
    if (found == 0)
      DDPRUN_THROW(runtime::CudaError, "cuBLASLt has no algorithm for a ", p.m, "x", p.n, "x",
                   p.k, " GEMM (", precisionName(ctx.precision()), ") on cuda:", ctx.device());
    plan.algo = result.algo;
    return plans_.emplace(p, std::move(plan)).first->second;
  }

  std::map<Problem, Plan> plans_;
};

class Linear final : public Layer {
 public:
  Linear(std::shared_ptr<Context> ctx, std::string name, int64_t in, int64_t out)
      : Layer(name), ctx_(std::move(ctx)), in_(in), out_(out),
        w_(makeDeviceParam(*ctx_, name + ".weight", {out, in})),
        b_(makeDeviceParam(*ctx_, name + ".bias", {out})), x16_(ctx_), w16_(ctx_), xF_(ctx_),
        dxF_(ctx_) {
    DDPRUN_CHECK(in > 0 && out > 0, name, ": linear layer sizes must be positive, got ", in, "x",
                 out);
    if (ctx_->autocast()) ab_ = ctx_->bf16() ? CUDA_R_16BF : CUDA_R_16F;
  }
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 2 && s[1] == in_, name(), " expects [N, ", in_, "], got ",
                 shapeString(s));
    return {s[0], out_};
  }
  // x float, or 16-bit (16-bit activations: the GEMM reads it as it is); y
  // float either way (the logits and the loss stay float, as autocast's
  // cross-entropy computes in float).
  void forward(const Tensor& x, Tensor& y, bool training) override {
    ctx_->bind();
    y.ensure(outputShape(x.shape()), ctx_->allocator());
    const int64_t n = x.dim(0);
    if (n == 0) return;
    const void* w = w_.value.data();
    const void* xin = x.is16() ? x.raw() : x.data();
    if (ab_ != CUDA_R_32F) {
      w = castTo16(*ctx_, w_.value.data(), weightCount(), w16_);
      if (!x.is16()) {
        xin = castTo16(*ctx_, x.data(), static_cast<size_t>(x.numel()), x16_);
        x16Of_ = training ? x.data() : nullptr;
      }
    }
    gemm({true, false, out_, n, in_, in_, in_, out_, false, true}, w, xin,
         [&] { return w_.value.data(); }, [&] { return floatOf(x); }, y.data(), b_.value.data());
    if (!training) releaseInput16();
  }
  bool backwardReadsOutput() const override { return false; }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    ctx_->bind();
    const int64_t n = x.dim(0);
    if (dx) dx->ensureLike(x, ctx_->allocator());
    if (n == 0) return zeroFlaggedGrads();
    const void* w = w_.value.data();
    const void* xin = x.is16() ? x.raw() : x.data();
    const void* g = dy.data();
    DeviceArray<uint16_t> dy16(ctx_);
    if (ab_ != CUDA_R_32F) {
      if (!w16_.get()) castTo16(*ctx_, w_.value.data(), weightCount(), w16_);
      if (!x.is16() && (x16Of_ != x.data() || !x16_.get()))
        castTo16(*ctx_, x.data(), static_cast<size_t>(x.numel()), x16_);
      w = w16_.get();
      if (!x.is16()) xin = x16_.get();
      g = castTo16(*ctx_, dy.data(), static_cast<size_t>(dy.numel()), dy16);
    }
    auto dyF = [&] { return dy.data(); };
    gemm({false, true, in_, out_, n, in_, out_, in_, !w_.overwriteGrad, false}, xin, g,
         [&] { return floatOf(x); }, dyF, w_.grad.data(), nullptr);
    w_.overwriteGrad = false;
    launchColumnSum(dy.data(), b_.grad.data(), n, out_, !b_.overwriteGrad, ctx_->stream());
    b_.overwriteGrad = false;
    if (dx) {
      // A 16-bit dx (x's type) is computed in float and rounded once.
      float* d = dx->is16() ? dxF_.ensure(static_cast<size_t>(dx->numel())) : dx->data();
      gemm({false, false, in_, n, out_, in_, out_, in_, false, false}, w, g,
           [&] { return w_.value.data(); }, dyF, d, nullptr);
      if (dx->is16()) {
        launchTo16(d, dx->raw(), static_cast<size_t>(dx->numel()), ctx_->bf16(), ctx_->stream());
        dxF_.reset();
      }
    }
    releaseInput16();  // one backward per forward
  }
  std::vector<Param*> params() override { return {&w_, &b_}; }

 private:
  size_t weightCount() const { return static_cast<size_t>(w_.value.numel()); }
  // An empty batch's backward: a gradient to be overwritten becomes zero.
  void zeroFlaggedGrads() {
    for (Param* p : {&w_, &b_}) {
      if (p->overwriteGrad)
        DDPRUN_CUDA_OK(cudaMemsetAsync(p->grad.data(), 0, p->grad.bytes(), ctx_->stream()));
      p->overwriteGrad = false;
    }
  }
  // One GEMM: from the 16-bit operands a16/b16 while the layer computes in
  // 16 bits, else from the float ones. cuBLASLt refused some 16-bit problems
  // at run time although its heuristic had offered an algorithm
  // (CUBLAS_STATUS_NOT_SUPPORTED, LeNet's layers in fp16 on an H100): such a
  // refusal is taken once, this GEMM runs in float and the layer stays in
  // float from then on (a GEMM either ran whole or not at all, so nothing is
  // accumulated twice).
  // a32()/b32() give the float operands, asked for only when the GEMM runs
  // in float (a 16-bit input is then converted: floatOf()).
  template <class A32, class B32>
  void gemm(LtGemm::Problem p, const void* a16, const void* b16, A32&& a32, B32&& b32, float* c,
            const float* bias) {
    if (ab_ != CUDA_R_32F) {
      p.ab = ab_;
      try {
        gemm_.run(*ctx_, p, a16, b16, c, bias);
        return;
      } catch (const runtime::CudaError& e) {
        if (e.message().find("NOT_SUPPORTED") == std::string::npos) throw;
        ab_ = CUDA_R_32F;
      }
    }
    p.ab = CUDA_R_32F;
    gemm_.run(*ctx_, p, a32(), b32(), c, bias);
  }
  // x's elements as floats: x itself, or (16-bit) a float copy in xF_, kept
  // until the next call.
  const float* floatOf(const Tensor& x) {
    if (!x.is16()) return x.data();
    float* f = xF_.ensure(static_cast<size_t>(x.numel()));
    launchFrom16(x.raw(), nullptr, f, x.numel(), 1, 1, x.dtype() == runtime::DType::kBFloat16,
                 ctx_->stream());
    return f;
  }
  void releaseInput16() {
    x16_.reset();
    x16Of_ = nullptr;
  }

  std::shared_ptr<Context> ctx_;
  int64_t in_, out_;
  Param w_, b_;
  LtGemm gemm_;
  cudaDataType_t ab_ = CUDA_R_32F;  // the GEMMs' A and B: float, or bf16/fp16 (autocast)
  // Autocast: the 16-bit input of the last training forward (and the float
  // tensor it came from) and weights of the last forward.
  DeviceArray<uint16_t> x16_, w16_;
  const float* x16Of_ = nullptr;
  // 16-bit inputs: their float copy where a GEMM runs in float (floatOf),
  // and dx computed in float before its rounding.
  DeviceArray<float> xF_, dxF_;
};

}  // namespace

std::unique_ptr<Layer> makeLinear(std::shared_ptr<Context> ctx, std::string name, int64_t in,
                                  int64_t out) {
  return std::make_unique<Linear>(std::move(ctx), std::move(name), in, out);
}

}  // namespace ddprun::train::cuda
