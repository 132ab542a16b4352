// Typed exceptions used by every ddprun library.
//
// Library APIs throw a subclass of ddprun::Error; each carries the file:line
// where it was raised so that a failure report points at the code, not only at
// the message. Asio handlers never throw (they work with error_code), and
// parsers return results instead of throwing.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ddprun {

class Error : public std::runtime_error {
 public:
  Error(const std::string& msg, const char* file = "", int line = 0);
  // The message without the source location.
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

// A deadline passed (connect, wait, collective).
class TimeoutError : public Error {
  using Error::Error;
};
// A socket, file or process operation failed.
class IoError : public Error {
  using Error::Error;
};
// The caller passed something that can never work (bad flag, bad address).
class InvalidArgument : public Error {
  using Error::Error;
};
// A blocking operation was abandoned on request (a signal, shutdown).
class CancelledError : public Error {
  using Error::Error;
};
// The peer spoke something we do not understand or closed mid-reply.
class ProtocolError : public Error {
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace ddprun

// Throw `Type` with a message built from the streamable arguments.
#define DDPRUN_THROW(Type, ...) \
  throw Type(::ddprun::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// Check a precondition; on failure throw InvalidArgument naming the condition.
#define DDPRUN_CHECK(cond, ...)                                        \
  do {                                                                 \
    if (!(cond))                                                       \
      DDPRUN_THROW(::ddprun::InvalidArgument, "check failed: " #cond   \
                   ": " __VA_OPT__(, ) __VA_ARGS__);                   \
  } while (0)
