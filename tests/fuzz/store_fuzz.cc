// libFuzzer target for the store's request parser and server state machine.
//
// (a) parseRequest on the raw input in both dialects: consumed bytes stay in
//     range, an accepted request re-encodes to exactly the bytes consumed, and
//     every strict prefix of it asks for more data.
// (b) The input, cut into chunks at positions taken from the input itself,
//     fed to a ServerState over several connections (which open and close as
//     the input says), with small limits so the limit paths are reached;
//     output is drained (sent()) and paused connections resumed as a
//     network layer would, and the memory budget is never exceeded.
// (c) The incremental RequestParser fed the input in pieces whose sizes come
//     from the input gives the same requests as one piece, and parses each
//     byte exactly once.
// (d) ReplyParser on the input as a reply to a command chosen by its first
//     byte: an accepted reply re-encodes to exactly the bytes consumed.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "ddprun/store/server_state.h"
#include "ddprun/store/wire.h"

using namespace ddprun::store;

namespace {

void die(const char* what) {
  std::fprintf(stderr, "invariant violated: %s\n", what);
  std::abort();
}

class NullOutbox : public Outbox {
 public:
  std::string& bufferFor(ConnId id) override { return out[id]; }
  void closeLater(ConnId id, const std::string&) override { doomed.push_back(id); }
  std::unordered_map<ConnId, std::string> out;
  std::vector<ConnId> doomed;
};

void checkParser(wire::Dialect d, std::string_view data) {
  wire::Limits limits;
  limits.maxKeyBytes = 64;
  limits.maxValueBytes = 256;
  limits.maxKeysPerRequest = 8;
  limits.maxRequestBytes = 1024;
  wire::Request req;
  auto res = wire::parseRequest(d, limits, data, req);
  if (res.status != wire::ParseStatus::kOk) {
    if (res.consumed != 0) die("consumed bytes on a non-Ok result");
    return;
  }
  if (res.consumed == 0 || res.consumed > data.size()) die("consumed out of range");
  std::string again;
  wire::encodeRequest(d, req, again);
  if (again != data.substr(0, res.consumed)) die("re-encoding differs from input");
  for (size_t cut = 0; cut < res.consumed; ++cut) {
    wire::Request r2;
    if (wire::parseRequest(d, limits, data.substr(0, cut), r2).status !=
        wire::ParseStatus::kNeedMore)
      die("strict prefix of a valid request was not NeedMore");
  }
}

void checkServer(const uint8_t* data, size_t size) {
  ServerLimits limits;
  limits.wire.maxKeyBytes = 64;
  limits.wire.maxValueBytes = 512;
  limits.wire.maxKeysPerRequest = 16;
  limits.wire.maxRequestBytes = 2048;
  limits.maxMemoryBytes = 4096;
  limits.maxUnsentBytes = 256;
  limits.maxReplyBytes = 1024;
  limits.maxWaitKeys = 8;
  limits.maxWatchKeys = 2;
  NullOutbox out;
  ServerState state(limits, out);
  bool open[4] = {false, false, false, false};
  size_t pos = 0;
  while (pos < size) {
    uint8_t ctl = data[pos++];
    ConnId id = ctl & 3;
    size_t len = (ctl >> 2) + 1;  // 1..64 bytes per chunk
    if (!open[id]) {
      state.open(id);
      open[id] = true;
    }
    if (len == 64) {  // a control byte of 0b111111xx closes the connection
      state.closed(id);
      open[id] = false;
      continue;
    }
    len = std::min(len, size - pos);
    std::string err = state.receive(id, std::string_view(
                                            reinterpret_cast<const char*>(data + pos), len));
    pos += len;
    if (!err.empty()) {
      state.closed(id);
      open[id] = false;
    }
    if (state.stats().memoryBytes > limits.maxMemoryBytes) die("memory over limit");
    for (ConnId d : out.doomed) {
      if (!open[d]) continue;
      state.closed(d);
      open[d] = false;
    }
    out.doomed.clear();
    // Every other chunk, the clients read their replies (odd control bytes
    // leave them unread, so backpressure and held input are exercised).
    if (ctl & 1) continue;
    for (auto& [cid, buf] : out.out) {
      state.sent(cid, buf.size());
      buf.clear();
      if (open[cid] && !state.resume(cid).empty()) {
        state.closed(cid);
        open[cid] = false;
      }
    }
  }
  for (ConnId id = 0; id < 4; ++id)
    if (open[id]) state.closed(id);
}

std::vector<wire::Request> parseAll(wire::RequestParser& p, std::string_view data,
                                    const uint8_t* sizes, size_t nSizes) {
  std::vector<wire::Request> out;
  size_t at = 0, k = 0;
  while (at < data.size()) {
    size_t piece = nSizes == 0 ? data.size() : sizes[k++ % nSizes] % 17 + 1;
    std::string_view chunk = data.substr(at, piece);
    at += chunk.size();
    while (true) {
      auto res = p.feed(chunk);
      if (res.status == wire::ParseStatus::kBad) return out;
      if (res.status == wire::ParseStatus::kNeedMore) break;
      out.push_back(p.request());
      p.next();
      chunk.remove_prefix(res.consumed);
      if (chunk.empty()) break;
    }
  }
  return out;
}

bool same(const wire::Request& a, const wire::Request& b) {
  return a.cmd == b.cmd && a.keys == b.keys && a.values == b.values &&
         a.number == b.number && a.u32 == b.u32;
}

void checkIncremental(wire::Dialect d, std::string_view data) {
  wire::Limits limits;
  limits.maxKeyBytes = 64;
  limits.maxValueBytes = 256;
  limits.maxKeysPerRequest = 8;
  limits.maxRequestBytes = 1024;
  wire::RequestParser whole(d, limits), split(d, limits);
  auto a = parseAll(whole, data, nullptr, 0);
  auto b = parseAll(split, data, reinterpret_cast<const uint8_t*>(data.data()),
                    std::min<size_t>(data.size(), 8));
  if (a.size() != b.size()) die("split parse gave a different number of requests");
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) die("split parse gave a different request");
  if (whole.bytesParsed() > data.size() || split.bytesParsed() > data.size())
    die("parsed more bytes than were fed");
}

void checkReply(std::string_view data) {
  if (data.empty()) return;
  auto cmd = static_cast<wire::Command>(static_cast<uint8_t>(data[0]) % 20);
  size_t expected = data.size() > 1 ? static_cast<uint8_t>(data[1]) % 8 : 0;
  std::string_view body = data.substr(std::min<size_t>(2, data.size()));
  wire::ReplyParser p(cmd, expected, 256, 16);
  auto res = p.feed(body);
  if (res.status != wire::ParseStatus::kOk) return;
  if (res.consumed > body.size()) die("reply consumed out of range");
  std::string again;
  wire::encodeReply(cmd, p.reply(), again);
  if (again != body.substr(0, res.consumed)) die("reply re-encoding differs from input");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view view(reinterpret_cast<const char*>(data), size);
  checkParser(wire::Dialect::kLegacy, view);
  checkParser(wire::Dialect::kV2, view);
  checkServer(data, size);
  checkIncremental(wire::Dialect::kLegacy, view);
  checkIncremental(wire::Dialect::kV2, view);
  checkReply(view);
  return 0;
}
