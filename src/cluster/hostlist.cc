// Expansion of Slurm host lists. Algorithm:
//  1. Split the list at the commas that are outside brackets (a comma inside
//     a bracket separates its ranges).
//  2. Parse each entry into pieces: literal text and brackets; a bracket is a
//     list of ranges [lo, hi] with the width of lo's digits.
//  3. Count the names the entry yields (the product of the brackets' sizes)
//     and the bytes of its longest name (its text plus each bracket's widest
//     number); check the name against kMaxHostNameBytes and the running
//     totals (names, and names x longest bytes) against kMaxHosts and
//     kMaxHostListBytes before anything is built.
//  4. Emit the names as an odometer over the brackets, the last bracket
//     turning fastest.
#include "ddprun/cluster/hostlist.h"

#include <algorithm>
#include <cstdint>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"

namespace ddprun::cluster {

namespace {

struct Range {
  uint64_t lo = 0;
  uint64_t hi = 0;
  size_t width = 0;  // digits of the lower bound as written (zero padding)
  uint64_t size() const { return hi - lo + 1; }
  // The most digits a number of this range is written with.
  size_t maxDigits() const { return std::max(width, std::to_string(hi).size()); }
};

// A piece of an entry: literal text, or a bracket of ranges.
struct Piece {
  std::string text;
  std::vector<Range> ranges;  // empty: literal text
  // Saturates just above kMaxHosts: a count past the limit is only an error.
  uint64_t size() const {
    uint64_t n = 0;
    for (const auto& r : ranges) n = std::min<uint64_t>(n + r.size(), kMaxHosts + 1);
    return n;
  }
  // The bytes this piece adds to the longest name it is part of.
  size_t maxBytes() const {
    size_t n = text.size();
    for (const auto& r : ranges) n = std::max(n, r.maxDigits());
    return n;
  }
};

[[noreturn]] void malformed(std::string_view entry, const std::string& why) {
  DDPRUN_THROW(InvalidArgument, "host list entry '", str::escape(entry), "': ", why);
}

// Digits only (no sign, no space: str::parseInt would take "+1"); 18 digits
// always fit, more is no host number anyone uses.
uint64_t number(std::string_view entry, std::string_view digits) {
  int64_t v = -1;
  if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string_view::npos ||
      !str::parseInt(digits, v, 0))
    malformed(entry, "'" + std::string(digits) + "' in brackets is not a number");
  return static_cast<uint64_t>(v);
}

// "01-03,7" -> {[1,3] width 2, [7,7] width 1}
std::vector<Range> parseBracket(std::string_view entry, std::string_view body) {
  if (str::trim(body).empty()) malformed(entry, "empty brackets");
  std::vector<Range> out;
  for (const std::string& part : str::split(body, ',')) {
    std::string p = str::trim(part);
    if (p.empty()) malformed(entry, "an empty range in brackets");
    Range r;
    auto dash = p.find('-');
    std::string_view loText = std::string_view(p).substr(0, dash);
    r.lo = number(entry, loText);
    r.width = loText.size();
    r.hi = dash == std::string::npos ? r.lo
                                     : number(entry, std::string_view(p).substr(dash + 1));
    if (r.hi < r.lo) malformed(entry, "range '" + p + "' goes down");
    out.push_back(r);
  }
  return out;
}

std::vector<Piece> parseEntry(std::string_view entry) {
  std::vector<Piece> pieces;
  size_t i = 0;
  while (i < entry.size()) {
    size_t open = entry.find_first_of("[]", i);
    if (open == std::string_view::npos) {
      pieces.push_back(Piece{std::string(entry.substr(i)), {}});
      break;
    }
    if (entry[open] == ']') malformed(entry, "']' without '['");
    if (open > i) pieces.push_back(Piece{std::string(entry.substr(i, open - i)), {}});
    size_t close = entry.find_first_of("[]", open + 1);
    if (close == std::string_view::npos || entry[close] != ']')
      malformed(entry, close == std::string_view::npos ? "'[' without ']'"
                                                       : "brackets inside brackets");
    pieces.push_back(Piece{"", parseBracket(entry, entry.substr(open + 1, close - open - 1))});
    i = close + 1;
  }
  return pieces;
}

std::string formatNumber(uint64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// The names of one parsed entry, appended to `out`.
void emit(const std::vector<Piece>& pieces, std::vector<std::string>& out) {
  // Per bracket: which range and which number in it (the odometer).
  std::vector<size_t> rangeAt(pieces.size(), 0);
  std::vector<uint64_t> valueAt(pieces.size(), 0);
  for (size_t p = 0; p < pieces.size(); ++p)
    if (!pieces[p].ranges.empty()) valueAt[p] = pieces[p].ranges[0].lo;
  for (;;) {
    std::string name;
    for (size_t p = 0; p < pieces.size(); ++p) {
      const Piece& pc = pieces[p];
      name += pc.ranges.empty() ? pc.text : formatNumber(valueAt[p], pc.ranges[rangeAt[p]].width);
    }
    out.push_back(std::move(name));
    // Advance the last bracket; carry into the ones before it.
    size_t p = pieces.size();
    for (;;) {
      if (p == 0) return;
      --p;
      const Piece& pc = pieces[p];
      if (pc.ranges.empty()) continue;
      if (valueAt[p] < pc.ranges[rangeAt[p]].hi) {
        ++valueAt[p];
        break;
      }
      if (rangeAt[p] + 1 < pc.ranges.size()) {
        valueAt[p] = pc.ranges[++rangeAt[p]].lo;
        break;
      }
      rangeAt[p] = 0;
      valueAt[p] = pc.ranges[0].lo;
    }
  }
}

// The list's entries: split at commas outside brackets, trimmed, empty ones
// skipped.
std::vector<std::string> entries(std::string_view list) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (i == list.size() || (list[i] == ',' && depth <= 0)) {
      std::string e = str::trim(list.substr(start, i - start));
      if (!e.empty()) out.push_back(std::move(e));
      start = i + 1;
    }
  }
  return out;
}

// How many names an entry yields, saturated just above kMaxHosts.
uint64_t nameCount(const std::vector<Piece>& pieces) {
  uint64_t n = 1;
  for (const auto& pc : pieces) {
    if (pc.ranges.empty()) continue;
    uint64_t s = pc.size();
    if (s > kMaxHosts || n * s > kMaxHosts) n = kMaxHosts + 1;
    else n *= s;
  }
  return n;
}

// The bytes of the entry's longest name, refused above kMaxHostNameBytes.
size_t longestName(std::string_view entry, const std::vector<Piece>& pieces) {
  size_t bytes = 0;
  for (const auto& pc : pieces) bytes += pc.maxBytes();
  if (bytes > kMaxHostNameBytes)
    malformed(entry, "a host name of " + std::to_string(bytes) + " bytes; host names have at most " +
                         std::to_string(kMaxHostNameBytes));
  return bytes;
}

[[noreturn]] void tooLarge(std::string_view list, const std::string& what) {
  DDPRUN_THROW(InvalidArgument, "host list '", str::escape(list), "' ", what);
}

}  // namespace

std::vector<std::string> expandHostList(std::string_view list) {
  std::vector<std::vector<Piece>> parsed;
  uint64_t total = 0;
  uint64_t bytes = 0;
  for (const std::string& e : entries(list)) {
    if (e.find_first_of(" \t\r\n") != std::string_view::npos)
      malformed(e, "a space inside a host name");
    auto pieces = parseEntry(e);
    const uint64_t n = nameCount(pieces);
    total += n;
    if (total > kMaxHosts) tooLarge(list, "names more than " + std::to_string(kMaxHosts) + " hosts");
    // n <= kMaxHosts and a name <= kMaxHostNameBytes: no overflow.
    bytes += n * longestName(e, pieces);
    if (bytes > kMaxHostListBytes)
      tooLarge(list, "expands to more than " + std::to_string(kMaxHostListBytes) +
                         " bytes of host names");
    parsed.push_back(std::move(pieces));
  }
  if (parsed.empty()) tooLarge(list, "names no host");
  std::vector<std::string> out;
  out.reserve(total);
  for (const auto& pieces : parsed) emit(pieces, out);
  return out;
}

}  // namespace ddprun::cluster
