// Counter-based randomness: values that are pure functions of (seed, counter).
//
// Sampling (a request's draw at a sequence position) and random model weights (an element of
// a named tensor) must not depend on what else was drawn before, so nothing here keeps state:
// SplitMix64's finaliser mixes the seed and the counter into 64 well-distributed bits.
#pragma once

#include <cstdint>

namespace troupe::kernels {

/// SplitMix64's step and finaliser: a bijective mix of 64 bits.
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A uniform double in [0, 1) that depends only on (seed, counter): 53 bits of
/// splitmix64(seed ^ splitmix64(counter ^ constant)).
inline double counter_uniform(std::uint64_t seed, std::uint64_t counter) {
  const std::uint64_t x = splitmix64(seed ^ splitmix64(counter ^ 0x6a09e667f3bcc909ULL));
  return double(x >> 11) * 0x1.0p-53;
}

}  // namespace troupe::kernels
