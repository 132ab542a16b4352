// The CUDA backend's cross-entropy (Backend::crossEntropy, crossEntropyDeferred,
// stageLabels, crossEntropyStaged, takeLossSum): the labels checked on the
// host and uploaded through pinned staging (staged_upload.h) into one fixed
// device slot (what a captured step's loss reads: step_graph.h), the loss
// kernel (loss_kernels.h) on them, and the training loss summed on the
// device until it is reported.
//
// Thread-safety: as the backend (its training thread).
#pragma once

#include <cstdint>
#include <memory>

#include "context.h"
#include "ddprun/train/tensor.h"
#include "loss_kernels.h"
#include "resources.h"
#include "staged_upload.h"

namespace ddprun::train::cuda {

class CrossEntropy {
 public:
  explicit CrossEntropy(std::shared_ptr<Context> ctx);
  // Checks n labels against `classes` (InvalidArgument naming a bad one) and
  // queues their upload into the device slot.
  void stage(const int32_t* labels, int64_t n, int64_t classes);
  // The loss kernel on the staged labels: logits [n, classes] (else
  // InvalidArgument), dL/dlogits times gradScale into *dlogits when not null.
  void launch(const Tensor& logits, Tensor* dlogits, float gradScale, float smoothing);
  // The last launch's result (waits for it).
  CeResult result();
  // The last launch's loss sum added to the training sum (on the device).
  void accumulate();
  // The training sum since the last call (waits), then zero.
  double takeSum();

 private:
  std::shared_ptr<Context> ctx_;
  DeviceArray<int32_t> labels_;
  DeviceArray<double> rowLoss_;
  DeviceArray<int> rowHit_;
  DeviceArray<CeResult> result_;
  DeviceArray<double> sum_;
  StagedUpload upload_;
  int64_t staged_ = 0, classes_ = 0;  // what the slot holds
};

}  // namespace ddprun::train::cuda
