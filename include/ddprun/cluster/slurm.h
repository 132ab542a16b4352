// Zero-flag launches inside a Slurm step: `srun --ntasks-per-node=1 ddprun
// train` needs no flag. What the step's environment says becomes default
// values of ddprun's (torchrun's) flags; flags on the command line and PET_*
// variables always win (the CLI asks for defaults only of the flags nobody
// gave).
//
// What is taken, for a flag not given:
//   --nnodes          SLURM_STEP_NUM_NODES (else SLURM_NNODES), checked
//                     against the expanded node list
//   --node-rank       the index of SLURMD_NODENAME in SLURM_STEP_NODELIST
//                     (else SLURM_JOB_NODELIST), else SLURM_NODEID: the
//                     step's first node is node rank 0, so global rank 0 is
//                     there
//   --master-addr     the list's first node (must resolve), and
//   --master-port     15000 + (SLURM_JOB_ID + 997 * SLURM_STEP_ID) % 10000
//                     (step 0: PyTorch Lightning's 15000 + job % 10000; two
//                     steps of one job on the same nodes never share it),
//                     both only with more than one node
//   --rdzv-endpoint   first node:that port, when --rdzv-backend c10d is given
//   --rdzv-id         "<SLURM_JOB_ID>.<SLURM_STEP_ID>"
//   --nproc-per-node  SLURM_GPUS_ON_NODE when > 0, else SLURM_CPUS_PER_TASK
//                     (srun -c N); else nothing: torchrun's default 1, never
//                     the node's CPU count
// Signals: Slurm signals every process of a step (scancel --signal, srun
// --signal, preemption), so SIGUSR1/SIGUSR2 reach the workers from Slurm and
// the agent only has to live through them; on SIGTERM Slurm SIGKILLs what is
// left after its own grace period, so the agent does not SIGKILL earlier.
// Nothing about the rendezvous is taken with --standalone. A step that runs
// several ddprun tasks on one node, a node list that does not parse or does
// not match the node count, and a first node that does not resolve are
// errors naming the variable. DDPRUN_SLURM=0 ignores Slurm altogether.
//
// Pure functions over an injected environment and resolver; thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ddprun::cluster {

// Reads one variable (the process environment, or a map in tests).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
// Whether a host name resolves to an address.
using Resolver = std::function<bool(const std::string& host)>;

// One flag's value taken from the cluster manager's environment.
struct FlagDefault {
  std::string dest;    // the flag's torchrun name: "nnodes", "node_rank", ...
  std::string value;   // as it would be written on the command line
  std::string source;  // the variable(s) it came from, for messages
};

// What a cluster manager's environment supplies.
struct ClusterDefaults {
  std::string manager;  // "Slurm"; empty when not inside one
  std::string where;    // "job 123 step 0 on node n1"
  std::vector<FlagDefault> flags;
  // Signals the manager sends to every process of the job (Slurm signals
  // every process of a step): the agent must live through them and need not
  // forward them.
  std::vector<int> signalsToEveryProcess;
  // The manager SIGKILLs what is left when its grace period ends (Slurm's
  // KillWait, or GraceTime on preemption): the agent need not SIGKILL first.
  bool enforcesGracePeriod = false;
  bool empty() const { return manager.empty(); }
  // "from Slurm (job 123 step 0 on n1): --nnodes 3 (SLURM_NNODES), ...";
  // the one line the agent prints.
  std::string summary() const;
};

// The flags a Slurm step supplies. `given(dest)` returns the value of a flag
// given on the command line or through PET_* (nullopt: not given); only
// flags not given are supplied. Returns an empty result outside a Slurm step
// (no SLURM_JOB_ID or no SLURM_STEP_ID, e.g. the batch script itself) or
// with DDPRUN_SLURM=0. Throws InvalidArgument naming the variable for a
// misconfigured step.
ClusterDefaults slurmDefaults(
    const EnvLookup& env,
    const std::function<std::optional<std::string>(const std::string& dest)>& given,
    const Resolver& resolves);

// The port a multi-node Slurm step rendezvous on: 15000 + (job id + 997 *
// step id) % 10000, in 15000..24999 (below the usual ephemeral range).
int slurmPort(uint64_t jobId, uint64_t stepId);

}  // namespace ddprun::cluster
