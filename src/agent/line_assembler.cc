#include "line_assembler.h"

#include <cstring>

namespace ddprun::agent::detail {

void LineAssembler::feed(std::string_view data, Clock::time_point now, std::string& out) {
  if (data.empty()) return;
  const void* last = ::memrchr(data.data(), '\n', data.size());
  if (last != nullptr) {
    const size_t lines = static_cast<const char*>(last) - data.data() + 1;
    out.append(held_).append(data.substr(0, lines));
    held_.clear();
    data.remove_prefix(lines);
  }
  if (data.empty()) return;
  if (held_.empty()) heldSince_ = now;
  held_.append(data);
  if (held_.size() >= max_) flushAll(out);
}

bool LineAssembler::flushDue(Clock::time_point now, std::string& out) {
  if (held_.empty() || heldSince_ + delay_ > now) return false;
  flushAll(out);
  return true;
}

void LineAssembler::flushAll(std::string& out) {
  out.append(held_);
  held_.clear();
  if (held_.capacity() > 2 * max_) held_.shrink_to_fit();
}

std::optional<LineAssembler::Clock::time_point> LineAssembler::deadline() const {
  if (held_.empty()) return std::nullopt;
  return heldSince_ + delay_;
}

}  // namespace ddprun::agent::detail
