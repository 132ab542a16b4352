// The keeper: see launcher.h for the design and keeper.h for the contract.
// Only async-signal-safe calls from here on (we run in a fork of a
// multithreaded process).
#include "keeper.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

#include "ddprun/common/fd.h"  // writeAll: async-signal-safe

namespace ddprun::agent::keeper {

namespace {
// Sent to the keeper when the agent (the thread that forked it) dies.
constexpr int kAgentGone = SIGUSR1;
// Between SIGKILL rounds: how long to wait for a SIGCHLD before looking for
// descendants again (one may have forked while we signalled).
constexpr long kKillRoundMs = 50;
// A descendant SIGKILL cannot end (stuck in the kernel), or no /proc to find
// them: after this many rounds the keeper exits anyway rather than hold the
// worker's exit back for ever.
constexpr int kMaxKillRounds = 200;
constexpr int kMaxTracked = 4096;  // descendants signalled per phase

struct LinuxDirent64 {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[];
};

// Calls `fn(number)` for each numeric entry of the directory `path` (pids in
// /proc, fds in /proc/self/fd). False when the directory cannot be opened.
template <class Fn>
bool forEachNumber(const char* path, Fn fn) {
  int dir = ::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  alignas(8) char buf[4096];
  for (;;) {
    long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      auto* d = reinterpret_cast<LinuxDirent64*>(buf + off);
      off += d->reclen;
      long value = 0;
      const char* c = d->name;
      if (*c < '0' || *c > '9') continue;
      for (; *c >= '0' && *c <= '9'; ++c) value = value * 10 + (*c - '0');
      if (*c == '\0' && value != dir) fn(value);
    }
  }
  ::close(dir);
  return true;
}

// "/proc/<pid>/stat" into `out` (at least 32 bytes).
void statPath(long pid, char* out) {
  const char prefix[] = "/proc/";
  char digits[24];
  int nd = 0;
  do {
    digits[nd++] = static_cast<char>('0' + pid % 10);
    pid /= 10;
  } while (pid > 0);
  int i = 0;
  for (const char* p = prefix; *p; ++p) out[i++] = *p;
  while (nd > 0) out[i++] = digits[--nd];
  for (const char* p = "/stat"; *p; ++p) out[i++] = *p;
  out[i] = '\0';
}

// The parent pid of `pid` from /proc/<pid>/stat ("pid (comm) S ppid ...";
// comm may hold ')' and spaces, so parse after the last ')'), or -1.
// `zombie` is set for a process that has exited but is not reaped yet.
long parentOf(long pid, bool& zombie) {
  char path[40];
  statPath(pid, path);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* close = nullptr;
  for (const char* p = buf; *p; ++p)
    if (*p == ')') close = p;
  if (close == nullptr || close[1] != ' ' || close[2] == '\0' || close[3] != ' ')
    return -1;
  zombie = close[2] == 'Z';
  long ppid = 0;
  for (const char* p = close + 4; *p >= '0' && *p <= '9'; ++p)
    ppid = ppid * 10 + (*p - '0');
  return ppid;
}

bool contains(const long* set, int n, long value) {
  for (int i = 0; i < n; ++i)
    if (set[i] == value) return true;
  return false;
}

// Algorithm: the descendants of the keeper are found by passes over /proc:
// a process whose parent is the keeper or an already found descendant is
// added (and signalled once, at once); passes repeat until one adds nothing.
// Children usually have larger pids than their parents, so the first pass
// finds almost everything. Zombies are not signalled (they are reaped).
void signalDescendants(int sig) {
  long found[kMaxTracked];
  int n = 0;
  found[n++] = ::getpid();
  for (bool added = true; added && n < kMaxTracked;) {
    added = false;
    forEachNumber("/proc", [&](long pid) {
      if (n >= kMaxTracked || contains(found, n, pid)) return;
      bool zombie = false;
      long ppid = parentOf(pid, zombie);
      if (ppid <= 0 || !contains(found, n, ppid)) return;
      found[n++] = pid;
      added = true;
      if (!zombie) ::kill(static_cast<pid_t>(pid), sig);
    });
  }
}

// Reaps every exited child. True while children remain (alive or not yet
// reapable); false once there are none (ECHILD): as a subreaper, no child
// means no descendant at all.
bool reapChildren() {
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0) continue;
    return pid == 0;
  }
}

long nowMs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Waits up to `ms` for a SIGCHLD (all signals are blocked in the keeper).
void waitChild(long ms) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  timespec ts{ms / 1000, (ms % 1000) * 1000000};
  siginfo_t info;
  ::sigtimedwait(&set, &info, &ts);
}

// The worker's process group (members stay findable without /proc), then
// every descendant found in /proc.
void signalTree(pid_t worker, int sig) {
  ::kill(-worker, sig);
  signalDescendants(sig);
}

// SIGTERM to every descendant, SIGKILL to those left after `graceMs`,
// rounds of SIGKILL until no child is left (bounded), each reaped.
void endDescendants(pid_t worker, long graceMs) {
  if (!reapChildren()) return;
  if (graceMs > 0) {
    signalTree(worker, SIGTERM);
    for (long deadline = nowMs() + graceMs, left;
         reapChildren() && (left = deadline - nowMs()) > 0;)
      waitChild(left);
  }
  for (int round = 0; reapChildren() && round < kMaxKillRounds; ++round) {
    signalTree(worker, SIGKILL);
    waitChild(kKillRoundMs);
  }
}

void setDefault(int sig) {
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  ::sigaction(sig, &sa, nullptr);
}

// Ends the keeper the way the worker ended: the same exit code, or the same
// signal with its default action (no core file of the keeper).
[[noreturn]] void exitLike(int status) {
  if (WIFEXITED(status)) ::_exit(WEXITSTATUS(status));
  int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
  rlimit noCore{0, 0};
  ::setrlimit(RLIMIT_CORE, &noCore);
  setDefault(sig);
  ::kill(::getpid(), sig);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::sigprocmask(SIG_UNBLOCK, &one, nullptr);
  ::_exit(128 + sig);  // a signal whose default action does not terminate
}

void closeAllDescriptors() {
  if (::close_range(0, ~0U, 0) == 0) return;
  if (forEachNumber("/proc/self/fd", [](long fd) { ::close(static_cast<int>(fd)); }))
    return;
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  for (rlim_t fd = 0; fd < rl.rlim_cur && fd < (1u << 20); ++fd)
    ::close(static_cast<int>(fd));
}

// The worker's side, before Boost execs it.
void prepareWorker(const Plan& plan, pid_t keeper) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != keeper) ::_exit(127);  // the keeper is gone already
  ::setpgid(0, 0);  // the agent's signals reach the worker's group, not the keeper
  if (plan.stdoutFd >= 0) ::dup2(plan.stdoutFd, STDOUT_FILENO);
  if (plan.stderrFd >= 0) ::dup2(plan.stderrFd, STDERR_FILENO);
  // Handlers would run the agent's code before exec (e.g. Asio's signal
  // pipe): back to the default, as exec would do. Ignored signals stay
  // ignored (nohup), except SIGPIPE and SIGXFSZ, which Python's subprocess
  // (torchrun) resets too: the agent ignores SIGPIPE for itself only.
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    bool handled = (old.sa_flags & SA_SIGINFO) != 0 ||
                   (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    if (handled || sig == SIGPIPE || sig == SIGXFSZ) setDefault(sig);
  }
  markCloseOnExecFrom3();
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

// SIGKILL to the worker and every descendant; the keeper then exits.
[[noreturn]] void agentGone(pid_t worker) {
  endDescendants(worker, 0);
  ::_exit(128 + SIGKILL);
}

// The keeper's life after the fork: wait for the worker's exit (reaping
// orphans that die meanwhile) or the agent's death.
[[noreturn]] void keep(const Plan& plan, pid_t worker) {
  sigset_t wake;
  sigemptyset(&wake);
  sigaddset(&wake, SIGCHLD);
  sigaddset(&wake, kAgentGone);
  bool trustDeathSignal = true;
  for (;;) {
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid == worker) {
        endDescendants(worker, plan.graceMs);
        exitLike(status);
      }
      if (pid <= 0) break;  // an orphan was reaped; look again
    }
    if (::getppid() != plan.agent) agentGone(worker);
    siginfo_t info;
    int sig;
    if (trustDeathSignal) {
      sig = ::sigwaitinfo(&wake, &info);
    } else {
      timespec second{1, 0};
      sig = ::sigtimedwait(&wake, &info, &second);
    }
    // PDEATHSIG follows the forking thread: with the agent alive, it cannot
    // be relied on any more; look at getppid() once a second instead.
    if (sig == kAgentGone && ::getppid() == plan.agent) trustDeathSignal = false;
  }
}
}  // namespace

void markCloseOnExecFrom3() {
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  auto mark = [](long fd) {
    if (fd >= 3) ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  };
  if (forEachNumber("/proc/self/fd", mark)) return;
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  for (rlim_t fd = 3; fd < rl.rlim_cur && fd < (1u << 20); ++fd)
    mark(static_cast<long>(fd));
}

void becomeKeeper(const Plan& plan) {
  // Every signal blocked: the keeper takes the ones it needs with
  // sigwaitinfo; the rest stay pending and never run the agent's handlers.
  sigset_t all;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  setDefault(SIGCHLD);  // queued while blocked only when not ignored
  setDefault(kAgentGone);
  ::setpgid(0, 0);  // not in the agent's group: a kill of that group spares it
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::prctl(PR_SET_PDEATHSIG, kAgentGone);
  if (::getppid() != plan.agent) ::_exit(127);  // the agent died before prctl
  const pid_t self = ::getpid();
  const pid_t worker = ::_Fork();
  if (worker == 0) {
    prepareWorker(plan, self);
    return;
  }
  if (worker < 0) {  // the agent reads -errno and says why
    const pid_t err = -errno;
    (void)writeAll(plan.pidPipe, &err, sizeof err);
    ::_exit(127);
  }
  // On failure the agent reads no pid and reports it.
  (void)writeAll(plan.pidPipe, &worker, sizeof worker);
  closeAllDescriptors();
  keep(plan, worker);
}

}  // namespace ddprun::agent::keeper
