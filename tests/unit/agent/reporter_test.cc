// The Reporter on canned streams: bytes written into the worker ends it
// hands out, the console read back from pipes (or a pty) given as the
// agent's stdout/stderr. The io_context is polled by hand; no sockets, no
// sleeps, no timing assertions.
#include <utility>

#include "ddprun/agent/reporter.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "temp_dir.h"

namespace ddprun::agent {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Owns a descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// A console stand-in: the Reporter writes to `w`, the test reads `r`.
struct Pipe {
  Fd r, w;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
    r.reset(fds[0]);
    w.reset(fds[1]);
  }
};

void setNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Everything readable now (the fd is made non-blocking).
std::string readNow(int fd) {
  setNonBlocking(fd);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return out;
    }
  }
}

void writeStr(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    ASSERT_GT(n, 0) << std::strerror(errno);
    s.remove_prefix(static_cast<size_t>(n));
  }
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t countOpenFds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

class ReporterTest : public ::testing::Test {
 protected:
  void SetUp() override { oldPipe_ = ::signal(SIGPIPE, SIG_IGN); }
  void TearDown() override { ::signal(SIGPIPE, oldPipe_); }

  ReporterOptions options(int consoleOut, int consoleErr) {
    ReporterOptions o;
    o.runDir = dir_.path();
    o.hostname = "node7";
    o.consoleOut = consoleOut;
    o.consoleErr = consoleErr;
    // A partial line goes out with the read that brought it (the tests of
    // line assembly set their own delay).
    o.partialLineDelay = std::chrono::milliseconds(0);
    return o;
  }
  // Runs every handler that is ready, until none is.
  void pollAll() {
    io_.restart();
    while (io_.poll() > 0) {
    }
  }
  // Blocks until one handler ran (a wait completed).
  void runOne() {
    io_.restart();
    io_.run_one();
  }
  std::string workerDir(int rank) const {
    return dir_.path() + "/attempt_0/" + std::to_string(rank);
  }

  TempDir dir_;
  boost::asio::io_context io_;
  sighandler_t oldPipe_ = SIG_DFL;
};

TEST_F(ReporterTest, RawRelaysBytesBeforeAnyNewlineOnSeparateChannels) {
  Pipe out, err;
  Reporter rep(io_, options(out.w.get(), err.w.get()));
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  Fd wo(fds.stdoutFd), we(fds.stderrFd);
  ASSERT_NE(fds.stdoutFd, fds.stderrFd);  // the consoles differ: one channel each
  EXPECT_FALSE(::isatty(fds.stdoutFd));   // the console is no terminal

  writeStr(we.get(), "epoch 1:  10%\r");
  pollAll();
  EXPECT_EQ(readNow(err.r.get()), "epoch 1:  10%\r");  // no newline awaited
  writeStr(we.get(), "epoch 1:  20%\r");
  writeStr(wo.get(), "result");
  pollAll();
  EXPECT_EQ(readNow(err.r.get()), "epoch 1:  20%\r");
  EXPECT_EQ(readNow(out.r.get()), "result");  // stdout to stdout, unprefixed
  EXPECT_FALSE(fs::exists(workerDir(0) + "/stdout.log"));
}

TEST_F(ReporterTest, SharedChannelKeepsStdoutAndStderrOrder) {
  Pipe console;
  Fd errCopy(::dup(console.w.get()));  // another fd, the same pipe
  Reporter rep(io_, options(console.w.get(), errCopy.get()));
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  ASSERT_EQ(fds.stdoutFd, fds.stderrFd);
  Fd w(fds.stdoutFd);  // closed once
  // What a worker's two streams would write, interleaved, unread meanwhile.
  writeStr(w.get(), "out 1\n");
  writeStr(w.get(), "err 1\n");
  writeStr(w.get(), "out 2 ");
  writeStr(w.get(), "err 2\n");
  pollAll();
  EXPECT_EQ(readNow(console.r.get()), "out 1\nerr 1\nout 2 err 2\n");
  rep.closeWorker(0);
  // The tail is the shared stream's, and says it holds stdout too.
  EXPECT_EQ(rep.stderrTail(0),
            (std::vector<std::string>{"out 1", "err 1", "out 2 err 2"}));
  EXPECT_TRUE(rep.tailHasStdout(0));
}

TEST_F(ReporterTest, ASeparateStderrChannelsTailHoldsStderrOnly) {
  Pipe out, err;
  Reporter rep(io_, options(out.w.get(), err.w.get()));
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  Fd wo(fds.stdoutFd), we(fds.stderrFd);
  writeStr(wo.get(), "out 1\n");
  writeStr(we.get(), "err 1\n");
  pollAll();
  rep.closeWorker(0);
  EXPECT_EQ(rep.stderrTail(0), std::vector<std::string>{"err 1"});
  EXPECT_FALSE(rep.tailHasStdout(0));
  EXPECT_FALSE(rep.tailHasStdout(5));
}

// Several workers on one raw console: each one's output goes out a whole
// line at a time, so a worker's unfinished line never takes another's.
TEST_F(ReporterTest, RawWorkersOnOneConsoleNeverMergeLines) {
  Pipe console;
  ReporterOptions o = options(console.w.get(), console.w.get());
  o.partialLineDelay = std::chrono::hours(1);  // held until its end comes
  Reporter rep(io_, o);
  WorkerFds a = rep.openWorker(0, 0, workerDir(0));
  WorkerFds b = rep.openWorker(1, 1, workerDir(1));
  Fd wa(a.stdoutFd), wb(b.stdoutFd);
  writeStr(wa.get(), "a1\na2 (first half");  // a block-buffered write ends mid-line
  pollAll();
  writeStr(wb.get(), "b1\n");
  pollAll();
  writeStr(wa.get(), ", second half)\n");
  pollAll();
  EXPECT_EQ(readNow(console.r.get()), "a1\nb1\na2 (first half, second half)\n");
  // The last unfinished line goes out at close, without waiting.
  writeStr(wb.get(), "no newline");
  pollAll();
  EXPECT_EQ(readNow(console.r.get()), "");
  rep.closeWorker(1);
  EXPECT_EQ(readNow(console.r.get()), "no newline");
}

// A partial line (a prompt, a progress bar) goes out once its short delay
// is over; another worker's line then starts on a line of its own.
TEST_F(ReporterTest, APartialLineGoesOutAfterItsDelayAndIsEndedBeforeAnotherWorkersLine) {
  Pipe console;
  ReporterOptions o = options(console.w.get(), console.w.get());
  o.partialLineDelay = std::chrono::milliseconds(1);
  Reporter rep(io_, o);
  WorkerFds a = rep.openWorker(0, 0, workerDir(0));
  WorkerFds b = rep.openWorker(1, 1, workerDir(1));
  Fd wa(a.stdoutFd), wb(b.stdoutFd);
  writeStr(wa.get(), "epoch 1:  10%\r");
  std::string seen;
  // Bounded: each run_one waits for the read, then for the deadline's timer.
  for (int i = 0; i < 100 && seen.empty(); ++i) {
    runOne();
    seen += readNow(console.r.get());
  }
  EXPECT_EQ(seen, "epoch 1:  10%\r");
  writeStr(wb.get(), "b1\n");
  pollAll();
  EXPECT_EQ(readNow(console.r.get()), "\nb1\n") << "a newline ends a's open line first";
  writeStr(wb.get(), "b2\n");  // the same writer: nothing to end
  pollAll();
  EXPECT_EQ(readNow(console.r.get()), "b2\n");
}

// A pseudo-terminal pair standing for the agent's terminal.
struct Terminal {
  Fd master, slave;
  Terminal() {
    master.reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (master.get() < 0 || ::grantpt(master.get()) != 0 || ::unlockpt(master.get()) != 0)
      throw std::runtime_error("posix_openpt");
    slave.reset(::open(::ptsname(master.get()), O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (slave.get() < 0) throw std::runtime_error("open pty slave");
  }
};

TEST_F(ReporterTest, WorkerGetsATerminalWhenTheConsoleIsOne) {
  Terminal term;
  winsize ws{};
  ws.ws_row = 33;
  ws.ws_col = 101;
  ASSERT_EQ(::ioctl(term.slave.get(), TIOCSWINSZ, &ws), 0);
  Reporter rep(io_, options(term.slave.get(), term.slave.get()));
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  ASSERT_EQ(fds.stdoutFd, fds.stderrFd);
  Fd w(fds.stdoutFd);
  EXPECT_TRUE(::isatty(w.get()));
  winsize got{};
  ASSERT_EQ(::ioctl(w.get(), TIOCGWINSZ, &got), 0);
  EXPECT_EQ(got.ws_row, 33);
  EXPECT_EQ(got.ws_col, 101);

  // A pty hands data to its reader asynchronously (a kernel work item):
  // run_one blocks until the channel is readable, then relays it all.
  writeStr(w.get(), "50%\r");
  runOne();
  EXPECT_EQ(readNow(term.master.get()), "50%\r");
  // The worker's pty leaves '\n' alone; only the console's terminal turns
  // it into "\r\n" (a worker pty with output processing would give "\r\r\n").
  writeStr(w.get(), "done\n");
  runOne();
  EXPECT_EQ(readNow(term.master.get()), "done\r\n");

  // Data still in the pty when the worker is gone is copied at close.
  writeStr(w.get(), "last words");
  w.reset();
  rep.closeWorker(0);
  EXPECT_EQ(readNow(term.master.get()), "last words");
  EXPECT_EQ(rep.stderrTail(0), (std::vector<std::string>{"50%\rdone", "last words"}));
}

TEST_F(ReporterTest, TeePrefixesLinesWithGlobalRankAndHostname) {
  Pipe out, err;
  ReporterOptions o = options(out.w.get(), err.w.get());
  o.role = "trainer";
  o.tee.all = Std::kAll;
  o.prefixTemplate = "${role_name}|${rank}|${local_rank}|${hostname}> ";
  Reporter rep(io_, o);
  EXPECT_EQ(rep.prefix(1, 9), "trainer|9|1|node7> ");
  WorkerFds fds = rep.openWorker(1, 9, workerDir(1));
  Fd wo(fds.stdoutFd), we(fds.stderrFd);
  writeStr(wo.get(), "hello\nwor");
  writeStr(we.get(), "oops\n");
  pollAll();
  EXPECT_EQ(readNow(out.r.get()), "trainer|9|1|node7> hello\n");  // whole lines only
  EXPECT_EQ(readNow(err.r.get()), "trainer|9|1|node7> oops\n");
  writeStr(wo.get(), "ld");
  rep.closeWorker(1);  // the unfinished line is ended for the console
  EXPECT_EQ(readNow(out.r.get()), "trainer|9|1|node7> world\n");
  EXPECT_EQ(readFile(workerDir(1) + "/stdout.log"),
            "hello\nworld");  // files: bytes as written
  EXPECT_EQ(readFile(workerDir(1) + "/stderr.log"), "oops\n");
}

TEST_F(ReporterTest, DefaultPrefixIsTorchruns) {
  Pipe console;
  ReporterOptions o = options(console.w.get(), console.w.get());
  Reporter rep(io_, o);
  EXPECT_EQ(rep.prefix(3, 11), "[default3]:");
}

TEST_F(ReporterTest, RedirectWritesFilesAndNothingToTheConsole) {
  Pipe out, err;
  ReporterOptions o = options(out.w.get(), err.w.get());
  o.redirects.perRank = {{1, Std::kErr}};  // rank 1's stderr only
  Reporter rep(io_, o);
  WorkerFds f0 = rep.openWorker(0, 0, workerDir(0));
  WorkerFds f1 = rep.openWorker(1, 1, workerDir(1));
  Fd w0o(f0.stdoutFd), w0e(f0.stderrFd), w1o(f1.stdoutFd), w1e(f1.stderrFd);
  writeStr(w0e.get(), "r0 err\n");
  writeStr(w1e.get(), "r1 err\n");
  writeStr(w1o.get(), "r1 out\n");
  pollAll();
  rep.closeWorker(0);
  rep.closeWorker(1);
  EXPECT_EQ(readNow(err.r.get()), "r0 err\n");
  EXPECT_EQ(readNow(out.r.get()), "r1 out\n");
  EXPECT_EQ(readFile(workerDir(1) + "/stderr.log"), "r1 err\n");
  EXPECT_FALSE(fs::exists(workerDir(1) + "/stdout.log"));
  EXPECT_FALSE(fs::exists(workerDir(0) + "/stderr.log"));
  EXPECT_EQ(rep.stderrTail(1), std::vector<std::string>{"r1 err"});
}

TEST_F(ReporterTest, DuplicateFiltersCopyMatchingLinesWithThePrefix) {
  Pipe console;
  ReporterOptions o = options(console.w.get(), console.w.get());
  o.duplicateStdoutFilters = {"loss", "acc"};
  o.duplicateStderrFilters = {"WARN"};
  Reporter rep(io_, o);
  WorkerFds fds = rep.openWorker(0, 2, workerDir(0));
  // The duplicate files must tell the streams apart: one channel each.
  ASSERT_NE(fds.stdoutFd, fds.stderrFd);
  Fd wo(fds.stdoutFd), we(fds.stderrFd);
  writeStr(wo.get(), "step 1 loss=3\nstep 1 lr=1\nstep 2 acc=0.5\n");
  writeStr(we.get(), "WARN slow\nfine\n");
  pollAll();
  rep.closeWorker(0);
  std::string shown = readNow(console.r.get());
  EXPECT_NE(shown.find("step 1 lr=1\n"), std::string::npos);  // the console is unchanged
  EXPECT_NE(shown.find("fine\n"), std::string::npos);
  EXPECT_EQ(readFile(dir_.file("duplicate_stdout.log")),
            "[default0]:step 1 loss=3\n[default0]:step 2 acc=0.5\n");
  EXPECT_EQ(readFile(dir_.file("duplicate_stderr.log")), "[default0]:WARN slow\n");
}

TEST_F(ReporterTest, LocalRanksFilterDropsConsoleOutputOnly) {
  Pipe out, err;
  ReporterOptions o = options(out.w.get(), err.w.get());
  o.localRanksFilter = {0};
  o.tee.perRank = {{2, Std::kAll}};
  Reporter rep(io_, o);
  WorkerFds f1 = rep.openWorker(1, 1, workerDir(1));  // raw, filtered out
  WorkerFds f2 = rep.openWorker(2, 2, workerDir(2));  // tee'd, filtered out
  Fd w1o(f1.stdoutFd), w1e(f1.stderrFd), w2o(f2.stdoutFd), w2e(f2.stderrFd);
  writeStr(w1o.get(), "r1 out\n");  // to /dev/null: accepted, shown nowhere
  writeStr(w1e.get(), "r1 err\n");
  writeStr(w2o.get(), "r2 out\n");
  writeStr(w2e.get(), "r2 err\n");
  pollAll();
  rep.closeWorker(1);
  rep.closeWorker(2);
  EXPECT_EQ(readNow(out.r.get()), "");
  EXPECT_EQ(readNow(err.r.get()), "");
  EXPECT_EQ(readFile(workerDir(2) + "/stdout.log"), "r2 out\n");
  EXPECT_EQ(readFile(workerDir(2) + "/stderr.log"), "r2 err\n");
  EXPECT_EQ(rep.stderrTail(1),
            std::vector<std::string>{"r1 err"});  // the report keeps it
}

TEST_F(ReporterTest, TailKeepsTheLastLinesAndCutsLongOnes) {
  Pipe out, err;
  ReporterOptions o = options(out.w.get(), err.w.get());
  o.tailLines = 3;
  o.maxLineBytes = 4;
  Reporter rep(io_, o);
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  Fd wo(fds.stdoutFd), we(fds.stderrFd);
  writeStr(we.get(), "a\nb\r\nc\nabcdefghij\nd\n");
  writeStr(we.get(), "unfin");
  pollAll();
  rep.closeWorker(0);
  // "abcdefghij" is cut into "abcd" "efgh" "ij"; "\r\n" ends a line too;
  // the unfinished line counts at close.
  EXPECT_EQ(rep.stderrTail(0), (std::vector<std::string>{"d", "unfi", "n"}));
  EXPECT_EQ(readNow(err.r.get()), "a\nb\r\nc\nabcdefghij\nd\nunfin");  // raw: untouched
  EXPECT_TRUE(rep.stderrTail(5).empty());
}

TEST_F(ReporterTest, LinesOfExactlyMaxLineBytesAreNotCut) {
  Pipe console;
  ReporterOptions o = options(console.w.get(), console.w.get());
  o.tee.all = Std::kErr;
  o.maxLineBytes = 4;
  Reporter rep(io_, o);
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  Fd wo(fds.stdoutFd), we(fds.stderrFd);
  writeStr(we.get(), "abcd\nab");
  pollAll();
  writeStr(we.get(), "cd\nabcde\n");
  pollAll();
  rep.closeWorker(0);
  EXPECT_EQ(readNow(console.r.get()),
            "[default0]:abcd\n[default0]:abcd\n[default0]:abcd\n"
            "[default0]:e\n");
}

// Writes `lines` numbered lines into `fd` from another thread and wakes the
// io_context once done, so the test's loop can stop polling.
std::string numberedLines(int from, int to) {
  std::string s;
  for (int i = from; i < to; ++i) s += "line " + std::to_string(i) + " of the log\n";
  return s;
}

TEST_F(ReporterTest, ThreeHundredThousandLinesAllPresentInOrderAfterClose) {
  Pipe console;
  Reporter rep(io_, options(console.w.get(), console.w.get()));
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  Fd w(fds.stdoutFd);
  std::string consoleText;
  std::thread reader([&] {
    char buf[65536];
    for (ssize_t n; (n = ::read(console.r.get(), buf, sizeof buf)) > 0;)
      consoleText.append(buf, static_cast<size_t>(n));
  });
  const int kLines = 300000, kLeft = 1000;
  std::atomic<bool> written{false};
  std::thread writer([&] {
    writeStr(w.get(), numberedLines(0, kLines - kLeft));
    boost::asio::post(io_, [&] { written = true; });  // wakes run_one
  });
  io_.restart();
  while (!written) io_.run_one();
  writer.join();
  pollAll();  // the pipe is empty now: the last lines fit in it
  // The last lines are still in the pipe when the worker is gone: the
  // close must copy them all, after the others.
  writeStr(w.get(), numberedLines(kLines - kLeft, kLines));
  w.reset();
  rep.closeWorker(0);
  console.w.reset();  // the reader sees the end
  reader.join();
  std::string expected = numberedLines(0, kLines);
  EXPECT_EQ(consoleText.size(), expected.size());
  EXPECT_TRUE(consoleText == expected);  // not printed: megabytes
  auto tail = rep.stderrTail(0);
  ASSERT_EQ(tail.size(), 20u);
  EXPECT_EQ(tail.back(), "line 299999 of the log");
}

TEST_F(ReporterTest, HundredMegabyteLineIsRelayedInPieces) {
  Pipe console;
  ReporterOptions o = options(console.w.get(), console.w.get());
  o.tee.all = Std::kErr;
  o.maxLineBytes = 64 * 1024;
  Reporter rep(io_, o);
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  Fd wo(fds.stdoutFd), we(fds.stderrFd);
  wo.reset();
  // The console: count bytes, lines and the longest line.
  size_t consoleBytes = 0, consoleLines = 0, longest = 0;
  std::thread reader([&] {
    char buf[65536];
    size_t current = 0;
    for (ssize_t n; (n = ::read(console.r.get(), buf, sizeof buf)) > 0;) {
      consoleBytes += static_cast<size_t>(n);
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] != '\n') {
          ++current;
          continue;
        }
        ++consoleLines;
        longest = std::max(longest, current);
        current = 0;
      }
    }
  });
  const size_t kBytes = 100u << 20;
  std::thread writer([&] {
    std::string chunk(1 << 20, 'x');
    for (size_t done = 0; done < kBytes; done += chunk.size()) writeStr(we.get(), chunk);
    we.reset();  // the worker is gone: its channel ends
  });
  io_.restart();
  io_.run();  // until every channel ended
  writer.join();
  rep.closeWorker(0);
  console.w.reset();
  reader.join();
  const size_t pieces = kBytes / o.maxLineBytes;
  const size_t prefix = std::string("[default0]:").size();
  EXPECT_EQ(consoleLines, pieces);
  EXPECT_EQ(longest, prefix + o.maxLineBytes);
  EXPECT_EQ(consoleBytes, kBytes + pieces * (prefix + 1));
  EXPECT_EQ(fs::file_size(workerDir(0) + "/stderr.log"), kBytes);
  auto tail = rep.stderrTail(0);
  ASSERT_EQ(tail.size(), 20u);
  EXPECT_EQ(tail.back().size(), o.maxLineBytes);
}

TEST_F(ReporterTest, ClosedConsoleDropsConsoleOutputAndFilesGetEverything) {
  Pipe console;
  ReporterOptions o = options(console.w.get(), console.w.get());
  o.tee.all = Std::kAll;
  Reporter rep(io_, o);
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  Fd wo(fds.stdoutFd), we(fds.stderrFd);
  console.r.reset();                           // `| head -2` has gone
  std::string lines = numberedLines(0, 2000);  // fits in the pipe
  writeStr(wo.get(), lines);
  pollAll();
  EXPECT_TRUE(rep.consoleClosed());
  writeStr(we.get(), "after\n");
  pollAll();
  EXPECT_NO_THROW(rep.failureReport("the report\n"));
  rep.closeWorker(0);
  EXPECT_EQ(readFile(workerDir(0) + "/stdout.log"), lines);
  EXPECT_EQ(readFile(workerDir(0) + "/stderr.log"), "after\n");
  EXPECT_EQ(readFile(dir_.file("failure_report.txt")), "the report\n");
}

TEST_F(ReporterTest, RawConsoleClosedMidRunDoesNotStopTheTail) {
  Pipe console;
  Reporter rep(io_, options(console.w.get(), console.w.get()));
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  Fd w(fds.stdoutFd);
  console.r.reset();
  writeStr(w.get(), "Traceback\nValueError: bad\n");
  pollAll();
  rep.closeWorker(0);
  EXPECT_TRUE(rep.consoleClosed());
  EXPECT_EQ(rep.stderrTail(0),
            (std::vector<std::string>{"Traceback", "ValueError: bad"}));
}

TEST_F(ReporterTest, EndAttemptReleasesEverythingAndANewAttemptWorks) {
  Pipe out, err;
  ReporterOptions o = options(out.w.get(), err.w.get());
  o.tee.all = Std::kErr;
  Reporter rep(io_, o);
  size_t fdsBefore = 0;
  for (int attempt = 0; attempt < 200; ++attempt) {
    // Counted after the first attempt: the io_context's reactor opens its
    // own descriptors (epoll, eventfd, timerfd) on first use.
    if (attempt == 1) fdsBefore = countOpenFds();
    std::string dir = dir_.path() + "/attempt_" + std::to_string(attempt) + "/0";
    WorkerFds fds = rep.openWorker(0, 0, dir);
    Fd wo(fds.stdoutFd), we(fds.stderrFd);
    writeStr(we.get(), "attempt " + std::to_string(attempt) + "\n");
    writeStr(wo.get(), "partial");
    pollAll();
    if (attempt % 2 == 0) rep.closeWorker(0);  // endAttempt also closes what is open
    rep.endAttempt();
    EXPECT_TRUE(rep.stderrTail(0).empty());
    pollAll();  // aborted waits complete and drop their channels
  }
  EXPECT_EQ(countOpenFds(), fdsBefore);
  std::string shown = readNow(err.r.get());
  EXPECT_NE(shown.find("[default0]:attempt 0\n"), std::string::npos);
  EXPECT_NE(shown.find("[default0]:attempt 199\n"), std::string::npos);
  EXPECT_EQ(readFile(dir_.path() + "/attempt_199/0/stderr.log"), "attempt 199\n");
}

std::set<int> openFds() {
  std::set<int> fds;
  for (const auto& e : fs::directory_iterator("/proc/self/fd"))
    fds.insert(std::stoi(e.path().filename().string()));
  return fds;
}

TEST_F(ReporterTest, DescriptorsAreCloseOnExecAndWorkerEndsBlocking) {
  Pipe out, err;
  std::set<int> before = openFds();
  ReporterOptions o = options(out.w.get(), err.w.get());
  o.tee.all = Std::kOut;
  o.duplicateStderrFilters = {"x"};
  Reporter rep(io_, o);
  WorkerFds fds = rep.openWorker(0, 0, workerDir(0));
  Fd wo(fds.stdoutFd), we(fds.stderrFd);
  for (int fd : {fds.stdoutFd, fds.stderrFd})
    EXPECT_FALSE(::fcntl(fd, F_GETFL) & O_NONBLOCK) << "a worker's end must block";
  // Every descriptor the Reporter opened: events.jsonl, duplicate file,
  // log file, pipes (the directory iterator's own is gone by then).
  std::set<int> now = openFds();
  size_t opened = 0;
  for (int fd : now) {
    if (before.count(fd)) continue;
    ++opened;
    EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC) << "fd " << fd;
  }
  EXPECT_GE(opened, 5u);
}

TEST_F(ReporterTest, EventsAreOneJsonObjectPerLine) {
  Pipe console;
  {
    Reporter rep(io_, options(console.w.get(), console.w.get()));
    rep.event("workers_started", {{"nproc", 2}}, 0);
    rep.event("worker_failed", {{"stderr", std::string("bad \xff bytes")}}, 1);
    rep.event("done", nullptr, 1);
  }
  std::ifstream in(dir_.file("events.jsonl"));
  std::vector<nlohmann::json> events;
  for (std::string line; std::getline(in, line);)
    events.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["event"], "workers_started");
  EXPECT_EQ(events[0]["nproc"], 2);
  EXPECT_EQ(events[0]["attempt"], 0);
  EXPECT_TRUE(events[0]["time"].is_number_float());
  EXPECT_GT(events[0]["time"].get<double>(), 1.6e9);
  EXPECT_EQ(events[1]["attempt"], 1);
  EXPECT_EQ(events[2]["event"], "done");
}

TEST_F(ReporterTest, FailureReportGoesToStderrAndTheFile) {
  Pipe out, err;
  Reporter rep(io_, options(out.w.get(), err.w.get()));
  rep.failureReport("=====\nfailed\n");
  EXPECT_EQ(readNow(err.r.get()), "=====\nfailed\n");
  EXPECT_EQ(readNow(out.r.get()), "");
  EXPECT_EQ(readFile(dir_.file("failure_report.txt")), "=====\nfailed\n");
  EXPECT_FALSE(rep.consoleClosed());
}

TEST(ReporterRunDir, CreatesTheBaseAndAFreshRunDirectory) {
  TempDir tmp;
  std::string base = tmp.path() + "/logs/nested";
  std::string a = Reporter::makeRunDir(base, "myjob");
  std::string b = Reporter::makeRunDir(base, "myjob");
  EXPECT_NE(a, b);
  for (const auto& d : {a, b}) {
    EXPECT_TRUE(fs::is_directory(d));
    std::string name = fs::path(d).filename().string();
    EXPECT_TRUE(str::startsWith(name, "myjob_")) << name;
    EXPECT_EQ(name.size(), std::string("myjob_").size() + 8);
    EXPECT_EQ(fs::path(d).parent_path().string(), base);
  }
}

TEST(ReporterRunDir, WithoutLogDirUsesAFreshTempDir) {
  TempDir tmp;
  const char* old = ::getenv("TMPDIR");
  std::string saved = old ? old : "";
  ::setenv("TMPDIR", tmp.path().c_str(), 1);
  std::string d = Reporter::makeRunDir("", "none");
  old ? ::setenv("TMPDIR", saved.c_str(), 1) : ::unsetenv("TMPDIR");
  fs::path base = fs::path(d).parent_path();
  EXPECT_EQ(base.parent_path().string(), tmp.path());
  EXPECT_TRUE(str::startsWith(base.filename().string(), "torchelastic_"));
  EXPECT_TRUE(str::startsWith(fs::path(d).filename().string(), "none_"));
}

TEST(ReporterRunDir, AFileInTheWayIsAnErrorNamingTheDirectory) {
  TempDir tmp;
  std::string file = tmp.file("not_a_dir");
  std::ofstream(file) << "x";
  try {
    Reporter::makeRunDir(file, "job");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find(file), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("--log-dir"), std::string::npos) << e.message();
  }
  EXPECT_THROW(Reporter::makeRunDir(file + "/below", "job"), IoError);
}

TEST(ReporterRunDir, AnUnwritableDirectoryIsAnError) {
  // /proc takes no new directories, even from root.
  const std::string dir = "/proc/ddprun-unwritable/logs";
  try {
    Reporter::makeRunDir(dir, "job");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(e.message().find(dir), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("writable --log-dir"), std::string::npos) << e.message();
  }
}

TEST(ReporterRunDir, AReadOnlyDirectoryIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes anywhere";
  TempDir tmp;
  std::string ro = tmp.file("ro");
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  EXPECT_THROW(Reporter::makeRunDir(ro, "job"), IoError);
  fs::permissions(ro, fs::perms::owner_all);
}

}  // namespace
}  // namespace ddprun::agent
