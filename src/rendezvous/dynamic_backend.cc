// The dynamic rendezvous's real backend: the endpoint's store (hosted here
// or not), TcpStore clients, each round's worker store, and heartbeats
// (heartbeat.h). Kept apart from dynamic_rendezvous.cc so that the unit
// tests, which inject all of these, link without it.
#include "ddprun/common/log.h"
#include "ddprun/common/net.h"
#include "ddprun/store/auth.h"
#include "ddprun/store/tcp_store_server.h"
#include "dynamic_rendezvous_internal.h"
#include "hosted_stores.h"

namespace ddprun::rendezvous {
namespace detail {
namespace {

using Millis = std::chrono::milliseconds;

class HeartbeatLiveness final : public Liveness {
 public:
  template <typename... Args>
  explicit HeartbeatLiveness(Args&&... args) : beat_(std::forward<Args>(args)...) {}
  void setPeers(std::vector<std::string> peers, Heartbeat::OnDead onDead) override {
    beat_.setPeers(std::move(peers), std::move(onDead));
  }
  void setOnLost(Heartbeat::OnLost onLost) override { beat_.setOnLost(std::move(onLost)); }
  void stop() override { beat_.stop(); }

 private:
  Heartbeat beat_;
};

// What a client of the endpoint is, beyond its timeouts: its name in the
// log, how long it reconnects after its connection broke, and the keys it
// owns (set again on every new connection).
struct ClientKind {
  const char* name;
  Millis reconnectBudget;
  std::string ownedPrefix;
};

// `timeout` bounds connecting, `requestTimeout` each request; `via` opens
// the client (TcpStore::connect when empty).
std::unique_ptr<store::Store> connectEndpoint(const DynamicOptions& opts,
                                              std::shared_ptr<store::CancelToken> cancel,
                                              Millis timeout, Millis requestTimeout,
                                              const ClientKind& kind,
                                              const EndpointConnect& via) {
  store::TcpStoreOptions o;
  o.host = opts.endpointHost;
  o.port = opts.endpointPort;
  o.timeout = requestTimeout;
  o.connectTimeout = timeout;
  o.cancel = std::move(cancel);
  o.authToken = opts.authSecret;
  o.allowOpenServer = store::auth::openStoreAllowed();
  o.name = kind.name;
  o.reconnect.budget = kind.reconnectBudget;
  o.ownedPrefix = kind.ownedPrefix;
  if (via) return via(o);
  return store::TcpStore::connect(o);
}

// A reset of a connection is survived when the store is back within the
// heartbeat timeout: longer, and the peers have dropped this node anyway.
Millis heartbeatTimeout(const DynamicOptions& opts) {
  return opts.keepAliveInterval * opts.keepAliveMaxAttempt;
}

// Binds the endpoint's port. An inferred host whose port is taken joins
// whoever listens there instead, as torchrun does (without looking for the
// holder: at a thousand agents on one host that scan of /proc was most of
// each agent's start-up); an explicit one fails naming the holder.
void hostEndpoint(DynamicOptions& opts, const std::shared_ptr<HostedStores>& hosted) {
  try {
    opts.endpointPort = hosted->hostRendezvousStore(
        "", opts.endpointPort, "the rendezvous store at the endpoint",
        "pass another port in --rdzv-endpoint (the same to every node), or stop that "
        "process",
        opts.authSecret, opts.runId, /*nameHolder=*/opts.isHostExplicit);
  } catch (const IoError& e) {
    if (opts.isHostExplicit) throw;
    DDPRUN_INFO("rendezvous: ", e.message(), "; joining it as a client");
    opts.isHost = false;
  }
}

}  // namespace

DynamicBackend makeDynamicTcpBackend(DynamicOptions& opts, EndpointConnect via) {
  // The host serves the endpoint for the rendezvous's whole life, and group
  // rank 0 each round's worker store; both stop at shutdown.
  auto hosted = std::make_shared<HostedStores>();
  if (opts.isHost) hostEndpoint(opts, hosted);
  DynamicBackend b;
  b.hosting = hosted->hosting();
  b.storeAddress = net::formatHostPort(opts.endpointHost, opts.endpointPort);
  b.connect = [opts, via](std::shared_ptr<store::CancelToken> cancel, Millis timeout) {
    return connectEndpoint(opts, std::move(cancel), timeout, opts.readTimeout,
                           {"rendezvous", heartbeatTimeout(opts), ""}, via);
  };
  b.localAddress = [](store::Store& s) {
    auto* tcp = dynamic_cast<store::TcpStore*>(&s);
    return tcp ? tcp->localAddress() : std::string();
  };
  b.startWorkerStore = [hosted] { return hosted->startWorkerStore(); };
  b.missedBeats = std::make_shared<std::atomic<uint64_t>>(0);
  b.startLiveness = [opts, via, missed = b.missedBeats](
                        const std::string& self) -> std::unique_ptr<Liveness> {
    HeartbeatOptions h;
    h.interval = opts.keepAliveInterval;
    h.maxAttempts = opts.keepAliveMaxAttempt;
    h.missed = missed.get();  // the backend, which holds it, outlives the liveness
    // Beats and their reads are small: a request still unanswered after the
    // heartbeat timeout means the link or the store is gone (the peers drop
    // this node then anyway: Heartbeat::setOnLost); a slower reply on a
    // loaded machine is no reason to give up.
    // A broken connection is replaced within one interval (the beats' own
    // retry is the next interval), and the new one owns this node's key.
    // A new connection gets the whole heartbeat timeout to connect and
    // handshake: one the store's kernel accepted is waited on, not dropped
    // after an interval and opened again (under a connection storm that
    // only adds to the storm); stop() cancels the wait.
    Heartbeat::Connect connect = [opts, via](std::shared_ptr<store::CancelToken> cancel) {
      return connectEndpoint(
          opts, std::move(cancel), heartbeatTimeout(opts), heartbeatTimeout(opts),
          {"heartbeat", opts.keepAliveInterval, "ddprun/" + opts.runId + "/hb/"}, via);
    };
    return std::make_unique<HeartbeatLiveness>(h, std::move(connect),
                                               "ddprun/" + opts.runId + "/hb/", self);
  };
  bindHostedStores(b, hosted);
  return b;
}

}  // namespace detail

std::unique_ptr<Rendezvous> makeDynamicRendezvous(const DynamicOptions& opts,
                                                  Rendezvous::Post post) {
  detail::validate(opts);  // before binding anything
  DynamicOptions resolved = opts;
  auto backend = detail::makeDynamicTcpBackend(resolved);
  return detail::makeDynamicRendezvous(resolved, std::move(post), std::move(backend));
}

}  // namespace ddprun::rendezvous
