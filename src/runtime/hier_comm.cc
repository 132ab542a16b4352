#include "hier_comm.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "reduce.h"

namespace ddprun::runtime {

void HierComm::localBroadcast(void* buf, size_t bytes, int localRoot) {
  if (local_) local_->broadcast(buf, bytes, localRoot);
}

// (1) all-reduce inside the host over shared memory, (2) ring all-reduce of
// the host sums between leaders, (3) broadcast from the leader inside the
// host. Network bytes per leader: 2(h-1)/h * S for h hosts, independent of
// the ranks per host; memory traffic inside a host as in ShmComm. kAvg is
// summed in both stages and divided once by the world size (hosts may hold
// different numbers of ranks).
void HierComm::allReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  const ReduceOp stageOp = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  if (local_)
    local_->allReduce(in, out, count, t, stageOp);
  else if (in != out && count)
    std::memcpy(out, in, count * dtypeSize(t));
  if (ring_) ring_->allReduce(out, out, count, t, stageOp);
  localBroadcast(out, count * dtypeSize(t), 0);
  if (op == ReduceOp::kAvg) divideBy(t, out, count, topo_.size);
}

// The root's host first spreads the data to its leader, the leaders relay it
// around the ring, and each leader broadcasts inside its host.
void HierComm::broadcast(void* buf, size_t bytes, int root) {
  const int rootHost = topo_.hostOfRank[root];
  const auto& rootLocals = topo_.ranksOfHost[rootHost];
  const int rootLocal = static_cast<int>(
      std::find(rootLocals.begin(), rootLocals.end(), root) - rootLocals.begin());
  if (topo_.hostIndex == rootHost && rootLocal != 0) localBroadcast(buf, bytes, rootLocal);
  if (ring_) ring_->broadcast(buf, bytes, rootHost);
  if (topo_.hostIndex != rootHost || rootLocal == 0) localBroadcast(buf, bytes, 0);
}

// Local all-gather into this host's blob, ring all-gather of host blobs
// between leaders, local broadcast of every blob, then each rank puts the
// pieces in rank order (ranks of a host need not be contiguous).
void HierComm::allGather(const void* in, void* out, const std::vector<size_t>& bytes) {
  const int hosts = topo_.numHosts;
  std::vector<size_t> blobBytes(hosts, 0);
  for (int h = 0; h < hosts; ++h)
    for (int r : topo_.ranksOfHost[h]) blobBytes[h] += bytes[r];
  const std::vector<size_t> blobOff = prefixOffsets(blobBytes);
  std::vector<char> all(blobOff[hosts]);
  char* mine = all.data() + blobOff[topo_.hostIndex];
  const auto& locals = topo_.ranksOfHost[topo_.hostIndex];
  if (local_) {
    std::vector<size_t> localBytes;
    for (int r : locals) localBytes.push_back(bytes[r]);
    local_->allGather(in, mine, localBytes);
  } else if (bytes[topo_.rank]) {
    std::memcpy(mine, in, bytes[topo_.rank]);
  }
  if (ring_) ring_->allGather(mine, all.data(), blobBytes);
  localBroadcast(all.data(), all.size(), 0);
  const std::vector<size_t> off = prefixOffsets(bytes);
  for (int h = 0; h < hosts; ++h) {
    size_t pos = blobOff[h];
    for (int r : topo_.ranksOfHost[h]) {
      if (bytes[r]) std::memcpy(static_cast<char*>(out) + off[r], all.data() + pos, bytes[r]);
      pos += bytes[r];
    }
  }
}

// Hierarchical all-reduce of the whole input into scratch, keep block `rank`.
// Moves size/1 times the bytes a ring reduce-scatter would; simple and
// correct for any placement of ranks on hosts.
void HierComm::reduceScatter(const void* in, void* out, size_t count, DType t, ReduceOp op) {
  const size_t es = dtypeSize(t);
  std::vector<char> tmp(count * es * topo_.size);
  allReduce(in, tmp.data(), count * topo_.size, t, op);
  if (count) std::memcpy(out, tmp.data() + topo_.rank * count * es, count * es);
}

void HierComm::barrier() {
  if (local_) local_->barrier();
  if (ring_) ring_->barrier();
  if (local_) local_->barrier();
}

void HierComm::abort(int by) noexcept {
  if (local_) local_->abort(by);
  if (ring_) ring_->abort(by);
}

}  // namespace ddprun::runtime
