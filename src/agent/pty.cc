#include "pty.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ddprun/agent/launcher.h"
#include "ddprun/common/error.h"

namespace ddprun::agent::detail {

namespace {
[[noreturn]] void fail(const char* what) {
  DDPRUN_THROW(IoError, "cannot open a pseudo-terminal for a worker (", what,
               "): ", startErrorText(errno));
}
}  // namespace

PtyPair openPty(int console) {
  PtyPair p;
  p.master.reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (p.master.get() < 0) fail("posix_openpt");
  if (::grantpt(p.master.get()) != 0) fail("grantpt");
  if (::unlockpt(p.master.get()) != 0) fail("unlockpt");
  char name[128];
  if (::ptsname_r(p.master.get(), name, sizeof name) != 0) fail("ptsname");
  p.slave.reset(::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (p.slave.get() < 0) fail(name);
  termios t{};
  if (::tcgetattr(p.slave.get(), &t) != 0) fail("tcgetattr");
  t.c_oflag &= ~static_cast<tcflag_t>(OPOST);
  if (::tcsetattr(p.slave.get(), TCSANOW, &t) != 0) fail("tcsetattr");
  winsize ws{};
  if (::ioctl(console, TIOCGWINSZ, &ws) == 0) ::ioctl(p.slave.get(), TIOCSWINSZ, &ws);
  return p;
}

}  // namespace ddprun::agent::detail
