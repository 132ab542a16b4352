// Which connections the status endpoint holds, which one it closes to make
// room, and how many it may hold at all: the policy of StatusServer
// (server.h), kept apart from sockets so that it is tested with a fake clock
// and a fake view of the sockets.
//
// The rule (docs/status.md, "Limits"): a connection is closed unanswered
// only when it is past its deadline, or when it waits on its client and room
// is needed. "Waits on its client" is the server's own view of the socket
// (the WaitsOnClient callback): everything the client sent has been read and
// its request is still incomplete (idle, or half-sent). A connection whose
// request sits unread in the socket, or is being answered, is never closed
// for a newer one: the server owes it an answer.
//
// A connection from an address holding maxPerAddress active connections
// makes room by closing that address's worst connection: the oldest one
// that was answered and only lingers until its client closes, else the
// oldest one waiting on its client. When there is none, the newcomer waits
// (kWaiting, its request not read yet) behind the address's earlier waiting
// ones, first come first served, until promote() finds room for it. When
// the endpoint holds maxConnections, the address holding the most gives way
// by the same rule (the next one when it has nothing to give); when no
// address has, the newcomer is held over the limit, and the server stops
// accepting (overCapacity()) until a connection ends: the kernel's listen
// queue holds the next ones. So no client, however many connections it
// opens or however slowly it sends, keeps another client's new connection
// out for longer than its own connections' deadlines, and a request that
// arrived is answered.
//
// Deadlines, from the accept: the whole request within headerDeadline (a
// waiting connection too), closed within `deadline`.
//
// Not thread-safe: the server's io thread is its only user. Ids are never
// reused; calls naming an id that is no longer held are ignored.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ddprun::status {

struct AdmissionLimits {
  size_t maxConnections = 512;  // held at a time, in all
  size_t maxPerAddress = 64;    // held at a time from one address, waiting ones aside
  std::chrono::milliseconds headerDeadline{2'000};  // accept -> whole request read
  std::chrono::milliseconds deadline{10'000};       // accept -> closed
};

// What the server does after accept(2) failed with errno `err`: accept again
// at once (the error was the connection's, e.g. ECONNABORTED), close a held
// connection to free a descriptor and accept again (EMFILE, ENFILE, ENOBUFS,
// ENOMEM; wait when none can be closed), or wait a little (anything else) so
// that a persistent error never spins the acceptor.
enum class AcceptAction { kAgain, kFreeDescriptor, kWait };
AcceptAction acceptAction(int err);

// The endpoint's share of the process's descriptors. The agent needs, beyond
// what it holds when the endpoint starts (`open`), descriptors for what it
// opens later: the worker store's server and the rendezvous clients
// (kAgentLater), per local worker its output channels and log files
// (kPerWorker), per worker of the job a connection to a worker store this
// agent may host (kPerJobWorker; the agent hosting the store serves every
// node's workers), per node a rendezvous connection this agent may host
// (kPerNode), and while a worker starts its pipes (kStarting). What remains
// of the soft RLIMIT_NOFILE (at the endpoint's start; the store server may
// raise it to the hard limit later, which only leaves more) is the
// endpoint's, less one for the connection it accepts over its limit
// (Admission::overCapacity).
struct DescriptorNeeds {
  static constexpr uint64_t kAgentLater = 16;
  static constexpr uint64_t kPerWorker = 4;     // stdout + stderr channels, 2 log files
  static constexpr uint64_t kPerJobWorker = 2;  // store connections per worker
  static constexpr uint64_t kPerNode = 2;
  static constexpr uint64_t kStarting = 8;  // output pipes' write ends, /dev/null,
                                            // the keeper's pid pipe, the exec-error pipe

  uint64_t limit = 0;  // RLIMIT_NOFILE's soft limit (RLIM_INFINITY: a large number)
  uint64_t open = 0;   // descriptors open when the endpoint starts (its own included)
  uint64_t localWorkers = 1;  // --nproc-per-node
  uint64_t nodes = 1;         // the most nodes the job may have (--nnodes MAX)
};
// What the agent keeps for itself: open + everything it opens later.
uint64_t reservedDescriptors(const DescriptorNeeds& needs);
// maxConnections as configured, but no more than the endpoint's share of the
// descriptor limit, and at least 1 (the endpoint then answers one client at
// a time rather than none).
size_t connectionCapacity(size_t configured, const DescriptorNeeds& needs);

class Admission {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Id = uint64_t;
  // What a connection is doing. kWaiting: admitted, its request not read
  // yet (no room for its address); kReading: its request is being read;
  // kAnswering: read, its answer is being written; kLingering: answered,
  // until its client closes.
  enum class Phase { kLingering = 0, kReading = 1, kAnswering = 2, kWaiting = 3 };
  // True when the connection `id` (kReading) waits on its client: the server
  // has read every byte it sent and its request is incomplete.
  using WaitsOnClient = std::function<bool(Id)>;

  // Preconditions: maxConnections >= 1, maxPerAddress >= 1,
  // headerDeadline <= deadline (InvalidArgument otherwise).
  explicit Admission(AdmissionLimits limits);

  struct Admitted {
    Id id;
    bool read = true;         // read its request now; false: kWaiting until promoted
    std::vector<Id> evicted;  // close these (no longer held) first
  };
  // A connection accepted at `now` from `address`.
  Admitted admit(const std::string& address, TimePoint now, const WaitsOnClient& idle);

  struct Promoted {
    std::vector<Id> started;  // kWaiting -> kReading: read their requests now
    std::vector<Id> evicted;  // close these (no longer held)
  };
  // Gives waiting connections the room there is now, oldest first per
  // address. The server calls it when room may have appeared: a connection
  // ended, was answered or went idle.
  Promoted promote(const WaitsOnClient& idle);

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
  // A connection to close to free a descriptor, by the rule above (never
  // one the server owes an answer); no longer held. nullopt when none.
  std::optional<Id> evictOne(const WaitsOnClient& idle);

  // More connections held than maxConnections: accept none until one ends.
  bool overCapacity() const { return conns_.size() > limits_.maxConnections; }
  size_t held() const { return conns_.size(); }
  size_t heldFrom(const std::string& address) const;  // waiting ones included
  size_t waiting() const { return waiting_; }
  std::optional<Phase> phase(Id id) const;
  const AdmissionLimits& limits() const { return limits_; }

 private:
  struct Conn {
    std::string address;
    TimePoint accepted;
    Phase phase;
  };
  struct Peer {
    std::array<std::set<Id>, 4> byPhase;  // ids ascend with age: begin() is the oldest
    size_t count = 0;
    size_t active() const {
      return count - byPhase[static_cast<size_t>(Phase::kWaiting)].size();
    }
  };

  TimePoint deadlineOf(const Conn& c) const;
  void add(Id id, Conn c);
  void remove(Id id);
  void setPhase(Id id, Phase p);
  void evict(Id id, std::vector<Id>& out);
  std::optional<Id> victimOf(const std::string& address, const WaitsOnClient& idle) const;
  std::optional<Id> anyVictim(const WaitsOnClient& idle) const;
  size_t activeFrom(const std::string& address) const;

  AdmissionLimits limits_;
  Id next_ = 1;
  size_t waiting_ = 0;
  std::map<Id, Conn> conns_;
  std::map<std::string, Peer> peers_;
  std::set<std::pair<size_t, std::string>> byCount_;  // (count, address)
  std::set<std::pair<TimePoint, Id>> deadlines_;
  std::set<std::string> queued_;  // addresses with waiting connections
};

}  // namespace ddprun::status
