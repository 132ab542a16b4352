#include "ddprun/train/metrics.h"

#include <openssl/evp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "ddprun/common/error.h"

namespace ddprun::train {

MetricsWriter::MetricsWriter(const std::string& path, bool append) {
  if (path.empty()) return;
  out_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!out_) DDPRUN_THROW(IoError, "cannot write the metrics file ", path, ": ", std::strerror(errno));
}

void MetricsWriter::write(const nlohmann::json& j) {
  if (!out_.is_open()) return;
  out_ << j.dump() << '\n';
  out_.flush();
}

Progress::Progress(std::FILE* out, bool enabled)
    : out_(out), enabled_(enabled), tty_(enabled && ::isatty(::fileno(out))) {}

void Progress::update(const std::string& line) {
  if (!enabled_) return;
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    dirty_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void Progress::finish() {
  if (dirty_) std::fputc('\n', out_);
  dirty_ = false;
  std::fflush(out_);
}

std::string parametersSha256(const std::vector<Param*>& params,
                             const std::vector<Buffer*>& buffers) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  DDPRUN_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "SHA-256 init");
  for (const Param* p : params) EVP_DigestUpdate(ctx.get(), p->value.data(), p->value.bytes());
  for (const Buffer* b : buffers) EVP_DigestUpdate(ctx.get(), b->value.data(), b->value.bytes());
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) {
    char b[3];
    std::snprintf(b, sizeof(b), "%02x", md[i]);
    hex += b;
  }
  return hex;
}

double peakRssMb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // kB on Linux
}

std::string formatSeconds(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  const long t = std::lround(s);
  char b[32];
  if (t >= 3600) std::snprintf(b, sizeof(b), "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(b, sizeof(b), "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(b, sizeof(b), "%lds", t);
  return b;
}

}  // namespace ddprun::train
