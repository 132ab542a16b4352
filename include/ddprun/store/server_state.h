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
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ddprun/store/wire.h"

namespace ddprun::store {

using ConnId = uint64_t;

struct ServerLimits {
  wire::Limits wire;
  size_t maxMemoryBytes = 1024ull * 1024 * 1024;  // keys + values + queues
  size_t maxConnections = 16384;
};

// Where replies go. bufferFor(id) returns the output buffer of a live
// connection; the server flushes it after receive() returns.
class Outbox {
 public:
  virtual ~Outbox() = default;
  virtual std::string& bufferFor(ConnId id) = 0;
};

struct ServerStats {
  uint64_t requests = 0;
  uint64_t connectionsRejected = 0;  // closed for a protocol or limit error
  size_t keys = 0;
  size_t memoryBytes = 0;
};

class ServerState {
 public:
  ServerState(ServerLimits limits, Outbox& outbox);
  ~ServerState();
  ServerState(const ServerState&) = delete;
  ServerState& operator=(const ServerState&) = delete;

  void open(ConnId id);
  // Feeds bytes received on a connection. Returns an empty string while the
  // connection is healthy, or why it must be closed (protocol error, limit).
  std::string receive(ConnId id, std::string_view bytes);
  // The connection is gone: drop its waiters and buffers.
  void closed(ConnId id);

  ServerStats stats() const;
  const ServerLimits& limits() const { return limits_; }
  // The dialect a connection settled on, if it has sent enough to tell.
  std::optional<wire::Dialect> dialectOf(ConnId id) const;

 private:
  struct Conn;
  std::string execute(Conn& c, wire::Request& r);
  std::string doSet(const std::string& key, std::string value);
  std::string doAdd(Conn& c, const std::string& key, int64_t delta, int64_t& out);
  void doWait(Conn& c, const std::vector<std::string>& keys);
  void doCompareSet(Conn& c, wire::Request& r);
  void doQueuePop(Conn& c, const std::string& key);
  void doBarrier(Conn& c, const std::string& key, int64_t worldSize);
  bool present(const std::string& key) const;
  void wake(const std::string& key, bool onlyOne = false);
  void cancelWaits(Conn& c);
  void notifyWatchers(const std::string& key, uint8_t type,
                      std::string_view oldValue, std::string_view newValue);
  bool reserve(size_t bytes, std::string& error);
  void release(size_t bytes);

  ServerLimits limits_;
  Outbox& outbox_;
  std::unordered_map<ConnId, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, std::string> kv_;
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  std::unordered_map<std::string, std::vector<ConnId>> waiters_;
  std::unordered_map<std::string, std::vector<ConnId>> watchers_;
  size_t memory_ = 0;
  uint64_t requests_ = 0;
  uint64_t rejected_ = 0;
};

}  // namespace ddprun::store
