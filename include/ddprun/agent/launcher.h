// Starting worker processes. The agent talks to a Launcher so that restart
// logic can be tested with a fake; PosixLauncher is the real one.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ddprun/agent/worker_spec.h"

namespace boost::asio {
class io_context;
}

namespace ddprun::agent {

struct ProcessSpec {
  std::vector<std::string> argv;
  Env env;
  int stdoutFd = -1;  // dup'ed onto the child's stdout; -1 inherits the agent's
  int stderrFd = -1;
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

// Boost.Process-based launcher. Each worker leads its own process group (so a
// signal reaches everything it started) and has PR_SET_PDEATHSIG=SIGKILL, so
// it dies with the agent even when the agent is SIGKILLed. Call from the one
// thread that also reaps children (PDEATHSIG is tied to the forking thread).
// Exits arrive as SIGCHLD through Asio (no polling) and are reaped with
// waitpid.
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
};

// Number of CUDA devices, found through the driver library at run time
// (dlopen of libcuda.so.1); 0 when there is no driver or no GPU.
int countCudaDevices();

}  // namespace ddprun::agent
