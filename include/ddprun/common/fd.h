// File descriptors: an owner that closes, and a write that writes everything.
// Shared by the agent (output relay, keeper, reporter) and the trainer's
// checkpoint writer.
//
// Thread-safety: a UniqueFd is a plain value, used by one thread at a time.
// writeAll keeps no state; two threads writing to the same fd at once may
// interleave their bytes. writeAll is async-signal-safe (write(2) and poll(2)
// only, no allocation), so a forked child of a multithreaded process (the
// agent's keeper) may call it.
#pragma once

#include <cstddef>
#include <string_view>

namespace ddprun {

// Owns one file descriptor (closed on destruction). Move-only. -1: none.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  // Gives the descriptor up without closing it; holds none afterwards.
  int release();
  // Closes the descriptor held (if any), then holds `fd`. close()'s result
  // is ignored: call close() first where it matters.
  void reset(int fd = -1);
  // Closes now and reports close(2)'s result (false with errno set: a
  // delayed write error, e.g. on NFS). True when none was held.
  bool close();

 private:
  int fd_ = -1;
};

// Writes all `size` bytes at `data` to `fd` with write(2), resuming after
// partial writes and EINTR and waiting (poll) when the fd is non-blocking and
// full. Returns false on any other failure, with errno set (EPIPE: the reader
// is gone, needs SIGPIPE ignored or blocked; EIO: write(2) wrote nothing).
bool writeAll(int fd, const void* data, size_t size);
inline bool writeAll(int fd, std::string_view data) {
  return writeAll(fd, data.data(), data.size());
}

// A file's type from its stat(2) st_mode, for messages: "a regular file",
// "a directory", "a symbolic link", "a FIFO", "a socket", "a character
// device", "a block device", else "a special file".
const char* fileTypeName(unsigned mode);

}  // namespace ddprun
