#include "runtime/random.hpp"

#include "runtime/check.hpp"

#include <xxhash.h>

#include <cmath>

namespace troupe::runtime {

namespace {

std::uint64_t splitmix64(std::uint64_t& x) noexcept {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept {
  return (x << k) | (x >> (64 - k));
}

} // namespace

rng::rng(std::uint64_t seed) : key_(seed) {
  std::uint64_t x = seed;
  for (auto& word : s_)
    word = splitmix64(x);
}

rng rng::split(std::string_view purpose, std::uint64_t index) const {
  auto named = XXH3_64bits_withSeed(purpose.data(), purpose.size(), key_);
  auto indexed = XXH3_64bits_withSeed(&index, sizeof(index), named);
  return rng{indexed};
}

std::uint64_t rng::operator()() noexcept {
  const auto result = rotl(s_[1] * 5, 7) * 9;
  const auto t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double rng::uniform() noexcept {
  return static_cast<double>((*this)() >> 11) * 0x1.0p-53;
}

std::uint64_t rng::below(std::uint64_t n) noexcept {
  TROUPE_CHECK(n > 0, "rng::below needs n > 0");
  // Lemire's nearly divisionless method.
  auto x = (*this)();
  auto m = static_cast<unsigned __int128>(x) * n;
  auto low = static_cast<std::uint64_t>(m);
  if (low < n) {
    const auto threshold = (0 - n) % n;
    while (low < threshold) {
      x = (*this)();
      m = static_cast<unsigned __int128>(x) * n;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

std::int64_t rng::between(std::int64_t lo, std::int64_t hi) noexcept {
  TROUPE_CHECK(lo <= hi, "rng::between needs lo <= hi");
  const auto span = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo);
  if (span == std::numeric_limits<std::uint64_t>::max())
    return static_cast<std::int64_t>((*this)());
  return lo + static_cast<std::int64_t>(below(span + 1));
}

bool rng::chance(double p) noexcept {
  if (p <= 0.0)
    return false;
  if (p >= 1.0)
    return true;
  return uniform() < p;
}

double rng::exponential(double rate) noexcept {
  TROUPE_CHECK(rate > 0.0, "rng::exponential needs rate > 0");
  return -std::log1p(-uniform()) / rate;
}

} // namespace troupe::runtime
