// Gradient buckets in device memory for the Reducer.
//
// Buckets come straight from cudaMalloc (not the caching allocator): the
// collectives read and write them on the process group's own stream, outside
// the compute stream's ordering the cache relies on; they are few and
// long-lived. zero/copy/compress/decompress run on the compute stream, after
// the backward kernels that wrote the gradients and before the optimizer.
//
// Ordering with the all-reduce: stream() hands the reducer the compute
// stream, and the reducer orders its collectives on streams (reducer.h): a
// bucket's all-reduce waits on the device for an event recorded on this
// stream when the bucket launches, and finalize() makes this stream wait for
// the all-reduce's completion. No thread waits on the host for the device
// inside a step; the runtime's device (runtime::cudaSelectedDevice()) is this
// context's (the backend checks it before making this memory).
#include <mutex>
#include <unordered_map>

#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "elementwise.h"

namespace ddprun::train::cuda {

namespace {

class CudaGradientMemory final : public runtime::GradientMemory {
 public:
  explicit CudaGradientMemory(std::shared_ptr<Context> ctx) : ctx_(std::move(ctx)) {}
  ~CudaGradientMemory() override {
    (void)cudaSetDevice(ctx_->device());
    (void)cudaStreamSynchronize(ctx_->stream());
  }
  runtime::Device device() const override { return runtime::Device::kCuda; }
  void* alloc(size_t bytes) override {
    ctx_->bind();
    void* p = nullptr;
    DDPRUN_CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    {
      std::lock_guard<std::mutex> g(sizesMu_);
      sizes_[p] = bytes;
    }
    ctx_->noteExternal(static_cast<int64_t>(bytes));
    DDPRUN_CUDA_OK(cudaMemsetAsync(p, 0, bytes, ctx_->stream()));
    // Zero before the collectives' stream could touch it.
    ctx_->synchronize();
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    ctx_->bind();
    ctx_->synchronize();  // kernels still reading it (a rebuild's copies)
    DDPRUN_CUDA_OK(cudaFree(p));
    std::lock_guard<std::mutex> g(sizesMu_);
    if (auto it = sizes_.find(p); it != sizes_.end()) {
      ctx_->noteExternal(-static_cast<int64_t>(it->second));
      sizes_.erase(it);
    }
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (!bytes || dst == src) return;
    ctx_->bind();
    DDPRUN_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx_->stream()));
  }
  void zero(void* p, size_t bytes) override {
    if (!bytes) return;
    ctx_->bind();
    DDPRUN_CUDA_OK(cudaMemsetAsync(p, 0, bytes, ctx_->stream()));
  }
  void compress(const float* src, void* dst16, size_t n, float scale,
                runtime::DType t) override {
    ctx_->bind();
    launchCompress16(src, dst16, n, scale, is16(t), ctx_->stream());
  }
  void decompress(const void* src16, float* dst, size_t n, runtime::DType t) override {
    ctx_->bind();
    launchDecompress16(src16, dst, n, is16(t), ctx_->stream());
  }
  void* stream() const override { return ctx_->stream(); }

 private:
  std::mutex sizesMu_;
  std::unordered_map<void*, size_t> sizes_;  // bucket -> bytes (peakBytes)
  // True for bf16, false for fp16 (the two hooks' types).
  static bool is16(runtime::DType t) {
    DDPRUN_CHECK(t == runtime::DType::kBFloat16 || t == runtime::DType::kFloat16,
                 "gradient compression to ", runtime::dtypeName(t), ": expected float16 or "
                 "bfloat16");
    return t == runtime::DType::kBFloat16;
  }

  std::shared_ptr<Context> ctx_;
};

}  // namespace

std::unique_ptr<runtime::GradientMemory> makeGradientMemory(std::shared_ptr<Context> ctx) {
  return std::make_unique<CudaGradientMemory>(std::move(ctx));
}

}  // namespace ddprun::train::cuda
