// PosixLauncher with real processes: descriptors a worker sees, descendants
// after the worker exits and after kill -9 of the agent, exit statuses,
// argv[0], signal dispositions. Every wait is on a pipe or on the exit
// report, with a generous deadline; nothing sleeps to synchronise.
#include <utility>

#include "ddprun/agent/launcher.h"
#include "ddprun/agent/worker_group.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddprun/common/env.h"
#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(30);

// A pipe whose ends close with it.
struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int p[2];
    if (pipe2(p, O_CLOEXEC) == 0) {
      r = p[0];
      w = p[1];
    }
  }
  ~Pipe() {
    closeRead();
    closeWrite();
  }
  void closeRead() {
    if (r >= 0) ::close(r);
    r = -1;
  }
  void closeWrite() {
    if (w >= 0) ::close(w);
    w = -1;
  }
};

// Lines from a pipe, each wait bounded by the deadline.
class LineReader {
 public:
  explicit LineReader(int fd) : fd_(fd) {}
  // The next line (without '\n'); false at EOF or when the deadline passed.
  bool next(std::string& line) {
    auto deadline = Clock::now() + kDeadline;
    for (;;) {
      auto nl = buf_.find('\n');
      if (nl != std::string::npos) {
        line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      if (eof_ || !fill(deadline)) return false;
    }
  }
  std::vector<std::string> take(size_t n) {
    std::vector<std::string> out;
    for (std::string l; out.size() < n && next(l);) out.push_back(l);
    return out;
  }
  // Every line up to EOF.
  std::vector<std::string> all() { return take(SIZE_MAX); }
  // True once every writer closed (within the deadline).
  bool atEof() {
    auto deadline = Clock::now() + kDeadline;
    while (!eof_ && fill(deadline)) {
    }
    return eof_;
  }

 private:
  bool fill(Clock::time_point deadline) {
    for (;;) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(left.count()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      char buf[4096];
      ssize_t got = ::read(fd_, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        eof_ = true;
        return false;
      }
      buf_.append(buf, static_cast<size_t>(got));
      return true;
    }
  }
  int fd_;
  std::string buf_;
  bool eof_ = false;
};

// The process is gone: no such pid, or only a zombie its new parent has not
// reaped (an orphan's fate after its keeper exited depends on pid 1).
bool gone(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z';
}

// Polls until every pid is gone or the deadline passes; returns those left.
std::vector<int> waitGone(const std::vector<int>& pids) {
  auto deadline = Clock::now() + kDeadline;
  std::vector<int> left = pids;
  while (Clock::now() < deadline) {
    left.clear();
    for (int pid : pids)
      if (!gone(pid)) left.push_back(pid);
    if (left.empty()) break;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(10));  // a poll interval, not a sync
  }
  return left;
}

int parentOf(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  auto close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  char state;
  int ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

std::vector<int> toPids(const std::vector<std::string>& lines) {
  std::vector<int> pids;
  for (const auto& l : lines) {
    int pid = 0;
    EXPECT_TRUE(str::parseInt(l, pid, 1)) << "not a pid: '" << l << "'";
    pids.push_back(pid);
  }
  return pids;
}

ProcessSpec shell(const std::string& script, int stdoutFd) {
  ProcessSpec spec;
  spec.argv = {"sh", "-c", script};
  spec.env = {{"PATH", "/usr/bin:/bin"}};
  spec.stdoutFd = stdoutFd;
  spec.descendantGrace = std::chrono::milliseconds(300);
  return spec;
}

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    launcher_.watchExits(io_, [this](int pid, int status) { exits_[pid] = status; });
  }
  void TearDown() override { launcher_.stopWatching(); }

  // Starts `script` under sh with stdout to a pipe; returns the pid.
  int start(const std::string& script, Pipe& out) {
    int pid = launcher_.start(shell(script, out.w));
    out.closeWrite();
    return pid;
  }
  // The waitpid status reported for `pid`, waiting on the io_context.
  int waitExit(int pid) {
    auto deadline = Clock::now() + kDeadline;
    while (!exits_.count(pid) && Clock::now() < deadline)
      io_.run_one_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(exits_.count(pid)) << "no exit reported for " << pid;
    return exits_.count(pid) ? exits_[pid] : -1;
  }

  boost::asio::io_context io_;
  PosixLauncher launcher_;
  std::map<int, int> exits_;
};

TEST_F(LauncherTest, WorkerSeesOnlyStdioAndTheKeeperHoldsNothing) {
  int stray = ::open("/dev/null", O_RDONLY);  // no O_CLOEXEC on purpose
  ASSERT_GE(stray, 0);
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);  // no SOCK_CLOEXEC either
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  Pipe out;
  // The shell lists its own descriptors (ls runs as its child), then stays
  // so that its keeper can be looked at.
  int pid = start("ls /proc/$$/fd; echo end; exec sleep 1000", out);
  LineReader lines(out.r);
  std::set<std::string> fds;
  for (std::string l; lines.next(l) && l != "end";) fds.insert(l);
  EXPECT_EQ(fds, (std::set<std::string>{"0", "1", "2"}));
  // The keeper closed every descriptor: it holds no socket, pipe or file.
  int keeper = parentOf(pid);
  ASSERT_GT(keeper, 1);
  std::vector<std::string> keeperFds;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(keeper) + "/fd"))
    keeperFds.push_back(e.path().filename().string());
  EXPECT_EQ(keeperFds, std::vector<std::string>{});
  launcher_.signalGroup(pid, SIGKILL);
  int status = waitExit(pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  ::close(stray);
  ::close(listener);
}

TEST_F(LauncherTest, DescendantsAreGoneWhenTheExitIsReported) {
  // A child in its own session, and one ignoring SIGTERM; then exit 0.
  Pipe out;
  int pid = start(
      "setsid sleep 1000 & echo $!; trap '' TERM; sleep 1000 & echo $!; exit 0", out);
  LineReader lines(out.r);
  auto pids = toPids(lines.take(2));
  ASSERT_EQ(pids.size(), 2u);
  int status = waitExit(pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int p : pids) {
    errno = 0;
    EXPECT_EQ(::kill(p, 0), -1) << "descendant " << p << " outlived its worker";
    EXPECT_EQ(errno, ESRCH);
  }
  EXPECT_TRUE(lines.atEof());  // nobody holds the worker's stdout any more
}

TEST_F(LauncherTest, AWorkerKilledThroughItsGroupTakesItsDescendantsAlong) {
  Pipe out;
  int pid = start("setsid sleep 1000 & echo $!; sleep 1000 & echo $!; wait", out);
  auto pids = toPids(LineReader(out.r).take(2));
  ASSERT_EQ(pids.size(), 2u);
  launcher_.signalGroup(pid, SIGKILL);
  int status = waitExit(pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  for (int p : pids) EXPECT_TRUE(::kill(p, 0) == -1 && errno == ESRCH) << p;
  launcher_.signalGroup(pid, SIGTERM);  // exited: nothing is signalled, nothing throws
}

TEST_F(LauncherTest, ExitStatusIsTheWorkersOwn) {
  Pipe a, b, c, d;
  int code7 = start("exit 7", a);
  int segv = start("ulimit -c 0; kill -SEGV $$", b);
  int term = start("kill -TERM $$", c);
  int byUs = start("echo up; exec sleep 1000", d);
  ASSERT_EQ(LineReader(d.r).take(1), (std::vector<std::string>{"up"}));
  launcher_.signalGroup(byUs, SIGTERM);
  int s = waitExit(code7);
  EXPECT_TRUE(WIFEXITED(s) && WEXITSTATUS(s) == 7) << s;
  s = waitExit(segv);
  EXPECT_TRUE(WIFSIGNALED(s) && WTERMSIG(s) == SIGSEGV) << s;
  s = waitExit(term);
  EXPECT_TRUE(WIFSIGNALED(s) && WTERMSIG(s) == SIGTERM) << s;
  s = waitExit(byUs);
  EXPECT_TRUE(WIFSIGNALED(s) && WTERMSIG(s) == SIGTERM) << s;
}

TEST_F(LauncherTest, Argv0IsPassedAsGiven) {
  const std::string script = "tr '\\0' '\\n' < /proc/$$/cmdline";
  Pipe out;
  int pid = launcher_.start(shell(script, out.w));  // "sh", found on PATH
  out.closeWrite();
  auto lines = LineReader(out.r).all();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "sh");
  EXPECT_EQ(lines.back(), script);
  waitExit(pid);
  Pipe out2;
  ProcessSpec spec = shell(script, out2.w);
  spec.argv[0] = "my-worker";
  spec.exe = "/bin/sh";
  pid = launcher_.start(spec);
  out2.closeWrite();
  lines = LineReader(out2.r).all();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], "my-worker");
  waitExit(pid);
}

TEST_F(LauncherTest, SignalDispositionsAndMaskAreTheDefaults) {
  struct sigaction ignore {
  }, oldPipe{}, oldHup{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &oldPipe);
  sigaction(SIGHUP, &ignore, &oldHup);  // as under nohup
  sigset_t block, oldMask;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR2);
  sigprocmask(SIG_BLOCK, &block, &oldMask);
  Pipe out;
  int pid = start("exec cat /proc/self/status", out);
  sigprocmask(SIG_SETMASK, &oldMask, nullptr);
  sigaction(SIGPIPE, &oldPipe, nullptr);
  sigaction(SIGHUP, &oldHup, nullptr);
  std::map<std::string, uint64_t> masks;
  for (const auto& l : LineReader(out.r).all())
    for (const char* key : {"SigIgn:", "SigBlk:"})
      if (str::startsWith(l, key))
        masks[key] = std::stoull(str::trim(l.substr(7)), nullptr, 16);
  ASSERT_EQ(masks.size(), 2u);
  auto bit = [](int sig) { return uint64_t{1} << (sig - 1); };
  EXPECT_EQ(masks["SigIgn:"] & bit(SIGPIPE), 0u) << "SIGPIPE ignored in the worker";
  EXPECT_NE(masks["SigIgn:"] & bit(SIGHUP), 0u)
      << "an inherited ignore (nohup) was dropped";
  EXPECT_EQ(masks["SigBlk:"], 0u);
  waitExit(pid);
}

TEST_F(LauncherTest, MissingProgramsSayWhatWasSearchedAndHowToFixIt) {
  ProcessSpec spec = shell("true", -1);
  spec.argv = {"nosuchprog_ddprun"};
  try {
    launcher_.start(spec);
    ADD_FAILURE() << "started a missing program";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("'nosuchprog_ddprun' not found on PATH (/usr/bin:/bin)"),
              std::string::npos)
        << e.message();
    EXPECT_EQ(e.message().find("PYTHON_EXEC"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find(".cc"), std::string::npos) << e.message();
  }
  spec.notFoundHint = "set PYTHON_EXEC to the interpreter";
  try {
    launcher_.start(spec);
    ADD_FAILURE() << "started a missing program";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("; set PYTHON_EXEC"), std::string::npos) << e.message();
  }
  // Executable but no valid format: execve fails in the worker, after fork.
  std::string tmpl = (fs::temp_directory_path() / "ddprun_launcher_XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  std::string bad = tmpl + "/bad";
  std::ofstream(bad) << "\x01\x02 not a program\n";
  chmod(bad.c_str(), 0755);
  spec.argv = {bad};
  try {
    launcher_.start(spec);
    ADD_FAILURE() << "started a file execve cannot run";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find(bad), std::string::npos) << e.message();
  }
  chmod(bad.c_str(), 0644);
  try {
    launcher_.start(spec);
    ADD_FAILURE() << "started a file that is not executable";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find("chmod +x"), std::string::npos) << e.message();
  }
  fs::remove_all(tmpl);
  io_.poll();
  EXPECT_TRUE(exits_.empty());  // failed starts leave no process to report
}

// kill -9 of the agent: the agent is a forked child of the test running a
// PosixLauncher; its worker has children in its group, in another session,
// and one ignoring SIGTERM. All of them must go.
TEST(LauncherAgentKilled, EveryDescendantIsGoneAfterKill9OfTheAgent) {
  Pipe out, ready;
  pid_t agent = ::fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {
    int rc = 0;
    try {
      boost::asio::io_context io;
      PosixLauncher launcher;
      launcher.watchExits(io, [](int, int) {});
      int pid = launcher.start(
          shell("echo $$; sleep 1000 & echo $!; setsid sleep 1000 & echo $!; "
                "trap '' TERM; sleep 1000 & echo $!; wait",
                out.w));
      ::close(out.w);
      (void)!::write(ready.w, &pid, sizeof pid);
      for (;;) ::pause();  // until killed
    } catch (...) {
      rc = 99;
    }
    ::_exit(rc);
  }
  out.closeWrite();
  ready.closeWrite();
  int worker = 0;
  pollfd p{ready.r, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 30000), 1);
  ASSERT_EQ(::read(ready.r, &worker, sizeof worker), static_cast<ssize_t>(sizeof worker));
  LineReader lines(out.r);
  auto pids = toPids(lines.take(4));
  ASSERT_EQ(pids.size(), 4u);
  EXPECT_EQ(pids[0], worker);  // start() returned the worker's own pid
  int keeper = parentOf(worker);
  EXPECT_EQ(parentOf(keeper), agent);
  pids.push_back(keeper);
  ASSERT_EQ(::kill(agent, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(agent, &status, 0), agent);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(waitGone(pids), std::vector<int>{}) << "survived kill -9 of the agent";
  EXPECT_TRUE(lines.atEof());
}

// Every worker writes to one shared pipe (the group closes the copies it gets).
class PipeOutput : public WorkerOutput {
 public:
  WorkerFds openWorker(int, int, const std::string&) override {
    int fd = ::fcntl(pipe.w, F_DUPFD_CLOEXEC, 3);
    return {fd, fd};
  }
  void closeWorker(int) override {}
  Pipe pipe;
};

// WorkerGroup on the real launcher: what runs for each kind of program.
class WorkerGroupReal : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ddprun_group_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }

  // Runs two workers of `cfg` to the end; returns their output lines, sorted
  // (the workers write each line with one os.write: writes below PIPE_BUF
  // do not interleave, print() may split them).
  std::vector<std::string> run(LaunchConfig cfg) {
    resolveWorkerProgram(cfg, ProgramSearch::fromProcess());
    boost::asio::io_context io;
    PosixLauncher launcher;
    PipeOutput output;
    const Env agentEnv = env::snapshot();
    WorkerGroup group(io, cfg, launcher, output, agentEnv,
                      chooseInterpreter(agentEnv, selfExecutable(), FileProbe::real()));
    launcher.watchExits(io, [&](int pid, int status) { group.onExit(pid, status); });
    rendezvous::RoundInfo round;
    round.worldSize = 2;
    round.workerStoreHost = "127.0.0.1";
    round.workerStorePort = 1;  // never connected to
    group.start(round, 2, 0, "run", (root_ / "attempt_0").string());
    output.pipe.closeWrite();
    std::vector<std::string> lines = LineReader(output.pipe.r).all();
    auto deadline = Clock::now() + kDeadline;
    while (group.running() > 0 && Clock::now() < deadline)
      io.run_one_for(std::chrono::milliseconds(200));
    EXPECT_EQ(group.running(), 0u);
    for (const auto& w : group.workers())
      EXPECT_EQ(w.exitCode, 0) << "local rank " << w.localRank;
    launcher.stopWatching();
    std::sort(lines.begin(), lines.end());
    return lines;
  }
  std::string script(const std::string& name, const std::string& text) {
    fs::path p = root_ / name;
    std::ofstream(p) << text;
    chmod(p.c_str(), 0755);
    return p.string();
  }
  fs::path root_;
};

TEST_F(WorkerGroupReal, ATextScriptRunsUnderPythonEvenWithAShebang) {
  LaunchConfig cfg;
  cfg.script =
      script("job.sh",
             "#!/bin/sh\nimport os, sys\n"
             "os.write(1, b'python %a %s\\n' % (sys.argv[1:], __name__.encode()))\n");
  cfg.scriptArgs = {"r${local_rank}"};
  EXPECT_EQ(run(cfg), (std::vector<std::string>{"python ['r0'] __main__",
                                                "python ['r1'] __main__"}));
}

TEST_F(WorkerGroupReal, RunPathRunsTheScriptAsMainThroughRunpy) {
  LaunchConfig cfg;
  cfg.runPath = true;
  cfg.script = script("job",
                      "import os, sys\n"
                      "os.write(1, b'%a %a %s\\n' % (sys.argv[0].endswith('job'), "
                      "sys.argv[1:], __name__.encode()))\n"
                      "raise SystemExit(0)\n");
  cfg.scriptArgs = {"${local_rank}"};
  EXPECT_EQ(run(cfg),
            (std::vector<std::string>{"True ['0'] __main__", "True ['1'] __main__"}));
}

TEST_F(WorkerGroupReal, NoPythonProgramKeepsItsBareNameAsArgv0) {
  LaunchConfig cfg;
  cfg.noPython = true;
  cfg.script = "sh";  // found on PATH, executed by its full path
  cfg.scriptArgs = {"-c", "head -z -n 1 /proc/$$/cmdline | tr '\\0' '\\n'"};
  EXPECT_EQ(run(cfg), (std::vector<std::string>{"sh", "sh"}));
}

}  // namespace
}  // namespace ddprun::agent
