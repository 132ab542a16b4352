// The per-worker keeper of PosixLauncher (see launcher.h for the design):
// code that runs in the agent's forked child, between fork and exec.
// Everything here is async-signal-safe (the agent is multithreaded): no
// allocation, no stdio, no locks; only system calls and stack buffers.
#pragma once

#include <sys/types.h>

namespace ddprun::agent::keeper {

// Prepared by the agent before fork.
struct Plan {
  pid_t agent = 0;    // the agent's pid (getppid() of the keeper)
  int pidPipe = -1;   // write end: the keeper sends the worker's pid here (-errno: fork failed)
  int stdoutFd = -1;  // dup'ed onto the worker's stdout, -1: inherit
  int stderrFd = -1;
  long graceMs = 2000;  // descendants' SIGTERM-to-SIGKILL grace after the worker exits
};

// Called in the forked child. The child becomes the keeper and never returns
// from here; the function returns only in the worker (its child), ready to be
// exec'ed: own process group, PR_SET_PDEATHSIG=SIGKILL, stdout/stderr set,
// signal mask empty, default actions for handled signals and SIGPIPE/SIGXFSZ,
// every fd >= 3 close-on-exec.
void becomeKeeper(const Plan& plan);

// Marks every descriptor >= 3 close-on-exec (close_range, else a walk of
// /proc/self/fd, else every number below RLIMIT_NOFILE).
void markCloseOnExecFrom3();

}  // namespace ddprun::agent::keeper
