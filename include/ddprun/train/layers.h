// Layers of the bundled trainer and the Backend that makes them.
//
// A Layer computes y = f(x) in forward() and, in backward(), accumulates the
// gradients of its parameters (Param::grad, which usually points into the
// Reducer's bucket memory) and writes dL/dx. forward() gives y its shape and
// element type (float, or a device's 16-bit activations: Tensor::dtype());
// dL/dy has y's type and dL/dx is given x's. Layers keep what backward needs
// from forward (im2col columns, pooling argmax, normalised activations), so
// one forward is followed by at most one backward.
//
// The Backend is the seam for devices: the CPU backend (OpenBLAS GEMM for
// linear and convolution layers, plain loops for the rest) lives in
// src/train/cpu/; the CUDA backend (src/train/cuda/) implements the same
// interface (cuDNN, cuBLAS) without changes to the reducer, the sampler or the
// loop.
//
// Thread-safety: a layer belongs to one training thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ddprun/train/precision.h"
#include "ddprun/train/tensor.h"

namespace ddprun::runtime {
class ProcessGroup;
class GradientMemory;
}

namespace ddprun::train {

// The trainer's random numbers (initialisation): mt19937_64 with an explicit
// float draw, so results do not depend on the standard library's
// distributions. state()/restore() round-trip through text for checkpoints.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : gen_(seed) {}
  float uniform(float lo, float hi);  // [lo, hi)
  float normal();                     // Box-Muller
  uint64_t next() { return gen_(); }
  std::string state() const;
  void restore(const std::string& s);

 private:
  std::mt19937_64 gen_;
};

struct Param {
  std::string name;  // PyTorch state_dict name, e.g. "conv1.weight"
  Tensor value;
  Tensor grad;       // same shape; a view into the reducer's bucket, or owned
  // The gradient is logically zero: the next backward that produces this
  // parameter's gradient writes it (overwrites grad's contents) instead of
  // adding to it, and clears the flag. The training loop sets it instead of
  // zeroing the gradients (no memset per step); a layer whose backward
  // produces no gradient for a set flag (an empty batch) zeroes grad itself.
  bool overwriteGrad = false;
};

// Non-trainable state saved with the model (batch norm running statistics).
struct Buffer {
  std::string name;
  Tensor value;
  bool isCount = false;  // stored as int64 (num_batches_tracked)
};

class Layer {
 public:
  virtual ~Layer() = default;
  const std::string& name() const { return name_; }
  virtual Shape outputShape(const Shape& in) const = 0;
  // `training` selects batch statistics (batch norm) and keeps state for
  // backward.
  virtual void forward(const Tensor& x, Tensor& y, bool training) = 0;
  // Accumulates parameter gradients (+=) and writes dL/dx into *dx (dx may
  // be null when nobody needs it: the first layer).
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) = 0;
  virtual std::vector<Param*> params() { return {}; }
  virtual std::vector<Buffer*> buffers() { return {}; }
  // Whether backward() reads y's elements (false: only x's, dy's and the
  // shapes), so that an in-place layer after it may overwrite y.
  virtual bool backwardReadsOutput() const { return true; }
  // Whether forward(x, y) may be given a y that shares x's storage: an
  // element-wise layer whose backward reads only y (ReLU). The Model then
  // runs it in place when the layer before does not read its own output.
  virtual bool worksInPlace() const { return false; }
  // Whether backwardAccumulate() is supported: backward with dL/dx added to
  // a gradient dx already holds (a residual block's two branches), in the
  // layer's own pass where the device allows (a GPU convolution: beta = 1).
  virtual bool accumulatesDx() const { return false; }
  // As backward(x, y, dy, &dx), but dx += dL/dx. Precondition:
  // accumulatesDx(); dx has x's shape and element type (InvalidArgument
  // otherwise). The default throws InvalidArgument.
  virtual void backwardAccumulate(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx);

 protected:
  explicit Layer(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
};

// Batch norm followed by a ReLU and, with a residual, the residual add
// between them: y = relu(bn(x) + z), ResNet's `out = bn2(conv2(..)); out +=
// identity; relu(out)` (and bn1 + relu, without z). One layer, so that a
// backend may run it in one pass forward (batch norm fused with the add and
// the ReLU) and fold the ReLU's mask and the residual's gradient into batch
// norm's backward. params() and buffers() are the batch norm's, named as
// batchNorm2d's. As a plain Layer (no residual) forward(x, y) is y =
// relu(bn(x)).
class BatchNormAct : public Layer {
 public:
  // z: null without a residual, else x's shape; neither x nor z may share
  // y's storage.
  virtual void forward(const Tensor& x, const Tensor* z, Tensor& y, bool training) = 0;
  // From dL/dy: dL/dx into *dx (null: not wanted) and, with a residual,
  // dL/dz into *dz (required then: the ReLU's masked dy, which is also the
  // batch norm's dy). Reads x and forward's y.
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx,
                        Tensor* dz) = 0;
  bool residual() const { return residual_; }
  // Whether recompute() works here: y again from x and the last training
  // forward's batch statistics, bit for bit that forward's y, changing no
  // statistic, running buffer or counter (a model may then give y back after
  // its last forward reader and recompute it for backward: issue 44 item 5).
  // The default: false.
  virtual bool recomputes() const { return false; }
  // Precondition: recomputes(), no residual, a training forward of x ran
  // last. The default throws InvalidArgument.
  virtual void recompute(const Tensor& x, Tensor& y);

  Shape outputShape(const Shape& in) const override { return in; }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

 protected:
  BatchNormAct(std::string name, bool residual) : Layer(std::move(name)), residual_(residual) {}
  // InvalidArgument unless z is given exactly with a residual (forward), and
  // dz with one (backward).
  void checkResidual(const Tensor* z) const;
  void checkResidualGrad(const Tensor* dz) const;

 private:
  bool residual_;
};

// Convolution geometry: square kernel, stride and zero padding; `bias`
// false for convolutions followed by batch norm (ResNet's bias=False).
struct Conv2dSpec {
  int64_t inC = 0, outC = 0;
  int kernel = 1, stride = 1, pad = 0;
  bool bias = true;
};
// Max pooling: square window, stride (0: the window), zero-free padding
// (padded positions never win: PyTorch's -inf padding), floor mode.
struct Pool2dSpec {
  int kernel = 2, stride = 0, pad = 0;
};

// Precision (the device's arithmetic): precision.h.

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  virtual std::string describe() const = 0;

  // Parameters are zero here; Model::initialize draws them (PyTorch's
  // default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases).
  virtual std::unique_ptr<Layer> linear(std::string name, int64_t in, int64_t out) = 0;
  virtual std::unique_ptr<Layer> conv2d(std::string name, const Conv2dSpec& spec) = 0;
  // Stride 1 with bias (LeNet's convolutions).
  std::unique_ptr<Layer> conv2d(std::string name, int64_t inC, int64_t outC, int kernel, int pad) {
    return conv2d(std::move(name), Conv2dSpec{inC, outC, kernel, 1, pad, true});
  }
  virtual std::unique_ptr<Layer> maxPool2d(std::string name, const Pool2dSpec& spec) = 0;
  // Window k, stride k (PyTorch's MaxPool2d(k)).
  std::unique_ptr<Layer> maxPool2d(std::string name, int k) {
    return maxPool2d(std::move(name), Pool2dSpec{k, k, 0});
  }
  // [N, C, H, W] -> [N, C]: AdaptiveAvgPool2d(1) then flatten(1) (torchvision's
  // ResNet head).
  virtual std::unique_ptr<Layer> globalAvgPool(std::string name) = 0;
  virtual std::unique_ptr<Layer> relu(std::string name) = 0;
  // [N, ...] -> [N, rest]: a view on every device (shared by the backends).
  virtual std::unique_ptr<Layer> flatten(std::string name);
  // `sync` non-null: SyncBatchNorm over that group (statistics all-reduced in
  // forward, the matching sums in backward).
  virtual std::unique_ptr<Layer> batchNorm2d(std::string name, int64_t channels,
                                             runtime::ProcessGroup* sync) = 0;
  // Batch norm `name` (as batchNorm2d) with the ReLU after it and, with
  // `residual`, the residual add before that ReLU (BatchNormAct). The
  // default composes batchNorm2d, add() and relu() (the arithmetic of the
  // three layers run apart); a device may fuse them.
  virtual std::unique_ptr<BatchNormAct> batchNormAct(std::string name, int64_t channels,
                                                     runtime::ProcessGroup* sync, bool residual);
  // Batch norm `bnName` with the ReLU after it and then max pooling
  // `poolName` (ResNet's stem) as one layer, where this backend fuses them
  // (it computes exactly what batchNormAct and maxPool2d compute apart, and
  // keeps their parameter and buffer names); nullptr where it does not: the
  // caller composes the two layers. The default: nullptr.
  virtual std::unique_ptr<Layer> batchNormActPool(std::string bnName, std::string poolName,
                                                  int64_t channels, runtime::ProcessGroup* sync,
                                                  const Pool2dSpec& pool) {
    (void)bnName, (void)poolName, (void)channels, (void)sync, (void)pool;
    return nullptr;
  }

  // Mean cross-entropy of the batch; writes dL/dlogits (times `gradScale`,
  // the fp16 loss scale) when asked and counts the rows whose arg-max equals
  // the label. `labels` is host memory (the backend uploads what it needs).
  // Returns once the loss is known on the host. With label smoothing set
  // (setLabelSmoothing) the loss and gradient are the smoothed ones; the
  // arg-max count is not affected.
  virtual double crossEntropy(const Tensor& logits, const int32_t* labels, Tensor* dlogits,
                              int64_t* correct, float gradScale = 1.0f) = 0;

  // Training's loss without waiting for it: as crossEntropy (dL/dlogits times
  // gradScale into *dlogits), but the batch's summed row losses are added to
  // an accumulator instead of being returned; takeLossSum() returns what was
  // added since its last call (waiting for it, on a device) and resets it. A
  // device backend thus synchronises only when the loss is reported. The
  // default: crossEntropy, accumulated on the host.
  virtual void crossEntropyDeferred(const Tensor& logits, const int32_t* labels, Tensor* dlogits,
                                    float gradScale);
  virtual double takeLossSum();
  // crossEntropyDeferred in two halves, so that the second can be recorded
  // in a CUDA graph (capture()): stageLabels checks n labels against
  // `classes` (InvalidArgument naming a bad one) and copies them where the
  // backend keeps the step's labels (a device: its fixed device slot, from
  // pinned staging); crossEntropyStaged is crossEntropyDeferred on the
  // staged labels (logits with n rows). The defaults keep a host copy.
  virtual void stageLabels(const int32_t* labels, int64_t n, int64_t classes);
  virtual void crossEntropyStaged(const Tensor& logits, Tensor* dlogits, float gradScale);

  // CUDA graphs (the trainer's StepGraphPlan, step_graph_plan.h). A step's
  // device work recorded once and replayed as one launch.
  class StepGraph {
   public:
    virtual ~StepGraph() = default;
    // Issues the recorded work again on the backend's stream (no wait).
    virtual void replay() = 0;
  };
  // "" when capture() may work on this backend, else why not (the default:
  // this backend runs its steps eagerly).
  virtual std::string captureRefusal() const;
  // Records the device work `body` issues through this backend into a
  // graph, without running it (replay() runs it). nullptr, with *why set,
  // when it cannot (captureRefusal()) or the capture failed: body threw, or
  // CUDA refused what it issued (a cudaMalloc the caching allocator could
  // not avoid, a host synchronisation, a call that cannot be captured). Then
  // none of body's device work ran and the backend works as before; host
  // state body changed stays changed (the caller redoes the step eagerly).
  // While body runs, the backend's layers skip host-side bookkeeping that a
  // replay would not repeat (batch norm's step counter check).
  virtual std::unique_ptr<StepGraph> capture(const std::function<void()>& body,
                                             std::string* why);
  // torch.nn.CrossEntropyLoss(label_smoothing=eps) for every later
  // crossEntropy and crossEntropyDeferred (training's and evaluation's loss
  // alike; set 0 around a call that wants the plain loss): the target
  // distribution is (1 - eps) * onehot(y) + eps/K over K classes
  // (kmath::crossEntropyLoss/crossEntropyGrad). 0 (the default) is the plain
  // cross-entropy, bit for bit. Throws InvalidArgument unless 0 <= eps <= 1
  // (PyTorch's range). A backend that does not implement the loss's
  // arithmetic itself (a test's fake) may ignore it.
  void setLabelSmoothing(float eps);
  float labelSmoothing() const { return labelSmoothing_; }

  // Optimizer kernels (torch.optim semantics, see optim.h); pointers are
  // this backend's memory. SGD's `nesterov` (momentum != 0): the update
  // direction is g' + momentum*buf instead of buf (kmath::sgdStep).
  virtual void sgdUpdate(float* w, const float* g, float* buf, size_t n, float lr,
                         float momentum, float weightDecay, bool firstStep,
                         bool nesterov = false) = 0;
  virtual void adamUpdate(float* w, const float* g, float* m, float* v, size_t n, float lr,
                          float beta1, float beta2, float eps, float weightDecay,
                          int64_t step) = 0;
  // One optimizer step over several contiguous chunks of parameters at once
  // (a device backend: one multi-tensor launch for all chunks): chunk i
  // updates n elements of w from g, with state s1 (SGD's momentum buffer,
  // null without momentum; Adam's exp_avg) and s2 (Adam's exp_avg_sq); w16,
  // when not null, receives the updated weights rounded to the backend's
  // 16-bit type (the autocast copy of bf16/fp16), in the same pass. The
  // defaults call sgdUpdate/adamUpdate per chunk (and ignore w16).
  struct OptimChunk {
    float* w = nullptr;
    const float* g = nullptr;
    float* s1 = nullptr;
    float* s2 = nullptr;
    void* w16 = nullptr;
    size_t n = 0;
  };
  virtual void sgdStep(const std::vector<OptimChunk>& chunks, float lr, float momentum,
                       float weightDecay, bool firstStep, bool nesterov = false);
  virtual void adamStep(const std::vector<OptimChunk>& chunks, float lr, float beta1,
                        float beta2, float eps, float weightDecay, int64_t step);
  // The optimizer inside a recorded step (capture()). A replay repeats every
  // argument the step was recorded with except those that change each step:
  // the learning rate, SGD's firstStep and Adam's step. An sgdStep/adamStep
  // issued while a capture records reads them, when it runs, from the
  // backend's optimizer slot, which stageOptimizerStep fills (stream
  // ordered: the work issued after it reads these values; the host's copy is
  // free on return) with what an eager call would be given. Outside a
  // capture sgdStep/adamStep use their arguments, as always; a slot staged
  // then is unused. The default (a backend that does not capture): nothing.
  virtual void stageOptimizerStep(float lr, bool firstStep, int64_t step, float beta1,
                                  float beta2);

  // Element-wise work on this backend's memory, ordered with its layers.
  // out = a + b (out may be a or b; same number of elements and element
  // type: float, or a device's 16-bit activations).
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  virtual void zero(Tensor& t) = 0;
  // dst gets src's elements (same number of elements and element type; dst
  // keeps its shape).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // y = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)
  // for [N, C, H, W] x (y is given that shape).
  virtual void resizeBilinear(const Tensor& x, int64_t h, int64_t w, Tensor& y) = 0;
  // data *= scale over n elements; returns false when any result is not
  // finite (the fp16 loss scaler's overflow check). Waits for the answer.
  virtual bool scaleAndCheckFinite(float* data, size_t n, float scale) = 0;

  // Host <-> backend memory (identity copies on CPU). Synchronous: on return
  // the host side may be reused or read.
  virtual void upload(const float* host, float* dst, size_t n) = 0;
  virtual void download(const float* src, float* host, size_t n) = 0;
  // The input pipeline: copies a host batch of numelOf(shape) floats into
  // memory this backend owns and returns it as a tensor of `shape`; the host
  // memory may be reused on return. On a device the copy runs from pinned
  // staging on a copy stream, overlapping the compute already issued, and the
  // compute issued after this call waits for it. The tensor may be read by
  // work issued before the next call (inputs are double-buffered). The
  // default: an allocation and upload().
  virtual Tensor uploadInput(const float* host, const Shape& shape);
  // The model's input from a batch in NCHW order (uploadInput's, or resized):
  // the same tensor where the backend's activations are NCHW (the default);
  // on a backend whose activations are NHWC in memory (CudaBackendOptions::
  // nhwc) a transposed copy in memory the backend owns, valid until the next
  // call (work issued before then may read it). Shapes stay [N, C, H, W]
  // either way: the layout is how the elements lie, not the shape.
  virtual Tensor modelInput(const Tensor& x) { return x; }
  // Waits until everything issued so far has finished (timing, benchmarks).
  virtual void synchronize() = 0;
  // Whether models give this backend's activations back to its allocator as
  // soon as backward has used them (and evaluation's once the next layer
  // has read them), instead of keeping them from step to step: a device's
  // caching allocator hands the memory out again without a system call, so
  // the peak is what one step needs; host allocations are not cached, so
  // the CPU keeps them (the default: every backend but the CPU).
  virtual bool releasesActivations() const { return device() != Device::kCpu; }
  // High-water mark of the device memory this backend holds in tensors
  // (activations, parameters, gradients, optimizer state, workspaces), in
  // bytes allocated, each request rounded up to 512 bytes as PyTorch's
  // torch.cuda.max_memory_allocated counts them; 0 on the CPU.
  virtual size_t peakDeviceBytes() const { return 0; }
  // High-water mark of the device memory reserved from CUDA (what is
  // allocated plus the allocator's cache and rounding: PyTorch's
  // max_memory_reserved); 0 on the CPU.
  virtual size_t peakReservedBytes() const { return 0; }
  // Starts both high-water marks again from what is held now (PyTorch's
  // reset_peak_memory_stats), e.g. after warm-up.
  virtual void resetPeakDeviceBytes() {}
  // Host synchronisations with the device so far (calls: every wait the
  // backend made; waits: those that found the device still busy). Zeros on
  // the CPU, which never waits for a device.
  struct HostSyncs {
    int64_t calls = 0, waits = 0;
  };
  virtual HostSyncs hostSyncs() const { return {}; }

  // The profile's timeline. mark() records a point in the order of the work
  // issued so far (a device: a timing event on the compute stream, no wait;
  // the CPU: the wall clock) and returns its index. markTimesMs() waits for
  // the device and returns every mark's time in milliseconds relative to
  // mark 0; clearMarks() forgets them. Marks cost no synchronisation, so
  // profiled steps keep the order and overlap of unprofiled ones.
  virtual size_t mark();
  virtual std::vector<double> markTimesMs();
  virtual void clearMarks();
  // Opens (true) or closes (false) the window of an external kernel tracer:
  // cudaProfilerStart/Stop on CUDA (the CUPTI tracer of the benchmarks
  // records kernels between them); nothing on the CPU.
  virtual void profilerRange(bool on) {}

  // Where the reducer keeps gradient buckets for this backend: the CPU's
  // shared heap, or device memory ordered after this backend's compute (the
  // all-reduce of a bucket starts only once the kernels that wrote its
  // gradients finished, without the training thread waiting).
  virtual std::unique_ptr<runtime::GradientMemory> gradientMemory(runtime::ProcessGroup& pg) = 0;

 private:
  double deferredLoss_ = 0;  // the default crossEntropyDeferred's accumulator
  std::vector<int32_t> stagedLabels_;  // the default stageLabels' copy
  float labelSmoothing_ = 0.0f;
  std::vector<double> markTimes_;  // the default mark()'s wall-clock times (seconds)
};

// The CPU backend; `threads` is OpenBLAS's thread count (1 keeps runs
// bitwise reproducible and fits one worker per core).
std::unique_ptr<Backend> makeCpuBackend(int threads = 1);

// The CUDA backend (cuDNN, cuBLASLt, our kernels) on GPU `device`, computing
// on its own stream. Throws InvalidArgument when this build has no CUDA or
// the device does not exist, IoError for CUDA failures.
struct CudaBackendOptions {
  int device = 0;
  Precision precision = Precision::kFp32;
  // Bitwise-repeatable runs: only deterministic cuDNN algorithms, and in fp32
  // only those that sum products directly (no Winograd or FFT). Off: any
  // algorithm that passes an accuracy check against a float64 reference, the
  // one with the smallest workspace within 3 % of the fastest
  // (src/train/cuda/conv_search.h).
  bool deterministic = false;
  // Activations NHWC in memory (PyTorch's channels_last; shapes stay
  // [N, C, H, W]): cuDNN's tensor-core convolutions and batch norm run
  // without transposes. Parameters stay in PyTorch's layout (OIHW filters),
  // so checkpoints, the reducer and the optimizer never see the layout;
  // convolutions transpose their filters to KRSC once per forward (fused
  // with the 16-bit cast in bf16/fp16) and their gradients back. A tensor
  // handed to a layer must be in the backend's layout: inputs go through
  // Backend::modelInput, and Flatten turns NHWC into PyTorch's C, H, W order.
  // Off: every activation NCHW (train --layout nchw, the A/B and fallback).
  bool nhwc = false;
  // bf16/fp16 with nhwc: the activations between layers, and the gradients
  // flowing back through them, are stored in 16 bits (Tensor::dtype()), as
  // autocast on channels_last keeps them: convolutions read and write them
  // directly (no casts), batch norm runs our NHWC kernels (float statistics,
  // fused with the ReLU and the residual add: bn_nhwc.h), ReLU, pooling and
  // the adds move 16-bit elements; linear layers take 16-bit inputs and give
  // float outputs, so the logits and the loss stay float. Parameters,
  // gradients and optimizer state stay float. Ignored in fp32/tf32 or NCHW.
  // train turns it on (DDPRUN_CUDA_ACT16=0 turns it off: backend_choice.cc);
  // the struct's default is the plain path the tests name explicitly.
  bool activations16 = false;
  // NHWC with float activations: batch norm through our NHWC kernels (fused
  // with the ReLU and the residual add, SyncBatchNorm included) instead of
  // cuDNN's (the A/B of the two; always ours with activations16). Ignored
  // with NCHW. train turns it on (DDPRUN_CUDA_OUR_BN=0 keeps cuDNN's).
  bool ourBatchNorm = false;
  // Convolutions through cuDNN's graph API (src/train/cuda/cudnn_graph.h):
  // its engines for each problem (heuristics mode A, then the fallback list:
  // the set PyTorch's cudnn.benchmark times) are timed and accuracy-checked
  // under the same policy as the legacy API's algorithms, which they
  // replace. kAll also tries engines whose plan compiles a kernel at run
  // time (seconds each). NHWC in fast mode only (deterministic mode keeps
  // the legacy heuristics); where no engine may run, the legacy search runs.
  enum class GraphConv { kOff, kPrecompiled, kAll };
  GraphConv graphConv = GraphConv::kOff;
  // Max pooling through our NHWC kernels (kernel <= 16) from the start,
  // not only where cuDNN refuses the configuration (DDPRUN_CUDA_OWN_POOL=1).
  bool ownPool = false;
  // NHWC, float activations, cuDNN's batch norm: cuDNN's fused batch norm +
  // ReLU (+ add) kernels instead of the layers apart (DDPRUN_CUDNN_BN_FUSION=1;
  // opt-in until a GPU run has measured it).
  bool cudnnBnFusion = false;
  // Our batch norm (16-bit activations or ourBatchNorm, NHWC): ResNet's stem,
  // bn1 + ReLU + the 3x3/2 max pool, as one layer (batchNormActPool), the
  // activation recomputed under each window instead of stored
  // (DDPRUN_CUDA_FUSED_STEM=1; opt-in until a GPU run has measured it).
  bool fusedStem = false;
  // Our batch norm: each sums launch folds in the chunk reduction and what
  // follows it (the statistics' finish forward, the parameter gradients
  // backward) through its last block per channel tile: 2 launches a
  // direction instead of 4 (DDPRUN_CUDA_BN_FOLD=1; the same sums bit for bit;
  // opt-in until a GPU run has measured it).
  bool bnFold = false;
  // Training steps recorded once as a CUDA graph and replayed (one rank:
  // forward, loss and backward; the trainer's StepGraphPlan says when;
  // DDPRUN_CUDA_GRAPH=1; opt-in until a GPU run has measured it).
  bool cudaGraph = false;
  // ResNet's blocks give conv2's input (relu(bn1(.))) back after forward and
  // recompute it from bn1's input for backward, on our batch norm kernels
  // (DDPRUN_CUDA_RECOMPUTE=1; opt-in until a GPU run has measured it).
  bool recompute = false;
  // Our batch norm's kernels launched with programmatic dependent launch
  // (PDL, compute capability 9.0+: each kernel's launch overlaps the tail
  // of the kernel before it; the same bits), DDPRUN_CUDA_PDL=1; opt-in
  // until a GPU run has measured it. Ignored on older devices.
  bool pdl = false;
  // Device memory: our caching allocator (free lists per size class), or
  // CUDA's stream-ordered cudaMallocAsync pool (DDPRUN_CUDA_ALLOCATOR=async).
  enum class Memory { kCaching, kAsync };
  Memory memory = Memory::kCaching;
};

std::unique_ptr<Backend> makeCudaBackend(const CudaBackendOptions& o);

}  // namespace ddprun::train
