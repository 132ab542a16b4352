#include "ddprun/common/fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace ddprun {
namespace {

bool isOpen(int fd) { return ::fcntl(fd, F_GETFD) >= 0; }

struct Pipe {
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    read.reset(fds[0]);
    write.reset(fds[1]);
  }
  UniqueFd read, write;
};

// Everything readable from `fd` until end of file.
std::string readAll(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

TEST(UniqueFd, ClosesOnDestructionAndResetButNotAfterRelease) {
  Pipe p;
  const int r = p.read.get(), w = p.write.get();
  {
    UniqueFd owner(p.read.release());
    EXPECT_EQ(p.read.get(), -1);
    EXPECT_TRUE(isOpen(r));
  }
  EXPECT_FALSE(isOpen(r));
  const int kept = p.write.release();
  EXPECT_EQ(kept, w);
  EXPECT_TRUE(isOpen(w));
  UniqueFd again(kept);
  again.reset();
  EXPECT_FALSE(isOpen(w));
  EXPECT_EQ(again.get(), -1);
}

TEST(UniqueFd, MovingHandsTheDescriptorOnAndClosesTheOldOne) {
  Pipe a, b;
  const int ar = a.read.get(), br = b.read.get();
  UniqueFd moved(std::move(a.read));
  EXPECT_EQ(moved.get(), ar);
  EXPECT_EQ(a.read.get(), -1);
  moved = std::move(b.read);  // closes ar
  EXPECT_FALSE(isOpen(ar));
  EXPECT_EQ(moved.get(), br);
  EXPECT_TRUE(isOpen(br));
}

TEST(UniqueFd, CloseReportsTheResultAndIsIdempotent) {
  Pipe p;
  const int r = p.read.get();
  EXPECT_TRUE(p.read.close());
  EXPECT_FALSE(isOpen(r));
  EXPECT_EQ(p.read.get(), -1);
  EXPECT_TRUE(p.read.close());  // holds none: nothing to report
}

// More than a pipe holds, through a non-blocking write end: partial writes
// and EAGAIN, waited out while a reader drains; every byte arrives in order.
TEST(WriteAll, WritesEverythingThroughAFullNonBlockingPipe) {
  Pipe p;
  ASSERT_EQ(::fcntl(p.write.get(), F_SETFL, O_NONBLOCK), 0);
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + i / 4096);
  std::string got;
  std::thread reader([&] { got = readAll(p.read.get()); });
  const bool ok = writeAll(p.write.get(), data);
  p.write.reset();
  reader.join();
  EXPECT_TRUE(ok);
  EXPECT_EQ(got.size(), data.size());
  EXPECT_TRUE(got == data);
  EXPECT_TRUE(writeAll(-1, std::string_view()));  // nothing to write: no call
}

TEST(WriteAll, FailsWithErrnoWhenTheReaderIsGoneOrTheFdIsBad) {
  auto old = ::signal(SIGPIPE, SIG_IGN);
  Pipe p;
  p.read.reset();
  errno = 0;
  EXPECT_FALSE(writeAll(p.write.get(), "x"));
  EXPECT_EQ(errno, EPIPE);
  ::signal(SIGPIPE, old);
  const char bytes[3] = {1, 2, 3};
  EXPECT_FALSE(writeAll(-1, bytes, sizeof bytes));
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
}  // namespace ddprun
