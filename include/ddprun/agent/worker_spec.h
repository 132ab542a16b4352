// What each worker process is started with: its command line and its
// environment, exactly torchrun's contract. Pure functions (apart from the
// file lookups of the program search), no processes.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ddprun/agent/launch_config.h"
#include "ddprun/rendezvous/rendezvous.h"

namespace ddprun::agent {

using Env = std::map<std::string, std::string>;

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

// How the worker program runs. `program` is the name as given: it becomes the
// worker's argv[0] (torchrun passes it unchanged). `path` is the file executed
// when the program runs directly: the name itself, "./name" for a bare name
// found in the current directory (never a namesake on PATH), or the absolute
// path the search found. `direct` false: it runs under Python (`path` empty).
// `notFound` is empty when the program was found, else an error message
// naming every place searched and how to fix it.
struct ResolvedProgram {
  std::string program;
  std::string path;
  bool direct = false;
  std::string notFound;
};

// The program-resolution rule:
//  - -m module, or --run-path: Python, never searched.
//  - a name containing '/', or a bare name that is a file in the current
//    directory: direct with --no-python or when the file is a native
//    executable (ELF); any other file, executable text with a shebang
//    included, runs under Python (`python -u file`), as torchrun does.
//  - otherwise (a bare name that is no file here): the executable of that
//    name beside ddprun, else on PATH, run directly as with --no-python
//    (`ddprun train` runs the bundled trainer). Without --no-python a
//    missing `*.py` name is left to Python to report, as torchrun does.
//    Nothing found: `notFound` says where it looked.
ResolvedProgram resolveProgram(const std::string& name, bool module, bool noPython,
                               bool runPath, const ProgramSearch& where);

// Applies resolveProgram to cfg.script at startup: sets cfg.noPython (true
// for a direct program) and cfg.programNotFound; cfg.script stays as given
// (the worker's argv[0]; workerCommand finds the file again).
void resolveWorkerProgram(LaunchConfig& cfg, const ProgramSearch& where);

// What one worker executes. `argv` is what the worker sees; `exe` the file
// to execute, empty when it is argv[0] itself (a bare argv[0], such as the
// interpreter "python3", is then looked up on the worker's PATH by the
// launcher). `interpreter`: argv[0] is the Python interpreter.
struct WorkerCommand {
  std::string exe;
  std::vector<std::string> argv;
  bool interpreter = false;
};

// The command of the worker with `localRank`:
//   `python -u script args`, `python -u -m module args`,
//   `python -u -c <runpy launcher> script args` (--run-path: the script runs
//   through runpy.run_path as __main__ with sys.argv = [script, args...]), or
//   `program args` (a direct program, see resolveProgram).
// "${local_rank}" in any argument becomes the local rank. `python` is the
// interpreter's command (chooseInterpreter in interpreter.h). Throws IoError
// with cfg.programNotFound when resolution found no program.
WorkerCommand workerCommand(const LaunchConfig& cfg, int localRank,
                            const std::string& python, const ProgramSearch& where);

// What the workers of one attempt share besides the config.
struct AttemptInfo {
  rendezvous::RoundInfo round;  // ranks, world size, the round's worker store
  std::string runId = "none";   // TORCHELASTIC_RUN_ID
  int restartCount = 0;         // TORCHELASTIC_RESTART_COUNT
  int localWorldSize = 1;       // workers on this node
};

// The environment of one worker: the agent's own environment plus torchrun's
// variables (RANK = round.baseRank + localRank, LOCAL_RANK, WORLD_SIZE,
// GROUP_RANK, ..., TORCHELASTIC_*, MASTER_ADDR/PORT = the round's worker
// store, TORCHELASTIC_USE_AGENT_STORE=True), and ddprun's own
// DDPRUN_PROGRESS_FILE = `progressFile` (common/progress_file.h; an inherited
// one is removed when `progressFile` is empty).
Env workerEnv(const LaunchConfig& cfg, const AttemptInfo& attempt, int localRank,
              const std::string& errorFile, const Env& agentEnv,
              const std::string& progressFile = "");

}  // namespace ddprun::agent
