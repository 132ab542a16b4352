// A model's (and its optimizer's) state as named tensors: the views saved in
// checkpoints and final model files, and the checked copy of a loaded file
// back into the model.
// Thread-safety: one training thread (the model is mutated).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ddprun/train/checkpoint.h"
#include "ddprun/train/models.h"
#include "ddprun/train/optim.h"

namespace ddprun::train {

// Host-readable elements of tensors that may live on a device: a CPU tensor
// is read in place, a device tensor is downloaded into a copy this object
// owns, once: reading it again (the same storage and size) returns that copy,
// so a save and a hash through one snapshot download each tensor once. A
// snapshot is thus a picture of one moment: take a new one after the model
// changed. Pointers stay valid while it lives.
class HostSnapshot {
 public:
  explicit HostSnapshot(Backend& be) : be_(be) {}
  const float* read(const Tensor& t);

 private:
  Backend& be_;
  std::deque<std::vector<float>> copies_;
  std::map<std::pair<const float*, int64_t>, const float*> read_;  // device tensor -> copy
};

// The model's parameters and buffers (and the optimizer's state when `optim`
// is not null) as host views for saveSafetensors, read through `snap`. Count
// buffers are stored as I64 in `counts`. `snap` and `counts` must outlive the
// views.
std::vector<TensorView> modelTensors(Model& model, Optimizer* optim, HostSnapshot& snap,
                                     std::vector<std::vector<int64_t>>& counts);

// SHA-256 (hex) of the parameters' then the buffers' float32 bytes, read
// through `snap` (metrics.h's parametersSha256 over host copies).
std::string modelSha256(const Model& model, HostSnapshot& snap);

// The end of a run: writes the model's parameters and buffers (no optimizer
// state) to `savePath` with `metadata` when the path is not empty, and
// returns modelSha256 of the same state. One snapshot serves both: each
// device tensor is downloaded once.
std::string saveAndHashModel(Model& model, Backend& be, const std::string& savePath,
                             const std::map<std::string, std::string>& metadata);

// Copies a file's tensors into the model (and optimizer state when `optim` is
// not null). Nothing is copied unless every tensor fits: present, of this
// model's dtype and shape, every float finite, variances and Adam's second
// moments >= 0, batch counts >= 0. Returns false with the reason (naming
// `path` and the tensor) otherwise.
// Elements are written through `be` (uploaded to a device backend).
bool copyInto(const SafeTensors& st, const std::string& path, Model& model,
              Optimizer* optim, Backend& be, std::string* why);

}  // namespace ddprun::train
