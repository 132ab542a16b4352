// String helpers shared by every library: the one splitter, trimming, prefix
// tests, integer parsing that rejects junk, log-safe escaping, random tokens.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::str {

// Splits on `sep`, keeping empty fields: "a,,b" -> {"a","","b"}, "a," ->
// {"a",""}, "" -> {} (no fields at all).
std::vector<std::string> split(std::string_view text, char sep);
// Joins with `sep` between items.
std::string join(const std::vector<std::string>& items, std::string_view sep);
// Without leading and trailing spaces and tabs.
std::string trim(std::string_view s);
bool startsWith(std::string_view s, std::string_view prefix);
bool endsWith(std::string_view s, std::string_view suffix);
// Replaces every occurrence of `from` (non-empty) by `to`, left to right,
// never re-scanning replaced text.
std::string replaceAll(std::string s, std::string_view from, std::string_view to);

// Whole-string decimal integer in [min, max]; false on junk, overflow or range
// (input::parseNumber, which says why).
bool parseInt(std::string_view text, int64_t& out, int64_t min = INT64_MIN,
              int64_t max = INT64_MAX);
bool parseInt(std::string_view text, int& out, int min = INT32_MIN, int max = INT32_MAX);
// Whole-string finite decimal number (no inf/nan, no spaces, within a
// double's range); false otherwise (input::parseNumber, which says why).
bool parseDouble(std::string_view text, double& out);

// For logs: printable ASCII kept, everything else as \xNN (and \\ for a
// backslash), cut to `maxBytes` of input with "...(N bytes)" appended.
std::string escape(std::string_view s, size_t maxBytes = 200);

// `n` characters from [a-z0-9], from std::random_device.
std::string randomToken(size_t n);
// A random (version 4) UUID, e.g. "1b4e28ba-2fa1-41d2-883f-0016d3cca427".
std::string uuid4();

}  // namespace ddprun::str
