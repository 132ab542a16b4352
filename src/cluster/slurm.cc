// Flag defaults from a Slurm step (slurm.h). Every value names the variable
// it came from, so that a conversion error later in the CLI names it too.
#include "ddprun/cluster/slurm.h"

#include <signal.h>

#include <algorithm>

#include "ddprun/cluster/hostlist.h"
#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"

namespace ddprun::cluster {

namespace {

// Step ids from this value up are Slurm's special steps (batch script,
// extern, interactive), which run on one node only: no multi-node launch.
constexpr int64_t kFirstSpecialStep = 0xFFFFFFF0LL;

struct Var {
  std::string name;
  std::string value;
};

// The first of `names` that is set and not empty.
std::optional<Var> first(const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (auto v = env(n); v && !str::trim(*v).empty()) return Var{n, str::trim(*v)};
  return std::nullopt;
}

int64_t integer(const Var& v, int64_t min) {
  int64_t out = 0;
  if (!str::parseInt(v.value, out, min))
    DDPRUN_THROW(InvalidArgument, v.name, "='", str::escape(v.value),
                 "' is not an integer >= ", min,
                 " (ddprun reads the Slurm step's layout from it; set DDPRUN_SLURM=0 to "
                 "ignore Slurm's variables)");
  return out;
}

// The count of a variable holding a number or Slurm's "N(xM)" repeat form
// (SLURM_GPUS_ON_NODE is a plain number; tolerate "2(x3)").
int64_t leadingCount(const Var& v) {
  std::string digits;
  for (char c : v.value) {
    if (c < '0' || c > '9') break;
    digits += c;
  }
  return integer(Var{v.name, digits.empty() ? v.value : digits}, 0);
}

}  // namespace

std::string ClusterDefaults::summary() const {
  std::vector<std::string> parts;
  for (const auto& f : flags)
    parts.push_back("--" + str::replaceAll(f.dest, "_", "-") + " " + f.value + " (" +
                    f.source + ")");
  return "from " + manager + " (" + where + "): " +
         (parts.empty() ? std::string("nothing, every flag was given") : str::join(parts, ", ")) +
         "; flags and PET_* variables take precedence";
}

int slurmPort(uint64_t jobId, uint64_t stepId) {
  // 997 is prime to 10000: steps 0..9999 of a job get distinct ports, and
  // step 0 keeps Lightning's 15000 + job % 10000.
  return 15000 + static_cast<int>((jobId % 10000 + (stepId % 10000) * 997) % 10000);
}

ClusterDefaults slurmDefaults(
    const EnvLookup& env,
    const std::function<std::optional<std::string>(const std::string& dest)>& given,
    const Resolver& resolves) {
  ClusterDefaults out;
  if (auto off = env("DDPRUN_SLURM"); off && str::trim(*off) == "0") return out;
  auto job = first(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  auto step = first(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  if (!job || !step) return out;
  const int64_t jobId = integer(*job, 0);
  const int64_t stepId = integer(*step, 0);
  if (stepId >= kFirstSpecialStep) return out;

  auto listVar = first(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  if (!listVar)
    DDPRUN_THROW(InvalidArgument, "inside Slurm job ", jobId, " step ", stepId,
                 " but SLURM_STEP_NODELIST is not set: run ddprun through srun, or set "
                 "DDPRUN_SLURM=0 and give the flags");
  std::vector<std::string> hosts;
  try {
    hosts = expandHostList(listVar->value);
  } catch (const InvalidArgument& e) {
    DDPRUN_THROW(InvalidArgument, listVar->name, "='", str::escape(listVar->value),
                 "' does not parse: ", e.message());
  }

  // The node count must match the list.
  int64_t nnodes = static_cast<int64_t>(hosts.size());
  if (auto n = first(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"})) {
    nnodes = integer(*n, 1);
    if (nnodes != static_cast<int64_t>(hosts.size()))
      DDPRUN_THROW(InvalidArgument, n->name, "=", nnodes, " but ", listVar->name, "='",
                   str::escape(listVar->value), "' names ", hosts.size(), " node(s)");
  }

  // One ddprun per node: it starts the node's workers itself.
  if (auto t = first(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}); t && integer(*t, 1) > nnodes)
    DDPRUN_THROW(InvalidArgument, t->name, "=", t->value, " on ", nnodes,
                 " node(s): several ddprun tasks share a node, but ddprun starts a node's "
                 "workers itself; run one per node (srun --ntasks-per-node=1) and choose "
                 "the workers with --nproc-per-node");
  if (auto l = first(env, {"SLURM_LOCALID"}); l && integer(*l, 0) != 0)
    DDPRUN_THROW(InvalidArgument, "SLURM_LOCALID=", l->value,
                 ": this is not the first task on its node; several ddprun tasks share the "
                 "node, but ddprun starts a node's workers itself; run one per node (srun "
                 "--ntasks-per-node=1)");

  // This node's place in the list.
  int64_t nodeRank = -1;
  std::string rankSource;
  auto self = first(env, {"SLURMD_NODENAME"});
  if (self) {
    auto it = std::find(hosts.begin(), hosts.end(), self->value);
    if (it == hosts.end())
      DDPRUN_THROW(InvalidArgument, "SLURMD_NODENAME='", str::escape(self->value),
                   "' is not in ", listVar->name, "='", str::escape(listVar->value), "'");
    nodeRank = it - hosts.begin();
    rankSource = "SLURMD_NODENAME in " + listVar->name;
  } else if (auto id = first(env, {"SLURM_NODEID"})) {
    nodeRank = integer(*id, 0);
    if (nodeRank >= nnodes)
      DDPRUN_THROW(InvalidArgument, "SLURM_NODEID=", nodeRank, " but the step has ", nnodes,
                   " node(s)");
    rankSource = "SLURM_NODEID";
  } else {
    DDPRUN_THROW(InvalidArgument, "inside Slurm job ", jobId, " step ", stepId,
                 " but neither SLURMD_NODENAME nor SLURM_NODEID is set: run ddprun through "
                 "srun, or set DDPRUN_SLURM=0 and give the flags");
  }

  out.manager = "Slurm";
  out.signalsToEveryProcess = {SIGUSR1, SIGUSR2};
  out.enforcesGracePeriod = true;
  out.where = "job " + std::to_string(jobId) + " step " + std::to_string(stepId) + " on " +
              hosts[static_cast<size_t>(nodeRank)];
  auto take = [&](const std::string& dest, std::string value, std::string source) {
    if (!given(dest)) out.flags.push_back({dest, std::move(value), std::move(source)});
  };

  const bool standalone = given("standalone").has_value();
  const std::string backend = given("rdzv_backend").value_or("static");
  const std::string port =
      std::to_string(slurmPort(static_cast<uint64_t>(jobId), static_cast<uint64_t>(stepId)));
  const std::string portSource =
      "15000 + (" + job->name + " + 997 * " + step->name + ") % 10000";
  auto firstHost = [&] {
    if (!resolves(hosts[0]))
      DDPRUN_THROW(InvalidArgument, "the step's first node '", hosts[0], "' (from ",
                   listVar->name, ") does not resolve to an address; fix the node's name "
                   "resolution or give --master-addr");
    return hosts[0];
  };
  if (!standalone) {
    take("nnodes", std::to_string(nnodes), listVar->name);
    take("rdzv_id", std::to_string(jobId) + "." + std::to_string(stepId),
         job->name + "." + step->name);
    if (backend == "static") {
      take("node_rank", std::to_string(nodeRank), rankSource);
      if (nnodes > 1) {
        if (!given("master_addr")) take("master_addr", firstHost(), "first of " + listVar->name);
        take("master_port", port, portSource);
      }
    } else if (!given("rdzv_endpoint")) {
      take("rdzv_endpoint", firstHost() + ":" + port,
           "first of " + listVar->name + ", " + portSource);
    }
  }
  // Without GPUs, the node's CPU count (SLURM_CPUS_ON_NODE) is no worker
  // count: a 128-core node would start 128 workers. torchrun's default, 1,
  // holds unless the user asked for CPUs per task (srun -c N).
  if (auto g = first(env, {"SLURM_GPUS_ON_NODE"}); g && leadingCount(*g) > 0) {
    take("nproc_per_node", std::to_string(leadingCount(*g)), g->name);
  } else if (auto c = first(env, {"SLURM_CPUS_PER_TASK"})) {
    take("nproc_per_node", std::to_string(std::max<int64_t>(1, leadingCount(*c))), c->name);
  }
  return out;
}

}  // namespace ddprun::cluster
