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

size_t connectionCapacity(size_t configured, uint64_t nofileSoftLimit) {
  const uint64_t quarter = nofileSoftLimit / 4;
  return std::max<size_t>(1, std::min<uint64_t>(configured, quarter));
}

Admission::Admission(AdmissionLimits limits) : limits_(limits) {
  DDPRUN_CHECK(limits_.maxConnections >= 1, "the status endpoint must hold a connection");
  DDPRUN_CHECK(limits_.maxPerAddress >= 1, "the status endpoint must hold a connection");
  DDPRUN_CHECK(limits_.headerDeadline <= limits_.deadline,
               "the request deadline cannot exceed the connection's");
}

Admission::TimePoint Admission::deadlineOf(const Conn& c) const {
  return c.accepted +
         (c.phase == Phase::kReading ? limits_.headerDeadline : limits_.deadline);
}

Admission::Admitted Admission::admit(const std::string& address, TimePoint now) {
  Admitted out{next_++, {}};
  while (heldFrom(address) >= limits_.maxPerAddress) {
    const Id victim = *worstOf(address);
    remove(victim);
    out.evicted.push_back(victim);
  }
  while (conns_.size() >= limits_.maxConnections) out.evicted.push_back(*evictOne());
  add(out.id, Conn{address, now, Phase::kReading});
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

std::optional<Admission::Id> Admission::evictOne() {
  if (byCount_.empty()) return std::nullopt;
  const auto id = worstOf(byCount_.rbegin()->second);
  remove(*id);
  return id;
}

size_t Admission::heldFrom(const std::string& address) const {
  auto it = peers_.find(address);
  return it == peers_.end() ? 0 : it->second.count;
}

std::optional<Admission::Phase> Admission::phase(Id id) const {
  auto it = conns_.find(id);
  if (it == conns_.end()) return std::nullopt;
  return it->second.phase;
}

std::optional<Admission::Id> Admission::worstOf(const std::string& address) const {
  auto it = peers_.find(address);
  if (it == peers_.end()) return std::nullopt;
  for (const auto& ids : it->second.byPhase)
    if (!ids.empty()) return *ids.begin();
  return std::nullopt;
}

void Admission::add(Id id, Conn c) {
  Peer& peer = peers_[c.address];
  byCount_.erase({peer.count, c.address});
  ++peer.count;
  byCount_.insert({peer.count, c.address});
  peer.byPhase[static_cast<size_t>(c.phase)].insert(id);
  deadlines_.insert({deadlineOf(c), id});
  conns_.emplace(id, std::move(c));
}

void Admission::remove(Id id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  const Conn& c = it->second;
  deadlines_.erase({deadlineOf(c), id});
  auto peer = peers_.find(c.address);
  peer->second.byPhase[static_cast<size_t>(c.phase)].erase(id);
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
