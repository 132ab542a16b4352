#include "ddprun/rendezvous/local_rendezvous.h"

#include <atomic>

#include "ddprun/common/error.h"
#include "ddprun/common/net.h"
#include "ddprun/store/tcp_store_server.h"
#include "hosting.h"

namespace ddprun::rendezvous {
namespace {

// Everything happens on the agent's thread at once (starting a server does
// not block); results still go through `post`, as the interface promises.
class LocalRendezvous final : public Rendezvous {
 public:
  LocalRendezvous(LocalOptions opts, Post post)
      : opts_(std::move(opts)), post_(std::move(post)) {}
  ~LocalRendezvous() override { shutdown(); }

  void setEventHandler(EventHandler handler) override { handler_ = std::move(handler); }

  void join(int localWorldSize, JoinHandler done) override {
    const int round = nextRound_++;
    std::exception_ptr error;
    RoundInfo info;
    try {
      info = startRound(round, localWorldSize);
    } catch (...) {
      error = std::current_exception();
    }
    post_([done = std::move(done), error, info] { done(error, info); });
  }

  void reportSuccess(int round) override {
    endRound({round, RoundEnd::kFinished, -1, ""});
  }
  void reportFailure(int round, const std::string& why, bool closeJob) override {
    endRound({round, closeJob ? RoundEnd::kClosed : RoundEnd::kFailed, 0, why});
  }

  void shutdown() override {
    stopped_ = true;
    store_.reset();  // stops the server: its workers are gone by now
  }
  void cancel() override { cancelled_ = true; }

  bool spansNodes() const override { return false; }
  std::string describe() const override {
    const uint16_t port = store_ ? store_->port() : opts_.port;
    return "local, worker store " +
           (port ? net::formatHostPort(opts_.host, port) : "on a free port each round");
  }

 private:
  // A fresh server each round: no worker reads a key of an earlier attempt.
  // The previous one is stopped first, so a fixed port is free again.
  RoundInfo startRound(int round, int localWorldSize) {
    if (cancelled_ || stopped_)
      DDPRUN_THROW(CancelledError, "joining round ", round, " was cancelled");
    DDPRUN_CHECK(localWorldSize > 0, "a node needs at least one worker, got ",
                 localWorldSize);
    store_.reset();
    store_ =
        detail::hostStore(opts_.bindHost, opts_.port, "the workers' store",
                          "pass another --master-port, or omit --master-port to use a "
                          "free port");
    joined_ = round;
    RoundInfo info;
    info.round = round;
    info.worldSize = localWorldSize;
    info.localWorldSizes = {localWorldSize};
    info.workerStoreHost = opts_.host;
    info.workerStorePort = store_->port();
    return info;
  }

  // One event per round: the first report wins, later ones are dropped.
  void endRound(RoundEvent event) {
    if (stopped_ || cancelled_ || event.round != joined_ || event.round <= ended_) return;
    ended_ = event.round;
    if (handler_) post_([handler = handler_, event] { handler(event); });
  }

  LocalOptions opts_;
  Post post_;
  EventHandler handler_;
  std::unique_ptr<store::TcpStoreServer> store_;
  int nextRound_ = 0;
  int joined_ = -1;  // the last round joined
  int ended_ = -1;   // the last round reported
  bool stopped_ = false;
  std::atomic<bool> cancelled_{false};  // the only member touched off the agent's thread
};

}  // namespace

std::unique_ptr<Rendezvous> makeLocalRendezvous(const LocalOptions& opts,
                                                Rendezvous::Post post) {
  return std::make_unique<LocalRendezvous>(opts, std::move(post));
}

}  // namespace ddprun::rendezvous
