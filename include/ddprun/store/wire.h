// The c10d TCPStore wire codec, shared by our client and our server.
//
// The protocol has no framing: a request is a command byte followed by fields
// whose sizes the command implies (see reference/tcpstore-protocol.md). Two
// dialects exist: PyTorch <= 2.0 ("legacy", no handshake) and >= 2.2 ("v2",
// VALIDATE magic first, renumbered commands). Integers are little-endian.
//
// parseRequest() is resumable: it looks at a prefix of the stream and either
// consumes one whole request, asks for more bytes, or rejects the stream. Every
// declared length is checked against Limits before anything is allocated or
// waited for, so a hostile peer cannot make the server buffer more than the
// limits allow. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
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

// Picks the dialect of a new connection from its first bytes: a leading
// VALIDATE (00 CE F7 85 3C) means v2, anything else legacy. Returns nullopt
// while it cannot yet tell (a lone 00 with fewer than 5 bytes).
std::optional<Dialect> detectDialect(std::string_view firstBytes);

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

// Serialises a request in a dialect. Throws InvalidArgument if the dialect
// has no such command.
void encodeRequest(Dialect d, const Request& r, std::string& out);

}  // namespace ddprun::store::wire
