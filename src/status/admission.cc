#include "ddprun/status/admission.h"

#include <algorithm>
#include <cerrno>

#include "ddprun/common/error.h"

namespace ddprun::status {

AcceptAction acceptAction(int err) {
  switch (err) {
    case EMFILE:
    case ENFILE:
    case ENOBUFS:
    case ENOMEM:
      return AcceptAction::kFreeDescriptor;
    // The connection's own trouble (accept(2): treat the network errors as
    // EAGAIN): the next one in the queue is fine.
    case ECONNABORTED:
    case EPROTO:
    case EPERM:
    case EINTR:
    case EAGAIN:
    case ENETDOWN:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case ENONET:
    case EHOSTUNREACH:
    case EOPNOTSUPP:
    case ENETUNREACH:
      return AcceptAction::kAgain;
    default:
      return AcceptAction::kWait;
  }
}

uint64_t reservedDescriptors(const DescriptorNeeds& n) {
  using D = DescriptorNeeds;
  return n.open + D::kAgentLater + n.localWorkers * D::kPerWorker +
         n.nodes * n.localWorkers * D::kPerJobWorker + n.nodes * D::kPerNode +
         D::kStarting;
}

size_t connectionCapacity(size_t configured, const DescriptorNeeds& needs) {
  const uint64_t reserved = reservedDescriptors(needs);
  const uint64_t share = needs.limit > reserved + 1 ? needs.limit - reserved - 1 : 0;
  return static_cast<size_t>(
      std::max<uint64_t>(1, std::min<uint64_t>(configured, share)));
}

Admission::Admission(AdmissionLimits limits) : limits_(limits) {
  DDPRUN_CHECK(limits_.maxConnections >= 1, "the status endpoint must hold a connection");
  DDPRUN_CHECK(limits_.maxPerAddress >= 1, "the status endpoint must hold a connection");
  DDPRUN_CHECK(limits_.headerDeadline <= limits_.deadline,
               "the request deadline cannot exceed the connection's");
}

Admission::TimePoint Admission::deadlineOf(const Conn& c) const {
  const bool unread = c.phase == Phase::kReading || c.phase == Phase::kWaiting;
  return c.accepted + (unread ? limits_.headerDeadline : limits_.deadline);
}

// Room for the whole endpoint first (the address holding the most gives
// way), then for the address; what cannot be made waits.
Admission::Admitted Admission::admit(const std::string& address, TimePoint now,
                                     const WaitsOnClient& idle) {
  Admitted out{next_++, true, {}};
  if (conns_.size() >= limits_.maxConnections)
    if (auto victim = anyVictim(idle)) evict(*victim, out.evicted);
  const bool queued = queued_.count(address) > 0;  // first come, first served
  if (!queued && activeFrom(address) >= limits_.maxPerAddress)
    if (auto victim = victimOf(address, idle)) evict(*victim, out.evicted);
  out.read = !queued && activeFrom(address) < limits_.maxPerAddress;
  add(out.id, Conn{address, now, out.read ? Phase::kReading : Phase::kWaiting});
  return out;
}

Admission::Promoted Admission::promote(const WaitsOnClient& idle) {
  Promoted out;
  const std::vector<std::string> addresses(queued_.begin(), queued_.end());
  for (const auto& address : addresses) {
    for (;;) {
      auto it = peers_.find(address);
      if (it == peers_.end()) break;
      const auto& waiting = it->second.byPhase[static_cast<size_t>(Phase::kWaiting)];
      if (waiting.empty()) break;
      const Id next = *waiting.begin();
      if (it->second.active() >= limits_.maxPerAddress) {
        auto victim = victimOf(address, idle);
        if (!victim) break;
        evict(*victim, out.evicted);
      }
      setPhase(next, Phase::kReading);
      out.started.push_back(next);
    }
  }
  return out;
}

void Admission::answering(Id id) { setPhase(id, Phase::kAnswering); }
void Admission::lingering(Id id) { setPhase(id, Phase::kLingering); }
void Admission::closed(Id id) { remove(id); }

std::vector<Admission::Id> Admission::expired(TimePoint now) {
  std::vector<Id> out;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    out.push_back(deadlines_.begin()->second);
    remove(out.back());
  }
  return out;
}

std::optional<Admission::TimePoint> Admission::nextDeadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

std::optional<Admission::Id> Admission::evictOne(const WaitsOnClient& idle) {
  const auto victim = anyVictim(idle);
  if (victim) remove(*victim);
  return victim;
}

size_t Admission::heldFrom(const std::string& address) const {
  auto it = peers_.find(address);
  return it == peers_.end() ? 0 : it->second.count;
}

size_t Admission::activeFrom(const std::string& address) const {
  auto it = peers_.find(address);
  return it == peers_.end() ? 0 : it->second.active();
}

std::optional<Admission::Phase> Admission::phase(Id id) const {
  auto it = conns_.find(id);
  if (it == conns_.end()) return std::nullopt;
  return it->second.phase;
}

// The oldest lingering connection, else the oldest one waiting on its
// client; never one being answered, waiting, or with its request unread.
std::optional<Admission::Id> Admission::victimOf(const std::string& address,
                                                 const WaitsOnClient& idle) const {
  auto it = peers_.find(address);
  if (it == peers_.end()) return std::nullopt;
  const auto& byPhase = it->second.byPhase;
  const auto& lingering = byPhase[static_cast<size_t>(Phase::kLingering)];
  if (!lingering.empty()) return *lingering.begin();
  for (Id id : byPhase[static_cast<size_t>(Phase::kReading)])
    if (idle(id)) return id;
  return std::nullopt;
}

// From the address holding the most; the next one when it has nothing to give.
std::optional<Admission::Id> Admission::anyVictim(const WaitsOnClient& idle) const {
  for (auto it = byCount_.rbegin(); it != byCount_.rend(); ++it)
    if (auto victim = victimOf(it->second, idle)) return victim;
  return std::nullopt;
}

void Admission::evict(Id id, std::vector<Id>& out) {
  remove(id);
  out.push_back(id);
}

void Admission::add(Id id, Conn c) {
  Peer& peer = peers_[c.address];
  byCount_.erase({peer.count, c.address});
  ++peer.count;
  byCount_.insert({peer.count, c.address});
  peer.byPhase[static_cast<size_t>(c.phase)].insert(id);
  if (c.phase == Phase::kWaiting) {
    ++waiting_;
    queued_.insert(c.address);
  }
  deadlines_.insert({deadlineOf(c), id});
  conns_.emplace(id, std::move(c));
}

void Admission::remove(Id id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  const Conn& c = it->second;
  deadlines_.erase({deadlineOf(c), id});
  auto peer = peers_.find(c.address);
  auto& ids = peer->second.byPhase[static_cast<size_t>(c.phase)];
  ids.erase(id);
  if (c.phase == Phase::kWaiting) {
    --waiting_;
    if (ids.empty()) queued_.erase(c.address);
  }
  byCount_.erase({peer->second.count, c.address});
  if (--peer->second.count == 0)
    peers_.erase(peer);
  else
    byCount_.insert({peer->second.count, c.address});
  conns_.erase(it);
}

void Admission::setPhase(Id id, Phase p) {
  auto it = conns_.find(id);
  if (it == conns_.end() || it->second.phase == p) return;
  Conn c = it->second;
  remove(id);
  c.phase = p;
  add(id, std::move(c));
}

}  // namespace ddprun::status
