// Hierarchical collectives: shared memory inside each host, a TCP ring
// between one leader per host (the host's lowest rank). Internal header.
#pragma once

#include "comm.h"
#include "ddprun/runtime/process_group.h"

namespace ddprun::runtime {

class HierComm : public Comm {
 public:
  // local: this host's ranks (null when alone on the host); ring: the host
  // leaders (non-null on leaders only).
  HierComm(const Topology& topo, Comm* local, Comm* ring) : topo_(topo), local_(local), ring_(ring) {}

  DDPRUN_COMM_COLLECTIVE_OVERRIDES;
  int size() const override { return topo_.size; }
  int me() const override { return topo_.rank; }

 private:
  bool leader() const { return topo_.localRank == 0; }
  void localBroadcast(void* buf, size_t bytes, int localRoot);

  const Topology& topo_;
  Comm* local_;
  Comm* ring_;
};

}  // namespace ddprun::runtime
