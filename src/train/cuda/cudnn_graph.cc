#include "cudnn_graph.h"

#include <algorithm>

#include "cudnn_backend.h"

namespace ddprun::train::cuda {

const char* directionName(ConvDirection d) {
  switch (d) {
    case ConvDirection::kForward: return "forward";
    case ConvDirection::kBackwardData: return "backward-data";
    case ConvDirection::kBackwardFilter: return "backward-filter";
  }
  return "?";
}

std::array<int64_t, 4> graphStrides(const std::array<int64_t, 4>& d, bool nhwc) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

EngineTraits traitsOf(const std::vector<cudnnBackendNumericalNote_t>& notes) {
  EngineTraits t;
  for (cudnnBackendNumericalNote_t n : notes) switch (n) {
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE: t.tensorCore = true; break;
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS: t.downConvertsInputs = true; break;
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: t.reducedReduction = true; break;
      case CUDNN_NUMERICAL_NOTE_FFT:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13: t.transform = true; break;
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC: t.nondeterministic = true; break;
      default: break;
    }
  return t;
}

bool engineAllowed(const EngineTraits& t, Precision p, bool deterministic) {
  if (t.downConvertsInputs || t.reducedReduction) return false;
  if (p == Precision::kFp32 && t.tensorCore) return false;
  return !(deterministic && t.nondeterministic);
}

std::string GraphEngine::name() const {
  // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, a false
  // positive) on "literal" + std::to_string(...) temporaries here.
  std::string s = "engine ";
  s += std::to_string(index);
  if (knobs.empty()) return s;
  s += " (knobs";
  for (const auto& [type, value] : knobs) {
    s += ' ';
    s += std::to_string(static_cast<int>(type));
    s += '=';
    s += std::to_string(value);
  }
  s += ')';
  return s;
}

namespace {
// The operands' unique ids: x (or dx), w (or dw), y (or dy).
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

}  // namespace

BackendDesc backendTensor(Setter& s, int64_t uid, const std::vector<int64_t>& dims,
                          const std::vector<int64_t>& strides, cudnnDataType_t type,
                          bool isVirtual, bool byValue) {
  BackendDesc d = BackendDesc::create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t alignment = 16;  // allocator blocks are 256-byte aligned
  const auto rank = static_cast<int64_t>(dims.size());
  s.set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  s.set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, dims.data());
  s.set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, strides.data());
  s.set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  s.set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  if (isVirtual) s.set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &isVirtual);
  if (byValue) s.set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byValue);
  s.finalize(d);
  return d;
}

BackendDesc backendConvolution(Setter& s, const kmath::ConvGeom& g) {
  BackendDesc conv = BackendDesc::create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t spatial = 2;
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;  // float accumulation in every precision
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dilation[2] = {1, 1}, stride[2] = {g.stride, g.stride}, pad[2] = {g.pad, g.pad};
  s.set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  s.set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  s.set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  s.set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation);
  s.set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
  s.set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  s.set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  s.finalize(conv);
  return conv;
}

namespace {
BackendDesc tensor(Setter& s, int64_t uid, const std::array<int64_t, 4>& dims, bool nhwc,
                   cudnnDataType_t type) {
  const std::array<int64_t, 4> strides = graphStrides(dims, nhwc);
  return backendTensor(s, uid, {dims.begin(), dims.end()}, {strides.begin(), strides.end()},
                       type);
}
}  // namespace

// The finalized descriptors of one problem's graph (kept alive with every
// plan built from it).
struct GraphPlan::Graph {
  BackendDesc x, w, y, conv, op, graph;
};

std::unique_ptr<GraphConv> GraphConv::create(cudnnHandle_t h, const GraphConvProblem& p,
                                             std::string* why) {
  const kmath::ConvGeom& g = p.g;
  auto graph = std::make_shared<GraphPlan::Graph>();
  Setter s;
  graph->x = tensor(s, kUidX, {g.n, g.c, g.h, g.w}, p.nhwc, p.ioType);
  graph->w = tensor(s, kUidW, {g.k, g.c, g.kernel, g.kernel}, p.nhwc, p.ioType);
  graph->y = tensor(s, kUidY, {g.n, g.k, g.oh, g.ow}, p.nhwc, p.ioType);

  graph->conv = backendConvolution(s, g);

  // The operation: the same three operands, alpha and beta, under each
  // direction's attribute names.
  struct OpAttrs {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  static constexpr OpAttrs kForward{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  static constexpr OpAttrs kBackwardData{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
  static constexpr OpAttrs kBackwardFilter{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  const OpAttrs& a = p.dir == ConvDirection::kForward        ? kForward
                     : p.dir == ConvDirection::kBackwardData ? kBackwardData
                                                             : kBackwardFilter;
  const float alpha = 1.0f, beta = 0.0f;  // beta 0: the output is overwritten
  graph->op = BackendDesc::create(a.type);
  s.desc(graph->op, a.x, graph->x);
  s.desc(graph->op, a.w, graph->w);
  s.desc(graph->op, a.y, graph->y);
  s.desc(graph->op, a.conv, graph->conv);
  s.set(graph->op, a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha);
  s.set(graph->op, a.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  s.finalize(graph->op);

  graph->graph = BackendDesc::create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  s.handle(graph->graph, false, h);
  const cudnnBackendDescriptor_t ops[1] = {graph->op.get()};
  s.set(graph->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops);
  s.finalize(graph->graph);
  if (!s.ok()) {
    if (why) *why = std::string("the operation graph did not build: ") +
                    cudnnGetErrorString(s.status());
    return nullptr;
  }
  return std::unique_ptr<GraphConv>(new GraphConv(h, p, std::move(graph)));
}

namespace {
std::vector<GraphEngine> heuristics(cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode) {
  std::vector<GraphEngine> out;
  BackendDesc heur = BackendDesc::create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  Setter s;
  s.desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  s.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  s.finalize(heur);
  int64_t n = 0;
  if (!s.ok() || cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                          nullptr) != CUDNN_STATUS_SUCCESS || n <= 0)
    return out;
  std::vector<BackendDesc> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < n; ++i) {
    cfgs.push_back(BackendDesc::create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw.push_back(cfgs.back().get());
  }
  if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               n, &n, raw.data()) != CUDNN_STATUS_SUCCESS)
    return out;
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(raw.size()); ++i) {
    BackendDesc engine = BackendDesc::create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    cudnnBackendDescriptor_t e = engine.get();
    int64_t got = 0;
    GraphEngine r;
    if (cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_ENGINECFG_ENGINE,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &e) !=
            CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got,
                                 &r.index) != CUDNN_STATUS_SUCCESS)
      continue;
    std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
    if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 notes.size(), &got, notes.data()) == CUDNN_STATUS_SUCCESS)
      r.notes.assign(notes.begin(), notes.begin() + std::clamp<int64_t>(got, 0, notes.size()));
    std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behavior{};
    if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                 behavior.size(), &got, behavior.data()) == CUDNN_STATUS_SUCCESS)
      r.runtimeCompiled =
          std::find(behavior.begin(),
                    behavior.begin() + std::clamp<int64_t>(got, 0, behavior.size()),
                    CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) !=
          behavior.begin() + std::clamp<int64_t>(got, 0, behavior.size());
    std::vector<BackendDesc> knobs;
    std::vector<cudnnBackendDescriptor_t> knobRaw;
    for (int k = 0; k < CUDNN_KNOB_TYPE_COUNTS; ++k) {
      knobs.push_back(BackendDesc::create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
      knobRaw.push_back(knobs.back().get());
    }
    if (cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, knobRaw.size(), &got,
                                 knobRaw.data()) != CUDNN_STATUS_SUCCESS)
      continue;
    bool readable = true;
    for (int64_t k = 0; k < got && k < static_cast<int64_t>(knobRaw.size()); ++k) {
      cudnnBackendKnobType_t type{};
      int64_t value = 0, c = 0;
      readable = readable &&
                 cudnnBackendGetAttribute(knobRaw[k], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                          CUDNN_TYPE_KNOB_TYPE, 1, &c, &type) ==
                     CUDNN_STATUS_SUCCESS &&
                 cudnnBackendGetAttribute(knobRaw[k], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                          CUDNN_TYPE_INT64, 1, &c, &value) ==
                     CUDNN_STATUS_SUCCESS;
      r.knobs.emplace_back(type, value);
    }
    if (readable) out.push_back(std::move(r));
  }
  return out;
}
}  // namespace

std::vector<GraphEngine> graphEngines(cudnnBackendDescriptor_t graph) {
  std::vector<GraphEngine> out = heuristics(graph, CUDNN_HEUR_MODE_A);
  for (GraphEngine& e : heuristics(graph, CUDNN_HEUR_MODE_FALLBACK))
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(std::move(e));
  return out;
}

std::vector<GraphEngine> GraphConv::engines() const { return graphEngines(graph_->graph); }

BackendDesc buildPlan(cudnnHandle_t h, cudnnBackendDescriptor_t graph, const GraphEngine& e,
                      int64_t* workspace, cudnnStatus_t* status) {
  Setter s;
  BackendDesc engine = BackendDesc::create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  s.desc(engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
  s.set(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &e.index);
  s.finalize(engine);
  std::vector<BackendDesc> knobs;
  std::vector<cudnnBackendDescriptor_t> knobRaw;
  for (const auto& [type, value] : e.knobs) {
    knobs.push_back(BackendDesc::create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    s.set(knobs.back(), CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &type);
    s.set(knobs.back(), CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value);
    s.finalize(knobs.back());
    knobRaw.push_back(knobs.back().get());
  }
  BackendDesc cfg = BackendDesc::create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  s.desc(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, engine);
  if (!knobRaw.empty())
    s.set(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
          static_cast<int64_t>(knobRaw.size()), knobRaw.data());
  s.finalize(cfg);
  BackendDesc plan = BackendDesc::create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  s.handle(plan, true, h);
  s.desc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
  s.finalize(plan);
  int64_t ws = 0, got = 0;
  cudnnStatus_t st = s.status();
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                  CUDNN_TYPE_INT64, 1, &got, &ws);
  if (status) *status = st;
  if (st != CUDNN_STATUS_SUCCESS || ws < 0) return BackendDesc();
  if (workspace) *workspace = ws;
  return plan;
}

std::shared_ptr<const GraphPlan> GraphConv::plan(const GraphEngine& e) const {
  int64_t ws = 0;
  BackendDesc plan = buildPlan(h_, graph_->graph, e, &ws, nullptr);
  if (!plan) return nullptr;
  return std::shared_ptr<const GraphPlan>(
      new GraphPlan(graph_, p_.dir, e, std::move(plan), static_cast<size_t>(ws)));
}

cudnnStatus_t GraphPlan::execute(cudnnHandle_t h, const void* in1, const void* in2, void* out,
                                 void* workspace) const {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  // The C API takes non-const pointers for every operand; inputs are only read.
  switch (dir_) {
    case ConvDirection::kForward:
      x = const_cast<void*>(in1), w = const_cast<void*>(in2), y = out;
      break;
    case ConvDirection::kBackwardData:
      w = const_cast<void*>(in1), y = const_cast<void*>(in2), x = out;
      break;
    case ConvDirection::kBackwardFilter:
      x = const_cast<void*>(in1), y = const_cast<void*>(in2), w = out;
      break;
  }
  // The variant pack of the last call is kept: the caching allocator hands
  // a layer the same blocks step after step, so most calls reuse it.
  const std::array<void*, 4> key = {x, w, y, workspace};
  if (!pack_ || key != packFor_) {
    void* ptrs[3] = {x, w, y};
    const int64_t uids[3] = {kUidX, kUidW, kUidY};
    BackendDesc pack = BackendDesc::create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    Setter s;
    s.set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    s.set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
    s.set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    s.finalize(pack);
    if (!s.ok()) return s.status();
    pack_ = std::move(pack);
    packFor_ = key;
  }
  return cudnnBackendExecute(h, plan_, pack_);
}

}  // namespace ddprun::train::cuda
