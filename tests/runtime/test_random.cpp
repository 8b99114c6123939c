// The seeded, splittable rng: reproducibility, stream independence, and its distributions.
#include "runtime/random.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

using troupe::runtime::rng;

namespace {

std::vector<std::uint64_t> draws(rng r, std::size_t n) {
  std::vector<std::uint64_t> out;
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(r());
  return out;
}

} // namespace

TEST_CASE("the same seed gives the same sequence") {
  CHECK(draws(rng{7}, 1000) == draws(rng{7}, 1000));
}

TEST_CASE("different seeds give different sequences") {
  CHECK(draws(rng{7}, 16) != draws(rng{8}, 16));
}

TEST_CASE("the first outputs of rng(42) are pinned so that an algorithm change is caught") {
  // xoshiro256** seeded through SplitMix64; computed once with an independent Python
  // transcription of the reference algorithms, and matching this implementation.
  rng r{42};
  CHECK(r() == 0x15780b2e0c2ec716ULL);
  CHECK(r() == 0x6104d9866d113a7eULL);
  CHECK(r() == 0xae17533239e499a1ULL);
}

TEST_CASE("a split stream does not depend on how much the parent drew before") {
  rng fresh{42};
  rng used{42};
  for (int i = 0; i < 1000; ++i)
    used();
  CHECK(draws(fresh.split("decode/instance", 3), 32) == draws(used.split("decode/instance", 3), 32));
  CHECK(fresh.split("decode/instance", 3).key() == used.split("decode/instance", 3).key());
}

TEST_CASE("a split stream does not depend on the order in which streams are split") {
  rng root{42};
  auto a1 = root.split("a");
  auto b1 = root.split("b", 5);
  rng other{42};
  auto b2 = other.split("b", 5);
  auto a2 = other.split("a");
  CHECK(draws(a1, 32) == draws(a2, 32));
  CHECK(draws(b1, 32) == draws(b2, 32));
}

TEST_CASE("splitting does not advance the parent stream") {
  rng split_from{42};
  for (int i = 0; i < 10; ++i)
    (void) split_from.split("child", static_cast<std::uint64_t>(i));
  CHECK(draws(split_from, 32) == draws(rng{42}, 32));
}

TEST_CASE("drawing from a child does not change its siblings or the parent") {
  rng root{42};
  auto first = root.split("x", 0);
  for (int i = 0; i < 100; ++i)
    first();
  CHECK(draws(root.split("x", 1), 16) == draws(rng{42}.split("x", 1), 16));
  CHECK(draws(root, 16) == draws(rng{42}, 16));
}

TEST_CASE("split streams with different names or indices differ") {
  rng root{42};
  std::set<std::uint64_t> keys;
  std::set<std::vector<std::uint64_t>> streams;
  for (auto name : {"prefill", "decode", "decode/instance", "store"})
    for (std::uint64_t index = 0; index < 8; ++index) {
      auto child = root.split(name, index);
      keys.insert(child.key());
      streams.insert(draws(child, 4));
    }
  CHECK(keys.size() == 32);
  CHECK(streams.size() == 32);
  // A child differs from its parent, and parents with different keys give different children.
  CHECK(root.split("decode").key() != root.key());
  CHECK(rng{1}.split("decode").key() != rng{2}.split("decode").key());
}

TEST_CASE("nested splits depend on the whole path") {
  rng root{42};
  auto ab = root.split("a").split("b");
  auto ba = root.split("b").split("a");
  CHECK(ab.key() != ba.key());
  CHECK(ab.key() == rng{42}.split("a").split("b").key());
}

TEST_CASE("below(n) stays in [0, n)") {
  rng r{3};
  for (std::uint64_t n : {1ULL, 2ULL, 3ULL, 7ULL, 10ULL, 1000ULL, (1ULL << 63) + 1, ~0ULL})
    for (int i = 0; i < 2000; ++i)
      CHECK_LT(r.below(n), n);
  for (int i = 0; i < 100; ++i)
    CHECK(r.below(1) == 0);
}

TEST_CASE("below(10) is roughly uniform (chi-square over 100k draws)") {
  rng r{12345};
  constexpr int buckets = 10;
  constexpr int n = 100'000;
  std::array<int, buckets> counts{};
  for (int i = 0; i < n; ++i)
    ++counts[r.below(buckets)];
  const double expected = static_cast<double>(n) / buckets;
  double chi2 = 0;
  for (auto c : counts)
    chi2 += (c - expected) * (c - expected) / expected;
  // 9 degrees of freedom: p = 0.001 at 27.9. The seed is fixed, so this cannot flake; a
  // biased or broken below() lands far above it.
  CHECK(chi2 < 27.9);
}

TEST_CASE("below() of a non-power-of-two bound near 2^64 is not modulo-biased") {
  // With n = 3 * 2^62, a plain `x % n` would make [0, 2^62) twice as likely as the rest.
  rng r{99};
  const std::uint64_t n = 3ULL << 62;
  int low = 0;
  constexpr int draws_n = 60'000;
  for (int i = 0; i < draws_n; ++i)
    if (r.below(n) < (1ULL << 62))
      ++low;
  CHECK(static_cast<double>(low) / draws_n == doctest::Approx(1.0 / 3).epsilon(0.03));
}

TEST_CASE("between(lo, hi) covers the inclusive range and nothing outside it") {
  rng r{5};
  std::set<std::int64_t> seen;
  for (int i = 0; i < 5000; ++i) {
    auto x = r.between(-3, 3);
    CHECK(x >= -3);
    CHECK(x <= 3);
    seen.insert(x);
  }
  CHECK(seen.size() == 7);
  CHECK(r.between(17, 17) == 17);
  // The full int64 range is allowed.
  constexpr auto lo = std::numeric_limits<std::int64_t>::min();
  constexpr auto hi = std::numeric_limits<std::int64_t>::max();
  bool negative = false;
  bool positive = false;
  for (int i = 0; i < 100; ++i) {
    auto x = r.between(lo, hi);
    negative |= x < 0;
    positive |= x > 0;
  }
  CHECK(negative);
  CHECK(positive);
}

TEST_CASE("chance(0) is never true and chance(1) always") {
  rng r{6};
  int zero = 0;
  int one = 0;
  for (int i = 0; i < 10'000; ++i) {
    zero += r.chance(0.0) ? 1 : 0;
    one += r.chance(1.0) ? 1 : 0;
  }
  CHECK(zero == 0);
  CHECK(one == 10'000);
  // Out-of-range probabilities are clamped.
  CHECK_FALSE(r.chance(-0.5));
  CHECK(r.chance(1.5));
}

TEST_CASE("chance(p) is true about a fraction p of the time") {
  rng r{8};
  int hits = 0;
  constexpr int n = 100'000;
  for (int i = 0; i < n; ++i)
    hits += r.chance(0.25) ? 1 : 0;
  CHECK(static_cast<double>(hits) / n == doctest::Approx(0.25).epsilon(0.02));
}

TEST_CASE("uniform() lies in [0, 1) with mean about one half") {
  rng r{9};
  double sum = 0;
  constexpr int n = 100'000;
  for (int i = 0; i < n; ++i) {
    auto u = r.uniform();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
  }
  CHECK(sum / n == doctest::Approx(0.5).epsilon(0.01));
}

TEST_CASE("exponential(rate) is positive with mean about 1 / rate") {
  rng r{10};
  for (double rate : {0.5, 4.0}) {
    double sum = 0;
    constexpr int n = 100'000;
    for (int i = 0; i < n; ++i) {
      auto x = r.exponential(rate);
      REQUIRE(x >= 0.0);
      sum += x;
    }
    CHECK(sum / n == doctest::Approx(1.0 / rate).epsilon(0.02));
  }
}
