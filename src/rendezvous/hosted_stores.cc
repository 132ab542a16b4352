#include "hosted_stores.h"

namespace ddprun::rendezvous::detail {

uint16_t HostedStores::hostRendezvousStore(const std::string& bindHost, uint16_t port,
                                           const std::string& role, const std::string& fix,
                                           const std::string& secret,
                                           const std::string& runId,
                                           bool nameHolder) {
  // Keys on the wire carry a leading "/": TcpStore sends them as PyTorch's
  // client does.
  const std::string job = "/ddprun/" + runId + "/";
  store::LeaseRule departures{job + "hb/", job + "gone/",
                              [relay = relay_](const std::string& name, store::ConnEnd how) {
                                std::lock_guard lock(relay->mu);
                                if (relay->onGone) relay->onGone(name, how);
                              }};
  rendezvous_ =
      hostStore(bindHost, port, role, fix, secret, {std::move(departures)}, nameHolder);
  return rendezvous_->port();
}

uint16_t HostedStores::startWorkerStore() {
  worker_.reset();
  worker_ = hostStore("", 0, "the round's worker store", "");
  return worker_->port();
}

void HostedStores::watchDepartures(OnGone onGone) {
  std::lock_guard lock(relay_->mu);
  relay_->onGone = std::move(onGone);
}

void HostedStores::stop() {
  {
    std::lock_guard lock(relay_->mu);
    relay_->onGone = nullptr;
  }
  worker_.reset();
  rendezvous_.reset();
}

}  // namespace ddprun::rendezvous::detail
