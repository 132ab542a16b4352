#include "ddprun/agent/worker_spec.h"

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
}  // namespace

std::vector<std::string> workerArgv(const LaunchConfig& cfg, int localRank,
                                    const std::string& python, bool scriptIsExecutable) {
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
