#include "fold_lease.h"

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"
#include "node_lease.h"

namespace ddprun::rendezvous::detail {
namespace {

// The expiry in "<id> <ms>"; 0 for "" or anything else (free: a value no
// node of ours wrote must not hold the job up).
int64_t expiryOf(const std::string& value) {
  const auto space = value.rfind(' ');
  int64_t ms = 0;
  if (space == std::string::npos ||
      !str::parseInt(value.substr(space + 1), ms, int64_t{0}, INT64_MAX / 4))
    return 0;
  return ms;
}

}  // namespace

bool FoldLease::acquire(int64_t nowMs) {
  if (held()) return renew(nowMs);
  const std::string seen = peekValue(store_, key_);  // "" when missing
  expires_ = expiryOf(seen);
  if (expires_ > nowMs) return false;
  const std::string next = me_ + " " + std::to_string(nowMs + leaseMs_);
  const std::string got = store_.compareSet(key_, seen, next);
  if (got != next) {
    expires_ = expiryOf(got);
    return false;
  }
  mine_ = next;
  expires_ = nowMs + leaseMs_;
  return true;
}

bool FoldLease::renew(int64_t nowMs) {
  if (!held()) return false;
  const std::string next = me_ + " " + std::to_string(nowMs + leaseMs_);
  const std::string got = store_.compareSet(key_, mine_, next);
  if (got != next) {
    mine_.clear();
    expires_ = expiryOf(got);
    return false;
  }
  mine_ = next;
  expires_ = nowMs + leaseMs_;
  return true;
}

void FoldLease::release(store::Store* via) {
  if (!held()) return;
  const std::string mine = std::move(mine_);
  mine_.clear();
  expires_ = 0;
  try {
    (via ? *via : store_).compareSet(key_, mine, "");
  } catch (const Error&) {  // it expires anyway
  }
}

}  // namespace ddprun::rendezvous::detail
