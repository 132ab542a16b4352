// A group of ranks that run collectives together: the runtime's counterpart of
// c10d's ProcessGroup, without LibTorch.
//
// fromEnv() reads the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE).
// Under ddprun (or torchrun 2.x) it connects to the store the agent hosts;
// launched without one (torchrun 1.x, Slurm, by hand) rank 0 hosts a store on
// MASTER_ADDR:MASTER_PORT. Ranks publish their host identity (hostname plus
// boot id, never LOCAL_WORLD_SIZE) and a TCP listener address in the store,
// then connect:
//   - ranks on one host talk through one shared-memory segment per host;
//   - one rank per host: a pipelined TCP ring;
//   - several hosts with several ranks each: hierarchical (shared memory on
//     the host, TCP ring between one leader per host).
//
// Operations run on one background thread per group, in issue order; every
// collective call returns a Work. After a failure (a peer died or stalled
// past the timeout) the group is broken: pending and later operations fail
// with the same error, which names the rank at fault.
//
// Thread-safety: collectives may be issued from any thread, but every rank
// must issue the same sequence of collectives.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/runtime/types.h"

namespace ddprun::store {
class Store;
}

namespace ddprun::runtime {

enum class Transport {
  kAuto,          // shm on one host, tcp ring with one rank per host, else hierarchical
  kShm,           // one host only
  kTcp,           // TCP ring over every rank, even on one host
  kHierarchical,  // shm per host + TCP ring between host leaders
};
const char* transportName(Transport t);
// "auto", "shm", "tcp", "hier" (also "hierarchical"). Throws InvalidArgument.
Transport parseTransport(const std::string& name);

struct ProcessGroupOptions {
  // A collective that cannot finish within this time fails (never hangs).
  // Env: DDPRUN_COLLECTIVE_TIMEOUT (seconds, may be fractional).
  std::chrono::milliseconds timeout{300'000};
  // Env: DDPRUN_TRANSPORT = auto|shm|tcp|hier.
  Transport transport = Transport::kAuto;
  // Which ranks share a host. Default: hostname + kernel boot id. Env
  // DDPRUN_HOST_ID overrides it (used to simulate several hosts on one).
  std::string hostId;
  // Address peers use to reach this rank's TCP listener. Default: the local
  // address of the route to MASTER_ADDR. Env: DDPRUN_SOCKET_ADDR.
  std::string socketAddr;
  // Bytes of shared memory per rank for allocShared() (sparse: only touched
  // pages cost memory). Env: DDPRUN_SHM_HEAP_MB. Default: 1 GiB, capped by
  // the free space of /dev/shm.
  size_t sharedHeapBytes = size_t{1} << 30;
  // Key prefix in the store; groups with distinct prefixes do not interfere.
  std::string prefix = "ddprun/pg";
};

// Reads DDPRUN_COLLECTIVE_TIMEOUT, DDPRUN_TRANSPORT, DDPRUN_HOST_ID,
// DDPRUN_SOCKET_ADDR and DDPRUN_SHM_HEAP_MB over `base`. Throws
// InvalidArgument naming the variable on a malformed value.
ProcessGroupOptions optionsFromEnv(ProcessGroupOptions base = {});

// Where every rank lives, as agreed at construction.
struct Topology {
  int rank = 0;
  int size = 1;
  int numHosts = 1;
  int hostIndex = 0;            // hosts numbered by their lowest rank
  int localRank = 0;            // index among the ranks of this host
  int localSize = 1;
  std::vector<int> hostOfRank;  // rank -> host index
  std::vector<std::vector<int>> ranksOfHost;
};

// Handle to an issued operation. Copyable; all copies share one state.
class Work {
 public:
  struct State;
  Work() = default;
  explicit Work(std::shared_ptr<State> s) : state_(std::move(s)) {}
  // Blocks until the operation finished; rethrows its error.
  void wait();
  bool completed() const;
  bool valid() const { return state_ != nullptr; }

 private:
  std::shared_ptr<State> state_;
};

class Comm;
class CudaComm;
namespace internal {
struct Access;  // src/runtime/pg_internal.h: the transports' and collectives' way in
}

class ProcessGroup {
 public:
  // See the file comment. Throws InvalidArgument naming a missing or
  // malformed variable, TimeoutError when peers do not show up in time.
  static std::unique_ptr<ProcessGroup> fromEnv(ProcessGroupOptions opts = optionsFromEnv());
  // Joins a group through an existing store (all ranks must use the same one).
  static std::unique_ptr<ProcessGroup> create(std::shared_ptr<store::Store> store, int rank,
                                              int size, ProcessGroupOptions opts);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return topo_.rank; }
  int size() const { return topo_.size; }
  const Topology& topology() const { return topo_; }
  // The transport in use after `auto` was resolved.
  Transport transport() const { return transport_; }
  const ProcessGroupOptions& options() const { return opts_; }
  // One line: rank, size, hosts, transport.
  std::string describe() const;

  // Memory in this host's shared segment: collectives whose buffers come from
  // here read peers' data in place instead of staging it (the fast path for
  // gradient buckets). Aligned to 64 bytes. Throws InvalidArgument when the
  // heap is exhausted, naming DDPRUN_SHM_HEAP_MB. Falls back to ordinary
  // memory when this rank has no shared segment (single rank, TCP transport).
  void* allocShared(size_t bytes);
  void freeShared(void* p);

 private:
  friend struct internal::Access;
  class Impl;
  explicit ProcessGroup(ProcessGroupOptions opts);
  // Implementations of the internal:: functions in src/runtime/pg_internal.h.
  Work enqueue(std::string name, std::function<void()> fn);
  Work run(std::string name, std::function<void()> fn, bool inlineOk);
  Comm& comm();
  CudaComm& cudaComm();
  std::string diagnose(const std::string& what, int suspect);
  void init(std::shared_ptr<store::Store> store, int rank, int size);
  void workerLoop();
  std::exception_ptr execute(const std::string& name, const std::function<void()>& fn);

  ProcessGroupOptions opts_;
  Topology topo_;
  Transport transport_ = Transport::kAuto;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::runtime
