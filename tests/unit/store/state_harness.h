// Test harness of ServerState: an in-memory Outbox and a client that speaks
// one dialect to it, with no sockets (shared by the store's unit tests).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "ddprun/store/server_state.h"
#include "ddprun/store/wire.h"

namespace ddprun::store::testing_harness {

using wire::Command;
using wire::Dialect;

class FakeOutbox : public Outbox {
 public:
  std::string& bufferFor(ConnId id) override { return out[id]; }
  // Takes and clears what was sent to a connection.
  std::string take(ConnId id) {
    std::string s = std::move(out[id]);
    out[id].clear();
    return s;
  }
  void closeLater(ConnId id, const std::string& why) override { doomed[id] = why; }
  std::map<ConnId, std::string> out;
  std::map<ConnId, std::string> doomed;
};

inline std::string u8(uint8_t v) { return std::string(1, static_cast<char>(v)); }
inline std::string i64(int64_t v) {
  return std::string(reinterpret_cast<const char*>(&v), 8);
}
inline std::string bytes(std::string_view s) {
  std::string out;
  wire::Writer(out).bytes(s);
  return out;
}

// A client connection talking to the state machine.
class Client {
 public:
  Client(ServerState& s, FakeOutbox& o, ConnId id, Dialect d)
      : s_(s), o_(o), id_(id), d_(d) {
    s_.open(id_);
    if (d_ == Dialect::kV2) {
      wire::Request v;
      v.cmd = Command::kValidate;
      v.u32 = wire::kValidationMagic;
      EXPECT_EQ(send(v), "");
    }
  }
  std::string send(const wire::Request& r) {
    std::string b;
    wire::encodeRequest(d_, r, b);
    return s_.receive(id_, b);
  }
  std::string send(Command c, std::vector<std::string> keys = {},
                   std::vector<std::string> values = {}, int64_t n = 0) {
    return send(wire::makeRequest(c, std::move(keys), std::move(values), n));
  }
  // Takes what was sent to this client and reports it written.
  std::string reply() {
    std::string r = o_.take(id_);
    s_.sent(id_, r.size());
    return r;
  }
  ConnId id() const { return id_; }

 private:
  ServerState& s_;
  FakeOutbox& o_;
  ConnId id_;
  Dialect d_;
};

inline std::string encoded(Dialect d, Command c, std::vector<std::string> keys = {},
                           std::vector<std::string> values = {}, int64_t n = 0) {
  std::string b;
  wire::encodeRequest(d, wire::makeRequest(c, std::move(keys), std::move(values), n), b);
  return b;
}

}  // namespace ddprun::store::testing_harness
