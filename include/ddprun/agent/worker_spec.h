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

// Where a bare program name (no slash) is looked for, in this order: the
// current directory, the directory of the ddprun binary (bundled programs
// such as `train`), then each directory of PATH.
struct ProgramSearch {
  std::string cwd = ".";     // the current directory
  std::string besideDdprun;  // empty: not searched
  std::string path;          // $PATH, ':'-separated; empty entries are skipped
  // This process: ".", the directory of /proc/self/exe, and $PATH.
  static ProgramSearch fromProcess();
};

// What runs as the worker: `program` (as given, "./name" for a program in the
// current directory, or an absolute path found by the search) and whether it
// runs directly (true) or through python. `notFound` is empty when the
// program was found, else an error message naming every place searched.
struct ResolvedProgram {
  std::string program;
  bool direct = false;
  std::string notFound;
};

// The program-resolution rule:
//  - -m module, or a name containing '/': as given; direct with --no-python,
//    or when it is an executable file not ending in .py (today's rule).
//  - a bare name that is a file in the current directory: the same rule
//    (python script unless executable or --no-python); a direct one becomes
//    "./name" so that it is never looked up on PATH instead.
//  - otherwise (a bare name that is not a file here): the executable of that
//    name beside ddprun, else on PATH, run directly as with --no-python.
//    Without --no-python a missing `*.py` name is left to python, as torchrun
//    does. Nothing found: `notFound` says where it looked.
ResolvedProgram resolveProgram(const std::string& name, bool module, bool noPython,
                               const ProgramSearch& where);

// Applies resolveProgram to cfg.script: sets cfg.script, cfg.noPython (true
// for a direct program) and cfg.programNotFound.
void resolveWorkerProgram(LaunchConfig& cfg, const ProgramSearch& where);

// argv of one worker: `python -u script args`, `python -u -m module args`,
// or `program args` (--no-python, or a script that is not a .py file and is
// executable); "${local_rank}" in any argument becomes the local rank.
// `python` is $PYTHON_EXEC when set, else "python3". Throws IoError with
// cfg.programNotFound when resolution found no program.
std::vector<std::string> workerArgv(const LaunchConfig& cfg, int localRank,
                                    const std::string& python, bool scriptIsExecutable);

// The environment of one worker: the agent's own environment plus torchrun's
// variables (RANK, LOCAL_RANK, ..., TORCHELASTIC_*, MASTER_ADDR/PORT).
Env workerEnv(const LaunchConfig& cfg, const GroupInfo& group, int localRank,
              int localWorldSize, int restartCount, const std::string& errorFile,
              const Env& agentEnv);

}  // namespace ddprun::agent
