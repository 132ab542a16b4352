// The outermost frame of every ddprun program's `main` (runMain): no program
// dies of an uncaught exception (std::terminate: SIGABRT, a core, no word of
// what went wrong), nor of SIGPIPE. Each program documents the exit code it
// passes here.
//
// Thread-safe; call it from `main` only (it writes to stderr).
#pragma once

#include <utility>

namespace ddprun {

// SIGPIPE ignored for the whole process: a write to a pipe or socket whose
// reader has gone is EPIPE, an error its writer handles, never the death of
// the program (a ddprun-store whose stderr reader left would otherwise die at
// its next log line, which any client can provoke). Ignored dispositions pass
// through exec: whoever starts programs that expect SIGPIPE's default sets it
// back in the child (the agent's worker keeper does, as Python's subprocess).
void ignoreSigpipe() noexcept;

// Ends the exception being handled (call it only inside a catch block): one
// line on stderr, "<program>: error: <what>" ("out of memory
// (std::bad_alloc)" for an allocation failure), written without allocating.
// Returns `exitCode`.
int reportEscapedException(const char* program, int exitCode) noexcept;

// Returns body(); an exception escaping it ends as reportEscapedException
// says, with `exitCode`.
template <typename Body>
int runGuarded(const char* program, int exitCode, Body&& body) noexcept {
  try {
    return body();
  } catch (...) {
    return reportEscapedException(program, exitCode);
  }
}

// The whole of a program's `main`: ignoreSigpipe(), then runGuarded.
template <typename Body>
int runMain(const char* program, int exitCode, Body&& body) noexcept {
  ignoreSigpipe();
  return runGuarded(program, exitCode, std::forward<Body>(body));
}

}  // namespace ddprun
