// The c10d TCPStore wire codec, shared by our client and our server.
//
// The protocol has no framing: a request is a command byte followed by fields
// whose sizes the command implies (see reference/tcpstore-protocol.md). Two
// dialects exist: PyTorch <= 2.0 ("legacy", no handshake) and >= 2.2 ("v2",
// VALIDATE magic first, renumbered commands). Integers are little-endian.
//
// RequestParser is incremental: it keeps its position inside a partial
// request, so a request of N bytes costs O(N) work however the stream splits
// it. Every declared length is checked against Limits, and offered to a
// budget hook, before anything is allocated, so a hostile peer cannot make the
// server buffer more than the limits and the budget allow. parseRequest() is
// the one-shot form over a prefix of the stream. Free functions are pure and
// thread-safe; a RequestParser belongs to one thread.
//
// Byte order: the protocol is little-endian. Integers are encoded and decoded
// byte by byte, so the code is correct on any host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddprun::store::wire {

enum class Dialect : uint8_t {
  kLegacy,  // PyTorch 1.13 .. 2.0: no handshake
  kV2,      // PyTorch >= 2.2: VALIDATE(magic) first, then PING
};
const char* dialectName(Dialect d);

// Commands, independent of their byte value in a dialect.
enum class Command : uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
  kWatchKey,  // legacy only (callback connection)
};
const char* commandName(Command c);

constexpr uint32_t kValidationMagic = 0x3C85F7CE;

// One-byte replies.
constexpr uint8_t kCheckReady = 0;
constexpr uint8_t kCheckNotReady = 1;
constexpr uint8_t kStopWaiting = 0;
constexpr uint8_t kWaitCanceled = 1;
// Legacy WATCH_KEY notifications.
constexpr uint8_t kKeyUpdated = 0;
constexpr uint8_t kKeyCreated = 1;
constexpr uint8_t kKeyDeleted = 2;
constexpr uint8_t kKeyCallbackRegistered = 3;

std::optional<Command> decodeCommand(Dialect d, uint8_t byte);
std::optional<uint8_t> encodeCommand(Dialect d, Command c);

// Bounds on what one peer may send. Defaults are generous for PyTorch's own
// traffic (keys are short, the largest values are gloo/NCCL addresses) while
// keeping a single connection from exhausting memory.
struct Limits {
  size_t maxKeyBytes = 64 * 1024;
  size_t maxValueBytes = 64 * 1024 * 1024;
  size_t maxKeysPerRequest = 128 * 1024;
  size_t maxRequestBytes = 128 * 1024 * 1024;  // all fields of one request
};

// A decoded request. Field use by command:
//   SET/APPEND/QUEUE_PUSH: keys[0], values[0]   COMPARE_SET: keys[0], values[0]
//   = expected, values[1] = desired   GET/DELETE_KEY/QUEUE_POP/QUEUE_LEN/
//   WATCH_KEY: keys[0]   ADD: keys[0], number = delta   BARRIER: keys[0],
//   number = world size   CHECK/WAIT/MULTI_GET: keys   MULTI_SET: keys, values
//   VALIDATE/PING: u32
struct Request {
  Command cmd = Command::kPing;
  std::vector<std::string> keys;
  std::vector<std::string> values;
  int64_t number = 0;
  uint32_t u32 = 0;
};

// Builds a request (shorthand for clients, tools and tests).
Request makeRequest(Command cmd, std::vector<std::string> keys = {},
                    std::vector<std::string> values = {}, int64_t number = 0,
                    uint32_t u32 = 0);

enum class ParseStatus { kNeedMore, kOk, kBad };

struct ParseResult {
  ParseStatus status = ParseStatus::kNeedMore;
  size_t consumed = 0;  // bytes of `data` that made up the request (kOk only)
  std::string error;    // why the stream was rejected (kBad only)
};

// Parses one request from the front of `data`. On kOk, `out` holds it.
ParseResult parseRequest(Dialect d, const Limits& limits, std::string_view data,
                         Request& out);

// Resumable parser of one connection's request stream.
//
// feed() consumes bytes until one request is complete (kOk: request() holds
// it, `consumed` says how many bytes of this call it used; call next() before
// feeding again), the bytes run out (kNeedMore: all of them were consumed and
// are remembered) or the stream breaks a limit (kBad, sticky). Each byte is
// examined once.
class RequestParser {
 public:
  // Asked for `bytes` before the parser allocates them for the partial
  // request (key/value storage, key list slots). Returns an empty string to
  // allow, or why not (the parse then fails with that error).
  using Reserve = std::function<std::string(size_t bytes)>;

  RequestParser(Dialect d, const Limits& limits, Reserve reserve = {});

  ParseResult feed(std::string_view data);
  Request& request() { return req_; }
  // Forgets the completed request and starts on the next one.
  void next();
  // Replaces the limits; call between requests (after next()). The server
  // parses tightly until a connection has authenticated, then widens them.
  void setLimits(const Limits& limits) { limits_ = limits; }
  // Bytes the current (partial or completed) request has reserved through the
  // hook; the caller releases them once the request is done with.
  size_t declaredBytes() const { return declared_; }
  // Returns declaredBytes() and forgets it: the caller has taken over the
  // accounting (the request's strings are about to be stored or dropped).
  size_t takeDeclared() { return std::exchange(declared_, 0); }
  // Bytes consumed over the parser's life (each exactly once).
  uint64_t bytesParsed() const { return parsed_; }
  // True while a request has begun but is not complete.
  bool partial() const { return started_ && !done_; }
  Dialect dialect() const { return dialect_; }

 private:
  enum class Step { kNeedMore, kDone, kBad };
  Step fields(std::string_view data, size_t& pos);
  Step fixed(std::string_view data, size_t& pos, size_t n, uint64_t& out);
  Step string(std::string_view data, size_t& pos, std::string& out, size_t limit,
              const char* what);
  Step count(std::string_view data, size_t& pos, size_t slotsPerKey);
  Step fail(std::string why);
  std::string charge(size_t bytes);

  Dialect dialect_;
  Limits limits_;
  Reserve reserve_;
  Request req_;
  bool started_ = false;  // command byte read
  bool done_ = false;
  bool bad_ = false;
  std::string error_;
  uint8_t fieldIdx_ = 0;     // which field of the command
  size_t listLen_ = 0;       // declared key count of a list field
  size_t listIdx_ = 0;       // next list entry
  bool haveCount_ = false;   // the list's count has been read
  bool inString_ = false;    // length read, bytes arriving
  size_t remaining_ = 0;     // bytes of the string still to come
  uint8_t scratch_[8] = {};  // a fixed-size field being assembled
  size_t have_ = 0;          // bytes of it so far
  uint64_t total_ = 0;       // declared field bytes of this request
  size_t declared_ = 0;
  uint64_t parsed_ = 0;
};

// Picks the dialect of a new connection from its first bytes: a leading
// VALIDATE (00 CE F7 85 3C) means v2, anything else legacy. Returns nullopt
// while it cannot yet tell (a lone 00 with fewer than 5 bytes).
std::optional<Dialect> detectDialect(std::string_view firstBytes);

// Little-endian integer helpers.
void putLe(std::string& out, uint64_t v, size_t n);
uint64_t getLe(const void* p, size_t n);

// Appends little-endian fields to a buffer.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  Writer& u8(uint8_t v);
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& u64(uint64_t v);
  Writer& bytes(std::string_view v);  // u64 length + data
 private:
  std::string& out_;
};

// ---- Replies ----
//
// A decoded reply. Field use by command:
//   GET, COMPARE_SET: values[0]   MULTI_GET: values, one per key asked
//   LIST_KEYS: values (the keys)  QUEUE_POP: number = entries before the pop
//   (0: empty queue, no value), values[0] the value   ADD, GETNUMKEYS,
//   DELETE_KEY, QUEUE_LEN: number   CHECK, WAIT, CANCEL_WAIT, BARRIER,
//   WATCH_KEY: code   PING: u32   SET, APPEND, MULTI_SET, QUEUE_PUSH,
//   VALIDATE: no reply (nothing is encoded or parsed)
struct Reply {
  std::vector<std::string> values;
  int64_t number = 0;
  uint8_t code = 0;
  uint32_t u32 = 0;
};

// Appends the reply to `c`. MULTI_GET encodes every entry of values.
void encodeReply(Command c, const Reply& r, std::string& out);

// Resumable parser of one reply, the client-side mirror of RequestParser.
// `expected` is the number of keys a MULTI_GET asked for; values longer than
// maxValueBytes and LIST_KEYS counts over maxCount reject the stream.
class ReplyParser {
 public:
  explicit ReplyParser(Command c, size_t expected = 0,
                       uint64_t maxValueBytes = 1ull << 32,
                       uint64_t maxCount = 1ull << 32);
  // Consumes bytes until the reply is complete (kOk, `consumed` of them),
  // they run out (kNeedMore, all consumed) or the reply is malformed (kBad).
  ParseResult feed(std::string_view data);
  // How many more bytes the reply certainly needs (0 once complete): a
  // blocking reader can read exactly this many without reading past it.
  size_t wanted() const;
  Reply& reply() { return reply_; }

 private:
  bool fixed(std::string_view data, size_t& pos, size_t n, uint64_t& out);
  ParseResult bad(std::string why);

  Command cmd_;
  size_t expected_;
  uint64_t maxValueBytes_;
  uint64_t maxCount_;
  Reply reply_;
  bool done_ = false;
  bool inStrings_ = false;  // header done; reading `count_` strings
  bool inString_ = false;   // length read, bytes arriving
  size_t count_ = 0;
  size_t idx_ = 0;
  size_t remaining_ = 0;
  uint8_t scratch_[8] = {};
  size_t have_ = 0;
};

// Serialises a request in a dialect. Throws InvalidArgument if the dialect
// has no such command.
void encodeRequest(Dialect d, const Request& r, std::string& out);

}  // namespace ddprun::store::wire
