// Starting worker processes. The agent talks to a Launcher so that restart
// logic can be tested with a fake; PosixLauncher is the real one.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/agent/worker_spec.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

struct ProcessSpec {
  // What the process sees as its command line; argv[0] is passed exactly as
  // given (`sleep`, not `/usr/bin/sleep`, as torchrun does).
  std::vector<std::string> argv;
  // The file executed. Empty: argv[0]; a name without '/' is then looked up
  // on the PATH of `env` (else /usr/bin:/bin), so PYTHON_EXEC=python3 and an
  // activated virtual environment find the same interpreter as a shell would.
  std::string exe;
  Env env;
  int stdoutFd = -1;  // dup'ed onto the child's stdout; -1 inherits the agent's
  int stderrFd = -1;
  // Added to the message when the program is missing, saying how to fix it
  // (WorkerGroup: "set PYTHON_EXEC ..." only when argv[0] is the interpreter).
  std::string notFoundHint;
  // After the worker exits, how long its remaining descendants get between
  // SIGTERM and SIGKILL before its exit is reported.
  std::chrono::milliseconds descendantGrace{2000};
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Starts a process; returns its pid. Throws IoError naming the program.
  virtual int start(const ProcessSpec& spec) = 0;
  // Sends a signal to the process group the process leads.
  virtual void signalGroup(int pid, int sig) = 0;
  // Reports every exit of a started process, as (pid, waitpid status), by
  // running `onExit` on `io`. Called once, before the first start().
  using ExitHandler = std::function<void(int pid, int status)>;
  virtual void watchExits(boost::asio::io_context& io, ExitHandler onExit) = 0;
  // Reaps every process that has exited by now and runs the exit handler
  // for each, synchronously (before deciding whom a stop signals, so that a
  // worker that failed by itself is never taken for a victim).
  virtual void pollExits() = 0;
  // Stops reporting (the agent is done).
  virtual void stopWatching() = 0;
};

// The Boost.Process launcher. No descendant of a worker outlives the worker,
// and nothing outlives the agent, even after `kill -9` of the agent.
//
// Design: a keeper process per worker.
//   agent ── keeper (own process group; PR_SET_CHILD_SUBREAPER;
//            │        PR_SET_PDEATHSIG=SIGUSR1 from the agent)
//            └── worker (leads its own process group; PR_SET_PDEATHSIG=SIGKILL
//                        from the keeper) ── the worker's children ...
// The agent forks the keeper (Boost.Process's on_exec_setup hook, i.e. after
// fork), which forks the worker; the worker returns from the hook and Boost
// execs it. The keeper never execs: it writes the worker's pid to a pipe
// (start() returns the worker's pid, and exits are reported under it), closes
// every descriptor and waits, with async-signal-safe calls only (the agent is
// multithreaded: no malloc, no stdio after fork).
//  - Signals: signalGroup() signals the worker's group; the keeper is in
//    another group, so even SIGKILL after the grace period leaves it alive to
//    clean up. It treats any wakeup but SIGCHLD as "is the agent gone?"
//    (getppid()).
//  - The worker exits: every orphaned descendant has been reparented to the
//    keeper (subreaper), so the keeper's descendants are exactly what is
//    left, wherever they moved (setsid, own process groups, double forks).
//    It sends them (and the worker's process group) SIGTERM, then SIGKILL
//    after `descendantGrace` (in rounds, for at most 10 s, should one be
//    stuck in the kernel), reaps them, and exits with the worker's status:
//    the same exit code, or the same signal (re-raised with the default
//    action and no core dump). No descendant left (the usual case): it exits
//    at once without reading /proc.
//  - The agent dies (even by SIGKILL): the keeper gets SIGUSR1 and SIGKILLs
//    the worker and every descendant, reaps them, exits. A spurious SIGUSR1
//    (PDEATHSIG follows the forking thread) makes it check getppid() once a
//    second from then on.
// Why not cgroup v2 (`cgroup.kill`): creating a cgroup needs a delegated
// subtree, i.e. root or a systemd user slice (systemd-run --scope), which a
// launcher started from a shell, a container or a batch job usually lacks.
// The keeper needs no privilege. Its gaps: a SIGKILL aimed at the keeper
// itself (the OOM killer, a user) kills the worker (PDEATHSIG) but orphans
// the worker's children; a process stuck in the kernel past the SIGKILL
// rounds is left behind.
//
// Descriptors: in the worker every fd >= 3 is close-on-exec (close_range, a
// /proc walk as the fallback), so the agent's sockets, pipes and files never
// leak into workers; the worker's signal mask is empty, and SIGPIPE and
// SIGXFSZ are back to their default action (the agent ignores SIGPIPE; other
// inherited dispositions, e.g. nohup's SIGHUP, are kept, as under torchrun).
//
// Threading: call everything from the one thread that runs `io` (the
// keeper's PDEATHSIG follows the forking thread). Exits arrive as SIGCHLD
// through Asio (no polling) and are reaped with waitpid.
class PosixLauncher : public Launcher {
 public:
  PosixLauncher();
  ~PosixLauncher() override;
  int start(const ProcessSpec& spec) override;
  void signalGroup(int pid, int sig) override;
  void watchExits(boost::asio::io_context& io, ExitHandler onExit) override;
  void pollExits() override;
  void stopWatching() override;

 private:
  struct Watch;
  void arm();
  std::unique_ptr<Watch> watch_;
  std::map<int, int> workerOfKeeper_;  // keeper pid -> worker pid, until reaped
};

// Why a process could not be started, for errno `err` of the call that
// failed, in words that name the resource and how to get more: descriptors
// (EMFILE: "out of file descriptors (RLIMIT_NOFILE 32); raise it with
// ulimit -n"; ENFILE: the system's file table), processes (EAGAIN: the
// RLIMIT_NPROC soft limit, ulimit -u), memory (ENOMEM); strerror otherwise.
std::string startErrorText(int err);

// Number of CUDA devices, found through the driver library at run time
// (dlopen of libcuda.so.1); 0 when there is no driver or no GPU.
int countCudaDevices();

}  // namespace ddprun::agent
