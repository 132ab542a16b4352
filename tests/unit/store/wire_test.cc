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

// Feeds `bytes` to a parser in pieces of `piece` bytes; returns the requests.
std::vector<Request> feedInPieces(RequestParser& p, std::string_view bytes, size_t piece) {
  std::vector<Request> out;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    std::string_view chunk = bytes.substr(at, piece);
    while (true) {
      auto res = p.feed(chunk);
      EXPECT_NE(res.status, ParseStatus::kBad) << res.error;
      if (res.status != ParseStatus::kOk) break;
      out.push_back(p.request());
      p.next();
      chunk.remove_prefix(res.consumed);
      if (chunk.empty()) break;
    }
  }
  return out;
}

TEST(RequestParser, AnySplitGivesTheSameRequests) {
  for (Dialect d : {Dialect::kLegacy, Dialect::kV2}) {
    std::string stream;
    std::vector<Request> sent;
    for (const auto& req : everyRequest()) {
      if (!encodeCommand(d, req.cmd)) continue;
      encodeRequest(d, req, stream);
      sent.push_back(req);
    }
    for (size_t piece : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, stream.size()}) {
      SCOPED_TRACE(std::string(dialectName(d)) + " piece " + std::to_string(piece));
      RequestParser p(d, Limits{});
      auto got = feedInPieces(p, stream, piece);
      ASSERT_EQ(got.size(), sent.size());
      for (size_t i = 0; i < got.size(); ++i) expectSame(sent[i], got[i]);
      EXPECT_EQ(p.bytesParsed(), stream.size());
      EXPECT_FALSE(p.partial());
    }
  }
}

// The parser never re-reads: a 32 MiB MULTI_SET costs exactly its size in
// parsed bytes whether it arrives in 1-byte, 2 KiB or one piece.
TEST(RequestParser, BytesParsedEqualRequestSizeForEverySplit) {
  std::vector<std::string> keys, values;
  for (int i = 0; i < 4096; ++i) {
    keys.push_back("/k" + std::to_string(i));
    values.push_back(std::string(8 * 1024 - 32, 'v'));
  }
  std::string bytes;
  encodeRequest(Dialect::kV2, makeRequest(Command::kMultiSet, keys, values), bytes);
  ASSERT_GT(bytes.size(), 32u * 1024 * 1024 - 64 * 1024);
  for (size_t piece : {size_t{1}, size_t{2048}, bytes.size()}) {
    SCOPED_TRACE(piece);
    RequestParser p(Dialect::kV2, Limits{});
    auto got = feedInPieces(p, bytes, piece);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].keys, keys);
    EXPECT_EQ(p.bytesParsed(), bytes.size());
  }
}

TEST(RequestParser, ReservesDeclaredBytesBeforeReadingThem) {
  size_t reserved = 0;
  RequestParser p(Dialect::kV2, Limits{}, [&](size_t n) -> std::string {
    if (reserved + n > 1000) return "budget";
    reserved += n;
    return {};
  });
  std::string bytes;
  encodeRequest(Dialect::kV2, makeRequest(Command::kSet, {"/k"}, {std::string(500, 'x')}), bytes);
  auto res = p.feed(std::string_view(bytes).substr(0, 1 + 8 + 2 + 8));  // header only
  EXPECT_EQ(res.status, ParseStatus::kNeedMore);
  EXPECT_EQ(p.declaredBytes(), 502u);  // the value's 500 bytes before they arrive
  EXPECT_TRUE(p.partial());
  // A second request declaring more than the budget left fails at its header.
  RequestParser q(Dialect::kV2, Limits{}, [&](size_t n) -> std::string {
    return reserved + n > 1000 ? "budget" : "";
  });
  std::string big;
  encodeRequest(Dialect::kV2, makeRequest(Command::kSet, {"/k"}, {std::string(600, 'x')}), big);
  res = q.feed(std::string_view(big).substr(0, 1 + 8 + 2 + 8));
  EXPECT_EQ(res.status, ParseStatus::kBad);
  EXPECT_EQ(res.error, "budget");
}

TEST(Wire, IntegersAreLittleEndianOnTheWire) {
  std::string out;
  Writer(out).u32(0x01020304).i64(-2).u64(0x1122334455667788ull);
  EXPECT_EQ(out, std::string("\x04\x03\x02\x01", 4) + std::string("\xFE\xFF\xFF\xFF\xFF\xFF\xFF\xFF", 8) +
                     std::string("\x88\x77\x66\x55\x44\x33\x22\x11", 8));
  EXPECT_EQ(getLe(out.data(), 4), 0x01020304u);
  EXPECT_EQ(static_cast<int64_t>(getLe(out.data() + 4, 8)), -2);
}

}  // namespace
}  // namespace ddprun::store::wire
