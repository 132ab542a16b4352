// Values people type: command-line flags, environment variables and
// --rdzv-conf entries, read one way by every program (ddprun, ddprun-store,
// train) so that one spelling means one thing everywhere.
//
// A number is a whole-string decimal: an optional sign, digits and, for a
// real, a fraction and an exponent (1.5, .5, 2e3). No spaces, no hex or
// octal, no suffix, no NaN or infinity; a value beyond the type
// (18446744073709551616 for 64 bits, 1e400 for a double) is out of range,
// never saturated or wrapped. Host names and paths hold no control
// character (bytes below 0x20, and 0x7f): one would be a pasting mistake,
// and printed raw it rewrites the terminal.
//
// The parsers return a result; the flag helpers throw InvalidArgument whose
// message names the flag, shows the value escaped (str::escape) and says
// what is accepted; the programs print it and exit 2. Pure functions,
// thread-safe.
#pragma once

#include <cfloat>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddprun::input {

enum class NumberProblem {
  kNone,          // accepted
  kNotANumber,    // empty, junk, spaces, hex, a suffix
  kNotAnInteger,  // a real (1.5, 1e3) where an integer is expected
  kNotFinite,     // nan, inf, infinity (any case, either sign)
  kOutOfRange,    // a number outside [min, max] or beyond the type
};

// Each leaves `out` alone unless it returns kNone. Bounds are inclusive.
NumberProblem parseNumber(std::string_view text, int64_t& out, int64_t min = INT64_MIN,
                          int64_t max = INT64_MAX);
NumberProblem parseNumber(std::string_view text, uint64_t& out, uint64_t min = 0,
                          uint64_t max = UINT64_MAX);
NumberProblem parseNumber(std::string_view text, double& out, double min = -DBL_MAX,
                          double max = DBL_MAX);

// The problem in words, for a message: "not a number", "not a whole number",
// "not a finite number", "out of range" ("" for kNone).
const char* describe(NumberProblem p);

// A flag's number: parseNumber, or InvalidArgument
//   "<flag>: invalid value '<text, escaped>': <describe>; expected <expected>"
// where `expected` states the accepted values ("an integer >= 0"). T is
// int64_t, uint64_t or double.
template <typename T>
T numberFlag(std::string_view flag, std::string_view text, T min, T max,
             std::string_view expected);

// True when `text` holds a byte below 0x20 or 0x7f.
bool hasControlChar(std::string_view text);
// Throws InvalidArgument when `text` holds a control character:
//   "<flag>: '<text, escaped>' holds a control character (\xNN); a <kind>
//   has none ..." (`kind`: "host name", "path").
void refuseControlChars(std::string_view flag, std::string_view text,
                        std::string_view kind);

}  // namespace ddprun::input
