// A model's (and its optimizer's) state as named tensors: the views saved in
// checkpoints and final model files, and the checked copy of a loaded file
// back into the model.
// Thread-safety: one training thread (the model is mutated).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddprun/train/checkpoint.h"
#include "ddprun/train/models.h"
#include "ddprun/train/optim.h"

namespace ddprun::train {

// The model's parameters and buffers (and the optimizer's state when `optim`
// is not null) as views for saveSafetensors. Count buffers are stored as I64
// in `counts`, which must outlive the views.
std::vector<TensorView> modelTensors(Model& model, Optimizer* optim,
                                     std::vector<std::vector<int64_t>>& counts);

// Copies a file's tensors into the model (and optimizer state when `optim` is
// not null). Nothing is copied unless every tensor fits: present, of this
// model's dtype and shape, every float finite, variances and Adam's second
// moments >= 0, batch counts >= 0. Returns false with the reason (naming
// `path` and the tensor) otherwise.
bool copyInto(const SafeTensors& st, const std::string& path, Model& model,
              Optimizer* optim, std::string* why);

}  // namespace ddprun::train
