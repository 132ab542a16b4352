// The pieces of cuDNN's graph API (the backend descriptors, no
// cudnn-frontend) that the convolution graphs (cudnn_graph.h) and the fusion
// probe's graphs (cudnn_fusion.h) share: attribute setting that keeps the
// first failure, tensor descriptors, the engines cuDNN's heuristics name for
// a finalized operation graph, and an engine's execution plan.
//
// Internal to src/train/cuda/. Thread-safety: none of its own (cuDNN's
// descriptors belong to one thread at a time).
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cudnn_graph.h"  // GraphEngine
#include "resources.h"    // BackendDesc

namespace ddprun::train::cuda {

// Attribute setting that keeps the first failure: a graph either builds
// completely or reports the status of the first call that failed.
class Setter {
 public:
  template <typename T>
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
           cudnnBackendAttributeType_t type, int64_t count, const T* value) {
    if (ok()) status_ = cudnnBackendSetAttribute(d, name, type, count, value);
  }
  void desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
            cudnnBackendDescriptor_t value) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  // cuDNN 9 deprecates the handle attributes of the operation graph and the
  // plan, but still reads them (and every sample sets them).
  // A null handle is not set (cuDNN 9.19 finalizes graphs and heuristics
  // without one; plans need the device).
  void handle(cudnnBackendDescriptor_t d, bool plan, cudnnHandle_t h) {
    if (!h) return;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    set(d, plan ? CUDNN_ATTR_EXECUTION_PLAN_HANDLE : CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        CUDNN_TYPE_HANDLE, 1, &h);
#pragma GCC diagnostic pop
  }
  void finalize(cudnnBackendDescriptor_t d) {
    if (ok()) status_ = cudnnBackendFinalize(d);
  }
  bool ok() const { return status_ == CUDNN_STATUS_SUCCESS; }
  cudnnStatus_t status() const { return status_; }

 private:
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
};

// A finalized tensor descriptor: `dims` and `strides` in cuDNN's logical
// order ([N, C, H, W] and the like), 16-byte aligned; isVirtual: an
// intermediate of the graph that never reaches memory; byValue: a scalar
// passed in the variant pack by value (epsilon, a momentum).
BackendDesc backendTensor(Setter& s, int64_t uid, const std::vector<int64_t>& dims,
                          const std::vector<int64_t>& strides, cudnnDataType_t type,
                          bool isVirtual = false, bool byValue = false);

// A finalized convolution descriptor of g (cross-correlation, dilation 1,
// float accumulation).
BackendDesc backendConvolution(Setter& s, const kmath::ConvGeom& g);

// The engines of heuristics mode A for a finalized operation graph, then
// those of the fallback list not already named, in cuDNN's order.
std::vector<GraphEngine> graphEngines(cudnnBackendDescriptor_t graph);

// Engine e's execution plan for the graph (h: the device's handle; without
// one cuDNN builds none), its workspace in *workspace; an empty descriptor,
// with cuDNN's status in *status, when it does not finalize.
BackendDesc buildPlan(cudnnHandle_t h, cudnnBackendDescriptor_t graph, const GraphEngine& e,
                      int64_t* workspace, cudnnStatus_t* status);

}  // namespace ddprun::train::cuda
