// The trainer's input pipeline (internal to ddprun_train).
//
// Two host batches in turn: while the device runs step k's backward, step
// k+1's samples are gathered into the other one and, on a device backend,
// their upload starts (Backend::uploadInput: pinned staging, a copy stream).
// A batch's input is the model's: a view of the host batch on the CPU, the
// upload on a device, bilinearly upsampled there when the model's input is
// larger than the data's images (--image-size).
//
// Thread-safety: one training thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ddprun/train/data.h"
#include "ddprun/train/layers.h"
#include "work_pool.h"

namespace ddprun::train {

class BatchFeed {
 public:
  // `input`: the model's per-sample input shape. Batches are assembled on
  // `dataThreads` threads (the training thread one of them).
  BatchFeed(Backend& be, Shape input, int dataThreads = 1);
  ~BatchFeed();

  // How training batches are augmented from now on (the trainer sets the
  // epoch at each epoch's start); evaluation batches never are.
  void setTransform(const SampleTransform& t) { transform_ = t; }

  struct Batch {
    Tensor x;               // the model's input
    const int32_t* labels;  // host labels, valid until the next call
  };
  // This step's batch: samples idx[0..n) of `d` (the batch prepared by
  // prepareNext when it holds them).
  Batch take(const Dataset& d, const int64_t* idx, int64_t n);
  // Gathers the following step's samples into the other buffer and starts
  // their upload; idx null: there is none (the epoch ends).
  void prepareNext(const Dataset& d, const int64_t* idx, int64_t n);
  // A batch used once (evaluation), never taken for a training step.
  Batch once(const Dataset& d, const int64_t* idx, int64_t n);

 private:
  struct HostBatch {
    std::vector<float> x;
    std::vector<int32_t> y;
    const int64_t* idx = nullptr;  // the indices it holds (nullptr: none)
    int64_t n = 0;
    Tensor dev;  // x on the backend's device (uploaded: non-null data)
  };
  void assemble(HostBatch& b, const Dataset& d, const int64_t* idx, int64_t n,
                const SampleTransform& t);
  void upload(HostBatch& b, const Dataset& d);
  Tensor toInput(HostBatch& b, const Dataset& d);
  // The batch's shape at the data's own image size (before upsampling).
  Shape nativeShape(const Dataset& d, int64_t n) const;

  Backend& be_;
  Shape input_;
  std::unique_ptr<WorkPool> pool_;
  SampleTransform transform_;
  HostBatch batches_[2];
  int cur_ = 0;  // batches_[cur_]: this step's
  Tensor xin_;   // the batch upsampled to the model's input
};

}  // namespace ddprun::train
