// Which kernels run a batch norm layer of the CUDA backend: one decision per
// layer, made once when the model is built (CudaBackend::batchNorm2d and
// batchNormAct) from the backend's options and how the model uses the layer,
// and named in the trainer's start line (CudaBackend::describe). The layers
// (batch_norm.h) run what the decision says; the only later changes are
// cuDNN refusing a configuration at its first call, said once on stderr
// (kCudnnNhwcFused runs as kCudnnNhwc with the add and ReLU apart; kCudnnNhwc
// as kCudnnNchw's plain API over NHWC descriptors).
//
// The table (nhwc: CudaBackendOptions::nhwc; ours: 16-bit activations, or
// ourBatchNorm on NHWC, Context::ourBatchNorm; fused: ReLU, or ReLU and the
// residual add, after the batch norm, Backend::batchNormAct):
//
//   ours  sync  layout  fusion option  ->  path               ReLU / add
//   yes   any   NHWC    any                kOursNhwc          in the kernels
//   no    yes   any     any                kOursSync          apart
//   no    no    NHWC    on, fused          kCudnnNhwcFused    in cuDNN's kernels
//   no    no    NHWC    otherwise          kCudnnNhwc         apart
//   no    no    NCHW    any                kCudnnNchw         apart
//
// Evaluation forwards use the running statistics on the same family:
// cuDNN's inference kernel for the cuDNN paths and kOursSync, ours for
// kOursNhwc. Header-only and free of CUDA types, so the CPU tests check the
// table (tests/unit/train/bn_path_test.cc).
#pragma once

#include <string>

namespace ddprun::train::cuda {

enum class BnKernels {
  kCudnnNchw,       // cuDNN's spatial batch norm (cudnnBatchNormalization*)
  kCudnnNhwc,       // cuDNN's NHWC persistent kernels (the Ex API, SPATIAL_PERSISTENT)
  kCudnnNhwcFused,  // the same with the ReLU (and the add) in cuDNN's kernels
  kOursNhwc,        // our NHWC kernels (bn_nhwc.h), any element type, SyncBatchNorm too
  kOursSync,        // SyncBatchNorm on float activations: our sums (bn_nchw.h)
};

// What follows the batch norm in the model's block (Backend::batchNormAct).
enum class BnFusedWith { kNone, kRelu, kReluAdd };

struct BnChoice {
  bool nhwc = false;
  bool ours = false;           // Context::ourBatchNorm()
  bool cudnnFusion = false;    // Context::cudnnBnFusion()
  bool sync = false;           // SyncBatchNorm
  BnFusedWith fusedWith = BnFusedWith::kNone;
};

struct BnPath {
  BnKernels kernels = BnKernels::kCudnnNchw;
  // The ReLU (and the add) run in the batch norm's own kernels; false: as
  // layers apart (Backend::batchNormAct's composition) or nothing to fuse.
  bool fused = false;

  bool operator==(const BnPath&) const = default;
};

constexpr BnPath chooseBnPath(const BnChoice& c) {
  const bool fusable = c.fusedWith != BnFusedWith::kNone;
  if (c.ours) return {BnKernels::kOursNhwc, fusable};
  if (c.sync) return {BnKernels::kOursSync, false};
  if (!c.nhwc) return {BnKernels::kCudnnNchw, false};
  if (c.cudnnFusion && fusable) return {BnKernels::kCudnnNhwcFused, true};
  return {BnKernels::kCudnnNhwc, false};
}

// The path's name in the start line, e.g. "ours-nhwc+relu+add".
inline std::string bnPathName(const BnPath& p, BnFusedWith w) {
  std::string s;
  switch (p.kernels) {
    case BnKernels::kCudnnNchw: s = "cudnn-nchw"; break;
    case BnKernels::kCudnnNhwc: s = "cudnn-nhwc"; break;
    case BnKernels::kCudnnNhwcFused: s = "cudnn-nhwc-fused"; break;
    case BnKernels::kOursNhwc: s = "ours-nhwc"; break;
    case BnKernels::kOursSync: s = "ours-sync"; break;
  }
  if (w == BnFusedWith::kNone) return s;
  const char* tail = w == BnFusedWith::kRelu ? "relu" : "add+relu";
  return s + (p.fused ? "+" : " then ") + tail;
}

}  // namespace ddprun::train::cuda
