#include "ddprun/store/wire.h"

#include <array>
#include <cstring>

#include "ddprun/common/error.h"

namespace ddprun::store::wire {

namespace {
using C = Command;
constexpr uint8_t kNone = 0xFF;

// Byte value -> command, per dialect (reference §2).
constexpr std::array<C, 9> kLegacyTable = {
    C::kSet,   C::kCompareSet, C::kGet,      C::kAdd,      C::kCheck,
    C::kWait,  C::kGetNumKeys, C::kWatchKey, C::kDeleteKey};
constexpr std::array<C, 19> kV2Table = {
    C::kValidate,  C::kSet,        C::kCompareSet, C::kGet,       C::kAdd,
    C::kCheck,     C::kWait,       C::kGetNumKeys, C::kDeleteKey, C::kAppend,
    C::kMultiGet,  C::kMultiSet,   C::kCancelWait, C::kPing,      C::kQueuePush,
    C::kQueuePop,  C::kQueueLen,   C::kListKeys,   C::kBarrier};

template <size_t N>
std::optional<uint8_t> findByte(const std::array<C, N>& table, C c) {
  for (size_t i = 0; i < N; ++i)
    if (table[i] == c) return static_cast<uint8_t>(i);
  return std::nullopt;
}

// The fields that follow each command byte, in wire order.
enum class F : uint8_t { kU32, kI64, kKey, kValue, kKeyList, kKeyValueList, kEnd };

struct Shape {
  std::array<F, 4> fields;
};

Shape shapeOf(C c) {
  switch (c) {
    case C::kValidate:
    case C::kPing:
      return {{F::kU32, F::kEnd}};
    case C::kSet:
    case C::kAppend:
    case C::kQueuePush:
      return {{F::kKey, F::kValue, F::kEnd}};
    case C::kCompareSet:
      return {{F::kKey, F::kValue, F::kValue, F::kEnd}};
    case C::kGet:
    case C::kDeleteKey:
    case C::kQueuePop:
    case C::kQueueLen:
    case C::kWatchKey:
      return {{F::kKey, F::kEnd}};
    case C::kAdd:
    case C::kBarrier:
      return {{F::kKey, F::kI64, F::kEnd}};
    case C::kCheck:
    case C::kWait:
    case C::kMultiGet:
      return {{F::kKeyList, F::kEnd}};
    case C::kMultiSet:
      return {{F::kKeyValueList, F::kEnd}};
    case C::kGetNumKeys:
    case C::kCancelWait:
    case C::kListKeys:
      break;
  }
  return {{F::kEnd}};
}
}  // namespace

Request makeRequest(Command cmd, std::vector<std::string> keys,
                    std::vector<std::string> values, int64_t number, uint32_t u32) {
  Request r;
  r.cmd = cmd;
  r.keys = std::move(keys);
  r.values = std::move(values);
  r.number = number;
  r.u32 = u32;
  return r;
}

const char* dialectName(Dialect d) {
  return d == Dialect::kLegacy ? "legacy (PyTorch <= 2.0)" : "v2 (PyTorch >= 2.2)";
}

const char* commandName(Command c) {
  static constexpr const char* kNames[] = {
      "VALIDATE",    "SET",        "COMPARE_SET", "GET",       "ADD",
      "CHECK",       "WAIT",       "GETNUMKEYS",  "DELETE_KEY", "APPEND",
      "MULTI_GET",   "MULTI_SET",  "CANCEL_WAIT", "PING",      "QUEUE_PUSH",
      "QUEUE_POP",   "QUEUE_LEN",  "LIST_KEYS",   "BARRIER",   "WATCH_KEY"};
  return kNames[static_cast<size_t>(c)];
}

std::optional<Command> decodeCommand(Dialect d, uint8_t byte) {
  if (d == Dialect::kLegacy) {
    if (byte < kLegacyTable.size()) return kLegacyTable[byte];
  } else if (byte < kV2Table.size()) {
    return kV2Table[byte];
  }
  return std::nullopt;
}

std::optional<uint8_t> encodeCommand(Dialect d, Command c) {
  return d == Dialect::kLegacy ? findByte(kLegacyTable, c) : findByte(kV2Table, c);
}

void putLe(std::string& out, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t getLe(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
  return v;
}

RequestParser::RequestParser(Dialect d, const Limits& limits, Reserve reserve)
    : dialect_(d), limits_(limits), reserve_(std::move(reserve)) {}

void RequestParser::next() {
  started_ = done_ = false;
  fieldIdx_ = 0;
  listLen_ = listIdx_ = 0;
  haveCount_ = inString_ = false;
  remaining_ = have_ = 0;
  total_ = 0;
  declared_ = 0;
}

RequestParser::Step RequestParser::fail(std::string why) {
  bad_ = true;
  error_ = std::move(why);
  return Step::kBad;
}

std::string RequestParser::charge(size_t bytes) {
  if (!reserve_ || bytes == 0) return {};
  std::string err = reserve_(bytes);
  if (err.empty()) declared_ += bytes;
  return err;
}

// Assembles an n-byte little-endian integer across calls in scratch_.
RequestParser::Step RequestParser::fixed(std::string_view data, size_t& pos,
                                         size_t n, uint64_t& out) {
  size_t take = std::min(n - have_, data.size() - pos);
  std::memcpy(scratch_ + have_, data.data() + pos, take);
  have_ += take;
  pos += take;
  if (have_ < n) return Step::kNeedMore;
  have_ = 0;
  out = getLe(scratch_, n);
  return Step::kDone;
}

// A u64 length then that many bytes, appended to `out` as they arrive. The
// length is checked and charged before the string's storage is allocated.
RequestParser::Step RequestParser::string(std::string_view data, size_t& pos,
                                          std::string& out, size_t limit,
                                          const char* what) {
  if (!inString_) {
    uint64_t len = 0;
    Step st = fixed(data, pos, 8, len);
    if (st != Step::kDone) return st;
    if (len > limit)
      return fail(std::string(what) + " of " + std::to_string(len) +
                  " bytes exceeds the limit of " + std::to_string(limit));
    total_ += len;
    if (total_ > limits_.maxRequestBytes)
      return fail("request exceeds the limit of " +
                  std::to_string(limits_.maxRequestBytes) + " bytes");
    if (std::string err = charge(len); !err.empty()) return fail(err);
    out.clear();
    out.reserve(len);
    inString_ = true;
    remaining_ = len;
  }
  size_t take = std::min(remaining_, data.size() - pos);
  out.append(data.data() + pos, take);
  pos += take;
  remaining_ -= take;
  if (remaining_ > 0) return Step::kNeedMore;
  inString_ = false;
  return Step::kDone;
}

// The u64 entry count of a list field; sizes the key (and value) vectors.
RequestParser::Step RequestParser::count(std::string_view data, size_t& pos,
                                         size_t slotsPerKey) {
  uint64_t n = 0;
  Step st = fixed(data, pos, 8, n);
  if (st != Step::kDone) return st;
  if (n > limits_.maxKeysPerRequest)
    return fail("request names " + std::to_string(n) +
                " keys, more than the limit of " +
                std::to_string(limits_.maxKeysPerRequest));
  if (std::string err = charge(n * slotsPerKey * sizeof(std::string)); !err.empty())
    return fail(err);
  req_.keys.resize(n);
  if (slotsPerKey == 2) req_.values.resize(n);
  listLen_ = n;
  listIdx_ = 0;
  haveCount_ = true;
  return Step::kDone;
}

// Advances through the command's fields from where the last call stopped.
RequestParser::Step RequestParser::fields(std::string_view data, size_t& pos) {
  const Shape shape = shapeOf(req_.cmd);
  while (true) {
    F f = shape.fields[fieldIdx_];
    Step st = Step::kDone;
    uint64_t v = 0;
    switch (f) {
      case F::kEnd:
        return Step::kDone;
      case F::kU32:
        st = fixed(data, pos, 4, v);
        req_.u32 = static_cast<uint32_t>(v);
        break;
      case F::kI64:
        st = fixed(data, pos, 8, v);
        req_.number = static_cast<int64_t>(v);
        break;
      case F::kKey:
        if (req_.keys.empty()) req_.keys.resize(1);
        st = string(data, pos, req_.keys[0], limits_.maxKeyBytes, "key");
        break;
      case F::kValue: {
        // Values of SET/COMPARE_SET follow the one key: index by value count.
        size_t vi = fieldIdx_ - 1;
        if (req_.values.size() <= vi) req_.values.resize(vi + 1);
        st = string(data, pos, req_.values[vi], limits_.maxValueBytes, "value");
        break;
      }
      case F::kKeyList:
      case F::kKeyValueList: {
        size_t slots = f == F::kKeyList ? 1 : 2;
        if (!haveCount_ && (st = count(data, pos, slots)) != Step::kDone) break;
        while (listIdx_ < listLen_ * slots) {
          // In a key/value list entries alternate: even = key, odd = value.
          size_t i = listIdx_ / slots;
          bool isValue = slots == 2 && listIdx_ % 2 == 1;
          st = isValue ? string(data, pos, req_.values[i], limits_.maxValueBytes, "value")
                       : string(data, pos, req_.keys[i], limits_.maxKeyBytes, "key");
          if (st != Step::kDone) return st;
          ++listIdx_;
        }
        break;
      }
    }
    if (st != Step::kDone) return st;
    ++fieldIdx_;
  }
}

ParseResult RequestParser::feed(std::string_view data) {
  if (bad_) return {ParseStatus::kBad, 0, error_};
  size_t pos = 0;
  if (!started_) {
    if (data.empty()) return {ParseStatus::kNeedMore, 0, {}};
    uint8_t byte = static_cast<uint8_t>(data[0]);
    auto cmd = decodeCommand(dialect_, byte);
    if (!cmd) {
      fail("unknown command byte " + std::to_string(byte) + " for the " +
           dialectName(dialect_) + " dialect");
      return {ParseStatus::kBad, 0, error_};
    }
    pos = 1;
    started_ = true;
    req_.cmd = *cmd;
    req_.keys.clear();
    req_.values.clear();
    req_.number = 0;
    req_.u32 = 0;
  }
  Step st = fields(data, pos);
  parsed_ += pos;
  if (st == Step::kBad) return {ParseStatus::kBad, 0, error_};
  if (st == Step::kNeedMore) return {ParseStatus::kNeedMore, pos, {}};
  done_ = true;
  return {ParseStatus::kOk, pos, {}};
}

ParseResult parseRequest(Dialect d, const Limits& limits, std::string_view data,
                         Request& out) {
  RequestParser p(d, limits);
  auto res = p.feed(data);
  if (res.status == ParseStatus::kOk) {
    out = std::move(p.request());
  } else {
    res.consumed = 0;
  }
  return res;
}

std::optional<Dialect> detectDialect(std::string_view first) {
  if (first.empty()) return std::nullopt;
  if (first[0] != 0) return Dialect::kLegacy;
  if (first.size() < 5) return std::nullopt;
  auto magic = static_cast<uint32_t>(getLe(first.data() + 1, 4));
  return magic == kValidationMagic ? Dialect::kV2 : Dialect::kLegacy;
}

Writer& Writer::u8(uint8_t v) {
  out_.push_back(static_cast<char>(v));
  return *this;
}
Writer& Writer::u32(uint32_t v) {
  putLe(out_, v, 4);
  return *this;
}
Writer& Writer::i64(int64_t v) {
  putLe(out_, static_cast<uint64_t>(v), 8);
  return *this;
}
Writer& Writer::u64(uint64_t v) {
  putLe(out_, v, 8);
  return *this;
}
Writer& Writer::bytes(std::string_view v) {
  u64(v.size());
  out_.append(v.data(), v.size());
  return *this;
}

void encodeRequest(Dialect d, const Request& r, std::string& out) {
  auto byte = encodeCommand(d, r.cmd);
  if (!byte)
    DDPRUN_THROW(InvalidArgument, commandName(r.cmd), " does not exist in the ",
                 dialectName(d), " dialect");
  Writer w(out);
  w.u8(*byte);
  switch (r.cmd) {
    case C::kValidate:
    case C::kPing:
      w.u32(r.u32);
      break;
    case C::kSet:
    case C::kAppend:
    case C::kQueuePush:
      w.bytes(r.keys.at(0)).bytes(r.values.at(0));
      break;
    case C::kCompareSet:
      w.bytes(r.keys.at(0)).bytes(r.values.at(0)).bytes(r.values.at(1));
      break;
    case C::kGet:
    case C::kDeleteKey:
    case C::kQueuePop:
    case C::kQueueLen:
    case C::kWatchKey:
      w.bytes(r.keys.at(0));
      break;
    case C::kAdd:
    case C::kBarrier:
      w.bytes(r.keys.at(0)).i64(r.number);
      break;
    case C::kCheck:
    case C::kWait:
    case C::kMultiGet:
      w.u64(r.keys.size());
      for (const auto& k : r.keys) w.bytes(k);
      break;
    case C::kMultiSet:
      DDPRUN_CHECK(r.keys.size() == r.values.size());
      w.i64(static_cast<int64_t>(r.keys.size()));
      for (size_t i = 0; i < r.keys.size(); ++i)
        w.bytes(r.keys[i]).bytes(r.values[i]);
      break;
    case C::kGetNumKeys:
    case C::kCancelWait:
    case C::kListKeys:
      break;
  }
}

}  // namespace ddprun::store::wire
