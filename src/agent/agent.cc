// <utility> first: Boost 1.74's Asio under C++20 with g++ 12.
#include <utility>

#include "ddprun/agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "ddprun/agent/failure.h"
#include "ddprun/agent/worker_spec.h"
#include "ddprun/common/error.h"
#include "ddprun/common/log.h"
#include "ddprun/rendezvous/static_rendezvous.h"
#include "ddprun/store/tcp_store_server.h"

extern char** environ;

namespace ddprun::agent {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using boost::system::error_code;

namespace {
constexpr size_t kTailLines = 20;

Env currentEnv() {
  Env env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::string randomSuffix() {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 8; ++i) s += kChars[rd() % 36];
  return s;
}

double nowSeconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string hostName() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

bool isExecutableFile(const std::string& path) {
  return access(path.c_str(), X_OK) == 0 && fs::is_regular_file(path);
}
}  // namespace

class Agent::Impl {
  // kWaitingPeers: this node's workers all succeeded; other nodes still run.
  enum class State { kIdle, kHealthy, kStopping, kWaitingPeers, kDone };
  enum class StopReason { kNone, kFailure, kSignal };

 public:
  Impl(LaunchConfig cfg, std::unique_ptr<Launcher> launcher)
      : cfg_(std::move(cfg)),
        launcher_(std::move(launcher)),
        sigs_(io_),
        killTimer_(io_),
        agentEnv_(currentEnv()),
        host_(hostName()) {}

  int run() {
    int rc = prepare();
    if (rc >= 0) return rc;
    launcher_->watchExits(io_, [this](int pid, int status) { onExit(pid, status); });
    for (int s : cfg_.signalsToHandle) sigs_.add(s);
    waitSignal();
    remaining_ = cfg_.maxRestarts;
    if (cfg_.maxNodes > 1) {
      try {
        rendezvous::StaticOptions ro;
        ro.masterAddr = cfg_.masterAddr;
        ro.masterPort = cfg_.masterPort;
        ro.nodeRank = cfg_.nodeRank;
        ro.nnodes = cfg_.maxNodes;
        ro.runId = cfg_.rdzvId;
        if (cfg_.rdzvConf.count("timeout"))
          ro.timeout = std::chrono::seconds(std::stoi(cfg_.rdzvConf.at("timeout")));
        rdzv_ = rendezvous::StaticRendezvous::create(ro);
      } catch (const std::exception& e) {
        std::cerr << "ddprun: error: rendezvous: " << e.what() << "\n";
        return kExitSetup;
      }
    }
    if (!startAttempt()) return exitCode_;
    io_.run();
    return exitCode_;
  }

 private:
  // One worker output stream copied by the agent (redirect, tee, tail).
  struct Stream {
    std::unique_ptr<asio::posix::stream_descriptor> pipe;
    std::ofstream file;
    FILE* console = nullptr;  // where console copies go, or null
    std::string prefix;       // prepended to console lines
    std::deque<std::string>* tail = nullptr;
    const std::vector<std::string>* filters = nullptr;  // --duplicate-*-filters
    std::ofstream* duplicates = nullptr;                 // where matching lines go
    std::string duplicatePrefix;
    std::string partial;
    std::array<char, 8192> buf{};
  };
  struct Worker {
    int localRank = 0;
    int pid = -1;
    bool running = false;
    int exitCode = 0;
    std::chrono::steady_clock::time_point started;
    std::string errorFile;
    Stream out, err;
    std::deque<std::string> tail;
  };

  // Resolves nproc and the log directory; returns an exit code on failure,
  // -1 to go on.
  int prepare() {
    switch (cfg_.nprocKind) {
      case NprocKind::kCount: nproc_ = cfg_.nprocPerNode; break;
      case NprocKind::kCpu: nproc_ = static_cast<int>(std::thread::hardware_concurrency()); break;
      case NprocKind::kGpu:
        nproc_ = countCudaDevices();
        if (nproc_ == 0) {
          std::cerr << "ddprun: error: --nproc-per-node=gpu but no CUDA device was found "
                       "(no driver or no GPU); use a number or 'cpu'\n";
          return kExitUsage;
        }
        break;
      case NprocKind::kAuto: {
        int gpus = countCudaDevices();
        nproc_ = gpus > 0 ? gpus : static_cast<int>(std::thread::hardware_concurrency());
        break;
      }
    }
    if (cfg_.rdzvBackend == "c10d" && !cfg_.standalone) {
      std::cerr << "ddprun: error: --rdzv-backend=c10d (elastic rendezvous) is not supported yet "
                   "in this version; use the static rendezvous (--nnodes N --node-rank R "
                   "--master-addr A --master-port P) or --standalone\n";
      return kExitUsage;
    }
    if (cfg_.minNodes != cfg_.maxNodes) {
      std::cerr << "ddprun: error: --nnodes " << cfg_.minNodes << ":" << cfg_.maxNodes
                << " asks for an elastic range, which needs --rdzv-backend=c10d (not supported "
                   "yet); give a fixed --nnodes N\n";
      return kExitUsage;
    }
    if (cfg_.maxNodes > 1 && cfg_.standalone) {
      std::cerr << "ddprun: error: --standalone is for one node; with --nnodes "
                << cfg_.maxNodes << " give --node-rank, --master-addr and --master-port\n";
      return kExitUsage;
    }
    if (cfg_.nodeRank >= cfg_.maxNodes) {
      std::cerr << "ddprun: error: --node-rank " << cfg_.nodeRank
                << " is out of range for --nnodes " << cfg_.maxNodes << " (0.."
                << cfg_.maxNodes - 1 << ")\n";
      return kExitUsage;
    }
    if (cfg_.standalone && cfg_.rdzvId == "none") cfg_.rdzvId = "standalone_" + randomSuffix();
    try {
      std::string base = cfg_.logDir;
      if (base.empty()) {
        std::string tmpl = (fs::temp_directory_path() / "torchelastic_XXXXXX").string();
        if (mkdtemp(tmpl.data()) == nullptr)
          DDPRUN_THROW(IoError, "cannot create a temporary log directory: ", std::strerror(errno));
        base = tmpl;
      }
      fs::create_directories(base);
      runDir_ = (fs::path(base) / (cfg_.rdzvId + "_" + randomSuffix())).string();
      fs::create_directories(runDir_);
      events_.open(fs::path(runDir_) / "events.jsonl");
      if (!cfg_.duplicateStdoutFilters.empty())
        dupOut_.open(fs::path(runDir_) / "duplicate_stdout.log");
      if (!cfg_.duplicateStderrFilters.empty())
        dupErr_.open(fs::path(runDir_) / "duplicate_stderr.log");
      if (!events_) DDPRUN_THROW(IoError, "cannot write ", runDir_, "/events.jsonl");
    } catch (const std::exception& e) {
      std::cerr << "ddprun: error: cannot use log directory '" << cfg_.logDir
                << "': " << e.what() << "; pass a writable --log-dir\n";
      return kExitSetup;
    }
    if (nproc_ > 1 && !agentEnv_.count("OMP_NUM_THREADS")) {
      agentEnv_["OMP_NUM_THREADS"] = "1";
      std::cerr << "ddprun: note: setting OMP_NUM_THREADS=1 for each of the " << nproc_
                << " workers (set it yourself to choose another value)\n";
    }
    return -1;
  }

  void event(const std::string& name, nlohmann::json fields = nlohmann::json::object()) {
    fields["event"] = name;
    fields["time"] = nowSeconds();
    fields["attempt"] = restartCount_;
    events_ << fields.dump() << "\n";
    events_.flush();
  }

  std::string prefixFor(int localRank) const {
    auto it = agentEnv_.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
    if (it == agentEnv_.end()) return "[" + cfg_.role + std::to_string(localRank) + "]:";
    std::string t = it->second;
    auto subst = [&](const std::string& key, const std::string& value) {
      for (size_t p = t.find(key); p != std::string::npos; p = t.find(key, p + value.size()))
        t.replace(p, key.size(), value);
    };
    subst("${role_name}", cfg_.role);
    subst("${rank}", std::to_string(localRank));  // one node: global == local
    subst("${local_rank}", std::to_string(localRank));
    return t;
  }

  // Sets up one stream of a worker. Returns the fd the child should write to,
  // or -1 to inherit the agent's.
  int setupStream(Worker& w, Stream& s, int which, const fs::path& dir, bool alwaysPipe) {
    Std bit = which == 1 ? Std::kOut : Std::kErr;
    auto has = [&](const StdSpec& spec) {
      return (static_cast<int>(spec.forRank(w.localRank)) & static_cast<int>(bit)) != 0;
    };
    bool redirect = has(cfg_.redirects), tee = has(cfg_.tee);
    bool shown = cfg_.localRanksFilter.empty() || cfg_.localRanksFilter.count(w.localRank);
    FILE* console = which == 1 ? stdout : stderr;
    const auto& filters = which == 1 ? cfg_.duplicateStdoutFilters : cfg_.duplicateStderrFilters;
    if (!filters.empty()) {
      s.filters = &filters;
      s.duplicates = which == 1 ? &dupOut_ : &dupErr_;
      s.duplicatePrefix = prefixFor(w.localRank);
      alwaysPipe = true;
    }
    if (!redirect && !tee && !alwaysPipe) {
      if (shown) return -1;
      int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
      return null;
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) DDPRUN_THROW(IoError, "pipe: ", std::strerror(errno));
    if (redirect || tee) {
      s.file.open(dir / (which == 1 ? "stdout.log" : "stderr.log"));
      if (tee && shown) {
        s.console = console;
        s.prefix = prefixFor(w.localRank);
      }
    } else if (shown) {
      s.console = console;  // passes through unchanged
    }
    if (which == 2) s.tail = &w.tail;
    s.pipe = std::make_unique<asio::posix::stream_descriptor>(io_, fds[0]);
    readStream(s);
    return fds[1];
  }

  void readStream(Stream& s) {
    s.pipe->async_read_some(asio::buffer(s.buf), [this, &s](error_code ec, size_t n) {
      if (ec) {
        flushPartial(s);
        return;
      }
      consume(s, s.buf.data(), n);
      readStream(s);
    });
  }

  void consume(Stream& s, const char* data, size_t n) {
    s.partial.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1)
      emit(s, std::string_view(s.partial).substr(start, nl - start + 1));
    s.partial.erase(0, start);
  }

  void flushPartial(Stream& s) {
    if (!s.partial.empty()) emit(s, s.partial + "\n");
    s.partial.clear();
  }

  void emit(Stream& s, std::string_view line) {
    if (s.file.is_open()) {
      s.file << line;
      s.file.flush();
    }
    if (s.console) {
      std::string out = s.prefix + std::string(line);
      std::fwrite(out.data(), 1, out.size(), s.console);
      std::fflush(s.console);
    }
    if (s.filters) {
      for (const auto& f : *s.filters)
        if (line.find(f) != std::string_view::npos) {
          *s.duplicates << s.duplicatePrefix << line;
          s.duplicates->flush();
          break;
        }
    }
    if (s.tail) {
      s.tail->emplace_back(line.substr(0, line.size() - 1));
      if (s.tail->size() > kTailLines) s.tail->pop_front();
    }
  }

  // Reads whatever a dead worker left in its pipes, so the report has it.
  void drain(Stream& s) {
    if (!s.pipe) return;
    int fd = s.pipe->native_handle();
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    char buf[8192];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) consume(s, buf, static_cast<size_t>(n));
  }

  bool startAttempt() {
    failures_.clear();
    // Old workers stay alive until their pipe handlers have run (they hold
    // references to the streams); closing cancels the reads.
    for (auto& w : workers_) {
      for (Stream* st : {&w->out, &w->err})
        if (st->pipe) {
          error_code ec;
          st->pipe->close(ec);
        }
      retired_.push_back(std::move(w));
    }
    workers_.clear();
    try {
      GroupInfo g = rendezvousRound();
      g.runId = cfg_.rdzvId;
      fs::path attemptDir = fs::path(runDir_) / ("attempt_" + std::to_string(restartCount_));
      fs::remove_all(attemptDir);
      std::string python = agentEnv_.count("PYTHON_EXEC") ? agentEnv_["PYTHON_EXEC"] : "python3";
      bool exec = isExecutableFile(cfg_.script);
      for (int lr = 0; lr < nproc_; ++lr) {
        auto w = std::make_unique<Worker>();
        w->localRank = lr;
        fs::path dir = attemptDir / std::to_string(lr);
        fs::create_directories(dir);
        w->errorFile = (dir / "error.json").string();
        ProcessSpec spec;
        spec.argv = workerArgv(cfg_, lr, python, exec);
        spec.env = workerEnv(cfg_, g, lr, nproc_, restartCount_, w->errorFile, agentEnv_);
        spec.stdoutFd = setupStream(*w, w->out, 1, dir, false);
        spec.stderrFd = setupStream(*w, w->err, 2, dir, true);
        try {
          w->pid = launcher_->start(spec);
        } catch (...) {
          closeFd(spec.stdoutFd);
          closeFd(spec.stderrFd);
          throw;
        }
        closeFd(spec.stdoutFd);
        closeFd(spec.stderrFd);
        w->running = true;
        w->started = std::chrono::steady_clock::now();
        event("start", {{"local_rank", lr}, {"pid", w->pid}});
        workers_.push_back(std::move(w));
      }
      state_ = State::kHealthy;
      DDPRUN_INFO("attempt ", restartCount_, ": started ", nproc_, " workers; worker store at ",
                  g.masterAddr, ":", g.masterPort, "; logs in ", attemptDir.string());
      return true;
    } catch (const std::exception& e) {
      std::cerr << "ddprun: error: " << e.what() << "\n";
      stopAll(SIGKILL);
      exitCode_ = kExitSetup;
      finish(kExitSetup);
      return false;
    }
  }

  // Agrees on ranks and the worker store for this attempt. One node: a fresh
  // store here (no worker can read a key from an earlier attempt); several:
  // the round of the static rendezvous, and a watcher for its end.
  GroupInfo rendezvousRound() {
    GroupInfo g;
    if (!rdzv_) {
      workerStore_.reset();
      store::TcpStoreServerOptions so;
      so.port = cfg_.standalone ? 0 : cfg_.masterPort;
      workerStore_ = store::TcpStoreServer::start(so);
      g.worldSize = nproc_;
      g.masterAddr = cfg_.standalone ? "127.0.0.1" : cfg_.masterAddr;
      g.masterPort = workerStore_->port();
      return g;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto info = rdzv_->join(restartCount_, nproc_);
    event("rendezvous", {{"group_rank", info.groupRank}, {"world_size", info.worldSize},
                         {"duration_s", std::chrono::duration<double>(
                                            std::chrono::steady_clock::now() - t0).count()}});
    g.groupRank = info.groupRank;
    g.groupWorldSize = info.groupWorldSize;
    g.baseRank = info.baseRank;
    g.worldSize = info.worldSize;
    g.masterAddr = info.workerStoreHost;
    g.masterPort = info.workerStorePort;
    baseRank_ = info.baseRank;
    startWatcher(restartCount_);
    return g;
  }

  // A thread blocks on the round's end key and hands the value to the io
  // thread. It ends when the key is set (finish() makes sure it is).
  void startWatcher(int round) {
    joinWatcher();
    watcher_ = std::thread([this, round, r = rdzv_.get()] {
      for (;;) {
        try {
          std::string v = r->waitEnd(round);
          asio::post(io_, [this, round, v] { onRoundEnd(round, v); });
          return;
        } catch (const TimeoutError&) {
          continue;  // a long job: keep waiting
        } catch (const std::exception&) {
          // The agent store went away. Node 0 only leaves after the round
          // ended, unless it crashed: let the io thread decide.
          asio::post(io_, [this, round] { onRoundEnd(round, "lost"); });
          return;
        }
      }
    });
  }

  void joinWatcher() {
    if (watcher_.joinable()) watcher_.join();
  }

  void onRoundEnd(int round, const std::string& value) {
    if (round != restartCount_ || state_ == State::kDone) return;
    if (value == "finished") {
      if (state_ == State::kWaitingPeers) finish(kExitSuccess);
      return;
    }
    if (value == "lost") {
      if (state_ == State::kWaitingPeers) {
        // Our workers succeeded; node 0 left after the round ended.
        finish(kExitSuccess);
        return;
      }
      onRoundEnd(round, "closed:0:the agent store on node 0 is gone");
      return;
    }
    // "failed:<node>:<why>" (restart together) or "closed:<node>:<why>" (the
    // job is over: stop and exit).
    auto colon = value.find(':');
    std::string kind = value.substr(0, colon);
    std::string rest = colon == std::string::npos ? "" : value.substr(colon + 1);
    if (rest.rfind(std::to_string(cfg_.nodeRank) + ":", 0) == 0) return;  // our own
    peerFailure_ = rest;
    peerClosed_ = kind == "closed";
    DDPRUN_WARN("node ", peerFailure_, "; stopping this node's workers");
    if (state_ == State::kHealthy) {
      beginStop(SIGTERM, StopReason::kFailure);
    } else if (state_ == State::kWaitingPeers) {
      state_ = State::kStopping;
      stopReason_ = StopReason::kFailure;
      asio::post(io_, [this] { afterStopped(); });
    }
  }

  static void closeFd(int fd) {
    if (fd >= 0) ::close(fd);
  }

  void waitSignal() {
    sigs_.async_wait([this](error_code ec, int sig) {
      if (ec) return;
      onSignal(sig);
      if (state_ != State::kDone) waitSignal();
    });
  }

  Worker* find(int pid) {
    for (auto& w : workers_)
      if (w->pid == pid) return w.get();
    return nullptr;
  }

  size_t running() const {
    size_t n = 0;
    for (const auto& w : workers_) n += w->running;
    return n;
  }

  void onExit(int pid, int status) {
    Worker* w = find(pid);
    if (w == nullptr || !w->running) return;
    w->running = false;
    w->exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    drain(w->out);
    drain(w->err);
    event("exit", {{"local_rank", w->localRank}, {"pid", pid}, {"exit_code", w->exitCode},
                   {"duration_s", std::chrono::duration<double>(
                                      std::chrono::steady_clock::now() - w->started).count()}});
    if (w->exitCode != 0 || state_ == State::kStopping) recordFailure(*w);
    if (state_ == State::kHealthy) {
      if (w->exitCode != 0) {
        DDPRUN_WARN("worker local_rank ", w->localRank, " (pid ", pid, ") failed with exit code ",
                    describeExit(w->exitCode), "; stopping the other workers");
        if (rdzv_)  // with no restarts left the whole job ends: "closed"
          announce("rank " + std::to_string(baseRank_ + w->localRank) + " exited with " +
                       describeExit(w->exitCode),
                   /*closed=*/remaining_ == 0);
        beginStop(SIGTERM, StopReason::kFailure);
      } else if (running() == 0) {
        event("succeeded");
        if (!rdzv_) {
          finish(kExitSuccess);
          return;
        }
        state_ = State::kWaitingPeers;  // exit barrier: the round's end says when
        announceSuccess();
        return;
      }
    }
    if (state_ == State::kStopping && running() == 0) {
      killTimer_.cancel();
      asio::post(io_, [this] { afterStopped(); });
    }
  }

  void announce(const std::string& why, bool closed) {
    try {
      rdzv_->announceEnd(restartCount_, closed ? "closed" : "failed", why);
    } catch (const std::exception& e) {
      DDPRUN_WARN("could not tell the other nodes: ", e.what());
    }
  }

  void announceSuccess() {
    try {
      rdzv_->announceSuccess(restartCount_);
    } catch (const std::exception& e) {
      DDPRUN_WARN("could not tell the other nodes: ", e.what());
    }
  }

  void recordFailure(const Worker& w) {
    if (w.exitCode == 0) return;
    WorkerFailure f;
    f.globalRank = baseRank_ + w.localRank;
    f.localRank = w.localRank;
    f.pid = w.pid;
    f.exitCode = w.exitCode;
    f.time = std::time(nullptr);
    f.victim = state_ == State::kStopping;
    readErrorFile(w.errorFile, f);
    f.stderrTail.assign(w.tail.begin(), w.tail.end());
    failures_.push_back(std::move(f));
  }

  void beginStop(int sig, StopReason reason) {
    if (state_ != State::kStopping || reason == StopReason::kSignal) stopReason_ = reason;
    state_ = State::kStopping;
    stopAll(sig);
    if (running() == 0) {
      asio::post(io_, [this] { afterStopped(); });
      return;
    }
    killTimer_.expires_after(cfg_.shutdownTimeout);
    killTimer_.async_wait([this](error_code ec) {
      if (ec) return;
      for (auto& w : workers_)
        if (w->running) {
          DDPRUN_WARN("worker local_rank ", w->localRank, " (pid ", w->pid,
                      ") did not exit within ", cfg_.shutdownTimeout.count(),
                      " s; sending SIGKILL");
          launcher_->signalGroup(w->pid, SIGKILL);
        }
    });
  }

  void stopAll(int sig) {
    for (auto& w : workers_)
      if (w->running) {
        DDPRUN_INFO("sending ", signalName(sig), " to worker local_rank ", w->localRank,
                    " (process group ", w->pid, ")");
        launcher_->signalGroup(w->pid, sig);
      }
  }

  void onSignal(int sig) {
    DDPRUN_WARN("received ", signalName(sig), "; forwarding it to the workers");
    event("signal", {{"signal", signalName(sig)}});
    stopSignal_ = sig;
    if (state_ == State::kHealthy || state_ == State::kStopping) beginStop(sig, StopReason::kSignal);
  }

  void afterStopped() {
    if (state_ != State::kStopping) return;
    if (stopReason_ == StopReason::kSignal) {
      finish(128 + stopSignal_);
      return;
    }
    if (remaining_ > 0 && !peerClosed_) {
      --remaining_;
      ++restartCount_;
      std::cerr << "ddprun: worker group failed; " << remaining_ + 1 << "/" << cfg_.maxRestarts
                << " restarts left; restarting (attempt " << restartCount_ << ")\n";
      event("restart", {{"remaining", remaining_}});
      startAttempt();
      return;
    }
    std::string name = cfg_.script;
    if (failures_.empty() || std::all_of(failures_.begin(), failures_.end(),
                                         [](const WorkerFailure& f) { return f.victim; }))
      std::cerr << "ddprun: the job failed on node " << peerFailure_
                << "; this node's workers were stopped (see that node's report for the root "
                   "cause)\n";
    if (!failures_.empty()) std::cerr << formatFailureSummary(name, host_, failures_);
    // Like torchrun: the root cause's error file becomes the agent's own.
    auto own = agentEnv_.find("TORCHELASTIC_ERROR_FILE");
    if (own != agentEnv_.end() && !own->second.empty() && !failures_.empty())
      copyRootErrorFile(failures_, own->second);
    event("failed");
    finish(kExitWorkersFailed);
  }

  void finish(int code) {
    if (rdzv_ && code != kExitSuccess)
      announce("node exiting with code " + std::to_string(code), /*closed=*/true);
    exitCode_ = code;
    state_ = State::kDone;
    error_code ec;
    sigs_.cancel(ec);
    launcher_->stopWatching();
    killTimer_.cancel();
    for (auto& w : workers_)
      for (Stream* s : {&w->out, &w->err})
        if (s->pipe) {
          drain(*s);
          flushPartial(*s);
          s->pipe->close(ec);
        }
    workerStore_.reset();
    io_.stop();
    joinWatcher();  // the end key is set by now (finished, or announced above)
  }

  LaunchConfig cfg_;
  asio::io_context io_;
  // After io_: the launcher's exit watch is an I/O object of io_ and must be
  // destroyed first.
  std::unique_ptr<Launcher> launcher_;
  asio::signal_set sigs_;
  asio::steady_timer killTimer_;
  Env agentEnv_;
  std::string host_;
  int nproc_ = 1;
  std::string runDir_;
  std::ofstream events_;
  std::ofstream dupOut_, dupErr_;
  std::unique_ptr<store::TcpStoreServer> workerStore_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<std::unique_ptr<Worker>> retired_;  // earlier attempts'
  std::vector<WorkerFailure> failures_;
  std::unique_ptr<rendezvous::StaticRendezvous> rdzv_;
  std::thread watcher_;
  std::string peerFailure_;
  bool peerClosed_ = false;
  int baseRank_ = 0;
  int restartCount_ = 0;
  int remaining_ = 0;
  int stopSignal_ = 0;
  int exitCode_ = 0;
  State state_ = State::kIdle;
  StopReason stopReason_ = StopReason::kNone;
};

Agent::Agent(LaunchConfig cfg, std::unique_ptr<Launcher> launcher)
    : impl_(std::make_unique<Impl>(std::move(cfg), std::move(launcher))) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }

}  // namespace ddprun::agent
