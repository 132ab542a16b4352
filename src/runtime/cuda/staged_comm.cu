// The staged CUDA transport (staged_comm.h): device -> pinned host, host
// collective, host -> device.
#include "staged_comm.h"

#include <memory>

#include "cuda_support.h"

namespace ddprun::runtime {

StagedComm::StagedComm(ProcessGroup& pg, Comm& host)
    : pg_(pg), host_(host), stream_(cuda::Stream::createBlocking()) {}

void StagedComm::allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  const size_t bytes = count * dtypeSize(t);
  char* h = stage(in, bytes, bytes);
  host_.allReduce(h, h, count, t, op);
  unstage(out, h, bytes);
}

void StagedComm::broadcast(void* buf, size_t bytes, int root) {
  char* h = stage(me() == root ? buf : nullptr, bytes, bytes);
  host_.broadcast(h, bytes, root);
  if (me() != root) unstage(buf, h, bytes);
}

void StagedComm::allGather(const void* in, void* out, const std::vector<size_t>& bytes) {
  const std::vector<size_t> off = prefixOffsets(bytes);
  const size_t before = off[me()], total = off.back();
  char* h = stage(nullptr, 0, total);
  copy(h + before, in, bytes[me()], cudaMemcpyDeviceToHost);
  host_.allGather(h + before, h, bytes);
  unstage(out, h, total);
}

void StagedComm::reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  const size_t bytes = count * dtypeSize(t);
  char* h = stage(in, bytes * size(), bytes * (size() + 1));
  host_.reduceScatter(h, h + bytes * size(), count, t, op);
  unstage(out, h + bytes * size(), bytes);
}

void StagedComm::allReduceOrdered(void* buf, size_t count, DType t, ReduceOp op,
                                  const internal::OrderedEvents& ev) {
  runOrderedBlocking({stream_}, ev, [&] { allReduce(buf, buf, count, t, op); });
}

void StagedComm::broadcastOrdered(const std::vector<std::pair<void*, size_t>>& buffers, int root,
                                  const internal::OrderedEvents& ev) {
  runOrderedBlocking({stream_}, ev, [&] {
    for (const auto& [p, bytes] : buffers) broadcast(p, bytes, root);
  });
}

char* StagedComm::stage(const void* dev, size_t bytes, size_t room) {
  char* h = static_cast<char*>(pinned_.ensure(room));
  if (dev && bytes) copy(h, dev, bytes, cudaMemcpyDeviceToHost);
  return h;
}

void StagedComm::unstage(void* dev, const char* h, size_t bytes) {
  if (bytes) copy(dev, h, bytes, cudaMemcpyHostToDevice);
}

void StagedComm::copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (!bytes) return;
  DDPRUN_CUDA_OK(cudaMemcpyAsync(dst, src, bytes, kind, stream_));
  syncStream(stream_, pg_.options().timeout, "staging copy");
}

std::unique_ptr<CudaComm> makeStagedComm(ProcessGroup& pg, Comm& host) {
  return std::make_unique<StagedComm>(pg, host);
}

}  // namespace ddprun::runtime
