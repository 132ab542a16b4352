// How many CPUs this process may run on. Thread-safe.
#pragma once

namespace ddprun {

// The CPUs of this process's affinity mask (sched_getaffinity), as
// torchrun 2.x counts them for --nproc-per-node cpu/auto
// (torch._utils.cpu_count): a container or a pod with a CPU set gets its
// share, not the machine's. At least 1; hardware_concurrency() when the
// mask cannot be read.
int availableCpus();

}  // namespace ddprun
