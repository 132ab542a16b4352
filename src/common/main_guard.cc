#include "ddprun/common/main_guard.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <new>

#include "ddprun/common/error.h"

namespace ddprun {

namespace {
// A fixed buffer and write(2): an exception may mean that memory ran out.
void writeLine(const char* program, const char* what) noexcept {
  char line[1024];
  int n = std::snprintf(line, sizeof line, "%s: error: %s\n", program, what);
  if (n < 0) return;
  size_t len = static_cast<size_t>(n) < sizeof line ? static_cast<size_t>(n) : sizeof line - 1;
  if (len > 0 && line[len - 1] != '\n') line[len - 1] = '\n';  // cut: still one line
  for (size_t done = 0; done < len;) {
    ssize_t w = ::write(STDERR_FILENO, line + done, len - done);
    if (w <= 0) return;
    done += static_cast<size_t>(w);
  }
}
}  // namespace

void ignoreSigpipe() noexcept {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

int reportEscapedException(const char* program, int exitCode) noexcept {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    writeLine(program, "out of memory (std::bad_alloc)");
  } catch (const Error& e) {
    writeLine(program, e.message().c_str());
  } catch (const std::exception& e) {
    writeLine(program, e.what());
  } catch (...) {
    writeLine(program, "an unknown exception");
  }
  return exitCode;
}

}  // namespace ddprun
