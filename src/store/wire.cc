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

// Cursor over the unparsed bytes. Each read either succeeds, runs out of
// data (need more) or violates a limit (bad); the first failure sticks.
class Reader {
 public:
  Reader(std::string_view data, const Limits& limits)
      : data_(data), limits_(limits) {}

  bool u8(uint8_t& v) { return fixed(&v, 1); }
  bool u32(uint32_t& v) { return fixed(&v, 4); }
  bool i64(int64_t& v) { return fixed(&v, 8); }
  bool u64(uint64_t& v) { return fixed(&v, 8); }

  // A length-prefixed field no longer than `limit`.
  bool bytes(std::string& out, size_t limit, const char* what) {
    uint64_t len = 0;
    if (!u64(len)) return false;
    if (len > limit)
      return bad(std::string(what) + " of " + std::to_string(len) +
                 " bytes exceeds the limit of " + std::to_string(limit));
    total_ += len;
    if (total_ > limits_.maxRequestBytes)
      return bad("request exceeds the limit of " +
                 std::to_string(limits_.maxRequestBytes) + " bytes");
    if (data_.size() - pos_ < len) return needMore();
    out.assign(data_.data() + pos_, len);
    pos_ += len;
    return true;
  }
  bool key(std::string& out) { return bytes(out, limits_.maxKeyBytes, "key"); }
  bool value(std::string& out) {
    return bytes(out, limits_.maxValueBytes, "value");
  }
  bool count(uint64_t& n) {
    if (!u64(n)) return false;
    if (n > limits_.maxKeysPerRequest)
      return bad("request names " + std::to_string(n) +
                 " keys, more than the limit of " +
                 std::to_string(limits_.maxKeysPerRequest));
    return true;
  }
  bool keyList(std::vector<std::string>& keys) {
    uint64_t n = 0;
    if (!count(n)) return false;
    keys.resize(n);
    for (auto& k : keys)
      if (!key(k)) return false;
    return true;
  }
  bool bad(std::string why) {
    status_ = ParseStatus::kBad;
    error_ = std::move(why);
    return false;
  }
  ParseResult result() const {
    if (status_ == ParseStatus::kOk) return {ParseStatus::kOk, pos_, {}};
    return {status_, 0, error_};
  }

 private:
  bool fixed(void* dst, size_t n) {
    if (data_.size() - pos_ < n) return needMore();
    std::memcpy(dst, data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool needMore() {
    status_ = ParseStatus::kNeedMore;
    return false;
  }
  std::string_view data_;
  const Limits& limits_;
  size_t pos_ = 0;
  uint64_t total_ = 0;
  ParseStatus status_ = ParseStatus::kOk;
  std::string error_;
};

// Reads the fields that follow the command byte.
bool parseBody(Reader& in, Request& r) {
  r.keys.clear();
  r.values.clear();
  switch (r.cmd) {
    case C::kValidate:
    case C::kPing:
      return in.u32(r.u32);
    case C::kSet:
    case C::kAppend:
    case C::kQueuePush:
      r.keys.resize(1);
      r.values.resize(1);
      return in.key(r.keys[0]) && in.value(r.values[0]);
    case C::kCompareSet:
      r.keys.resize(1);
      r.values.resize(2);
      return in.key(r.keys[0]) && in.value(r.values[0]) && in.value(r.values[1]);
    case C::kGet:
    case C::kDeleteKey:
    case C::kQueuePop:
    case C::kQueueLen:
    case C::kWatchKey:
      r.keys.resize(1);
      return in.key(r.keys[0]);
    case C::kAdd:
    case C::kBarrier:
      r.keys.resize(1);
      return in.key(r.keys[0]) && in.i64(r.number);
    case C::kCheck:
    case C::kWait:
    case C::kMultiGet:
      return in.keyList(r.keys);
    case C::kMultiSet: {
      uint64_t n = 0;
      if (!in.count(n)) return false;
      r.keys.resize(n);
      r.values.resize(n);
      for (uint64_t i = 0; i < n; ++i)
        if (!in.key(r.keys[i]) || !in.value(r.values[i])) return false;
      return true;
    }
    case C::kGetNumKeys:
    case C::kCancelWait:
    case C::kListKeys:
      return true;
  }
  return in.bad("unhandled command");
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

ParseResult parseRequest(Dialect d, const Limits& limits, std::string_view data,
                         Request& out) {
  Reader in(data, limits);
  uint8_t byte = 0;
  if (!in.u8(byte)) return in.result();
  auto cmd = decodeCommand(d, byte);
  if (!cmd) {
    in.bad("unknown command byte " + std::to_string(byte) + " for the " +
           dialectName(d) + " dialect");
    return in.result();
  }
  out.cmd = *cmd;
  parseBody(in, out);
  return in.result();
}

std::optional<Dialect> detectDialect(std::string_view first) {
  if (first.empty()) return std::nullopt;
  if (first[0] != 0) return Dialect::kLegacy;
  if (first.size() < 5) return std::nullopt;
  uint32_t magic = 0;
  std::memcpy(&magic, first.data() + 1, 4);
  return magic == kValidationMagic ? Dialect::kV2 : Dialect::kLegacy;
}

Writer& Writer::u8(uint8_t v) {
  out_.push_back(static_cast<char>(v));
  return *this;
}
Writer& Writer::u32(uint32_t v) {
  out_.append(reinterpret_cast<const char*>(&v), 4);
  return *this;
}
Writer& Writer::i64(int64_t v) {
  out_.append(reinterpret_cast<const char*>(&v), 8);
  return *this;
}
Writer& Writer::u64(uint64_t v) {
  out_.append(reinterpret_cast<const char*>(&v), 8);
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
