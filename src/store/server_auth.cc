// ServerState's side of the authentication exchange (auth.h): what a
// connection of a server with a secret may do before it has proved that it
// knows the secret.
#include <string>

#include "ddprun/common/strings.h"
#include "ddprun/store/auth.h"
#include "ddprun/store/server_state.h"
#include "server_conn.h"

namespace ddprun::store {

using wire::Command;

namespace {
// Requests an unauthenticated connection may make: VALIDATE, PING, the nonce
// GET, the proof SET, and a little slack for a client that asks twice.
constexpr int kMaxUnauthenticatedRequests = 8;

// Parser limits before authentication: the exchange's keys and values are
// tens of bytes, so an unauthenticated peer holds at most a few hundred
// bytes of the budget (a declared 60 MiB value is refused at its length).
const wire::Limits kUnauthenticatedLimits{/*maxKeyBytes=*/64, /*maxValueBytes=*/64,
                                          /*maxKeysPerRequest=*/1,
                                          /*maxRequestBytes=*/256};

std::string refuse(const std::string& what) {
  return what +
         " before authenticating (this store requires a token: give the "
         "client the same secret as the server)";
}
}  // namespace

const wire::Limits& ServerState::wireLimits(const Conn& c) const {
  return c.authed ? limits_.wire : kUnauthenticatedLimits;
}

bool ServerState::authenticated(ConnId id) const {
  auto it = conns_.find(id);
  return it == conns_.end() || it->second->authed;
}

std::string ServerState::authStep(Conn& c, wire::Request& r) {
  if (++c.authRequests > kMaxUnauthenticatedRequests)
    return refuse(std::to_string(kMaxUnauthenticatedRequests) + " requests");
  const std::string* key = r.keys.empty() ? nullptr : &r.keys[0];
  std::string error;
  switch (r.cmd) {
    case Command::kValidate:
      return r.u32 == wire::kValidationMagic ? "" : "bad VALIDATE magic";
    case Command::kPing: {  // PyTorch >= 2.5 pings right after VALIDATE
      std::string* out = reply(c, 4, error);
      if (out) wire::Writer(*out).u32(r.u32);
      return error;
    }
    case Command::kGet:
      if (*key != auth::kNonceKey) break;
      if (c.nonce.empty()) c.nonce = auth_.nonce ? auth_.nonce() : auth::newNonce();
      if (std::string* out = reply(c, 8 + c.nonce.size(), error))
        wire::Writer(*out).bytes(c.nonce);
      return error;
    case Command::kSet:
      if (*key == auth::kProofKey) return authProof(c, r);
      break;
    default:
      break;
  }
  return refuse(std::string(wire::commandName(r.cmd)) +
                (key ? " of key '" + str::escape(*key, 64) + "'" : ""));
}

// The SET of the proof: right, and the connection is served from its next
// request on, with the full limits; wrong (or sent before the nonce was
// asked for), and it is closed.
std::string ServerState::authProof(Conn& c, const wire::Request& r) {
  if (c.nonce.empty()) return refuse("a proof sent before its nonce was asked for");
  if (!auth::proofEquals(r.values[0], auth::clientProof(auth_.secret, c.nonce)))
    return "wrong authentication proof: the client's token is not the server's (use "
           "the same secret on every node)";
  c.authed = true;
  c.parser->setLimits(limits_.wire);
  return {};
}

}  // namespace ddprun::store
