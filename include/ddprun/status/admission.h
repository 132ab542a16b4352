// Which connections the status endpoint holds, and which one it closes to
// make room: the admission and eviction policy of StatusServer (server.h),
// kept apart from sockets so that it is tested with a fake clock.
//
// The rule (docs/status.md): every new connection is admitted. When its
// address already holds maxPerAddress connections, that address's "worst"
// connection is closed first; when the endpoint holds maxConnections, the
// worst connection of the address holding the most is. Worst means, in this
// order: answered and lingering (the client has not closed yet), still
// sending its request (unfinished or idle), being answered; the oldest first
// among equals. A connection must deliver its whole request within
// headerDeadline of being accepted and be done within `deadline`; past that
// it is expired. So no client, however many connections it opens or however
// slowly it sends, keeps another client's new connection out: a liveness
// probe that sends its request at once is always read.
//
// Not thread-safe: the server's io thread is its only user. Ids are never
// reused; calls naming an id that is no longer held are ignored.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::status {

struct AdmissionLimits {
  size_t maxConnections = 512;  // held at a time, in all
  size_t maxPerAddress = 64;    // held at a time from one peer address
  std::chrono::milliseconds headerDeadline{2'000};  // accept -> whole request read
  std::chrono::milliseconds deadline{10'000};       // accept -> closed
};

// What the server does after accept(2) failed with errno `err`: accept again
// at once (the error was the connection's, e.g. ECONNABORTED), close a held
// connection to free a descriptor and accept again (EMFILE, ENFILE, ENOBUFS,
// ENOMEM; wait when none is held), or wait a little (anything else) so that
// a persistent error never spins the acceptor.
enum class AcceptAction { kAgain, kFreeDescriptor, kWait };
AcceptAction acceptAction(int err);

// maxConnections as configured, but at most a quarter of the process's
// descriptor limit (RLIMIT_NOFILE's soft limit) and at least 1, so that the
// endpoint never takes the descriptors the agent needs for its workers.
size_t connectionCapacity(size_t configured, uint64_t nofileSoftLimit);

class Admission {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Id = uint64_t;
  // What a connection is doing; also the eviction order (lingering first).
  enum class Phase { kLingering = 0, kReading = 1, kAnswering = 2 };

  // Preconditions: maxConnections >= 1, maxPerAddress >= 1,
  // headerDeadline <= deadline (InvalidArgument otherwise).
  explicit Admission(AdmissionLimits limits);

  struct Admitted {
    Id id;
    std::vector<Id> evicted;  // close these (no longer held) before serving `id`
  };
  // A connection accepted at `now` from `address`, reading its request.
  Admitted admit(const std::string& address, TimePoint now);
  // Its request is read: it is being answered (deadline: accept + deadline).
  void answering(Id id);
  // Its answer is written; it lingers until the client closes.
  void lingering(Id id);
  // It ended by itself.
  void closed(Id id);

  // The held connections whose deadline is <= now; no longer held.
  std::vector<Id> expired(TimePoint now);
  // When the next connection expires; nullopt when none is held.
  std::optional<TimePoint> nextDeadline() const;
  // The connection to close to free a descriptor (the worst of the address
  // holding the most); no longer held. nullopt when none is held.
  std::optional<Id> evictOne();

  size_t held() const { return conns_.size(); }
  size_t heldFrom(const std::string& address) const;
  std::optional<Phase> phase(Id id) const;
  const AdmissionLimits& limits() const { return limits_; }

 private:
  struct Conn {
    std::string address;
    TimePoint accepted;
    Phase phase;
  };
  struct Peer {
    std::array<std::set<Id>, 3> byPhase;  // ids ascend with age: begin() is the oldest
    size_t count = 0;
  };

  TimePoint deadlineOf(const Conn& c) const;
  void add(Id id, Conn c);
  void remove(Id id);
  void setPhase(Id id, Phase p);
  std::optional<Id> worstOf(const std::string& address) const;

  AdmissionLimits limits_;
  Id next_ = 1;
  std::map<Id, Conn> conns_;
  std::map<std::string, Peer> peers_;
  std::set<std::pair<size_t, std::string>> byCount_;  // (count, address)
  std::set<std::pair<TimePoint, Id>> deadlines_;
};

}  // namespace ddprun::status
