// input::parseNumber and its flag helpers (issue 40): one reading of numbers
// for every program. NaN, infinities, values beyond the type or the range,
// junk around a number: refused, each with its reason; control characters
// in host names and paths: refused, shown escaped.
#include "ddprun/common/user_input.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ddprun/common/error.h"
#include "ddprun/common/strings.h"

namespace ddprun::input {
namespace {

using P = NumberProblem;

struct Case {
  const char* text;
  P problem;
};

// The texts every kind of number refuses, and why.
const std::vector<Case> kRefusedEverywhere = {
    {"", P::kNotANumber},        {"nan", P::kNotFinite},
    {"NaN", P::kNotFinite},      {"-nan", P::kNotFinite},
    {"nan(0x1)", P::kNotFinite}, {"inf", P::kNotFinite},
    {"-inf", P::kNotFinite},     {"+Infinity", P::kNotFinite},
    {"1e400", P::kOutOfRange},  // a real beyond a double; a whole number: not one
    {"5x", P::kNotANumber},     // trailing junk
    {"5 ", P::kNotANumber},      {" 5", P::kNotANumber},
    {"0x10", P::kNotANumber},    {"--5", P::kNotANumber},
    {"+-5", P::kNotANumber},     {"1,5", P::kNotANumber},
    {"e5", P::kNotANumber},      {".", P::kNotANumber},
    {"1e", P::kNotANumber},      {"five", P::kNotANumber},
};

TEST(UserInput, IntegersAreWholeStringDecimalsWithin64Bits) {
  for (const Case& c : kRefusedEverywhere) {
    int64_t v = 42;
    P want = c.problem == P::kOutOfRange ? P::kNotAnInteger : c.problem;
    EXPECT_EQ(parseNumber(c.text, v), want) << "'" << c.text << "'";
    EXPECT_EQ(v, 42) << "changed on refusal: '" << c.text << "'";
  }
  const std::vector<Case> table = {
      {"18446744073709551616", P::kOutOfRange},  // 2^64
      {"9223372036854775808", P::kOutOfRange},   // 2^63
      {"-9223372036854775809", P::kOutOfRange},
      {"99999999999999999999999", P::kOutOfRange},
      {"1.5", P::kNotAnInteger},
      {"1e3", P::kNotAnInteger},
  };
  for (const Case& c : table) {
    int64_t v = 42;
    EXPECT_EQ(parseNumber(c.text, v), c.problem) << c.text;
  }
  int64_t v = 0;
  EXPECT_EQ(parseNumber("9223372036854775807", v), P::kNone);
  EXPECT_EQ(v, INT64_MAX);
  EXPECT_EQ(parseNumber("-9223372036854775808", v), P::kNone);
  EXPECT_EQ(v, INT64_MIN);
  EXPECT_EQ(parseNumber("+7", v), P::kNone);
  EXPECT_EQ(v, 7);
  EXPECT_EQ(parseNumber("010", v), P::kNone);  // decimal, never octal
  EXPECT_EQ(v, 10);
  EXPECT_EQ(parseNumber("-0", v), P::kNone);
  EXPECT_EQ(v, 0);
}

TEST(UserInput, IntegerBoundsAreInclusive) {
  int64_t v = 0;
  EXPECT_EQ(parseNumber("0", v, 0, 3), P::kNone);
  EXPECT_EQ(parseNumber("3", v, 0, 3), P::kNone);
  EXPECT_EQ(parseNumber("-1", v, 0, 3), P::kOutOfRange);  // negative where not allowed
  EXPECT_EQ(parseNumber("4", v, 0, 3), P::kOutOfRange);
  EXPECT_EQ(v, 3);
}

TEST(UserInput, UnsignedIntegersRefuseNegativesInsteadOfWrapping) {
  for (const Case& c : kRefusedEverywhere) {
    uint64_t v = 42;
    P want = c.problem == P::kOutOfRange ? P::kNotAnInteger : c.problem;
    EXPECT_EQ(parseNumber(c.text, v), want) << "'" << c.text << "'";
    EXPECT_EQ(v, 42u);
  }
  uint64_t v = 0;
  EXPECT_EQ(parseNumber("-1", v), P::kOutOfRange);                    // not 2^64-1
  EXPECT_EQ(parseNumber("18446744073709551616", v), P::kOutOfRange);  // not saturated
  EXPECT_EQ(parseNumber("18446744073709551615", v), P::kNone);
  EXPECT_EQ(v, UINT64_MAX);
  EXPECT_EQ(parseNumber("-0", v), P::kNone);
  EXPECT_EQ(v, 0u);
  EXPECT_EQ(parseNumber("0", v, 1), P::kOutOfRange);
}

TEST(UserInput, RealsAreFiniteDecimalsWithinTheirRange) {
  for (const Case& c : kRefusedEverywhere) {
    double v = 42;
    EXPECT_EQ(parseNumber(c.text, v), c.problem) << "'" << c.text << "'";
    EXPECT_EQ(v, 42);
  }
  double v = 0;
  EXPECT_EQ(parseNumber("-1e400", v), P::kOutOfRange);
  EXPECT_EQ(parseNumber("1e-400", v), P::kOutOfRange);  // would silently be 0
  EXPECT_EQ(parseNumber("0x1p3", v), P::kNotANumber);   // no hex floats
  EXPECT_EQ(parseNumber("1e-320", v, 0.05, 10), P::kOutOfRange);
  EXPECT_EQ(parseNumber("-0.5", v, 0, 10), P::kOutOfRange);
  for (auto [text, want] : std::vector<std::pair<const char*, double>>{{"2.5", 2.5},
                                                                       {".5", 0.5},
                                                                       {"5.", 5},
                                                                       {"+1e3", 1000},
                                                                       {"-2E-1", -0.2},
                                                                       {"0", 0}}) {
    ASSERT_EQ(parseNumber(text, v), P::kNone) << text;
    EXPECT_DOUBLE_EQ(v, want) << text;
  }
  EXPECT_EQ(parseNumber("0.05", v, 0.05, 10), P::kNone);  // bounds are inclusive
  EXPECT_EQ(parseNumber("10", v, 0.05, 10), P::kNone);
}

TEST(UserInput, TheStrHelpersReadNumbersTheSameWay) {
  int64_t i = 0;
  double d = 0;
  EXPECT_FALSE(str::parseInt("18446744073709551616", i));
  EXPECT_FALSE(str::parseInt("+-5", i));
  EXPECT_FALSE(str::parseDouble("nan", d));
  EXPECT_FALSE(str::parseDouble(" 5", d));
  EXPECT_FALSE(str::parseDouble("1e400", d));
  EXPECT_TRUE(str::parseDouble("2.5", d));
  EXPECT_EQ(d, 2.5);
}

std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(UserInput, NumberFlagNamesTheFlagTheValueEscapedAndTheAcceptedRange) {
  EXPECT_EQ(numberFlag<int64_t>("--n", "12", 0, 20, "an integer from 0 to 20"), 12);
  EXPECT_EQ(refusal([] {
              numberFlag<uint64_t>("--max-x", "18446744073709551616", 1, UINT64_MAX,
                                   "an integer > 0");
            }),
            "--max-x: invalid value '18446744073709551616': out of range; expected an "
            "integer > 0");
  EXPECT_EQ(
      refusal([] { numberFlag<double>("--t", "nan", 0, 10, "seconds from 0 to 10"); }),
      "--t: invalid value 'nan': not a finite number; expected seconds from 0 to 10");
  EXPECT_EQ(refusal([] { numberFlag<int64_t>("--n", "3\x1b[2J", 0, 9, "a digit"); }),
            "--n: invalid value '3\\x1b[2J': not a number; expected a digit");
}

TEST(UserInput, ControlCharactersInHostsAndPathsAreRefusedShownEscaped) {
  EXPECT_FALSE(hasControlChar("node-3.cluster"));
  EXPECT_FALSE(hasControlChar("/data/run 1/ümlaut"));  // spaces and UTF-8 are fine
  for (const char* bad : {"a\nb", "a\rb", "a\tb", "\x1b[31mred", "a\x7f", "a\x01"})
    EXPECT_TRUE(hasControlChar(bad)) << str::escape(bad);
  refuseControlChars("--log-dir", "/tmp/logs", "path");  // no throw
  std::string m =
      refusal([] { refuseControlChars("--master-addr", "evil\nhost", "host name"); });
  EXPECT_TRUE(str::startsWith(m,
                              "--master-addr: 'evil\\x0ahost' holds a control character "
                              "(\\x0a); a host name has none"))
      << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  m = refusal([] { refuseControlChars("--log-dir", "/tmp/\x1b]0;x\x07", "path"); });
  EXPECT_NE(m.find("'/tmp/\\x1b]0;x\\x07'"), std::string::npos) << m;
  EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
}

}  // namespace
}  // namespace ddprun::input
