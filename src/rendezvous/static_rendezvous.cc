#include "ddprun/rendezvous/static_rendezvous.h"

#include "ddprun/common/error.h"
#include "ddprun/common/log.h"

namespace ddprun::rendezvous {

store::TcpStoreOptions StaticRendezvous::clientOptions() const {
  store::TcpStoreOptions o;
  o.host = opts_.masterAddr;
  o.port = opts_.masterPort;
  o.timeout = opts_.timeout;
  o.connectTimeout = opts_.timeout;
  return o;
}

std::unique_ptr<StaticRendezvous> StaticRendezvous::create(const StaticOptions& opts) {
  DDPRUN_CHECK(opts.nodeRank >= 0 && opts.nodeRank < opts.nnodes, "--node-rank ", opts.nodeRank,
               " must be between 0 and --nnodes - 1 = ", opts.nnodes - 1);
  std::unique_ptr<StaticRendezvous> r(new StaticRendezvous(opts));
  if (opts.nodeRank == 0) {
    store::TcpStoreServerOptions so;
    so.port = opts.masterPort;
    r->agentStore_ = store::TcpStoreServer::start(so);
  }
  r->client_ = store::TcpStore::connect(r->clientOptions());
  return r;
}

std::string StaticRendezvous::key(int round, const std::string& name) const {
  return "ddprun/" + opts_.runId + "/round/" + std::to_string(round) + "/" + name;
}

RoundInfo StaticRendezvous::join(int round, int localWorldSize) {
  client_->set(key(round, "node/" + std::to_string(opts_.nodeRank)),
               std::to_string(localWorldSize));
  std::vector<std::string> keys;
  for (int i = 0; i < opts_.nnodes; ++i) keys.push_back(key(round, "node/" + std::to_string(i)));
  try {
    client_->wait(keys, opts_.timeout);
  } catch (const TimeoutError&) {
    DDPRUN_THROW(TimeoutError, "rendezvous round ", round, ": not every one of the ",
                 opts_.nnodes, " nodes joined within ", opts_.timeout.count() / 1000,
                 " s (store at ", client_->address(), "); check --nnodes and that every node ",
                 "was started with the same --master-addr/--master-port/--rdzv-id");
  }
  auto sizes = client_->multiGet(keys);
  RoundInfo info;
  info.groupRank = opts_.nodeRank;
  info.groupWorldSize = opts_.nnodes;
  for (int i = 0; i < opts_.nnodes; ++i) {
    int n = std::stoi(sizes[i]);
    if (i < opts_.nodeRank) info.baseRank += n;
    info.worldSize += n;
  }
  if (opts_.nodeRank == 0) {
    workerStore_.reset();  // a fresh keyspace for every round
    workerStore_ = store::TcpStoreServer::start({});
    client_->set(key(round, "worker_store"), std::to_string(workerStore_->port()));
  }
  info.workerStoreHost = opts_.masterAddr;
  info.workerStorePort = static_cast<uint16_t>(std::stoi(client_->get(key(round, "worker_store"))));
  return info;
}

void StaticRendezvous::announceEnd(int round, const std::string& kind, const std::string& why) {
  client_->compareSet(key(round, "end"), "",
                      kind + ":" + std::to_string(opts_.nodeRank) + ":" + why);
}

void StaticRendezvous::announceSuccess(int round) {
  if (client_->add(key(round, "done"), 1) == opts_.nnodes)
    client_->compareSet(key(round, "end"), "", "finished");
}

std::string StaticRendezvous::waitEnd(int round) const {
  auto c = store::TcpStore::connect(clientOptions());
  return c->get(key(round, "end"));
}

}  // namespace ddprun::rendezvous
