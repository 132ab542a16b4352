#include "ddprun/common/user_input.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"

namespace ddprun::input {

namespace {

bool isDigit(char c) { return c >= '0' && c <= '9'; }

bool isControl(char c) {
  auto b = static_cast<unsigned char>(c);
  return b < 0x20 || b == 0x7f;
}

size_t digitsAt(std::string_view t, size_t i) {
  size_t n = 0;
  while (i + n < t.size() && isDigit(t[i + n])) ++n;
  return n;
}

size_t signAt(std::string_view t, size_t i) {
  return i < t.size() && (t[i] == '+' || t[i] == '-') ? 1 : 0;
}

// [+-]digits
bool integerForm(std::string_view t) {
  size_t s = signAt(t, 0);
  size_t d = digitsAt(t, s);
  return d > 0 && s + d == t.size();
}

// [+-](digits[.digits] | .digits)([eE][+-]digits)
bool realForm(std::string_view t) {
  size_t i = signAt(t, 0);
  size_t whole = digitsAt(t, i);
  i += whole;
  size_t fraction = 0;
  if (i < t.size() && t[i] == '.') {
    fraction = digitsAt(t, i + 1);
    i += 1 + fraction;
  }
  if (whole + fraction == 0) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    size_t s = signAt(t, i + 1);
    size_t exp = digitsAt(t, i + 1 + s);
    if (exp == 0) return false;
    i += 1 + s + exp;
  }
  return i == t.size();
}

// Why `t` is not in the form asked for.
NumberProblem notANumber(std::string_view t, bool integer) {
  std::string word(t.substr(signAt(t, 0)));
  std::transform(word.begin(), word.end(), word.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (word == "nan" || word == "inf" || word == "infinity" ||
      str::startsWith(word, "nan("))
    return NumberProblem::kNotFinite;
  if (integer && realForm(t)) return NumberProblem::kNotAnInteger;
  return NumberProblem::kNotANumber;
}

// The magnitude of an integerForm text: false beyond 64 bits.
bool magnitude(std::string_view t, bool& negative, uint64_t& m) {
  size_t s = signAt(t, 0);
  negative = s == 1 && t[0] == '-';
  auto [ptr, ec] = std::from_chars(t.data() + s, t.data() + t.size(), m);
  return ec == std::errc() && ptr == t.data() + t.size();
}

}  // namespace

NumberProblem parseNumber(std::string_view text, int64_t& out, int64_t min, int64_t max) {
  if (!integerForm(text)) return notANumber(text, true);
  bool negative = false;
  uint64_t m = 0;
  constexpr uint64_t kMaxPositive = static_cast<uint64_t>(INT64_MAX);
  if (!magnitude(text, negative, m) || m > kMaxPositive + (negative ? 1 : 0))
    return NumberProblem::kOutOfRange;
  // -2^63 has no positive counterpart: negate in unsigned arithmetic.
  int64_t v = negative ? static_cast<int64_t>(0 - m) : static_cast<int64_t>(m);
  if (v < min || v > max) return NumberProblem::kOutOfRange;
  out = v;
  return NumberProblem::kNone;
}

NumberProblem parseNumber(std::string_view text, uint64_t& out, uint64_t min,
                          uint64_t max) {
  if (!integerForm(text)) return notANumber(text, true);
  bool negative = false;
  uint64_t m = 0;
  if (!magnitude(text, negative, m) || (negative && m != 0) || m < min || m > max)
    return NumberProblem::kOutOfRange;
  out = m;
  return NumberProblem::kNone;
}

NumberProblem parseNumber(std::string_view text, double& out, double min, double max) {
  if (!realForm(text)) return notANumber(text, false);
  // from_chars: no locale, no leading '+'; out of range beyond a double's
  // exponent (1e400, and 1e-400, which would silently be 0).
  const char* b = text.data() + (text[0] == '+' ? 1 : 0);
  double v = 0;
  auto [ptr, ec] = std::from_chars(b, text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range) return NumberProblem::kOutOfRange;
  if (ec != std::errc() || ptr != text.data() + text.size())
    return NumberProblem::kNotANumber;
  if (!(v >= min && v <= max)) return NumberProblem::kOutOfRange;
  out = v;
  return NumberProblem::kNone;
}

const char* describe(NumberProblem p) {
  switch (p) {
    case NumberProblem::kNone:
      return "";
    case NumberProblem::kNotANumber:
      return "not a number";
    case NumberProblem::kNotAnInteger:
      return "not a whole number";
    case NumberProblem::kNotFinite:
      return "not a finite number";
    case NumberProblem::kOutOfRange:
      return "out of range";
  }
  return "not a number";
}

template <typename T>
T numberFlag(std::string_view flag, std::string_view text, T min, T max,
             std::string_view expected) {
  T v{};
  NumberProblem p = parseNumber(text, v, min, max);
  if (p != NumberProblem::kNone)
    DDPRUN_THROW(InvalidArgument, flag, ": invalid value '", str::escape(text),
                 "': ", describe(p), "; expected ", expected);
  return v;
}

template int64_t numberFlag<int64_t>(std::string_view, std::string_view, int64_t, int64_t,
                                     std::string_view);
template uint64_t numberFlag<uint64_t>(std::string_view, std::string_view, uint64_t,
                                       uint64_t, std::string_view);
template double numberFlag<double>(std::string_view, std::string_view, double, double,
                                   std::string_view);

bool hasControlChar(std::string_view text) {
  return std::any_of(text.begin(), text.end(), isControl);
}

void refuseControlChars(std::string_view flag, std::string_view text,
                        std::string_view kind) {
  auto it = std::find_if(text.begin(), text.end(), isControl);
  if (it == text.end()) return;
  char byte[8];
  std::snprintf(byte, sizeof byte, "\\x%02x", static_cast<unsigned char>(*it));
  DDPRUN_THROW(
      InvalidArgument, flag, ": '", str::escape(text), "' holds a control character (",
      byte, "); a ", kind,
      " has none: look for a stray newline, tab or escape sequence in the command "
      "line or the environment");
}

}  // namespace ddprun::input
