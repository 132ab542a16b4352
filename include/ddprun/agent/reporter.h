// Where the workers' output and the agent's records go: the console (raw, as
// under torchrun, or line-prefixed with --tee), per-rank log files
// (--redirects/--tee), duplicate files (--duplicate-*-filters), the stderr
// tail kept for the failure report, events.jsonl and the failure report.
//
// Console output without --redirects/--tee is raw (no prefix) and relayed a
// whole line at a time, so that lines of different workers never merge; an
// unfinished line (a prompt, a `\r` progress bar) goes out after at most
// partialLineDelay, or once it reaches maxLineBytes, and if another worker
// writes to the console while such a line is open there, a newline ends it
// first. When the agent's console is a terminal the workers get a
// pseudo-terminal, so isatty() is true for them as under torchrun; when the agent's stdout and
// stderr are the same file or terminal a worker's two streams share one
// channel, so their order is kept exactly. A line longer than maxLineBytes is
// cut into pieces (linear time, bounded memory). Writing to a closed console
// (EPIPE) never stops the job: console output is dropped from then on and
// the files still get everything.
//
// Every descriptor the Reporter opens is close-on-exec. Precondition: the
// process ignores SIGPIPE (the agent does), so a closed console is an EPIPE.
//
// Threading: one thread, the agent's (the io_context's), which must outlive
// the Reporter. Not copyable.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ddprun/agent/launch_config.h"

namespace ddprun::agent {

struct ReporterOptions {
  std::string runDir;  // exists; events.jsonl, failure_report.txt, duplicate_*.log go here
  std::string role = "default";
  StdSpec redirects;
  StdSpec tee;
  std::set<int> localRanksFilter;  // empty: every rank on the console
  std::vector<std::string> duplicateStdoutFilters;
  std::vector<std::string> duplicateStderrFilters;
  // --log-line-prefix-template / TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, with
  // ${role_name}, ${rank} (global), ${local_rank} and ${hostname}. Empty:
  // torchrun's default "[${role_name}${local_rank}]:".
  std::string prefixTemplate;
  std::string hostname;  // for ${hostname}; empty: this machine's (net::hostName)
  int consoleOut = 1;    // the agent's stdout and stderr (tests pass pipes)
  int consoleErr = 2;
  size_t maxLineBytes = 64 * 1024;  // longer lines are cut (tee, duplicates, tail)
  // Raw console: an unfinished line waits at most this long for its end (0:
  // it goes out with the read that brought it).
  std::chrono::milliseconds partialLineDelay{100};
  size_t tailLines = 20;
};

// The ends a worker writes to: dup2'ed onto its stdout and stderr (the same
// fd twice when they share a channel). Blocking, close-on-exec. The caller
// closes them after start (once when they are the same fd).
struct WorkerFds {
  int stdoutFd = -1;
  int stderrFd = -1;
};

// Where a worker's output channels come from (the Reporter; a fake in tests).
class WorkerOutput {
 public:
  virtual ~WorkerOutput() = default;
  // Opens one worker's channels for an attempt; log files go in `workerDir`.
  // Throws IoError (pipe/pty/file failure).
  virtual WorkerFds openWorker(int localRank, int globalRank, const std::string& workerDir) = 0;
  // The worker exited: copies everything left in its channels now,
  // completely and in order, then closes them.
  virtual void closeWorker(int localRank) = 0;
};

class Reporter : public WorkerOutput {
 public:
  // Opens <runDir>/events.jsonl (appending) and the duplicate files that
  // filters ask for. Throws IoError naming the file, InvalidArgument when
  // runDir is empty or maxLineBytes is 0.
  Reporter(boost::asio::io_context& io, ReporterOptions opts);
  ~Reporter() override;
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // Creates <logDir or a fresh temp dir>/<runId>_<8 random chars> (mode 0700,
  // like torchrun's mkdtemp) and returns it. The fresh temp dir is
  // $TMPDIR/torchelastic_XXXXXX. Throws IoError naming the directory and
  // saying to pass a writable --log-dir.
  static std::string makeRunDir(const std::string& logDir, const std::string& runId);

  // The line prefix for one worker (tee'd lines, duplicate files).
  std::string prefix(int localRank, int globalRank) const;

  // A worker's channels, one of each kind per stream:
  // - redirected (-r) or tee'd (-t): a pipe; bytes to <workerDir>/std*.log,
  //   tee'd lines also to the console with prefix();
  // - otherwise (raw): bytes to the console as they come, no prefix; a pty
  //   when that console is a terminal, else a pipe; stdout and stderr share
  //   one channel when the console's stdout and stderr are the same file and
  //   no duplicate filter needs to tell them apart;
  // - ranks outside --local-ranks-filter: no console output (raw stdout goes
  //   to /dev/null; files, duplicates and the tail are unaffected).
  // Opening a rank that is open already closes its old channels first.
  WorkerFds openWorker(int localRank, int globalRank, const std::string& workerDir) override;
  // Reads what is left without blocking (until empty, end of data, or a
  // bound only a descendant still writing can reach), writes it out with
  // the unfinished line, and closes the channels. The tail stays readable.
  void closeWorker(int localRank) override;
  // Forgets every worker of the attempt (closing any still open): buffers,
  // descriptors, tails. Pending handlers hold no Reporter memory.
  void endAttempt();
  // closeWorker for every worker still open, and every file flushed (at
  // agent exit; the destructor does it too).
  void flushAll();

  // The last `tailLines` lines the worker wrote to stderr (or to its shared
  // channel), without newlines; a line longer than maxLineBytes counts as
  // pieces of that size. Empty for an unknown rank; kept until endAttempt.
  std::vector<std::string> stderrTail(int localRank) const;
  // Whether that tail also holds stdout lines: the worker's stdout and
  // stderr share one channel (see openWorker), which cannot tell them apart.
  bool tailHasStdout(int localRank) const;

  // One JSON line in <runDir>/events.jsonl: fields + "event", "time", "attempt".
  void event(const std::string& name, nlohmann::json fields, int attempt);
  // The failure report: to the console's stderr (unless closed) and always
  // to <runDir>/failure_report.txt.
  void failureReport(const std::string& text);

  // A console write failed (EPIPE: the reader went away): that stream's
  // console output has been dropped since; files still get everything.
  bool consoleClosed() const;
  const std::string& runDir() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddprun::agent
