#include "ddprun/agent/worker_spec.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "ddprun/common/error.h"

namespace ddprun::agent {

RankLayout assignRanks(const std::vector<int>& localWorldSizes) {
  RankLayout layout;
  for (int n : localWorldSizes) {
    DDPRUN_CHECK(n > 0, "a node reported ", n, " local workers");
    layout.baseRanks.push_back(layout.worldSize);
    layout.worldSize += n;
  }
  return layout;
}

namespace {
std::string substituteLocalRank(std::string arg, int localRank) {
  static const std::string kMacro = "${local_rank}";
  for (size_t pos = arg.find(kMacro); pos != std::string::npos;
       pos = arg.find(kMacro, pos)) {
    std::string r = std::to_string(localRank);
    arg.replace(pos, kMacro.size(), r);
    pos += r.size();
  }
  return arg;
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

namespace fs = std::filesystem;

bool isFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

bool isExecutableFile(const fs::path& p) {
  return isFile(p) && access(p.c_str(), X_OK) == 0;
}

std::vector<std::string> pathDirs(const std::string& path) {
  std::vector<std::string> dirs;
  size_t start = 0;
  for (size_t i = 0; i <= path.size(); ++i)
    if (i == path.size() || path[i] == ':') {
      if (i > start) dirs.push_back(path.substr(start, i - start));
      start = i + 1;
    }
  return dirs;
}

// `p` without "." parts or a trailing '/', for messages and argv[0].
std::string clean(const fs::path& p) {
  std::string s = p.lexically_normal().string();
  if (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}
}  // namespace

ProgramSearch ProgramSearch::fromProcess() {
  ProgramSearch s;
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) s.besideDdprun = self.parent_path().string();
  const char* path = std::getenv("PATH");
  s.path = path ? path : "";
  return s;
}

ResolvedProgram resolveProgram(const std::string& name, bool module, bool noPython,
                               const ProgramSearch& where) {
  if (module) return {name, false, ""};
  const bool py = endsWith(name, ".py");
  const bool bare = name.find('/') == std::string::npos;
  const fs::path here = fs::path(where.cwd) / name;
  if (!bare || isFile(here)) {
    const bool direct = noPython || (!py && isExecutableFile(here));
    return {direct && bare ? "./" + name : name, direct, ""};
  }
  if (py && !noPython) return {name, false, ""};  // python reports the missing script
  if (!where.besideDdprun.empty()) {
    fs::path bundled = fs::path(where.besideDdprun) / name;
    if (isExecutableFile(bundled)) return {clean(bundled), true, ""};
  }
  for (const auto& dir : pathDirs(where.path)) {
    fs::path candidate = fs::path(dir) / name;
    if (isExecutableFile(candidate)) return {clean(candidate), true, ""};
  }
  std::error_code ec;
  fs::path cwd = fs::absolute(where.cwd, ec);
  std::string msg = "program '" + name + "' not found: it is not a file in the current directory (" +
                    clean(ec ? fs::path(where.cwd) : cwd) + ")";
  if (!where.besideDdprun.empty())
    msg += ", not a bundled program beside ddprun (" + clean(fs::path(where.besideDdprun) / name) + ")";
  msg += ", and not an executable on PATH (" + (where.path.empty() ? "empty" : where.path) +
         "); give a path to it (e.g. ./" + name + ")";
  return {name, true, msg};
}

void resolveWorkerProgram(LaunchConfig& cfg, const ProgramSearch& where) {
  ResolvedProgram r = resolveProgram(cfg.script, cfg.module, cfg.noPython, where);
  cfg.script = r.program;
  cfg.noPython = r.direct;
  cfg.programNotFound = r.notFound;
}

std::vector<std::string> workerArgv(const LaunchConfig& cfg, int localRank,
                                    const std::string& python, bool scriptIsExecutable) {
  if (!cfg.programNotFound.empty()) DDPRUN_THROW(IoError, cfg.programNotFound);
  std::vector<std::string> argv;
  bool direct = cfg.noPython || (!cfg.module && !endsWith(cfg.script, ".py") && scriptIsExecutable);
  if (!direct) {
    argv = {python, "-u"};
    if (cfg.module) argv.push_back("-m");
  }
  argv.push_back(cfg.script);
  for (const auto& a : cfg.scriptArgs) argv.push_back(substituteLocalRank(a, localRank));
  return argv;
}

Env workerEnv(const LaunchConfig& cfg, const GroupInfo& group, int localRank,
              int localWorldSize, int restartCount, const std::string& errorFile,
              const Env& agentEnv) {
  Env env = agentEnv;
  int rank = group.baseRank + localRank;
  auto set = [&](const char* k, const std::string& v) { env[k] = v; };
  set("RANK", std::to_string(rank));
  set("LOCAL_RANK", std::to_string(cfg.virtualLocalRank ? 0 : localRank));
  set("WORLD_SIZE", std::to_string(group.worldSize));
  set("LOCAL_WORLD_SIZE", std::to_string(localWorldSize));
  set("GROUP_RANK", std::to_string(group.groupRank));
  set("GROUP_WORLD_SIZE", std::to_string(group.groupWorldSize));
  set("ROLE_RANK", std::to_string(rank));
  set("ROLE_WORLD_SIZE", std::to_string(group.worldSize));
  set("ROLE_NAME", cfg.role);
  set("MASTER_ADDR", group.masterAddr);
  set("MASTER_PORT", std::to_string(group.masterPort));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(restartCount));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(cfg.maxRestarts));
  set("TORCHELASTIC_RUN_ID", group.runId);
  set("TORCHELASTIC_USE_AGENT_STORE", group.useAgentStore ? "True" : "False");
  set("TORCHELASTIC_ERROR_FILE", errorFile);
  set("TORCHELASTIC_SIGNALS_TO_HANDLE", cfg.signalsToHandleText);
  if (!env.count("TORCH_NCCL_ASYNC_ERROR_HANDLING")) set("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (cfg.virtualLocalRank) {
    // One device each: the parent's list element [local_rank], else the index.
    std::string visible = std::to_string(localRank);
    auto it = agentEnv.find("CUDA_VISIBLE_DEVICES");
    if (it != agentEnv.end() && !it->second.empty()) {
      std::vector<std::string> devs;
      size_t start = 0;
      for (size_t i = 0; i <= it->second.size(); ++i)
        if (i == it->second.size() || it->second[i] == ',') {
          devs.push_back(it->second.substr(start, i - start));
          start = i + 1;
        }
      if (localRank < static_cast<int>(devs.size())) visible = devs[localRank];
    }
    set("CUDA_VISIBLE_DEVICES", visible);
  }
  return env;
}

}  // namespace ddprun::agent
