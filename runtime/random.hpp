// rng: troupe's seeded, splittable pseudo-random number generator.
//
// A simulation must give the same result for the same seed, and adding an actor must not
// change what any other actor draws. So there is exactly one seeded root, and every actor or
// purpose gets its own stream by *splitting*: a child's stream depends only on its parent's
// key and the child's name (and index), never on how many numbers anyone drew before or in
// which order streams were split. Streams are xoshiro256** seeded through SplitMix64; child
// keys are derived with XXH3 over the name, seeded with the parent key.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string_view>

namespace troupe::runtime {

class rng {
public:
  using result_type = std::uint64_t;

  /// The root stream for `seed`.
  explicit rng(std::uint64_t seed);

  /// A child stream named `purpose` (e.g. "decode/instance"), optionally with an index (e.g.
  /// the instance number). Depends only on this stream's key and the arguments: splitting
  /// does not advance this stream, and draws from this stream do not change its children.
  rng split(std::string_view purpose, std::uint64_t index = 0) const;

  /// The key identifying this stream (stable across runs for the same seed and path).
  std::uint64_t key() const noexcept { return key_; }

  /// The next 64 random bits.
  std::uint64_t operator()() noexcept;

  /// A uniform double in [0, 1).
  double uniform() noexcept;

  /// A uniform integer in [0, n), without modulo bias. Requires n > 0.
  std::uint64_t below(std::uint64_t n) noexcept;

  /// A uniform integer in [lo, hi] (inclusive). Requires lo <= hi.
  std::int64_t between(std::int64_t lo, std::int64_t hi) noexcept;

  /// True with probability p (p clamped to [0, 1]).
  bool chance(double p) noexcept;

  /// An exponentially distributed value with the given rate (mean 1/rate). Requires rate > 0.
  double exponential(double rate) noexcept;

  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }

private:
  std::uint64_t key_;
  std::array<std::uint64_t, 4> s_;
};

} // namespace troupe::runtime
