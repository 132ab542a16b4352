// <utility> first: Boost 1.74 under C++20 with g++ 12.
#include <utility>

#include "ddprun/agent/launcher.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/process.hpp>
#include <boost/process/extend.hpp>
#include <cerrno>
#include <cstring>
#include <optional>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "keeper.h"

namespace bp = boost::process;

namespace ddprun::agent {

namespace {
// Everything the child needs, prepared before fork: nothing is allocated
// between fork and exec.
struct Prepared {
  std::string exe;
  std::vector<std::string> argStrings, envStrings;
  std::vector<char*> argv, envp;
};

// Runs in the child between fork and exec: the child becomes the keeper
// (which never returns) and its child, the worker, returns to be exec'ed as
// `exe` with our argv (argv[0] as given) and environment.
struct KeeperSetup : bp::extend::handler {
  keeper::Plan plan;
  Prepared* prepared;
  pid_t* failedPid;          // the keeper's pid when Boost reports an error
  std::error_code* failure;  // the error Boost reports
  template <class Executor>
  void on_exec_setup(Executor& exec) const {
    keeper::becomeKeeper(plan);
    exec.exe = prepared->exe.c_str();
    exec.cmd_line = prepared->argv.data();
    exec.env = prepared->envp.data();
  }
  template <class Executor>
  void on_error(Executor& exec, const std::error_code& ec) const {
    *failedPid = exec.pid;
    *failure = ec;
  }
};

// A soft resource limit as text ("unlimited" for RLIM_INFINITY).
std::string softLimit(int resource) {
  rlimit rl{};
  if (::getrlimit(resource, &rl) != 0) return "unknown";
  return rl.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(rl.rlim_cur);
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string withHint(std::string msg, const std::string& hint) {
  return hint.empty() ? msg : msg + "; " + hint;
}

// The file to execute: a name with '/' as is, a bare name looked up on the
// worker's PATH (as execvp would, but before fork, and with a message).
std::string findExecutable(const ProcessSpec& spec) {
  const std::string& name = spec.exe.empty() ? spec.argv[0] : spec.exe;
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) == 0) return name;
    int err = errno;
    if (err == ENOENT)
      DDPRUN_THROW(IoError, withHint("cannot start worker: '" + name + "' does not exist",
                                     spec.notFoundHint));
    DDPRUN_THROW(IoError, "cannot start worker: '", name, "' cannot be executed (",
                 std::strerror(err), ")",
                 err == EACCES ? "; make it executable (chmod +x)" : "");
  }
  auto it = spec.env.find("PATH");
  const std::string path = it != spec.env.end() ? it->second : "/usr/bin:/bin";
  for (const auto& dir : str::split(path, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  DDPRUN_THROW(IoError,
               withHint("cannot start worker: '" + name + "' not found on PATH (" +
                            (path.empty() ? "empty" : path) + ")",
                        spec.notFoundHint));
}

Prepared prepare(const ProcessSpec& spec) {
  Prepared p;
  p.exe = findExecutable(spec);
  p.argStrings = spec.argv;
  for (const auto& [k, v] : spec.env) p.envStrings.push_back(k + "=" + v);
  p.argv = pointers(p.argStrings);
  p.envp = pointers(p.envStrings);
  return p;
}

// What the keeper writes right after forking the worker: its pid, or
// -errno when the fork failed (keeper.h); nullopt when the keeper exited
// without a word.
std::optional<pid_t> readWorkerPid(int fd) {
  pid_t pid = 0;
  size_t got = 0;
  auto* out = reinterpret_cast<char*>(&pid);
  while (got < sizeof pid) {
    ssize_t n = ::read(fd, out + got, sizeof pid - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    got += static_cast<size_t>(n);
  }
  return pid;
}

// A keeper whose worker never ran: make sure it is gone, and reap it.
void discardKeeper(pid_t keeper) {
  if (keeper <= 0) return;
  ::kill(keeper, SIGKILL);
  int status = 0;
  while (::waitpid(keeper, &status, 0) < 0 && errno == EINTR) {
  }
}
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
  for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;) {
    // A keeper exits with its worker's status, after the worker's
    // descendants are gone: report it under the worker's pid.
    auto it = workerOfKeeper_.find(pid);
    if (it != workerOfKeeper_.end()) {
      pid = it->second;
      workerOfKeeper_.erase(it);
    }
    watch_->onExit(pid, status);
  }
}

void PosixLauncher::stopWatching() {
  if (!watch_) return;
  boost::system::error_code ec;
  watch_->sigchld.cancel(ec);
}

std::string startErrorText(int err) {
  switch (err) {
    case EMFILE:
      return "out of file descriptors (RLIMIT_NOFILE " + softLimit(RLIMIT_NOFILE) +
             "); raise it with ulimit -n";
    case ENFILE:
      return "the system is out of file descriptors (ENFILE: its file table is full); "
             "close files elsewhere or raise fs.file-max";
    case EAGAIN:
      return "out of processes (RLIMIT_NPROC " + softLimit(RLIMIT_NPROC) +
             ", or the system's pid or thread limit); raise it with ulimit -u";
    case ENOMEM:
      return "out of memory";
    default:
      return std::strerror(err);
  }
}

int PosixLauncher::start(const ProcessSpec& spec) {
  DDPRUN_CHECK(!spec.argv.empty(), "empty worker command");
  Prepared prepared = prepare(spec);
  int pidPipe[2];
  if (::pipe2(pidPipe, O_CLOEXEC) != 0)
    DDPRUN_THROW(IoError, "cannot start worker '", spec.argv[0],
                 "': ", startErrorText(errno));
  pid_t failedPid = -1;
  std::error_code failure;
  KeeperSetup setup;
  setup.plan.agent = ::getpid();
  setup.plan.pidPipe = pidPipe[1];
  setup.plan.stdoutFd = spec.stdoutFd;
  setup.plan.stderrFd = spec.stderrFd;
  setup.plan.graceMs = static_cast<long>(spec.descendantGrace.count());
  setup.prepared = &prepared;
  setup.failedPid = &failedPid;
  setup.failure = &failure;
  std::error_code ec;
  // Boost reports an exec failure of the worker (which holds its error pipe
  // until exec) and returns once the worker has exec'ed. When its own pipe
  // or fork fails, it may return an invalid child and report nothing
  // (Boost 1.74 with an error_code): errno then says why.
  errno = 0;
  bp::child child(
      bp::exe = prepared.exe,
      bp::args = std::vector<std::string>(spec.argv.begin() + 1, spec.argv.end()), setup,
      ec);
  const int err = errno;
  ::close(pidPipe[1]);
  if (ec || failure || !child.valid()) {
    ::close(pidPipe[0]);
    discardKeeper(failedPid);
    const std::error_code why =
        ec ? ec : failure ? failure : std::error_code(err, std::system_category());
    DDPRUN_THROW(IoError, "cannot start worker '", spec.argv[0], "' (", prepared.exe, "): ",
                 why.value() == 0 ? "Boost.Process created no process and said not why"
                 : why.category() == std::system_category() ? startErrorText(why.value())
                                                            : why.message());
  }
  const pid_t keeperPid = child.id();
  child.detach();  // the agent reaps it through SIGCHLD
  const auto worker = readWorkerPid(pidPipe[0]);
  ::close(pidPipe[0]);
  if (!worker || *worker <= 0) {
    discardKeeper(keeperPid);
    if (worker && *worker < 0)
      DDPRUN_THROW(IoError, "cannot start worker '", spec.argv[0],
                   "': its keeper process could not fork it: ", startErrorText(-*worker));
    DDPRUN_THROW(IoError, "cannot start worker '", spec.argv[0],
                 "': its keeper process ended before forking it");
  }
  workerOfKeeper_[keeperPid] = *worker;
  return *worker;
}

void PosixLauncher::signalGroup(int pid, int sig) {
  // Only workers whose keeper still runs: a pid reported as exited may have
  // been reused by now.
  bool live = false;
  for (const auto& [keeperPid, worker] : workerOfKeeper_) live = live || worker == pid;
  if (!live) return;
  // The worker leads its group, unless it moved itself elsewhere.
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
