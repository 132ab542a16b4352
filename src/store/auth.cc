#include "ddprun/store/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "ddprun/common/env.h"
#include "ddprun/common/error.h"

namespace ddprun::store::auth {

namespace {
// Bound into every proof: a proof made for this exchange is useless in any
// other protocol keyed by the same secret, and the two directions differ.
constexpr std::string_view kClientContext = "ddprun-store-auth-v1 client";
constexpr std::string_view kServerContext = "ddprun-store-auth-v1 server";

std::string hmac(std::string_view secret, std::string_view nonce,
                 std::string_view context) {
  std::string msg;
  msg.reserve(nonce.size() + context.size());
  msg.append(nonce).append(context);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len))
    DDPRUN_THROW(IoError, "HMAC-SHA256 failed in OpenSSL");
  return std::string(reinterpret_cast<const char*>(out), len);
}

// Drops trailing newlines and blanks (`echo secret > file` adds a newline).
std::string trimEnd(std::string s) {
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t'))
    s.pop_back();
  return s;
}

// Reads at most kMaxSecretBytes + 1 bytes of an open file.
std::string readBounded(int fd, const std::string& path) {
  std::string data(kMaxSecretBytes + 1, '\0');
  size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      DDPRUN_THROW(InvalidArgument, "cannot read the token file '", path,
                   "': ", std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  return data;
}

std::string checked(std::string secret, const std::string& source) {
  if (secret.size() > kMaxSecretBytes)
    DDPRUN_THROW(InvalidArgument, source, " holds more than ", kMaxSecretBytes,
                 " bytes; a token of 32 to 64 random characters is enough "
                 "(e.g. openssl rand -hex 32)");
  secret = trimEnd(std::move(secret));
  if (secret.empty())
    DDPRUN_THROW(InvalidArgument, source,
                 " is empty; put the shared secret in it (e.g. openssl rand -hex 32)");
  return secret;
}
}  // namespace

std::string newNonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()),
                 static_cast<int>(nonce.size())) != 1)
    DDPRUN_THROW(IoError, "the system's random generator failed (OpenSSL RAND_bytes)");
  return nonce;
}

std::string clientProof(std::string_view secret, std::string_view nonce) {
  return hmac(secret, nonce, kClientContext);
}

std::string serverProof(std::string_view secret, std::string_view nonce) {
  return hmac(secret, nonce, kServerContext);
}

bool proofEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// Refuses what is not a private regular file: a FIFO or device (whose read
// may block forever or never end), and any mode that gives the group or
// others a bit (docs/rendezvous.md: 0600 or stricter).
void checkTokenFile(const struct stat& st, const std::string& path) {
  if (!S_ISREG(st.st_mode))
    DDPRUN_THROW(InvalidArgument, "the token file '", path, "' is not a regular file (",
                 S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                                                                       : "a device or socket",
                 "); put the secret in an ordinary file of mode 0600");
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    DDPRUN_THROW(InvalidArgument, "the token file '", path, "' has mode ", mode, ", open to ",
                 (st.st_mode & S_IRWXO) != 0 ? "every user of this machine" : "the file's group",
                 "; it must be 0600 or stricter: chmod 600 '", path, "'");
  }
}

std::string loadSecret(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading must not wait for a writer (it
  // is refused below; a regular file ignores the flag).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    DDPRUN_THROW(InvalidArgument, "cannot open the token file '", path,
                 "': ", std::strerror(errno));
  struct stat st {};
  std::string data;
  try {
    if (::fstat(fd, &st) != 0)
      DDPRUN_THROW(InvalidArgument, "cannot stat the token file '", path,
                   "': ", std::strerror(errno));
    checkTokenFile(st, path);
    data = readBounded(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return checked(std::move(data), "the token file '" + path + "'");
}

std::optional<std::string> secretFromEnv() {
  auto value = env::get(kTokenEnv);
  if (!value) return std::nullopt;
  return checked(std::move(*value), std::string(kTokenEnv));
}

bool openStoreAllowed() {
  const std::string v = env::get(kAllowOpenEnv).value_or("");
  if (v.empty() || v == "0" || v == "false") return false;
  if (v == "1" || v == "true") return true;
  DDPRUN_THROW(InvalidArgument, "$", kAllowOpenEnv, "='", v.substr(0, 16),
               "': expected 1 (use a store that requires no token) or 0");
}

}  // namespace ddprun::store::auth
