// Slurm's compressed host lists (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST),
// expanded by ddprun itself: `scontrol show hostnames` is often missing
// inside containers, and the order of the result decides which node is the
// first (global rank 0, the rendezvous endpoint).
//
// The forms accepted are Slurm's (hostlist.c):
//   n1,n2            names separated by commas
//   gpu[01-03,7]     a bracket of numbers and ranges; a range keeps the width
//                    of its lower bound ("01-10" -> 01, 02, ..., 10)
//   n[1-2]x          text after a bracket
//   r[1-2]n[01-02]   several brackets: every combination, the first bracket
//                    varying slowest (r1n01, r1n02, r2n01, r2n02)
// Names keep the list's order; duplicates are kept (Slurm's lists have none).
// Empty entries between commas are skipped, as Slurm does.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::cluster {

// The most names one list may expand to: checked before anything is
// allocated, so `n[0-999999999]` is an error, not an out-of-memory.
constexpr size_t kMaxHosts = 1 << 16;
// The longest host name (DNS: 255 bytes), and the most bytes of names one
// list may expand to (65,536 names of 128 bytes), both computed from the
// pattern before expansion: `<120,000 bytes>[0-65535]` is an error in
// microseconds, not gigabytes.
constexpr size_t kMaxHostNameBytes = 255;
constexpr size_t kMaxHostListBytes = 8u << 20;

// Every host name of `list`, in order. Throws InvalidArgument naming the
// offending part for malformed input: an unclosed or nested bracket, an
// empty bracket or range, a bound that is not a number, a range whose lower
// bound exceeds its upper one, more than kMaxHosts names, a name longer than
// kMaxHostNameBytes, more than kMaxHostListBytes of names, or no name at all.
std::vector<std::string> expandHostList(std::string_view list);

}  // namespace ddprun::cluster
