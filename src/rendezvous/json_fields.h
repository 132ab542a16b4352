// Bounded reads of the rendezvous's JSON values (the state, arrivals,
// verdicts, placements): every integer as int64 within explicit bounds,
// never narrowed or wrapped; every text within a size. What is wrong is a
// BadField, which the decoder turns into a ProtocolError naming its key.
//
// Thread-safety: plain functions.
#pragma once

#include <climits>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace ddprun::rendezvous::detail {

struct BadField : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The integer `name` of `j` in [lo, hi] (a number beyond int64, or not an
// integer at all, is refused, never converted).
inline int64_t intIn(const nlohmann::json& j, const char* name, int64_t lo, int64_t hi) {
  const nlohmann::json& v = j.at(name);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX))
    throw BadField(std::string("\"") + name + "\" is not an integer");
  const int64_t n = v.get<int64_t>();
  if (n < lo || n > hi)
    throw BadField(std::string("\"") + name + "\" = " + std::to_string(n) + " is outside [" +
                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return n;
}

// The text `name` of `j`, at most `maxBytes` long.
inline std::string textIn(const nlohmann::json& j, const char* name, size_t maxBytes) {
  std::string t = j.at(name).get<std::string>();
  if (t.size() > maxBytes)
    throw BadField(std::string("\"") + name + "\" is longer than " + std::to_string(maxBytes) +
                   " bytes");
  return t;
}

}  // namespace ddprun::rendezvous::detail
