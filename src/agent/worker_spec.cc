#include "ddprun/agent/worker_spec.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/progress_file.h"
#include "ddprun/common/strings.h"
#include "ddprun/store/auth.h"

namespace ddprun::agent {

namespace {
namespace fs = std::filesystem;

// torchrun's --run-path: runpy.run_path(script) as __main__, with
// sys.argv = [script, args...] (`python -c code a b` starts with
// sys.argv = ['-c', 'a', 'b']). SystemExit(0) ends Python with 0.
constexpr const char* kRunPathCode =
    "import runpy,sys; sys.argv=sys.argv[1:]; runpy.run_path(sys.argv[0], "
    "run_name='__main__')";

bool isFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool isExecutableFile(const fs::path& p) {
  return isFile(p) && access(p.c_str(), X_OK) == 0;
}

// A native executable starts with the ELF magic; everything else (text,
// shebang scripts included) is a script for Python, as under torchrun.
bool isElf(const fs::path& p) {
  if (!isFile(p)) return false;
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  static constexpr char kMagic[4] = {0x7f, 'E', 'L', 'F'};
  char magic[4] = {};
  bool elf = ::read(fd, magic, sizeof magic) == 4 && std::memcmp(magic, kMagic, 4) == 0;
  ::close(fd);
  return elf;
}

// `p` without "." parts or a trailing '/', for messages and paths.
std::string clean(const fs::path& p) {
  std::string s = p.lexically_normal().string();
  if (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::string notFoundMessage(const std::string& name, const ProgramSearch& where) {
  std::error_code ec;
  fs::path cwd = fs::absolute(where.cwd, ec);
  std::string msg = "program '" + name +
                    "' not found: it is not a file in the current directory (" +
                    clean(ec ? fs::path(where.cwd) : cwd) + ")";
  if (!where.besideDdprun.empty())
    msg += ", not a bundled program beside ddprun (" +
           clean(fs::path(where.besideDdprun) / name) + ")";
  msg += ", and not an executable on PATH (" +
         (where.path.empty() ? "empty" : where.path) + "); give a path to it (e.g. ./" +
         name + ")";
  return msg;
}

// A bare name that is no file here: the bundled program, else one on PATH.
ResolvedProgram searchProgram(const std::string& name, const ProgramSearch& where) {
  if (!where.besideDdprun.empty()) {
    fs::path bundled = fs::path(where.besideDdprun) / name;
    if (isExecutableFile(bundled)) return {name, clean(bundled), true, ""};
  }
  for (const auto& dir : str::split(where.path, ':')) {
    if (dir.empty()) continue;
    fs::path candidate = fs::path(dir) / name;
    if (isExecutableFile(candidate)) return {name, clean(candidate), true, ""};
  }
  return {name, "", true, notFoundMessage(name, where)};
}

std::string substituteLocalRank(const std::string& arg, int localRank) {
  return str::replaceAll(arg, "${local_rank}", std::to_string(localRank));
}
}  // namespace

ProgramSearch ProgramSearch::fromProcess() {
  ProgramSearch s;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) s.besideDdprun = self.parent_path().string();
  s.path = env::get("PATH").value_or("");
  return s;
}

ResolvedProgram resolveProgram(const std::string& name, bool module, bool noPython,
                               bool runPath, const ProgramSearch& where) {
  if (module || runPath) return {name, "", false, ""};
  const bool bare = name.find('/') == std::string::npos;
  const fs::path here = fs::path(where.cwd) / name;
  if (!bare || isFile(here)) {
    if (!noPython && !isElf(here)) return {name, "", false, ""};
    return {name, bare ? "./" + name : name, true, ""};
  }
  if (!noPython && str::endsWith(name, ".py"))
    return {name, "", false, ""};  // Python reports it
  return searchProgram(name, where);
}

void resolveWorkerProgram(LaunchConfig& cfg, const ProgramSearch& where) {
  ResolvedProgram r =
      resolveProgram(cfg.script, cfg.module, cfg.noPython, cfg.runPath, where);
  cfg.noPython = r.direct;
  cfg.programNotFound = r.notFound;
}

WorkerCommand workerCommand(const LaunchConfig& cfg, int localRank,
                            const std::string& python, const ProgramSearch& where) {
  if (!cfg.programNotFound.empty()) DDPRUN_THROW(IoError, cfg.programNotFound);
  ResolvedProgram r =
      resolveProgram(cfg.script, cfg.module, cfg.noPython, cfg.runPath, where);
  WorkerCommand cmd;
  if (r.direct) {
    // Not found again (a test config that skipped resolveWorkerProgram): the
    // launcher looks the name up itself and reports it.
    cmd.exe = r.path;
    cmd.argv.push_back(r.program);
  } else {
    cmd.interpreter = true;
    cmd.argv = {python, "-u"};
    if (cfg.runPath) {
      cmd.argv.insert(cmd.argv.end(), {"-c", kRunPathCode});
    } else if (cfg.module) {
      cmd.argv.push_back("-m");
    }
    cmd.argv.push_back(cfg.script);
  }
  for (const auto& a : cfg.scriptArgs)
    cmd.argv.push_back(substituteLocalRank(a, localRank));
  return cmd;
}

Env workerEnv(const LaunchConfig& cfg, const AttemptInfo& attempt, int localRank,
              const std::string& errorFile, const Env& agentEnv,
              const std::string& progressFile) {
  const rendezvous::RoundInfo& round = attempt.round;
  Env env = agentEnv;
  // The rendezvous store's secret is the agents' alone: a worker that could
  // read it could forge heartbeats and round ends (docs/rendezvous.md).
  env.erase(store::auth::kTokenEnv);
  int rank = round.baseRank + localRank;
  auto set = [&](const char* k, const std::string& v) { env[k] = v; };
  set("RANK", std::to_string(rank));
  set("LOCAL_RANK", std::to_string(cfg.virtualLocalRank ? 0 : localRank));
  set("WORLD_SIZE", std::to_string(round.worldSize));
  set("LOCAL_WORLD_SIZE", std::to_string(attempt.localWorldSize));
  set("GROUP_RANK", std::to_string(round.groupRank));
  set("GROUP_WORLD_SIZE", std::to_string(round.groupWorldSize));
  set("ROLE_RANK", std::to_string(rank));
  set("ROLE_WORLD_SIZE", std::to_string(round.worldSize));
  set("ROLE_NAME", cfg.role);
  set("MASTER_ADDR", round.workerStoreHost);
  set("MASTER_PORT", std::to_string(round.workerStorePort));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt.restartCount));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(cfg.maxRestarts));
  set("TORCHELASTIC_RUN_ID", attempt.runId);
  set("TORCHELASTIC_USE_AGENT_STORE", "True");  // every backend hosts the workers' store
  set("TORCHELASTIC_ERROR_FILE", errorFile);
  set("TORCHELASTIC_SIGNALS_TO_HANDLE", cfg.signalsToHandleText);
  // An agent's own file only: one inherited from an outer ddprun would make
  // this worker report into the outer job's.
  if (progressFile.empty())
    env.erase(kProgressFileEnv);
  else
    set(kProgressFileEnv, progressFile);
  if (!env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING"))
    set("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (cfg.virtualLocalRank) {
    // One device each: the parent's list element [local_rank], else the index.
    std::string visible = std::to_string(localRank);
    auto it = agentEnv.find("CUDA_VISIBLE_DEVICES");
    if (it != agentEnv.end() && !it->second.empty()) {
      auto devs = str::split(it->second, ',');
      if (localRank < static_cast<int>(devs.size())) visible = devs[localRank];
    }
    set("CUDA_VISIBLE_DEVICES", visible);
  }
  return env;
}

}  // namespace ddprun::agent
