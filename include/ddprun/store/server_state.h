// The store server's logic without sockets: key-value map, queues, blocked
// waiters and the per-connection byte stream state machine.
//
// The network layer (TcpStoreServer) calls open(), receive() and closed() and
// delivers what the state writes into each connection's Outbox buffer. Tests
// drive the same object with plain byte strings. Not thread-safe: one thread
// owns it (the server's io_context thread).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ddprun/store/wire.h"

namespace ddprun::store {

using ConnId = uint64_t;

// Every byte the server holds on a client's behalf is reserved against
// maxMemoryBytes before it is allocated: stored keys/values/queue entries,
// the partial request being received, input held back by backpressure,
// unsent replies and notifications, WAIT and WATCH_KEY registrations. A
// client whose request cannot be reserved is closed; the server is not.
// The arithmetic of the defaults is in docs/store.md.
struct ServerLimits {
  wire::Limits wire;
  size_t maxMemoryBytes = 1024ull * 1024 * 1024;
  size_t maxConnections = 16384;
  // Per connection: while more output than this waits for a client, its
  // further requests are not processed (checked after every request).
  size_t maxUnsentBytes = 4 * 1024 * 1024;
  // One reply (GET, MULTI_GET, LIST_KEYS, QUEUE_POP, a notification). A
  // request whose reply would be larger closes its client. Output waiting
  // for a connection never exceeds maxUnsentBytes + maxReplyBytes: a
  // watcher or waiter pushed past that is closed.
  size_t maxReplyBytes = 128 * 1024 * 1024;
  size_t maxWaitKeys = 128 * 1024;  // keys one connection may WAIT on at once
  size_t maxWatchKeys = 4096;       // WATCH_KEY registrations per connection
};

// How a connection ended, as far as the server can tell. kClosed: its peer
// closed it (a FIN: the process exited, or died and the kernel closed its
// sockets). kReset: anything else (an RST from the network, a middlebox or
// `ss -K`, a failed read or write, or the server closing it): the process at
// the other end may well be alive and connect again.
enum class ConnEnd { kClosed, kReset };

// The value of a lease's tombstone: how its connection ended ("closed" or
// "reset"; see LeaseRule).
const char* tombstoneValue(ConnEnd how);

// Where replies go. bufferFor(id) returns the output buffer of a live
// connection; the server flushes it after receive() returns and reports the
// bytes it wrote with ServerState::sent().
class Outbox {
 public:
  virtual ~Outbox() = default;
  virtual std::string& bufferFor(ConnId id) = 0;
  // Another connection than the one being served broke a cap (a watcher or
  // waiter that does not read); the network layer closes it after the
  // current call returns. Its output is no longer written.
  virtual void closeLater(ConnId id, const std::string& why) {
    (void)id;
    (void)why;
  }
  // Whether the peer of a live connection has already closed its end (the
  // kernel holds its FIN or RST, not yet read). Asked only for lease owners
  // (LeaseRule); the default knows nothing.
  virtual bool peerClosed(ConnId id) {
    (void)id;
    return false;
  }
  // How a connection for which peerClosed() is true ended (see ConnEnd).
  virtual ConnEnd peerEnd(ConnId id) {
    (void)id;
    return ConnEnd::kClosed;
  }
};

// Keys bound to the connection that set them (an etcd lease, a ZooKeeper
// ephemeral node): a key under `prefix` belongs to the connection that last
// SET it (SET, MULTI_SET, or a COMPARE_SET that wrote it). When that
// connection closes, the key is deleted (watchers hear KEY_DELETED) and the
// key `tombstonePrefix` + <the rest of its name> is set to how it ended
// (tombstoneValue: "closed" or "reset") in the same step, waking whoever
// waits for it; then `onEnded(<the rest>, how)` runs, on the server's thread
// (it must neither block nor throw). An explicit DELETE_KEY ends nothing.
//
// A tombstone describes the end of one connection, not of the node: it is
// deleted (watchers hear KEY_DELETED) as soon as a connection takes the key
// again (the node beats on a new connection after a reset), so that it exists
// only while no connection owns the key. Clients may not write under a
// tombstone prefix: SET, COMPARE_SET, ADD, APPEND, MULTI_SET, DELETE_KEY,
// QUEUE_PUSH, QUEUE_POP and BARRIER of such a key close the connection.
//
// So that a reader never sees a process alive after something it caused
// could reveal its death: before a GET, CHECK, WAIT or MULTI_GET of a
// tombstone key is served, the owner of the matching lease is asked
// Outbox::peerClosed(), and a closed one is ended first. (A process killed
// closes its sockets before its children get their parent-death signal, so
// the FIN is in the server's socket before any of its consequences can
// reach another client.)
struct LeaseRule {
  std::string prefix;
  std::string tombstonePrefix;
  std::function<void(const std::string& name, ConnEnd how)> onEnded;
};

// Shared-secret authentication of connections (the exchange is in auth.h).
// With a secret, a new connection may send only VALIDATE, PING (PyTorch's
// handshake) and the exchange, at most 8 requests
// of at most a few hundred bytes each; anything else closes it. Without one
// (the default) every connection is served at once, as in PyTorch.
struct ServerAuth {
  std::string secret;
  // A fresh nonce per connection; auth::newNonce() when empty (tests inject).
  std::function<std::string()> nonce;
};

struct ServerStats {
  uint64_t requests = 0;
  uint64_t connectionsRejected = 0;  // closed for a protocol or limit error
  size_t keys = 0;
  size_t memoryBytes = 0;    // everything reserved against maxMemoryBytes
  uint64_t bytesParsed = 0;  // request bytes parsed, each once
};

class ServerState {
 public:
  ServerState(ServerLimits limits, Outbox& outbox, ServerAuth auth = {});
  ~ServerState();
  ServerState(const ServerState&) = delete;
  ServerState& operator=(const ServerState&) = delete;

  void open(ConnId id);
  // Feeds bytes received on a connection. Returns an empty string while the
  // connection is healthy, or why it must be closed (protocol error, limit).
  // Requests are processed until the connection's unsent output exceeds
  // maxUnsentBytes; the rest is held (and charged) until resume().
  std::string receive(ConnId id, std::string_view bytes);
  // True while the connection's unsent output is over maxUnsentBytes: the
  // network layer should stop reading it until sent() drains it.
  bool paused(ConnId id) const;
  // Processes input held back by backpressure; same result as receive().
  std::string resume(ConnId id);
  // The network layer handed `bytes` of the connection's output to the OS.
  void sent(ConnId id, size_t bytes);
  // The connection has begun a request that has not fully arrived.
  bool partial(ConnId id) const;
  // The connection is gone: drop its waiters, registrations and buffers.
  // `inFlight` bytes of its output are still held by a write in progress:
  // they stay charged to the budget until releaseInFlight() (the memory is
  // only freed when that write ends), so a storm of closing slow readers
  // cannot hand the same budget out twice. `how` it ended goes to the
  // tombstones of the leases it held (LeaseRule).
  void closed(ConnId id, size_t inFlight = 0, ConnEnd how = ConnEnd::kClosed);
  // The write of a closed connection ended: its `inFlight` bytes are freed.
  void releaseInFlight(size_t bytes);

  // Adds a lease rule (see LeaseRule). Prefixes of different rules must not
  // overlap.
  void addLeaseRule(LeaseRule rule);

  ServerStats stats() const;
  const ServerLimits& limits() const { return limits_; }
  // False while a connection of a server with a secret has not proved it
  // knows it (true for every connection of an open server).
  bool authenticated(ConnId id) const;
  // The dialect a connection settled on, if it has sent enough to tell.
  std::optional<wire::Dialect> dialectOf(ConnId id) const;
  // Deletes every key and queue whose name does not begin with `keep`, each
  // as DELETE_KEY would (its watchers are told; blocked waiters wait on) and
  // returns how many went. For the program hosting the server, to hand one
  // store to a new generation of clients with a clean keyspace (the static
  // rendezvous's agent store, which each round's workers share).
  size_t eraseKeysOutside(std::string_view keep);
  // The same for every key and queue whose name begins with one of
  // `prefixes` (an owner erasing only what its own clients wrote).
  size_t eraseKeysUnder(const std::vector<std::string>& prefixes);

 private:
  size_t eraseIf(const std::function<bool(const std::string&)>& doomed);
  struct Conn;
  std::string process(Conn& c, std::string_view data, size_t& used);
  std::string feed(Conn& c, std::string_view data, size_t& used);
  std::string hold(Conn& c, std::string_view rest);
  std::string execute(Conn& c, wire::Request& r);
  std::string authStep(Conn& c, wire::Request& r);
  std::string authProof(Conn& c, const wire::Request& r);
  const wire::Limits& wireLimits(const Conn& c) const;
  std::string* reply(Conn& c, size_t bytes, std::string& error);
  template <typename Write>
  std::string put(Conn& c, size_t bytes, Write&& write);
  bool pushTo(Conn& w, size_t bytes);
  void doom(Conn& w, const std::string& why);
  std::string doSet(const std::string& key, std::string value);
  std::string doAdd(Conn& c, const std::string& key, int64_t delta, int64_t& out);
  std::string doWait(Conn& c, const std::vector<std::string>& keys);
  std::string doWatch(Conn& c, const std::string& key);
  std::string doCompareSet(Conn& c, wire::Request& r);
  std::string doQueuePop(Conn& c, const std::string& key);
  std::string doMultiGet(Conn& c, const std::vector<std::string>& keys);
  std::string doListKeys(Conn& c);
  std::string doBarrier(Conn& c, const std::string& key, int64_t worldSize);
  bool present(const std::string& key) const;
  void wake(const std::string& key, bool onlyOne = false);
  void cancelWaits(Conn& c);
  void notifyWatchers(const std::string& key, uint8_t type,
                      std::string_view oldValue, std::string_view newValue);
  bool reserve(size_t bytes, std::string& error);
  void release(size_t bytes);
  // Leases (server_leases.cc).
  const LeaseRule* leaseRuleOf(const std::string& key) const;
  std::string bindLease(Conn& c, const std::string& key);
  void forgetLease(const std::string& key);
  const LeaseRule* tombstoneRuleOf(const std::string& key) const;
  std::string refuseTombstoneWrite(const wire::Request& r) const;
  // Deletes a key as DELETE_KEY does (its watchers are told); false if absent.
  bool eraseKey(const std::string& key);
  void endLeases(Conn& c, ConnEnd how);
  void probeTombstones(const Conn& reader, const std::vector<std::string>& keys);

  ServerLimits limits_;
  Outbox& outbox_;
  ServerAuth auth_;
  std::unordered_map<ConnId, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, std::string> kv_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, std::vector<ConnId>> waiters_;
  std::unordered_map<std::string, std::vector<ConnId>> watchers_;
  std::vector<LeaseRule> leaseRules_;
  std::unordered_map<std::string, ConnId> leaseOwner_;  // leased key -> its owner
  size_t memory_ = 0;
  uint64_t requests_ = 0;
  uint64_t rejected_ = 0;
  uint64_t parsed_ = 0;  // request bytes parsed, all connections, ever
};

}  // namespace ddprun::store
