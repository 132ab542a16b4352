// Collectives: each an options struct plus a function. `xxx()` blocks;
// `xxxAsync()` returns a Work immediately. Operations complete in issue order.
//
// Buffers are host memory for Device::kCpu and CUDA device memory for
// Device::kCuda. In place: pass output == input (or leave input null).
// Buffers must stay valid until the Work completes. Every rank must pass the
// same count, dtype, op and root (allGather counts may differ per rank but
// every rank must pass the same `counts` vector).
#pragma once

#include <cstddef>
#include <vector>

#include "ddprun/runtime/process_group.h"
#include "ddprun/runtime/types.h"

namespace ddprun::runtime {

struct AllReduceOptions {
  const void* input = nullptr;  // null: in place on output
  void* output = nullptr;
  size_t count = 0;             // elements
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Device device = Device::kCpu;
};
Work allReduceAsync(ProcessGroup& pg, const AllReduceOptions& o);
void allReduce(ProcessGroup& pg, const AllReduceOptions& o);

struct BroadcastOptions {
  void* buffer = nullptr;  // root: data to send; others: where it lands
  size_t count = 0;
  DType dtype = DType::kFloat32;
  int root = 0;
  Device device = Device::kCpu;
};
Work broadcastAsync(ProcessGroup& pg, const BroadcastOptions& o);
void broadcast(ProcessGroup& pg, const BroadcastOptions& o);

struct AllGatherOptions {
  const void* input = nullptr;  // this rank's piece; null: already in place in output
  void* output = nullptr;       // all pieces, rank order (sum of counts elements)
  size_t count = 0;             // elements per rank when `counts` is empty
  std::vector<size_t> counts;   // optional: elements of each rank (unequal sizes)
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;
};
Work allGatherAsync(ProcessGroup& pg, const AllGatherOptions& o);
void allGather(ProcessGroup& pg, const AllGatherOptions& o);

struct ReduceScatterOptions {
  const void* input = nullptr;  // size * count elements: block r goes to rank r
  void* output = nullptr;       // count elements (may point at block `rank` of input)
  size_t count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Device device = Device::kCpu;
};
Work reduceScatterAsync(ProcessGroup& pg, const ReduceScatterOptions& o);
void reduceScatter(ProcessGroup& pg, const ReduceScatterOptions& o);

struct BarrierOptions {};
Work barrierAsync(ProcessGroup& pg, const BarrierOptions& o = {});
void barrier(ProcessGroup& pg, const BarrierOptions& o = {});

}  // namespace ddprun::runtime
