// FNV-1a, 64 bits: a hash that is the same on every compiler, platform and
// run (std::hash is not), for values that leave the process: the checkpoint
// directory's file-name tags (train/checkpoint_dir.cc) and the parameter
// check the reducer compares across ranks (runtime/reducer.cc). Not for
// security (trivial to collide on purpose). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

namespace ddprun {

inline constexpr uint64_t kFnv1aOffset = 0xcbf29ce484222325ull;  // 14695981039346656037
inline constexpr uint64_t kFnv1aPrime = 0x100000001b3ull;        // 1099511628211

// FNV-1a of the bytes of `s`, starting from `seed`: the standard offset
// basis, or an earlier result to hash a sequence piece by piece
// (fnv1a(b, fnv1a(a)) == fnv1a(a + b)).
constexpr uint64_t fnv1a(std::string_view s, uint64_t seed = kFnv1aOffset) {
  uint64_t h = seed;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * kFnv1aPrime;
  return h;
}

}  // namespace ddprun
