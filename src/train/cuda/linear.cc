// The linear layer on cuBLASLt.
//
// Row-major [N, in] activations and [out, in] weights are column-major
// matrices transposed, so (column-major throughout, ld = leading dimension):
//   forward   y^T (out x N)  = W_cm^T (out x in) * x^T (in x N)  + b  (bias epilogue)
//   dW        dW_cm (in x out) += x^T (in x N) * dy (N x out)     (beta = 1)
//   dx        dx^T (in x N)   = W_cm (in x out) * dy^T (out x N)
//   db        += column sums of dy (our kernel, in double)
// cuBLASLt's BGRAD epilogues write the bias gradient rather than add to it,
// and gradients here accumulate, hence the kernel for db.
//
// Precision: CUBLAS_COMPUTE_32F (strict fp32) or CUBLAS_COMPUTE_32F_FAST_TF32.
// Algorithms come from cuBLASLt's heuristic once per problem shape (cached);
// split-K schemes that reduce with atomics (CUBLASLT_REDUCTION_SCHEME_INPLACE)
// are excluded so results repeat bitwise.
#include <map>
#include <tuple>

#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "kernels.h"

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
    auto key() const { return std::tie(ta, tb, m, n, k, lda, ldb, ldc, accumulate, bias); }
    bool operator<(const Problem& o) const { return key() < o.key(); }
  };

  void run(Context& ctx, const Problem& p, const float* a, const float* b, float* c,
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
  static LtLayout layout(int64_t rows, int64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t l = nullptr;
    DDPRUN_CUBLAS_OK(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, static_cast<uint64_t>(rows),
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
    plan.a = p.ta ? layout(p.k, p.m, p.lda) : layout(p.m, p.k, p.lda);
    plan.b = p.tb ? layout(p.n, p.k, p.ldb) : layout(p.k, p.n, p.ldb);
    plan.c = layout(p.m, p.n, p.ldc);

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
                   p.k, " float GEMM on cuda:", ctx.device());
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
        b_(makeDeviceParam(*ctx_, name + ".bias", {out})) {
    DDPRUN_CHECK(in > 0 && out > 0, name, ": linear layer sizes must be positive, got ", in, "x",
                 out);
  }
  Shape outputShape(const Shape& s) const override {
    DDPRUN_CHECK(s.size() == 2 && s[1] == in_, name(), " expects [N, ", in_, "], got ",
                 shapeString(s));
    return {s[0], out_};
  }
  void forward(const Tensor& x, Tensor& y, bool) override {
    ctx_->bind();
    y.ensure(outputShape(x.shape()), ctx_->allocator());
    const int64_t n = x.dim(0);
    if (n == 0) return;
    gemm_.run(*ctx_, {true, false, out_, n, in_, in_, in_, out_, false, true}, w_.value.data(),
              x.data(), y.data(), b_.value.data());
  }
  void backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) override {
    ctx_->bind();
    const int64_t n = x.dim(0);
    if (dx) dx->ensure(x.shape(), ctx_->allocator());
    if (n == 0) return;
    gemm_.run(*ctx_, {false, true, in_, out_, n, in_, out_, in_, true, false}, x.data(), dy.data(),
              w_.grad.data(), nullptr);
    launchColumnSumAccumulate(dy.data(), b_.grad.data(), n, out_, ctx_->stream());
    if (dx)
      gemm_.run(*ctx_, {false, false, in_, n, out_, in_, out_, in_, false, false},
                w_.value.data(), dy.data(), dx->data(), nullptr);
  }
  std::vector<Param*> params() override { return {&w_, &b_}; }

 private:
  std::shared_ptr<Context> ctx_;
  int64_t in_, out_;
  Param w_, b_;
  LtGemm gemm_;
};

}  // namespace

std::unique_ptr<Layer> makeLinear(std::shared_ptr<Context> ctx, std::string name, int64_t in,
                                  int64_t out) {
  return std::make_unique<Linear>(std::move(ctx), std::move(name), in, out);
}

}  // namespace ddprun::train::cuda
