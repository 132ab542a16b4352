#include "ddprun/agent/reporter.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>

#include "ddprun/common/error.h"
#include "ddprun/common/fd.h"
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/common/strings.h"
#include "output_channel.h"
#include "ddprun/agent/launcher.h"
#include "pty.h"

namespace fs = std::filesystem;

namespace ddprun::agent {

using detail::Channel;
using detail::ChannelSinks;
using detail::Console;
using detail::FileSink;

namespace {

bool sameFile(int a, int b) {
  if (a == b) return true;
  struct stat sa {
  }, sb{};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

[[noreturn]] void logDirError(const std::string& dir, const std::string& why) {
  DDPRUN_THROW(IoError, "cannot use log directory '", dir, "': ", why,
               "; pass a writable --log-dir");
}

std::string freshTempBase() {
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  std::string tmpl = (tmp / "torchelastic_XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) logDirError(tmp.string(), std::strerror(errno));
  return tmpl;
}

UniqueFd openDevNull() {
  UniqueFd fd(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  if (fd.get() < 0)
    DDPRUN_THROW(IoError, "cannot open /dev/null: ", std::strerror(errno));
  return fd;
}

// A pipe whose write end (the worker's) stays blocking.
std::pair<UniqueFd, UniqueFd> openPipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    DDPRUN_THROW(IoError,
                 "cannot create a pipe for worker output: ", startErrorText(errno));
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

}  // namespace

class Reporter::Impl {
 public:
  Impl(boost::asio::io_context& io, ReporterOptions opts);
  ~Impl();
  WorkerFds openWorker(int localRank, int globalRank, const std::string& workerDir);
  void closeWorker(int localRank);
  void endAttempt();
  std::vector<std::string> stderrTail(int localRank) const;
  bool tailHasStdout(int localRank) const {
    auto it = workers_.find(localRank);
    return it != workers_.end() && it->second.err && it->second.err == it->second.out;
  }
  std::string prefix(int localRank, int globalRank) const;
  void event(const std::string& name, nlohmann::json fields, int attempt);
  void failureReport(const std::string& text);
  void closeAll();
  bool consoleClosed() const { return out_->closed() || err_->closed(); }
  const std::string& runDir() const { return opts_.runDir; }

 private:
  // What becomes of one stream of one worker.
  struct StreamPlan {
    bool file = false;  // redirected or tee'd: <workerDir>/<name>
    bool tee = false;   // lines with a prefix on the console
    bool raw = false;   // bytes on the console as they come
    bool tail = false;  // stderr: keep the tail
    const char* name = "";
    std::shared_ptr<Console> console;
    std::shared_ptr<FileSink> duplicates;
    const std::vector<std::string>* filters = nullptr;
    bool needsChannel() const { return file || tee || raw || tail || duplicates; }
  };
  struct Worker {
    std::shared_ptr<Channel> out;  // null: stdout goes to /dev/null
    std::shared_ptr<Channel> err;  // the same channel as `out` when shared
  };

  StreamPlan plan(int localRank, Std stream) const;
  ChannelSinks sinksFor(const StreamPlan& p, int localRank, int globalRank,
                        const std::string& workerDir) const;
  // Opens a channel for `p`; returns the worker's end.
  UniqueFd openChannel(const StreamPlan& p, int localRank, int globalRank,
                       const std::string& workerDir, std::shared_ptr<Channel>& channel);
  static void closeChannels(Worker& w);

  boost::asio::io_context& io_;
  ReporterOptions opts_;
  std::shared_ptr<Console> out_, err_;  // one object when they are the same file
  bool sameConsole_;
  std::shared_ptr<FileSink> duplicateOut_, duplicateErr_;
  UniqueFd events_;
  std::map<int, Worker> workers_;
};

Reporter::Impl::Impl(boost::asio::io_context& io, ReporterOptions opts)
    : io_(io), opts_(std::move(opts)) {
  DDPRUN_CHECK(opts_.maxLineBytes > 0, "maxLineBytes must be positive");
  DDPRUN_CHECK(!opts_.runDir.empty(), "the Reporter needs a run directory");
  if (opts_.hostname.empty()) opts_.hostname = net::hostName();
  out_ = std::make_shared<Console>(opts_.consoleOut);
  sameConsole_ = sameFile(opts_.consoleOut, opts_.consoleErr);
  err_ = sameConsole_ ? out_ : std::make_shared<Console>(opts_.consoleErr);
  fs::path dir(opts_.runDir);
  std::string eventsPath = (dir / "events.jsonl").string();
  events_.reset(
      ::open(eventsPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (events_.get() < 0)
    DDPRUN_THROW(IoError, "cannot create ", eventsPath, ": ", std::strerror(errno),
                 "; pass a writable --log-dir");
  if (!opts_.duplicateStdoutFilters.empty())
    duplicateOut_ = std::make_shared<FileSink>((dir / "duplicate_stdout.log").string());
  if (!opts_.duplicateStderrFilters.empty())
    duplicateErr_ = std::make_shared<FileSink>((dir / "duplicate_stderr.log").string());
}

Reporter::Impl::~Impl() { closeAll(); }

void Reporter::Impl::closeAll() {
  for (auto& [rank, w] : workers_) closeChannels(w);
}

std::string Reporter::Impl::prefix(int localRank, int globalRank) const {
  std::string t = opts_.prefixTemplate.empty() ? "[${role_name}${local_rank}]:"
                                               : opts_.prefixTemplate;
  // Numbers first, then the free-text values, so that a role or host name
  // is never scanned for the other keys.
  t = str::replaceAll(std::move(t), "${local_rank}", std::to_string(localRank));
  t = str::replaceAll(std::move(t), "${rank}", std::to_string(globalRank));
  t = str::replaceAll(std::move(t), "${hostname}", opts_.hostname);
  return str::replaceAll(std::move(t), "${role_name}", opts_.role);
}

Reporter::Impl::StreamPlan Reporter::Impl::plan(int localRank, Std stream) const {
  auto has = [&](const StdSpec& spec) {
    return (static_cast<int>(spec.forRank(localRank)) & static_cast<int>(stream)) != 0;
  };
  bool shown =
      opts_.localRanksFilter.empty() || opts_.localRanksFilter.count(localRank) > 0;
  bool isOut = stream == Std::kOut;
  StreamPlan p;
  // As torchrun: a tee'd stream is also written to its file.
  p.file = has(opts_.redirects) || has(opts_.tee);
  p.tee = shown && has(opts_.tee);
  p.raw = shown && !p.file;
  p.tail = !isOut;
  p.name = isOut ? "stdout.log" : "stderr.log";
  p.console = isOut ? out_ : err_;
  p.duplicates = isOut ? duplicateOut_ : duplicateErr_;
  p.filters = isOut ? &opts_.duplicateStdoutFilters : &opts_.duplicateStderrFilters;
  return p;
}

ChannelSinks Reporter::Impl::sinksFor(const StreamPlan& p, int localRank, int globalRank,
                                      const std::string& workerDir) const {
  ChannelSinks s;
  if (p.raw || p.tee) s.console = p.console;
  s.consoleLines = p.tee;
  if (p.tee || p.duplicates) s.prefix = prefix(localRank, globalRank);
  if (p.file) {
    std::error_code ec;
    fs::create_directories(workerDir, ec);
    if (ec) logDirError(workerDir, ec.message());
    s.file = std::make_shared<FileSink>((fs::path(workerDir) / p.name).string());
  }
  s.duplicates = p.duplicates;
  if (p.duplicates) s.filters = *p.filters;
  s.tailLines = p.tail ? opts_.tailLines : 0;
  s.maxLineBytes = opts_.maxLineBytes;
  s.partialLineDelay = opts_.partialLineDelay;
  return s;
}

UniqueFd Reporter::Impl::openChannel(const StreamPlan& p, int localRank, int globalRank,
                                     const std::string& workerDir,
                                     std::shared_ptr<Channel>& channel) {
  ChannelSinks sinks = sinksFor(p, localRank, globalRank, workerDir);
  // A raw stream on a terminal gets a terminal, as under torchrun, where
  // the worker inherits the agent's.
  if (p.raw && ::isatty(p.console->fd())) {
    detail::PtyPair pty = detail::openPty(p.console->fd());
    channel = Channel::start(io_, std::move(pty.master), true, std::move(sinks));
    return std::move(pty.slave);
  }
  auto [readEnd, writeEnd] = openPipe();
  channel = Channel::start(io_, std::move(readEnd), false, std::move(sinks));
  return std::move(writeEnd);
}

WorkerFds Reporter::Impl::openWorker(int localRank, int globalRank,
                                     const std::string& workerDir) {
  if (auto it = workers_.find(localRank); it != workers_.end()) {
    closeChannels(it->second);
    workers_.erase(it);
  }
  StreamPlan out = plan(localRank, Std::kOut);
  StreamPlan err = plan(localRank, Std::kErr);
  Worker w;
  try {
    // One channel for both keeps their order exactly; only possible when
    // they go to the same place and nothing needs to tell them apart.
    if (sameConsole_ && out.raw && err.raw && !out.duplicates && !err.duplicates) {
      UniqueFd fd = openChannel(err, localRank, globalRank, workerDir, w.err);
      w.out = w.err;
      workers_[localRank] = w;
      int raw = fd.release();
      return {raw, raw};
    }
    UniqueFd outFd = out.needsChannel()
                         ? openChannel(out, localRank, globalRank, workerDir, w.out)
                         : openDevNull();
    UniqueFd errFd = openChannel(err, localRank, globalRank, workerDir, w.err);
    workers_[localRank] = w;
    return {outFd.release(), errFd.release()};
  } catch (...) {
    closeChannels(w);
    throw;
  }
}

void Reporter::Impl::closeChannels(Worker& w) {
  if (w.out) w.out->close();
  if (w.err) w.err->close();
}

void Reporter::Impl::closeWorker(int localRank) {
  auto it = workers_.find(localRank);
  if (it != workers_.end()) closeChannels(it->second);
}

void Reporter::Impl::endAttempt() {
  for (auto& [rank, w] : workers_) closeChannels(w);
  workers_.clear();
}

std::vector<std::string> Reporter::Impl::stderrTail(int localRank) const {
  auto it = workers_.find(localRank);
  if (it == workers_.end() || !it->second.err) return {};
  const auto& tail = it->second.err->tail();
  return {tail.begin(), tail.end()};
}

void Reporter::Impl::event(const std::string& name, nlohmann::json fields, int attempt) {
  if (!fields.is_object()) fields = nlohmann::json::object();
  fields["event"] = name;
  fields["time"] =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  fields["attempt"] = attempt;
  // Invalid UTF-8 (a worker's output in a field) is replaced, never thrown.
  std::string line =
      fields.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line += '\n';
  if (!writeAll(events_.get(), line))
    DDPRUN_WARN("cannot write ", opts_.runDir, "/events.jsonl: ", std::strerror(errno));
}

void Reporter::Impl::failureReport(const std::string& text) {
  err_->write(text);
  std::string path = (fs::path(opts_.runDir) / "failure_report.txt").string();
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0 || !writeAll(fd.get(), text))
    DDPRUN_WARN("cannot write ", path, ": ", std::strerror(errno));
}

// ---------------------------------------------------------------------------

Reporter::Reporter(boost::asio::io_context& io, ReporterOptions opts)
    : impl_(std::make_unique<Impl>(io, std::move(opts))) {}

Reporter::~Reporter() = default;

std::string Reporter::makeRunDir(const std::string& logDir, const std::string& runId) {
  std::string base = logDir.empty() ? freshTempBase() : logDir;
  std::error_code ec;
  if (fs::exists(base, ec) && !fs::is_directory(base, ec))
    logDirError(base, "it exists and is not a directory");
  fs::create_directories(base, ec);
  if (ec) logDirError(base, ec.message());
  // mkdir fails with EEXIST on a clash with an earlier run: draw again.
  for (int i = 0; i < 100; ++i) {
    std::string dir = (fs::path(base) / (runId + "_" + str::randomToken(8))).string();
    if (::mkdir(dir.c_str(), 0700) == 0) return dir;
    if (errno != EEXIST) logDirError(base, std::strerror(errno));
  }
  logDirError(base, "no fresh run directory name could be found");
}

std::string Reporter::prefix(int localRank, int globalRank) const {
  return impl_->prefix(localRank, globalRank);
}

WorkerFds Reporter::openWorker(int localRank, int globalRank,
                               const std::string& workerDir) {
  return impl_->openWorker(localRank, globalRank, workerDir);
}

void Reporter::closeWorker(int localRank) { impl_->closeWorker(localRank); }

void Reporter::endAttempt() { impl_->endAttempt(); }

void Reporter::flushAll() { impl_->closeAll(); }

std::vector<std::string> Reporter::stderrTail(int localRank) const {
  return impl_->stderrTail(localRank);
}

bool Reporter::tailHasStdout(int localRank) const {
  return impl_->tailHasStdout(localRank);
}

void Reporter::event(const std::string& name, nlohmann::json fields, int attempt) {
  impl_->event(name, std::move(fields), attempt);
}

void Reporter::failureReport(const std::string& text) { impl_->failureReport(text); }

bool Reporter::consoleClosed() const { return impl_->consoleClosed(); }

const std::string& Reporter::runDir() const { return impl_->runDir(); }

}  // namespace ddprun::agent
