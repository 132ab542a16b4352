// What each worker process is started with: its command line and its
// environment, exactly torchrun's contract. Pure functions, no processes.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ddprun/agent/launch_config.h"

namespace ddprun::agent {

using Env = std::map<std::string, std::string>;

// The outcome of a rendezvous as far as the workers are concerned.
struct GroupInfo {
  int groupRank = 0;       // this node's rank
  int groupWorldSize = 1;  // number of nodes
  int baseRank = 0;        // global rank of this node's local rank 0
  int worldSize = 1;       // workers across all nodes
  std::string masterAddr = "127.0.0.1";
  uint16_t masterPort = 29500;
  bool useAgentStore = true;
  std::string runId = "none";
};

// Global rank offsets for nodes with the given local world sizes, in group
// rank order: offsets[i] = sum of sizes before i; total = the world size.
struct RankLayout {
  std::vector<int> baseRanks;
  int worldSize = 0;
};
RankLayout assignRanks(const std::vector<int>& localWorldSizes);

// argv of one worker: `python -u script args`, `python -u -m module args`,
// or `program args` (--no-python, or a script that is not a .py file and is
// executable); "${local_rank}" in any argument becomes the local rank.
// `python` is $PYTHON_EXEC when set, else "python3".
std::vector<std::string> workerArgv(const LaunchConfig& cfg, int localRank,
                                    const std::string& python, bool scriptIsExecutable);

// The environment of one worker: the agent's own environment plus torchrun's
// variables (RANK, LOCAL_RANK, ..., TORCHELASTIC_*, MASTER_ADDR/PORT).
Env workerEnv(const LaunchConfig& cfg, const GroupInfo& group, int localRank,
              int localWorldSize, int restartCount, const std::string& errorFile,
              const Env& agentEnv);

}  // namespace ddprun::agent
