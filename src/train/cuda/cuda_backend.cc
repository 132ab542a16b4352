// The CUDA backend of `train`: cuDNN (convolution, pooling, batch norm),
// cuBLASLt (linear) and our kernels (loss, optimizers, element-wise), all on
// one non-blocking compute stream per backend; memory from a caching
// allocator. See cuda_layers.h for the layers, context.h for what they share.
// Precisions: fp32, tf32, and bf16/fp16 as torch.autocast (convolutions and
// linear layers compute on 16-bit casts of their inputs and weights with
// float accumulation; see conv.cc and linear.cc; the master weights
// and the gradients stay float). The activations between layers are float,
// or 16-bit with CudaBackendOptions::activations16 (cuda_layers.h says how
// the layers treat either).
#include <cuda_profiler_api.h>
#include <cudnn.h>

#include <cstring>
#include <vector>

#include "../cuda_plugin.h"
#include "cross_entropy.h"
#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "ddprun/build_id.h"  // generated: cmake/build_id.cmake
#include "ddprun/common/plugin.h"
#include "ddprun/runtime/cuda.h"
#include "elementwise.h"
#include "loss_kernels.h"
#include "optim_kernels.h"
#include "pool_kernels.h"
#include "staged_upload.h"
#include "step_graph.h"
#include "transpose.h"

namespace ddprun::train {

namespace cuda {

Param makeDeviceParam(Context& ctx, const std::string& name, const Shape& shape) {
  Param p;
  p.name = name;
  p.value = Tensor(shape, ctx.allocator());
  p.grad = Tensor(shape, ctx.allocator());
  return p;
}

void* castTo16(Context& ctx, const float* src, size_t n, DeviceArray<uint16_t>& dst) {
  void* p = dst.ensure(n);
  launchTo16(src, p, n, ctx.bf16(), ctx.stream());
  return p;
}

void checkType(const Tensor& a, const Tensor& b, const char* what) {
  DDPRUN_CHECK(a.dtype() == b.dtype(), what, ": a ", runtime::dtypeName(a.dtype()), " and a ",
               runtime::dtypeName(b.dtype()), " tensor (", shapeString(a.shape()), ", ",
               shapeString(b.shape()), "): their element types must agree");
}

namespace {

void checkSame(const Tensor& a, const Tensor& b, const char* what) {
  DDPRUN_CHECK(a.numel() == b.numel(), what, " of ", shapeString(a.shape()), " and ",
               shapeString(b.shape()), ": element counts differ");
  checkType(a, b, what);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o)
      : ctx_(std::make_shared<Context>(o)),
        ce_(ctx_), flag_(ctx_), stepScalars_(ctx_) {}
  ~CudaBackend() override {
    try {
      ctx_->bind();
      copy_.synchronize();  // no copy may still read a staging buffer
      ctx_->synchronize();
    } catch (...) {  // a destructor must not throw; the context cleans up regardless
    }
  }

  Device device() const override { return Device::kCuda; }
  Allocator& allocator() override { return ctx_->allocator(); }
  std::string describe() const override {
    const size_t v = cudnnGetVersion();
    return "cuda:" + std::to_string(ctx_->device()) + " (" + ctx_->deviceName() + ", cuDNN " +
           std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + ", " +
           precisionName(ctx_->precision()) + (ctx_->nhwc() ? ", nhwc" : ", nchw") +
           (ctx_->activations16() ? ", 16-bit activations" : "") +
           (ctx_->ourBatchNorm() ? ", our batch norm" : "") +
           (ctx_->bnFold() ? " (sums folded)" : "") + (ctx_->pdl() ? " (PDL)" : "") +
           bnPathsNote() +
           graphConvNote(ctx_->graphConv()) + ")";
  }

  std::string captureRefusal() const override { return stepGraphRefusal(*ctx_); }
  std::unique_ptr<StepGraph> capture(const std::function<void()>& body,
                                     std::string* why) override {
    return captureStepGraph(ctx_, body, why);
  }

  static std::string graphConvNote(CudaBackendOptions::GraphConv g) {
    switch (g) {
      case CudaBackendOptions::GraphConv::kOff: return "";
      case CudaBackendOptions::GraphConv::kPrecompiled: return ", cuDNN graph convolutions";
      case CudaBackendOptions::GraphConv::kAll:
        return ", cuDNN graph convolutions with runtime-compiled engines";
    }
    return "";
  }

  std::unique_ptr<Layer> linear(std::string n, int64_t in, int64_t out) override {
    return makeLinear(ctx_, std::move(n), in, out);
  }
  std::unique_ptr<Layer> conv2d(std::string n, const Conv2dSpec& s) override {
    return makeConv2d(ctx_, std::move(n), s);
  }
  std::unique_ptr<Layer> maxPool2d(std::string n, const Pool2dSpec& s) override {
    return makeMaxPool2d(ctx_, std::move(n), s);
  }
  std::unique_ptr<Layer> globalAvgPool(std::string n) override {
    return makeGlobalAvgPool(ctx_, std::move(n));
  }
  std::unique_ptr<Layer> flatten(std::string n) override {
    if (!ctx_->nhwc()) return Backend::flatten(std::move(n));
    return makeFlattenNhwc(ctx_, Backend::flatten(std::move(n)));
  }
  std::unique_ptr<Layer> relu(std::string n) override {
    return makeRelu(ctx_, std::move(n));
  }
  // Batch norm: the path from bn_path.h's table, decided here once per
  // layer and named in describe().
  std::unique_ptr<Layer> batchNorm2d(std::string n, int64_t c, runtime::ProcessGroup* s) override {
    const BnPath p = chooseBnPath(*ctx_, s != nullptr, BnFusedWith::kNone);
    if (!composing_) notePath(bnPathName(p, BnFusedWith::kNone));
    return makeBatchNorm2d(ctx_, std::move(n), c, s, p);
  }
  // A fused path runs BatchNormAct as one layer; the others compose the
  // batch norm, the add and the ReLU (Backend's composition).
  std::unique_ptr<BatchNormAct> batchNormAct(std::string n, int64_t c, runtime::ProcessGroup* s,
                                             bool residual) override {
    const BnFusedWith w = residual ? BnFusedWith::kReluAdd : BnFusedWith::kRelu;
    const BnPath p = chooseBnPath(*ctx_, s != nullptr, w);
    notePath(bnPathName(p, w));
    if (p.fused) return makeBatchNormAct(ctx_, std::move(n), c, s, residual, p);
    composing_ = true;
    try {
      auto layer = Backend::batchNormAct(std::move(n), c, s, residual);
      composing_ = false;
      return layer;
    } catch (...) {
      composing_ = false;
      throw;
    }
  }

  // ResNet's stem as one layer where our fused kernels run its batch norm
  // (CudaBackendOptions::fusedStem); else nullptr: the model composes.
  std::unique_ptr<Layer> batchNormActPool(std::string bnName, std::string poolName, int64_t c,
                                          runtime::ProcessGroup* s,
                                          const Pool2dSpec& pool) override {
    const BnPath p = chooseBnPath(*ctx_, s != nullptr, BnFusedWith::kRelu);
    if (!ctx_->fusedStem() || p.kernels != BnKernels::kOursNhwc || pool.kernel > 16 ||
        pool.pad > pool.kernel / 2)
      return nullptr;
    notePath(bnPathName(p, BnFusedWith::kRelu) + "+maxpool");
    return makeBatchNormActPool(ctx_, bnName, poolName, c, s, pool, p);
  }

  double crossEntropy(const Tensor& logits, const int32_t* labels, Tensor* dlogits,
                      int64_t* correct, float gradScale) override {
    stageAndLaunchLoss(logits, labels, dlogits, gradScale);
    const CeResult r = ce_.result();
    if (correct) *correct = r.correct;
    const int64_t n = logits.dim(0);
    return n ? r.lossSum / static_cast<double>(n) : 0.0;
  }
  void crossEntropyDeferred(const Tensor& logits, const int32_t* labels, Tensor* dlogits,
                            float gradScale) override {
    stageAndLaunchLoss(logits, labels, dlogits, gradScale);
    ce_.accumulate();
  }
  void stageLabels(const int32_t* labels, int64_t n, int64_t classes) override {
    ctx_->bind();
    ce_.stage(labels, n, classes);
  }
  void crossEntropyStaged(const Tensor& logits, Tensor* dlogits, float gradScale) override {
    ctx_->bind();
    ce_.launch(logits, dlogits, gradScale, labelSmoothing());
    ce_.accumulate();
  }
  double takeLossSum() override {
    ctx_->bind();
    return ce_.takeSum();
  }

  void sgdUpdate(float* w, const float* g, float* buf, size_t n, float lr, float momentum,
                 float wd, bool first, bool nesterov) override {
    ctx_->bind();
    launchSgd(w, g, buf, n, lr, momentum, wd, first, nesterov, ctx_->stream());
  }
  void adamUpdate(float* w, const float* g, float* m, float* v, size_t n, float lr, float b1,
                  float b2, float eps, float wd, int64_t step) override {
    ctx_->bind();
    launchAdam(w, g, m, v, n, kmath::adamScalars(lr, b1, b2, step), b1, b2, eps, wd,
               ctx_->stream());
  }
  // One multi-tensor launch for all chunks (one per kMaxOptimChunks), the
  // 16-bit weight copies written in the same pass.
  void sgdStep(const std::vector<Backend::OptimChunk>& chunks, float lr, float momentum,
               float wd, bool first, bool nesterov) override {
    ctx_->bind();
    const cuda::OptimChunk* table = toKernelChunks(chunks);
    launchSgdMulti(table, chunks.size(), lr, momentum, wd, first, nesterov, ctx_->bf16(),
                   ctx_->stream(), capturedStepScalars());
  }
  void adamStep(const std::vector<Backend::OptimChunk>& chunks, float lr, float b1, float b2,
                float eps, float wd, int64_t step) override {
    ctx_->bind();
    const cuda::OptimChunk* table = toKernelChunks(chunks);
    launchAdamMulti(table, chunks.size(), kmath::adamScalars(lr, b1, b2, step), b1, b2, eps, wd,
                    ctx_->bf16(), ctx_->stream(), capturedStepScalars());
  }
  void stageOptimizerStep(float lr, bool first, int64_t step, float b1, float b2) override {
    ctx_->bind();
    OptimStepScalars v;
    v.lr = lr;
    v.first = first ? 1 : 0;
    if (step > 0) v.adam = kmath::adamScalars(lr, b1, b2, step);
    stepScalarsUpload_.upload(&v, sizeof(v), stepScalars_.ensure(1), ctx_->stream());
  }

  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    checkSame(a, b, "add");
    checkSame(a, out, "add");
    ctx_->bind();
    launchAdd(a.raw(), b.raw(), out.raw(), static_cast<size_t>(a.numel()), a.dtype(),
              ctx_->stream());
  }
  void zero(Tensor& t) override {
    if (!t.numel()) return;
    ctx_->bind();
    DDPRUN_CUDA_OK(cudaMemsetAsync(t.raw(), 0, t.bytes(), ctx_->stream()));
  }
  void copy(const Tensor& src, Tensor& dst) override {
    checkSame(src, dst, "copy");
    if (!src.numel() || src.raw() == dst.raw()) return;
    ctx_->bind();
    DDPRUN_CUDA_OK(cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(), cudaMemcpyDeviceToDevice,
                                   ctx_->stream()));
  }
  void resizeBilinear(const Tensor& x, int64_t h, int64_t w, Tensor& y) override {
    DDPRUN_CHECK(x.rank() == 4 && x.dim(2) > 0 && x.dim(3) > 0 && h > 0 && w > 0,
                 "bilinear resize of ", shapeString(x.shape()), " to ", h, "x", w);
    ctx_->bind();
    y.ensure({x.dim(0), x.dim(1), h, w}, ctx_->allocator());
    launchResizeBilinear(x.data(), y.data(), x.dim(0) * x.dim(1), x.dim(2), x.dim(3), h, w,
                         ctx_->stream());
  }
  bool scaleAndCheckFinite(float* data, size_t n, float scale) override {
    ctx_->bind();
    int* flag = flag_.ensure(1);
    DDPRUN_CUDA_OK(cudaMemsetAsync(flag, 0, sizeof(int), ctx_->stream()));
    launchScaleCheckFinite(data, n, scale, flag, ctx_->stream());
    int nonFinite = 0;
    ctx_->readBack(flag, &nonFinite, sizeof(int));
    return nonFinite == 0;
  }

  void upload(const float* host, float* dst, size_t n) override {
    ctx_->bind();
    ctx_->upload(host, dst, n * sizeof(float));
  }
  void download(const float* src, float* host, size_t n) override {
    ctx_->bind();
    ctx_->download(src, host, n * sizeof(float));
  }
  void synchronize() override {
    ctx_->bind();
    ctx_->synchronize();
  }
  // kInputSlots slots in turn, each a pinned staging buffer and a device
  // buffer. A slot's copy (on copy_) first waits for `consumed`: the compute
  // work issued up to the call after the slot's last use, i.e. every kernel
  // that may read its previous batch; the compute stream then waits for
  // `copied`. A slot's device buffer is allocated (or grown) with the compute
  // stream drained, so that the copy stream never writes a cached block that
  // pending compute kernels still use. The host refills a slot's staging
  // buffer once its last copy ran; with several slots that copy is steps old,
  // so the host waits only when it runs that many steps ahead of the device
  // (and then for work queued long before, never draining the device).
  Tensor uploadInput(const float* host, const Shape& shape) override {
    ctx_->bind();
    const size_t n = static_cast<size_t>(numelOf(shape)), bytes = n * sizeof(float);
    InputSlot& prev = slots_[(nextSlot_ + kInputSlots - 1) % kInputSlots];
    if (prev.used) prev.consumed.record(ctx_->stream());
    InputSlot& s = slots_[nextSlot_];
    nextSlot_ = (nextSlot_ + 1) % kInputSlots;
    if (s.used && !s.copied.done()) s.copied.synchronize();  // its staging buffer is free again
    void* pin = s.pinned.ensure(std::max<size_t>(bytes, 1));
    if (bytes) std::memcpy(pin, host, bytes);
    if (n > s.capacity) {
      s.dev = Tensor({static_cast<int64_t>(n)}, ctx_->allocator());
      s.capacity = n;
      ctx_->synchronize();
    } else if (s.used) {
      DDPRUN_CUDA_OK(cudaStreamWaitEvent(copy_.get(), s.consumed.get(), 0));
    }
    if (bytes)
      DDPRUN_CUDA_OK(cudaMemcpyAsync(s.dev.data(), pin, bytes, cudaMemcpyHostToDevice,
                                     copy_.get()));
    s.copied.record(copy_.get());
    DDPRUN_CUDA_OK(cudaStreamWaitEvent(ctx_->stream(), s.copied.get(), 0));
    s.used = true;
    return Tensor::view(s.dev.data(), shape, Device::kCuda);
  }
  // NHWC: the batch transposed into a buffer of ours (reused each call; work
  // on the one stream reads it before the next call's transpose overwrites it).
  // With 16-bit activations the transpose rounds to 16 bits in the same pass.
  Tensor modelInput(const Tensor& x) override {
    if (!ctx_->nhwc() || x.rank() != 4) return x;
    ctx_->bind();
    nhwcInput_.ensure(x.shape(), ctx_->allocator(), ctx_->actType());
    if (ctx_->activations16())
      launchTransposeTo16(x.data(), nhwcInput_.raw(), x.dim(0), x.dim(1), x.dim(2) * x.dim(3),
                          ctx_->bf16(), ctx_->stream());
    else
      launchTranspose(x.data(), nhwcInput_.data(), x.dim(0), x.dim(1), x.dim(2) * x.dim(3),
                      false, ctx_->stream());
    return nhwcInput_;
  }
  size_t peakDeviceBytes() const override { return ctx_->peakBytes(); }
  size_t peakReservedBytes() const override { return ctx_->peakReservedBytes(); }
  void resetPeakDeviceBytes() override { ctx_->resetPeaks(); }
  HostSyncs hostSyncs() const override {
    const HostSyncCounts c = hostSyncCounts();
    return {c.calls, c.waits};
  }
  // Timing events recorded on the compute stream, from a pool reused across
  // profiles (no allocation or synchronisation while marking once warm).
  size_t mark() override {
    ctx_->bind();
    if (marks_ == markEvents_.size()) markEvents_.push_back(Event::createTiming());
    markEvents_[marks_].record(ctx_->stream());
    return marks_++;
  }
  std::vector<double> markTimesMs() override {
    std::vector<double> out;
    if (marks_ == 0) return out;
    ctx_->bind();
    markEvents_[marks_ - 1].synchronize();
    out.reserve(marks_);
    for (size_t i = 0; i < marks_; ++i) {
      float ms = 0.0f;
      DDPRUN_CUDA_OK(cudaEventElapsedTime(&ms, markEvents_[0], markEvents_[i]));
      out.push_back(ms);
    }
    return out;
  }
  void clearMarks() override { marks_ = 0; }
  void profilerRange(bool on) override {
    ctx_->bind();
    DDPRUN_CUDA_OK(on ? cudaProfilerStart() : cudaProfilerStop());
  }
  std::unique_ptr<runtime::GradientMemory> gradientMemory(runtime::ProcessGroup&) override {
    if (runtime::cudaSelectedDevice() != ctx_->device())
      DDPRUN_THROW(InvalidArgument, "the CUDA backend computes on cuda:", ctx_->device(),
                   " but the runtime's CUDA collectives use cuda:", runtime::cudaSelectedDevice(),
                   " (LOCAL_RANK modulo the GPU count, or DDPRUN_CUDA_DEVICE); make the backend "
                   "on runtime::cudaSelectedDevice()");
    return makeGradientMemory(ctx_);
  }

 private:
  // The batch norm paths of the layers built so far, in first-use order,
  // with their counts: ", batch norm ours-nhwc+relu x9, ours-nhwc x3".
  void notePath(const std::string& path) {
    for (auto& [name, count] : bnPaths_)
      if (name == path) return void(++count);
    bnPaths_.emplace_back(path, 1);
  }
  std::string bnPathsNote() const {
    std::string s;
    for (const auto& [name, count] : bnPaths_)
      s += (s.empty() ? ", batch norm " : ", ") + name + " x" + std::to_string(count);
    return s;
  }

  struct InputSlot {
    PinnedBuffer pinned;
    Tensor dev;
    size_t capacity = 0;
    Event copied = Event::create(), consumed = Event::create();
    bool used = false;
  };

  std::shared_ptr<Context> ctx_;
  std::vector<std::pair<std::string, int>> bnPaths_;  // notePath's
  bool composing_ = false;  // batchNormAct composes: its batch norm is noted already
  static constexpr int kInputSlots = 4;  // input batches in flight
  std::vector<Event> markEvents_;  // the profile's timeline (mark())
  size_t marks_ = 0;               // marks recorded since clearMarks()
  Stream copy_ = Stream::create();  // the input pipeline's copies
  InputSlot slots_[kInputSlots];
  int nextSlot_ = 0;
  Tensor nhwcInput_;  // modelInput's
  CrossEntropy ce_;
  DeviceArray<int> flag_;
  std::vector<cuda::OptimChunk> optimChunks_;  // the optimizer steps' chunk table, reused
  // The optimizer's per-step scalars a captured step reads (stageOptimizerStep).
  DeviceArray<OptimStepScalars> stepScalars_;
  StagedUpload stepScalarsUpload_;

  // Where a launch being recorded reads its per-step scalars: the slot
  // (allocated by stageOptimizerStep before the capture: a capture may not
  // allocate); null outside a capture.
  const OptimStepScalars* capturedStepScalars() {
    if (!ctx_->capturing()) return nullptr;
    DDPRUN_CHECK(stepScalars_.get(), "an optimizer step recorded in a CUDA graph needs its "
                 "scalars staged first (Backend::stageOptimizerStep before the capture)");
    return stepScalars_.get();
  }

  // The kernels' form of the chunks (into optimChunks_). A 16-bit copy is
  // asked for only where the layers compute in 16 bits.
  const cuda::OptimChunk* toKernelChunks(const std::vector<Backend::OptimChunk>& chunks) {
    optimChunks_.clear();
    for (const Backend::OptimChunk& c : chunks) {
      DDPRUN_CHECK(!c.w16 || ctx_->autocast(), "the optimizer was asked for 16-bit weight "
                   "copies, but this backend computes in ", precisionName(ctx_->precision()),
                   ": pass w16 only with bf16 or fp16");
      optimChunks_.push_back({c.w, c.g, c.s1, c.s2, c.w16, c.n});
    }
    return optimChunks_.data();
  }
  // The labels staged (checked, uploaded) and the loss launched on them, not
  // yet waited for.
  void stageAndLaunchLoss(const Tensor& logits, const int32_t* labels, Tensor* dlogits,
                          float gradScale) {
    DDPRUN_CHECK(logits.rank() == 2, "cross-entropy expects logits [N, classes], got ",
                 shapeString(logits.shape()));
    ctx_->bind();
    ce_.stage(labels, logits.dim(0), logits.dim(1));
    ce_.launch(logits, dlogits, gradScale, labelSmoothing());
  }
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> makeCudaBackend(const CudaBackendOptions& o) {
  const int count = runtime::cudaDeviceCount();
  if (count == 0)
    DDPRUN_THROW(InvalidArgument, "--device cuda: no CUDA GPU is visible on this machine (no "
                 "device or no driver); use --device cpu");
  if (o.device < 0 || o.device >= count)
    DDPRUN_THROW(InvalidArgument, "cuda:", o.device, " does not exist: this machine has ", count,
                 " CUDA device", count == 1 ? "" : "s", " (cuda:0", count > 1 ? "..cuda:" : "",
                 count > 1 ? std::to_string(count - 1) : std::string(), ")");
  return std::make_unique<cuda::CudaBackend>(o);
}

}  // namespace ddprun::train

// Read from the file before it is loaded (common/plugin.h): a train of
// another build refuses this plugin without running any of its code.
DDPRUN_PLUGIN_BUILD_ID(ddprun_train_cuda_plugin, DDPRUN_BUILD_ID);

extern "C" __attribute__((visibility("default"))) const ddprun::train::internal::CudaBackendPlugin*
ddprun_train_cuda_plugin() {
  static const ddprun::train::internal::CudaBackendPlugin table{
      .buildId = DDPRUN_BUILD_ID,
      .make = ddprun::train::makeCudaBackend,
  };
  return &table;
}
