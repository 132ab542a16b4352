// libFuzzer target for the store's request parser and server state machine.
//
// (a) parseRequest on the raw input in both dialects: consumed bytes stay in
//     range, an accepted request re-encodes to exactly the bytes consumed, and
//     every strict prefix of it asks for more data.
// (b) The input, cut into chunks at positions taken from the input itself,
//     fed to a ServerState over several connections (which open and close as
//     the input says), with small limits so the limit paths are reached.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>

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
  std::string& bufferFor(ConnId id) override {
    auto& b = out[id];
    if (b.size() > (1 << 20)) b.clear();
    return b;
  }
  std::unordered_map<ConnId, std::string> out;
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
  }
  for (ConnId id = 0; id < 4; ++id)
    if (open[id]) state.closed(id);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view view(reinterpret_cast<const char*>(data), size);
  checkParser(wire::Dialect::kLegacy, view);
  checkParser(wire::Dialect::kV2, view);
  checkServer(data, size);
  return 0;
}
