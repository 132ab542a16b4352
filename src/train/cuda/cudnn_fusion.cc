// cuDNN's runtime-fusion patterns, probed (cudnn_fusion.h).
#include "cudnn_fusion.h"

#include <array>
#include <vector>

#include "cudnn_backend.h"

namespace ddprun::train::cuda {

const char* fusionPatternName(FusionPattern p) {
  switch (p) {
    case FusionPattern::kScaleBiasReluConvGenStats: return "scale_bias_relu_conv_genstats";
    case FusionPattern::kBnFinalize: return "bn_finalize";
    case FusionPattern::kDgradDreluDbnWeights: return "dgrad_drelu_dbn_weights";
  }
  return "?";
}

namespace {

// One graph under construction: its tensors (alive until the graph is
// finalized and kept with it), its operations, the next free unique id.
struct Builder {
  Setter s;
  std::vector<BackendDesc> keep;
  std::vector<BackendDesc> ops;
  int64_t uid = 1;

  cudnnBackendDescriptor_t tensor(const std::vector<int64_t>& dims, cudnnDataType_t type,
                                  bool isVirtual = false, bool byValue = false) {
    std::vector<int64_t> strides(dims.size(), 1);
    if (dims.size() == 4) {
      const std::array<int64_t, 4> st =
          graphStrides({dims[0], dims[1], dims[2], dims[3]}, /*nhwc=*/true);
      strides.assign(st.begin(), st.end());
    }
    keep.push_back(backendTensor(s, uid++, dims, strides, type, isVirtual, byValue));
    return keep.back().get();
  }
  // Activation-sized [n, c, h, w] and per-channel [1, c, 1, 1] float.
  cudnnBackendDescriptor_t act(int64_t n, int64_t c, int64_t h, int64_t w, cudnnDataType_t t,
                               bool isVirtual = false) {
    return tensor({n, c, h, w}, t, isVirtual);
  }
  cudnnBackendDescriptor_t channel(int64_t c) { return tensor({1, c, 1, 1}, CUDNN_DATA_FLOAT); }
  cudnnBackendDescriptor_t inter(int64_t n, int64_t c, int64_t h, int64_t w) {
    return act(n, c, h, w, CUDNN_DATA_FLOAT, /*isVirtual=*/true);
  }

  cudnnBackendDescriptor_t op(cudnnBackendDescriptorType_t type) {
    ops.push_back(BackendDesc::create(type));
    return ops.back().get();
  }
  void finish(cudnnBackendDescriptor_t d) { s.finalize(d); }

  // A pointwise operation of `mode` in float math, its operands set by the
  // caller, finalized by finish().
  cudnnBackendDescriptor_t pointwiseOp(cudnnPointwiseMode_t mode) {
    keep.push_back(BackendDesc::create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
    cudnnBackendDescriptor_t pw = keep.back().get();
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    s.set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    s.set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    s.finalize(pw);
    cudnnBackendDescriptor_t o = op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    s.desc(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    return o;
  }
  // y = mode(x, alpha2 * b) (b null: a unary mode).
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y, float alpha2 = 1.0f) {
    cudnnBackendDescriptor_t o = pointwiseOp(mode);
    s.desc(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) s.desc(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    s.desc(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    if (alpha2 != 1.0f)
      s.set(o, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &alpha2);
    finish(o);
  }
  // dx = relu'(x) * dy.
  void reluBackward(cudnnBackendDescriptor_t dy, cudnnBackendDescriptor_t x,
                    cudnnBackendDescriptor_t dx) {
    cudnnBackendDescriptor_t o = pointwiseOp(CUDNN_POINTWISE_RELU_BWD);
    s.desc(o, CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, dy);
    s.desc(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    s.desc(o, CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, dx);
    finish(o);
  }
  // A convolution operation (forward: a = x, b = w, c = y; backward-data:
  // a = dx, b = w, c = dy), alpha 1, beta 0.
  void convolution(bool forward, const kmath::ConvGeom& g, cudnnBackendDescriptor_t a,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    keep.push_back(backendConvolution(s, g));
    cudnnBackendDescriptor_t conv = keep.back().get();
    const float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t o =
        op(forward ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
                   : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
    if (forward) {
      s.desc(o, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, a);
      s.desc(o, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, b);
      s.desc(o, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, c);
      s.desc(o, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
      s.set(o, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
      s.set(o, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    } else {
      s.desc(o, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, a);
      s.desc(o, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, b);
      s.desc(o, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, c);
      s.desc(o, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv);
      s.set(o, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
      s.set(o, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    }
    finish(o);
  }
  // The operation graph of every operation added, finalized.
  BackendDesc graph(cudnnHandle_t h) {
    BackendDesc g = BackendDesc::create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    s.handle(g, false, h);
    std::vector<cudnnBackendDescriptor_t> raw;
    for (const BackendDesc& o : ops) raw.push_back(o.get());
    s.set(g.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
          static_cast<int64_t>(raw.size()), raw.data());
    s.finalize(g);
    return g;
  }
};

void scaleBiasReluConvGenStats(Builder& b, const FusionProblem& p) {
  const kmath::ConvGeom& g = p.g;
  cudnnBackendDescriptor_t x = b.act(g.n, g.c, g.h, g.w, p.ioType);
  cudnnBackendDescriptor_t scale = b.channel(g.c), bias = b.channel(g.c);
  cudnnBackendDescriptor_t scaled = b.inter(g.n, g.c, g.h, g.w);
  cudnnBackendDescriptor_t biased = b.inter(g.n, g.c, g.h, g.w);
  cudnnBackendDescriptor_t act = b.inter(g.n, g.c, g.h, g.w);
  b.pointwise(CUDNN_POINTWISE_MUL, x, scale, scaled);
  b.pointwise(CUDNN_POINTWISE_ADD, scaled, bias, biased);
  b.pointwise(CUDNN_POINTWISE_RELU_FWD, biased, nullptr, act);
  cudnnBackendDescriptor_t w = b.act(g.k, g.c, g.kernel, g.kernel, p.ioType);
  cudnnBackendDescriptor_t y = b.act(g.n, g.k, g.oh, g.ow, p.ioType);
  b.convolution(true, g, act, w, y);
  cudnnBackendDescriptor_t sum = b.channel(g.k), sqsum = b.channel(g.k);
  cudnnBackendDescriptor_t o = b.op(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  b.s.set(o, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode);
  b.s.set(o, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  b.s.desc(o, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y);
  b.s.desc(o, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum);
  b.s.desc(o, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, sqsum);
  b.finish(o);
}

void bnFinalize(Builder& b, const FusionProblem& p) {
  const int64_t c = p.g.k;
  cudnnBackendDescriptor_t o = b.op(CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR);
  const cudnnBnFinalizeStatsMode_t mode = CUDNN_BN_FINALIZE_STATISTICS_TRAINING;
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  b.s.set(o, CUDNN_ATTR_OPERATION_BN_FINALIZE_STATS_MODE, CUDNN_TYPE_BN_FINALIZE_STATS_MODE, 1,
          &mode);
  b.s.set(o, CUDNN_ATTR_OPERATION_BN_FINALIZE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  // Per-channel inputs and outputs, then the scalars, passed by value (cuDNN
  // 9.19 refuses a finalize whose accumulation count is a device tensor).
  for (const cudnnBackendAttributeName_t a :
       {CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SUM_DESC, CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC,
        CUDNN_ATTR_OPERATION_BN_FINALIZE_SCALE_DESC, CUDNN_ATTR_OPERATION_BN_FINALIZE_BIAS_DESC,
        CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC,
        CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC,
        CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC,
        CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC,
        CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_MEAN_DESC,
        CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC,
        CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_SCALE_DESC,
        CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_BIAS_DESC})
    b.s.desc(o, a, b.channel(c));
  b.s.desc(o, CUDNN_ATTR_OPERATION_BN_FINALIZE_EPSILON_DESC,
           b.tensor({1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, /*byValue=*/true));
  b.s.desc(o, CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC,
           b.tensor({1, 1, 1, 1}, CUDNN_DATA_FLOAT, false, /*byValue=*/true));
  b.s.desc(o, CUDNN_ATTR_OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC,
           b.tensor({1, 1, 1, 1}, CUDNN_DATA_INT64, false, /*byValue=*/true));
  b.finish(o);
}

void dgradDreluDbnWeights(Builder& b, const FusionProblem& p) {
  const kmath::ConvGeom& g = p.g;
  cudnnBackendDescriptor_t dy = b.act(g.n, g.k, g.oh, g.ow, p.ioType);
  cudnnBackendDescriptor_t w = b.act(g.k, g.c, g.kernel, g.kernel, p.ioType);
  cudnnBackendDescriptor_t dgrad = b.inter(g.n, g.c, g.h, g.w);
  b.convolution(false, g, dgrad, w, dy);
  // The batch norm's output recomputed: (x - mean) * invstd * scale + bias,
  // the subtraction an add with alpha2 = -1 (the mean tensor is also the
  // weight gradients' mean, so it holds the mean itself).
  cudnnBackendDescriptor_t x = b.act(g.n, g.c, g.h, g.w, p.ioType);
  cudnnBackendDescriptor_t mean = b.channel(g.c), invstd = b.channel(g.c);
  cudnnBackendDescriptor_t scale = b.channel(g.c), bias = b.channel(g.c);
  cudnnBackendDescriptor_t t1 = b.inter(g.n, g.c, g.h, g.w), t2 = b.inter(g.n, g.c, g.h, g.w);
  cudnnBackendDescriptor_t t3 = b.inter(g.n, g.c, g.h, g.w), bn = b.inter(g.n, g.c, g.h, g.w);
  b.pointwise(CUDNN_POINTWISE_ADD, x, mean, t1, -1.0f);
  b.pointwise(CUDNN_POINTWISE_MUL, t1, invstd, t2);
  b.pointwise(CUDNN_POINTWISE_MUL, t2, scale, t3);
  b.pointwise(CUDNN_POINTWISE_ADD, t3, bias, bn);
  cudnnBackendDescriptor_t dx = b.act(g.n, g.c, g.h, g.w, p.ioType);
  b.reluBackward(dgrad, bn, dx);
  cudnnBackendDescriptor_t o = b.op(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR);
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  b.s.set(o, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
  b.s.desc(o, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, x);
  b.s.desc(o, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC, dx);
  b.s.desc(o, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, mean);
  b.s.desc(o, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, invstd);
  b.s.desc(o, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, scale);
  for (const cudnnBackendAttributeName_t a :
       {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC,
        CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC,
        CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC,
        CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC,
        CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS})
    b.s.desc(o, a, b.channel(g.c));
  b.finish(o);
}

}  // namespace

FusionSupport probeFusion(cudnnHandle_t h, const FusionProblem& p) {
  FusionSupport r;
  Builder b;
  switch (p.pattern) {
    case FusionPattern::kScaleBiasReluConvGenStats: scaleBiasReluConvGenStats(b, p); break;
    case FusionPattern::kBnFinalize: bnFinalize(b, p); break;
    case FusionPattern::kDgradDreluDbnWeights: dgradDreluDbnWeights(b, p); break;
  }
  BackendDesc graph = b.graph(h);
  if (!b.s.ok()) {
    r.graphWhy = cudnnGetErrorString(b.s.status());
    return r;
  }
  r.graphBuilt = true;
  const std::vector<GraphEngine> engines = graphEngines(graph);
  r.engines = static_cast<int>(engines.size());
  if (!h) {
    r.planWhy = "no device: no plan built";
    return r;
  }
  r.planWhy = engines.empty() ? "the heuristics named no engine" : "";
  for (const GraphEngine& e : engines) {
    int64_t ws = 0;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    if (buildPlan(h, graph, e, &ws, &st)) {
      r.supported = true;
      r.engine = e;
      r.workspace = ws;
      r.planWhy.clear();
      return r;
    }
    r.planWhy = cudnnGetErrorString(st);
  }
  return r;
}

}  // namespace ddprun::train::cuda
