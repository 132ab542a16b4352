// Gradient buckets in device memory for the Reducer.
//
// Buckets come straight from cudaMalloc (not the caching allocator): the
// collectives read and write them on the process group's own stream, outside
// the compute stream's ordering the cache relies on; they are few and
// long-lived. zero/copy/compress/decompress run on the compute stream, after
// the backward kernels that wrote the gradients and before the optimizer.
//
// Ordering with the all-reduce: producedFence() records an event on the
// compute stream when a bucket launches (the training thread goes on with
// backward) and hands the communication thread a function that waits for
// that event, making the backend's device current on that thread for the
// wait and restoring the thread's device afterwards (the runtime binds its
// own, runtime::cudaSelectedDevice(), which the backend checks it matches).
// Events are pooled: one is reused once its last fence has run and gone.
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda_layers.h"
#include "ddprun/common/error.h"
#include "kernels.h"

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
  std::function<void()> producedFence() override {
    ctx_->bind();
    std::shared_ptr<Event> ev = freeEvent();
    ev->record(ctx_->stream());
    const int device = ctx_->device();
    return [ev, device] {
      int prev = -1;
      const bool known = cudaGetDevice(&prev) == cudaSuccess;
      if (!known || prev != device) DDPRUN_CUDA_OK(cudaSetDevice(device));
      ev->waitUncounted();  // the communication thread: not a training-thread wait
      if (known && prev != device) DDPRUN_CUDA_OK(cudaSetDevice(prev));
    };
  }

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
  // An event no pending fence holds (use_count 1: only the pool).
  std::shared_ptr<Event> freeEvent() {
    std::lock_guard lock(mu_);
    for (auto& e : events_)
      if (e.use_count() == 1) return e;
    events_.push_back(std::make_shared<Event>(Event::create()));
    return events_.back();
  }

  std::shared_ptr<Context> ctx_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Event>> events_;
};

}  // namespace

std::unique_ptr<runtime::GradientMemory> makeGradientMemory(std::shared_ptr<Context> ctx) {
  return std::make_unique<CudaGradientMemory>(std::move(ctx));
}

}  // namespace ddprun::train::cuda
