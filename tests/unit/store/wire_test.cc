#include "ddprun/store/wire.h"

#include <gtest/gtest.h>

#include "ddprun/common/error.h"

#include <string>
#include <vector>

namespace ddprun::store::wire {
namespace {


// One request of every command, with awkward payloads (empty, NUL, "//").
std::vector<Request> everyRequest() {
  std::string bin("a\0b", 3);
  return {
      makeRequest(Command::kValidate, {}, {}, 0, kValidationMagic),
      makeRequest(Command::kPing, {}, {}, 0, 4242),
      makeRequest(Command::kSet, {"/k"}, {bin}),
      makeRequest(Command::kSet, {"//worker/attempt_0/x"}, {""}),
      makeRequest(Command::kCompareSet, {"/k"}, {"", "new"}),
      makeRequest(Command::kGet, {"/k"}),
      makeRequest(Command::kAdd, {"init/"}, {}, -7),
      makeRequest(Command::kCheck, {"/a", "/b"}),
      makeRequest(Command::kWait, {"/a"}),
      makeRequest(Command::kWait, {}),
      makeRequest(Command::kGetNumKeys),
      makeRequest(Command::kDeleteKey, {"/k"}),
      makeRequest(Command::kAppend, {"/k"}, {"tail"}),
      makeRequest(Command::kMultiGet, {"/a", "/b", "/c"}),
      makeRequest(Command::kMultiSet, {"/a", "/b"}, {"1", bin}),
      makeRequest(Command::kCancelWait),
      makeRequest(Command::kQueuePush, {"/q"}, {"v"}),
      makeRequest(Command::kQueuePop, {"/q"}),
      makeRequest(Command::kQueueLen, {"/q"}),
      makeRequest(Command::kListKeys),
      makeRequest(Command::kBarrier, {"/bar"}, {}, 8),
      makeRequest(Command::kWatchKey, {"/w"}),
  };
}

void expectSame(const Request& a, const Request& b) {
  EXPECT_EQ(a.cmd, b.cmd);
  EXPECT_EQ(a.keys, b.keys);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.number, b.number);
  EXPECT_EQ(a.u32, b.u32);
}

TEST(Wire, CommandBytesFollowEachDialect) {
  EXPECT_EQ(encodeCommand(Dialect::kLegacy, Command::kSet), 0);
  EXPECT_EQ(encodeCommand(Dialect::kLegacy, Command::kAdd), 3);
  EXPECT_EQ(encodeCommand(Dialect::kLegacy, Command::kWatchKey), 7);
  EXPECT_EQ(encodeCommand(Dialect::kLegacy, Command::kDeleteKey), 8);
  EXPECT_FALSE(encodeCommand(Dialect::kLegacy, Command::kAppend));
  EXPECT_EQ(encodeCommand(Dialect::kV2, Command::kValidate), 0);
  EXPECT_EQ(encodeCommand(Dialect::kV2, Command::kAdd), 4);
  EXPECT_EQ(encodeCommand(Dialect::kV2, Command::kCancelWait), 12);
  EXPECT_EQ(encodeCommand(Dialect::kV2, Command::kPing), 13);
  EXPECT_EQ(encodeCommand(Dialect::kV2, Command::kListKeys), 17);
  EXPECT_EQ(encodeCommand(Dialect::kV2, Command::kBarrier), 18);
  EXPECT_FALSE(encodeCommand(Dialect::kV2, Command::kWatchKey));
  EXPECT_FALSE(decodeCommand(Dialect::kLegacy, 9));
  EXPECT_FALSE(decodeCommand(Dialect::kV2, 19));
  EXPECT_FALSE(decodeCommand(Dialect::kV2, 0xFF));
}

TEST(Wire, MatchesCapturedPyTorchBytes) {
  // PyTorch 2.6 start: VALIDATE, PING(pid), ADD("init/", 1).
  std::string v2;
  encodeRequest(Dialect::kV2, makeRequest(Command::kValidate, {}, {}, 0, kValidationMagic), v2);
  encodeRequest(Dialect::kV2, makeRequest(Command::kAdd, {"init/"}, {}, 1), v2);
  const unsigned char expectV2[] = {0x00, 0xCE, 0xF7, 0x85, 0x3C, 0x04, 5, 0, 0, 0, 0,
                                    0,    0,    0,    'i',  'n',  'i',  't', '/', 1, 0,
                                    0,    0,    0,    0,    0,    0};
  EXPECT_EQ(v2, std::string(reinterpret_cast<const char*>(expectV2), sizeof expectV2));
  // PyTorch 1.13 capture: 03 05000000 00000000 'init/' 01000000 00000000.
  std::string legacy;
  encodeRequest(Dialect::kLegacy, makeRequest(Command::kAdd, {"init/"}, {}, 1), legacy);
  EXPECT_EQ(legacy.substr(0, 9), std::string("\x03\x05\0\0\0\0\0\0\0", 9));
  EXPECT_EQ(legacy.size(), 1u + 8 + 5 + 8);
}

TEST(Wire, RoundTripsEveryCommandInBothDialects) {
  Limits limits;
  for (Dialect d : {Dialect::kLegacy, Dialect::kV2}) {
    for (const auto& req : everyRequest()) {
      if (!encodeCommand(d, req.cmd)) continue;
      SCOPED_TRACE(std::string(commandName(req.cmd)) + " " + dialectName(d));
      std::string bytes;
      encodeRequest(d, req, bytes);
      Request out;
      auto res = parseRequest(d, limits, bytes, out);
      ASSERT_EQ(res.status, ParseStatus::kOk) << res.error;
      EXPECT_EQ(res.consumed, bytes.size());
      expectSame(req, out);
    }
  }
}

TEST(Wire, EveryStrictPrefixNeedsMore) {
  Limits limits;
  for (Dialect d : {Dialect::kLegacy, Dialect::kV2}) {
    for (const auto& req : everyRequest()) {
      if (!encodeCommand(d, req.cmd)) continue;
      std::string bytes;
      encodeRequest(d, req, bytes);
      for (size_t cut = 0; cut < bytes.size(); ++cut) {
        Request out;
        auto res = parseRequest(d, limits, std::string_view(bytes).substr(0, cut), out);
        EXPECT_EQ(res.status, ParseStatus::kNeedMore)
            << commandName(req.cmd) << " cut at " << cut;
        EXPECT_EQ(res.consumed, 0u);
      }
    }
  }
}

TEST(Wire, ParsesOnlyTheFirstOfSeveralRequests) {
  std::string bytes;
  encodeRequest(Dialect::kV2, makeRequest(Command::kSet, {"/a"}, {"1"}), bytes);
  size_t first = bytes.size();
  encodeRequest(Dialect::kV2, makeRequest(Command::kGet, {"/a"}), bytes);
  Request out;
  auto res = parseRequest(Dialect::kV2, Limits{}, bytes, out);
  ASSERT_EQ(res.status, ParseStatus::kOk);
  EXPECT_EQ(res.consumed, first);
  EXPECT_EQ(out.cmd, Command::kSet);
}

TEST(Wire, RejectsOversizedKeyBeforeItsBytesArrive) {
  Limits limits;
  limits.maxKeyBytes = 16;
  std::string bytes;
  Writer(bytes).u8(*encodeCommand(Dialect::kV2, Command::kGet)).u64(17);
  Request out;
  auto res = parseRequest(Dialect::kV2, limits, bytes, out);
  EXPECT_EQ(res.status, ParseStatus::kBad);
  EXPECT_NE(res.error.find("key of 17 bytes exceeds the limit of 16"), std::string::npos)
      << res.error;
}

TEST(Wire, RejectsOversizedValueAndTooManyKeys) {
  Limits limits;
  limits.maxValueBytes = 100;
  limits.maxKeysPerRequest = 3;
  std::string set;
  Writer(set).u8(1).bytes("/k").u64(1ull << 40);  // a 1 TiB value announced
  Request out;
  auto res = parseRequest(Dialect::kV2, limits, set, out);
  EXPECT_EQ(res.status, ParseStatus::kBad);
  EXPECT_NE(res.error.find("value of"), std::string::npos);
  std::string wait;
  Writer(wait).u8(*encodeCommand(Dialect::kV2, Command::kWait)).u64(4);
  res = parseRequest(Dialect::kV2, limits, wait, out);
  EXPECT_EQ(res.status, ParseStatus::kBad);
  EXPECT_NE(res.error.find("4 keys"), std::string::npos);
  // A hostile count close to 2^64 is rejected too, without allocation.
  std::string huge;
  Writer(huge).u8(*encodeCommand(Dialect::kV2, Command::kMultiSet)).u64(~0ull);
  EXPECT_EQ(parseRequest(Dialect::kV2, limits, huge, out).status, ParseStatus::kBad);
}

TEST(Wire, RejectsRequestsOverTheTotalLimit) {
  Limits limits;
  limits.maxRequestBytes = 10;
  std::string bytes;
  encodeRequest(Dialect::kV2, makeRequest(Command::kMultiSet, {"/a", "/b"}, {"123456", "7890"}),
                bytes);
  Request out;
  EXPECT_EQ(parseRequest(Dialect::kV2, limits, bytes, out).status, ParseStatus::kBad);
}

TEST(Wire, RejectsUnknownCommandBytes) {
  Request out;
  for (uint8_t b : {uint8_t{19}, uint8_t{42}, uint8_t{0xFF}}) {
    std::string bytes(1, static_cast<char>(b));
    auto res = parseRequest(Dialect::kV2, Limits{}, bytes, out);
    EXPECT_EQ(res.status, ParseStatus::kBad);
    EXPECT_NE(res.error.find("unknown command byte"), std::string::npos);
  }
  EXPECT_EQ(parseRequest(Dialect::kLegacy, Limits{}, "\x09", out).status,
            ParseStatus::kBad);
}

TEST(Wire, DetectsDialectFromFirstBytes) {
  EXPECT_FALSE(detectDialect(""));
  EXPECT_FALSE(detectDialect(std::string("\0", 1)));
  EXPECT_FALSE(detectDialect(std::string("\0\xCE\xF7\x85", 4)));
  EXPECT_EQ(detectDialect(std::string("\0\xCE\xF7\x85\x3C", 5)), Dialect::kV2);
  EXPECT_EQ(detectDialect(std::string("\0\x05\0\0\0", 5)), Dialect::kLegacy);
  EXPECT_EQ(detectDialect("\x03"), Dialect::kLegacy);
}

TEST(Wire, EncodingACommandMissingFromTheDialectThrows) {
  std::string out;
  EXPECT_THROW(encodeRequest(Dialect::kLegacy, makeRequest(Command::kAppend, {"/k"}, {"v"}), out),
               InvalidArgument);
}

}  // namespace
}  // namespace ddprun::store::wire
