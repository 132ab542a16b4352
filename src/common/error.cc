#include "ddprun/common/error.h"

namespace ddprun {

namespace {
std::string withLocation(const std::string& msg, const char* file, int line) {
  if (file == nullptr || *file == '\0') return msg;
  std::string f(file);
  auto pos = f.rfind("/src/");
  if (pos != std::string::npos) f = f.substr(pos + 1);
  return msg + " [" + f + ":" + std::to_string(line) + "]";
}
}  // namespace

Error::Error(const std::string& msg, const char* file, int line)
    : std::runtime_error(withLocation(msg, file, line)),
      message_(msg),
      file_(file),
      line_(line) {}

}  // namespace ddprun
