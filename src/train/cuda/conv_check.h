// The accuracy check behind the CUDA backend's fast convolution mode
// (conv_search.h): a cuDNN algorithm is run on a reduced problem of a
// layer's geometry and compared with the float64 reference of
// conv_reference.h, and a per-call workspace owner shared by the layer and
// the check.
//
// Thread-safety: as the layer that owns it (one training thread).
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "../kernel_math.h"
#include "context.h"
#include "cudnn_graph.h"
#include "resources.h"

namespace ddprun::train::cuda {

// The workspace a convolution algorithm may always need (cuDNN's candidates
// above it are skipped, except in fast mode where the run's peak memory
// leaves room: conv_search.h; PyTorch lets cuDNN take what is free, but a
// capped, per-call workspace keeps the peak predictable). The accuracy
// check's reduced problems are held to it.
constexpr size_t kConvWorkspaceCap = size_t{256} << 20;

// The check's reduced problem has the layer's C, K, kernel, stride,
// padding, H and W, and this batch (or the layer's, if smaller): every
// output element of forward and backward-data depends on one sample only,
// so the algorithm's error per element is that of the full batch; the
// backward-filter sums over fewer samples, which keeps its error's order.
constexpr int64_t kConvCheckBatch = 2;

// The largest error an algorithm may show in precision p, in the check's
// measure max|out - ref| / max|ref| (uniform inputs in [-1, 1)). The
// reasoning is at the definition (conv_check.cc).
double convErrorBound(Precision p);

// Device bytes from the context's caching allocator for the lifetime of the
// object (none for 0 bytes). Freeing right after a cuDNN call is enqueued is
// safe: reuse is stream-ordered on the context's one stream
// (caching_allocator.h), so whoever gets the block next runs after the call.
class ScopedDeviceBytes {
 public:
  ScopedDeviceBytes(Context& ctx, size_t bytes)
      : ctx_(ctx), bytes_(bytes), p_(bytes ? ctx.allocator().allocBytes(bytes) : nullptr) {}
  ~ScopedDeviceBytes() {
    if (p_) ctx_.allocator().freeBytes(p_);
  }
  ScopedDeviceBytes(const ScopedDeviceBytes&) = delete;
  ScopedDeviceBytes& operator=(const ScopedDeviceBytes&) = delete;
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  Context& ctx_;
  size_t bytes_;
  void* p_;
};

// One layer's check at one input shape. Construction draws x, w and dy of
// the reduced problem (fixed seeds; in bf16/fp16 rounded to the 16-bit type,
// and the reference reads the rounded values, so what is measured is the
// algorithm's own error); each direction's reference is computed on first
// use. error() runs the algorithm and waits for the result: search time only.
class ConvAccuracyCheck {
 public:
  // `full`: the layer's geometry at the searched shape; `type`: the data
  // type of x, w and y in the layer's cuDNN calls (float, bf16 or half);
  // `wDesc`, `conv`: the layer's descriptors (error() sets conv's math type).
  ConvAccuracyCheck(std::shared_ptr<Context> ctx, const kmath::ConvGeom& full,
                    cudnnDataType_t type, cudnnFilterDescriptor_t wDesc,
                    cudnnConvolutionDescriptor_t conv);
  ConvAccuracyCheck(const ConvAccuracyCheck&) = delete;
  ConvAccuracyCheck& operator=(const ConvAccuracyCheck&) = delete;

  // max|out - ref| / max|ref| of `algo` with math type `math`; +infinity
  // when cuDNN cannot run it on the reduced problem or it would need more
  // than kConvWorkspaceCap; NaN when it produced a NaN.
  double error(cudnnConvolutionFwdAlgo_t algo, cudnnMathType_t math);
  double error(cudnnConvolutionBwdDataAlgo_t algo, cudnnMathType_t math);
  double error(cudnnConvolutionBwdFilterAlgo_t algo, cudnnMathType_t math);
  // The same for a graph-API engine (cudnn_graph.h), built for the reduced
  // problem: +infinity also when the engine does not support it.
  double error(ConvDirection dir, const GraphEngine& e);

 private:
  // Runs one direction on the reduced problem: (in1, in2) -> out in the
  // operand order of GraphPlan::execute; false: it could not run.
  using Runner = std::function<bool(const void* in1, const void* in2, void* out)>;
  // The reference of `dir` (computed on first use) against what run gives.
  double errorOf(ConvDirection dir, const Runner& run);
  // An input: float values in NCHW / OIHW order (what the reference reads)
  // and, where cuDNN reads something else (16-bit precisions, an NHWC
  // context: NHWC / KRSC), cuDNN's copy.
  struct Operand {
    explicit Operand(const std::shared_ptr<Context>& ctx) : f(ctx), h(ctx), t(ctx) {}
    DeviceArray<float> f;
    DeviceArray<uint16_t> h;  // 16-bit (in the layer's layout)
    DeviceArray<float> t;     // float in NHWC / KRSC
    const void* data() const {
      if (h.get()) return h.get();
      if (t.get()) return t.get();
      return f.get();
    }
  };
  // The matrices whose transposes turn a tensor of [a, b, c, d] from NCHW to
  // NHWC (a, b, c*d); Transposed: back (a, c*d, b).
  struct Dims {
    int64_t a, b, cd;
  };
  void draw(Operand& o, size_t n, uint64_t seed, Dims d);
  // The measure for `n` outputs of the layer's type and layout at `out`
  // against `ref` (NCHW / OIHW of dims d).
  double measure(const void* out, const double* ref, size_t n, Dims d);
  Dims xDims() const { return {g_.n, g_.c, g_.h * g_.w}; }
  Dims wDims() const { return {g_.k, g_.c, g_.kernel * g_.kernel}; }
  Dims yDims() const { return {g_.n, g_.k, g_.oh * g_.ow}; }
  size_t elementBytes() const { return type_ == CUDNN_DATA_FLOAT ? 4 : 2; }
  size_t xCount() const { return static_cast<size_t>(g_.n * g_.c * g_.h * g_.w); }
  size_t wCount() const { return static_cast<size_t>(g_.k * g_.c * g_.kernel * g_.kernel); }
  size_t yCount() const { return static_cast<size_t>(g_.n * g_.k * g_.oh * g_.ow); }

  std::shared_ptr<Context> ctx_;
  kmath::ConvGeom g_;
  cudnnDataType_t type_;
  bool nhwc_;  // the context's layout
  cudnnFilterDescriptor_t wDesc_;
  cudnnConvolutionDescriptor_t conv_;
  TensorDesc xDesc_, yDesc_;
  Operand x_, w_, dy_;
  DeviceArray<double> refY_, refDx_, refDw_, result_;
  DeviceArray<float> outF_;  // 16-bit outputs as float for the comparison
  // The reduced problem's operation graph per direction (graph engines).
  std::unique_ptr<GraphConv> graph_[3];
  bool graphTried_[3] = {false, false, false};
};

}  // namespace ddprun::train::cuda
