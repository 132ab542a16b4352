// Shared-secret authentication of store clients: the secret's sources (a
// token file, an environment variable) and the challenge-response both ends
// of a connection compute.
//
// The exchange runs inside the ordinary TCPStore protocol, on keys no
// PyTorch or ddprun user key can name (user keys start with "/"):
//   client: GET kNonceKey             server: a fresh random nonce (kNonceBytes)
//   client: SET kProofKey = clientProof(secret, nonce)
//   client: GET kVerdictKey           server: serverProof(secret, nonce)
// A wrong proof, or any other request before it, closes the connection. The
// secret never crosses the wire; values do travel in clear (see
// docs/store.md, "Authentication"). An open server (no secret) answers the
// nonce GET with an empty value, which is how a client tells it apart.
//
// Free functions, thread-safe. Errors are InvalidArgument (bad token source,
// with how to fix it) or IoError (the system's random generator failed).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ddprun/common/error.h"

namespace ddprun::store::auth {

// The store refused this client's token, or did not prove it knows the
// secret itself. Never retried: the same secret must be given everywhere.
class AuthError : public ProtocolError {
  using ProtocolError::ProtocolError;
};

inline constexpr std::string_view kNonceKey = "ddprun-auth/nonce";
inline constexpr std::string_view kProofKey = "ddprun-auth/proof";
inline constexpr std::string_view kVerdictKey = "ddprun-auth/verdict";
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256
// Longest secret accepted from a file or the environment.
inline constexpr size_t kMaxSecretBytes = 4096;
// The environment variable holding the secret when no file is given.
inline constexpr const char* kTokenEnv = "DDPRUN_RDZV_TOKEN";
// Set to 1: a client holding a token uses a store that requires none (one
// warning) instead of refusing it (docs/rendezvous.md, "Authentication").
inline constexpr const char* kAllowOpenEnv = "DDPRUN_RDZV_ALLOW_OPEN_STORE";

// kNonceBytes from OpenSSL's RAND_bytes. Throws IoError if it fails.
std::string newNonce();
// HMAC-SHA256(secret, nonce || a fixed context string); the two directions
// use different contexts, so one proof cannot be replayed as the other.
std::string clientProof(std::string_view secret, std::string_view nonce);
std::string serverProof(std::string_view secret, std::string_view nonce);
// Constant-time comparison (CRYPTO_memcmp) of equal-length strings; false
// for different lengths.
bool proofEquals(std::string_view a, std::string_view b);

// Reads the secret from `path`: trailing newlines and spaces are dropped.
// Refuses (InvalidArgument naming the file and the fix) a file that cannot
// be read, is not a regular file (a FIFO is refused at once, never waited
// on), has any group or other permission bit (0600 or stricter; the
// message names the mode and `chmod 600`), is empty after trimming or is
// larger than kMaxSecretBytes. The message never contains the secret.
std::string loadSecret(const std::string& path);
// The secret in $DDPRUN_RDZV_TOKEN (trimmed as above); nullopt if unset.
// Set but empty, or too long: InvalidArgument.
std::optional<std::string> secretFromEnv();
// Whether $DDPRUN_RDZV_ALLOW_OPEN_STORE allows an open store: "1" or "true"
// yes; unset, "", "0" or "false" no; anything else InvalidArgument.
bool openStoreAllowed();

}  // namespace ddprun::store::auth
