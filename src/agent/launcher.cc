// <utility> first: Boost 1.74 under C++20 with g++ 12.
#include <utility>

#include "ddprun/agent/launcher.h"

#include <dlfcn.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <sys/wait.h>

#include <boost/asio.hpp>
#include <boost/process.hpp>
#include <boost/process/extend.hpp>
#include <cerrno>
#include <cstring>

#include "ddprun/common/error.h"

namespace bp = boost::process;

namespace ddprun::agent {

namespace {
// Runs in the child between fork and exec: own process group, die with the
// parent, and the requested stdout/stderr.
struct WorkerSetup : bp::extend::handler {
  pid_t parent;
  int out, err;
  char** envp;  // prepared before fork: nothing is allocated in the child
  template <class Executor>
  void on_exec_setup(Executor& exec) const {
    exec.env = envp;
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the agent died before prctl
    if (out >= 0) dup2(out, STDOUT_FILENO);
    if (err >= 0) dup2(err, STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // the agent blocks some signals
  }
};
}  // namespace

struct PosixLauncher::Watch {
  explicit Watch(boost::asio::io_context& io) : sigchld(io, SIGCHLD) {}
  boost::asio::signal_set sigchld;
  ExitHandler onExit;
};

PosixLauncher::PosixLauncher() = default;
PosixLauncher::~PosixLauncher() = default;

void PosixLauncher::watchExits(boost::asio::io_context& io, ExitHandler onExit) {
  watch_ = std::make_unique<Watch>(io);
  watch_->onExit = std::move(onExit);
  arm();
}

void PosixLauncher::arm() {
  watch_->sigchld.async_wait([this](boost::system::error_code ec, int) {
    if (ec) return;
    pollExits();
    arm();
  });
}

void PosixLauncher::pollExits() {
  if (!watch_) return;
  int status = 0;
  for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;) watch_->onExit(pid, status);
}

void PosixLauncher::stopWatching() {
  if (!watch_) return;
  boost::system::error_code ec;
  watch_->sigchld.cancel(ec);
}

int PosixLauncher::start(const ProcessSpec& spec) {
  DDPRUN_CHECK(!spec.argv.empty(), "empty worker command");
  // The environment is handed to execve as a prepared array (Boost 1.74's
  // bp::environment reads past string ends when looking keys up).
  std::vector<std::string> envStrings;
  std::vector<char*> envp;
  for (const auto& [k, v] : spec.env) envStrings.push_back(k + "=" + v);
  for (auto& e : envStrings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = spec.argv[0];
  if (exe.find('/') == std::string::npos) {
    auto path = spec.env.count("PATH") ? spec.env.at("PATH") : std::string("/usr/bin:/bin");
    auto found = bp::search_path(exe, [&] {
      std::vector<boost::filesystem::path> dirs;
      size_t start = 0;
      for (size_t i = 0; i <= path.size(); ++i)
        if (i == path.size() || path[i] == ':') {
          if (i > start) dirs.emplace_back(path.substr(start, i - start));
          start = i + 1;
        }
      return dirs;
    }());
    if (found.empty())
      DDPRUN_THROW(IoError, "cannot start worker: '", exe,
                   "' not found on PATH (set PYTHON_EXEC or use a full path)");
    exe = found.string();
  }
  std::vector<std::string> args(spec.argv.begin() + 1, spec.argv.end());
  std::error_code ec;
  WorkerSetup setup;
  setup.parent = getpid();
  setup.out = spec.stdoutFd;
  setup.err = spec.stderrFd;
  setup.envp = envp.data();
  bp::child child(bp::exe = exe, bp::args = args, setup, ec);
  if (ec)
    DDPRUN_THROW(IoError, "cannot start worker '", spec.argv[0], "': ", ec.message());
  int pid = child.id();
  child.detach();  // the agent reaps it through SIGCHLD
  return pid;
}

void PosixLauncher::signalGroup(int pid, int sig) {
  if (::kill(-pid, sig) != 0 && errno == ESRCH) ::kill(pid, sig);
}

int countCudaDevices() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 0;
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (init == nullptr || count == nullptr || init(0) != 0 || count(&n) != 0) n = 0;
  dlclose(lib);
  return n;
}

}  // namespace ddprun::agent
