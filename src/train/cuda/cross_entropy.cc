// The CUDA backend's cross-entropy (cross_entropy.h).
#include "cross_entropy.h"

#include <utility>

#include "ddprun/common/error.h"
#include "ddprun/runtime/cuda_check.h"

namespace ddprun::train::cuda {

CrossEntropy::CrossEntropy(std::shared_ptr<Context> ctx)
    : ctx_(std::move(ctx)), labels_(ctx_), rowLoss_(ctx_), rowHit_(ctx_), result_(ctx_),
      sum_(ctx_) {}

void CrossEntropy::stage(const int32_t* labels, int64_t n, int64_t k) {
  for (int64_t i = 0; i < n; ++i)
    DDPRUN_CHECK(labels[i] >= 0 && labels[i] < k, "label ", labels[i], " outside [0, ", k, ")");
  int32_t* dLabels = labels_.ensure(static_cast<size_t>(n));
  staged_ = n;
  classes_ = k;
  upload_.upload(labels, static_cast<size_t>(n) * sizeof(int32_t), dLabels, ctx_->stream());
}

void CrossEntropy::launch(const Tensor& logits, Tensor* dlogits, float gradScale,
                          float smoothing) {
  DDPRUN_CHECK(logits.rank() == 2, "cross-entropy expects logits [N, classes], got ",
               shapeString(logits.shape()));
  DDPRUN_CHECK(logits.dim(0) == staged_ && logits.dim(1) == classes_, "cross-entropy: logits ",
               shapeString(logits.shape()), " for ", staged_, " labels staged for ", classes_,
               " classes");
  const int64_t n = logits.dim(0), k = logits.dim(1);
  if (dlogits) dlogits->ensure(logits.shape(), ctx_->allocator());
  launchCrossEntropy(logits.data(), labels_.get(), n, k, dlogits ? dlogits->data() : nullptr,
                     gradScale, smoothing, rowLoss_.ensure(static_cast<size_t>(n)),
                     rowHit_.ensure(static_cast<size_t>(n)), result_.ensure(1), ctx_->stream());
}

CeResult CrossEntropy::result() {
  CeResult r;
  ctx_->readBack(result_.get(), &r, sizeof(r));
  return r;
}

void CrossEntropy::accumulate() {
  if (!sum_.get()) {
    sum_.ensure(1);
    DDPRUN_CUDA_OK(cudaMemsetAsync(sum_.get(), 0, sizeof(double), ctx_->stream()));
  }
  launchAccumulateLoss(result_.get(), sum_.get(), ctx_->stream());
}

double CrossEntropy::takeSum() {
  if (!sum_.get()) return 0.0;
  double s = 0;
  ctx_->readBack(sum_.get(), &s, sizeof(s));
  DDPRUN_CUDA_OK(cudaMemsetAsync(sum_.get(), 0, sizeof(double), ctx_->stream()));
  return s;
}

}  // namespace ddprun::train::cuda
