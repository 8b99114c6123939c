#include "kernels/engram_hash.hpp"

#include <array>
#include <limits>

#include "kernels/model_layout.hpp"

namespace troupe::kernels {

namespace {

// SeedSequence(entropy) with a pool of four 32-bit words, then generate_state(4 · 64 bits).
std::array<std::uint64_t, 4> seed_sequence_state(std::uint64_t seed) {
  constexpr std::uint32_t init_a = 0x43b0d7e5u, mult_a = 0x931e8875u;
  constexpr std::uint32_t init_b = 0x8b51f9ddu, mult_b = 0x58f38dedu;
  constexpr std::uint32_t mix_l = 0xca01f9ddu, mix_r = 0x4973f715u;
  std::vector<std::uint32_t> entropy;
  do {
    entropy.push_back(static_cast<std::uint32_t>(seed & 0xffffffffu));
    seed >>= 32;
  } while (seed != 0);

  std::uint32_t hash_const = init_a;
  auto hashmix = [&](std::uint32_t value) {
    value ^= hash_const;
    hash_const *= mult_a;
    value *= hash_const;
    value ^= value >> 16;
    return value;
  };
  auto mix = [](std::uint32_t x, std::uint32_t y) {
    std::uint32_t r = mix_l * x - mix_r * y;
    return r ^ (r >> 16);
  };
  std::array<std::uint32_t, 4> pool{};
  for (std::size_t i = 0; i < 4; ++i) pool[i] = hashmix(i < entropy.size() ? entropy[i] : 0u);
  for (std::size_t src = 0; src < 4; ++src)
    for (std::size_t dst = 0; dst < 4; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src]));
  for (std::size_t src = 4; src < entropy.size(); ++src)
    for (std::size_t dst = 0; dst < 4; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src]));

  std::array<std::uint32_t, 8> words{};
  std::uint32_t hc = init_b;
  for (std::size_t i = 0; i < 8; ++i) {
    std::uint32_t v = pool[i % 4];
    v ^= hc;
    hc *= mult_b;
    v *= hc;
    v ^= v >> 16;
    words[i] = v;
  }
  std::array<std::uint64_t, 4> out{};
  for (std::size_t i = 0; i < 4; ++i)
    out[i] = static_cast<std::uint64_t>(words[2 * i]) |
             (static_cast<std::uint64_t>(words[2 * i + 1]) << 32);
  return out;
}

constexpr unsigned __int128 pcg_multiplier =
    (static_cast<unsigned __int128>(0x2360ed051fc65da4ull) << 64) | 0x4385df649fccf645ull;

}  // namespace

numpy_rng::numpy_rng(std::uint64_t seed) {
  const auto s = seed_sequence_state(seed);
  const unsigned __int128 initstate = (static_cast<unsigned __int128>(s[0]) << 64) | s[1];
  const unsigned __int128 initseq = (static_cast<unsigned __int128>(s[2]) << 64) | s[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1u;
  state_ = state_ * pcg_multiplier + inc_;
  state_ += initstate;
  state_ = state_ * pcg_multiplier + inc_;
}

std::uint64_t numpy_rng::next_uint64() {
  state_ = state_ * pcg_multiplier + inc_;
  const auto hi = static_cast<std::uint64_t>(state_ >> 64);
  const auto lo = static_cast<std::uint64_t>(state_);
  const auto rot = static_cast<unsigned>(state_ >> 122);
  const std::uint64_t x = hi ^ lo;
  return (x >> rot) | (x << ((64 - rot) & 63));
}

std::int64_t numpy_rng::integers(std::int64_t high) {
  const auto range = static_cast<std::uint64_t>(high - 1);  // inclusive bound
  if (range == 0) return 0;
  const unsigned __int128 excl = static_cast<unsigned __int128>(range) + 1;
  unsigned __int128 m = static_cast<unsigned __int128>(next_uint64()) * excl;
  auto leftover = static_cast<std::uint64_t>(m);
  if (leftover < static_cast<std::uint64_t>(excl)) {
    const std::uint64_t threshold =
        (std::numeric_limits<std::uint64_t>::max() - range) % static_cast<std::uint64_t>(excl);
    while (leftover < threshold) {
      m = static_cast<unsigned __int128>(next_uint64()) * excl;
      leftover = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::int64_t>(m >> 64);
}

engram_hash_layout engram_hash_layout::from_config(const text_config& c) {
  engram_hash_layout l;
  l.max_ngram_size = c.engram_max_ngram_size;
  l.n_heads = c.engram_n_heads;
  l.columns = (c.engram_max_ngram_size - 1) * c.engram_n_heads;
  const std::int64_t bound = std::max<std::int64_t>(
      1, (std::numeric_limits<std::int64_t>::max() / c.engram_compressed_vocab_size) / 2);
  const auto primes = engram_primes(c);
  for (std::size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
    numpy_rng rng(static_cast<std::uint64_t>(10007 * c.engram_layer_ids[i]));
    std::vector<std::int64_t> mult;
    for (std::int64_t n = 0; n < l.max_ngram_size; ++n) mult.push_back(rng.integers(bound) * 2 + 1);
    l.multipliers.push_back(std::move(mult));
    std::vector<std::int64_t> offsets;
    std::int64_t total = 0;
    for (std::int64_t p : primes[i]) {
      offsets.push_back(total);
      total += p;
    }
    l.primes.push_back(primes[i]);
    l.offsets.push_back(std::move(offsets));
  }
  return l;
}

void engram_hash_layout::hash(std::int64_t layer_index, std::span<const std::int64_t> lookback,
                              std::int64_t* out) const {
  const auto& mult = multipliers[static_cast<std::size_t>(layer_index)];
  const auto& pr = primes[static_cast<std::size_t>(layer_index)];
  const auto& off = offsets[static_cast<std::size_t>(layer_index)];
  std::int64_t rolling = lookback[0] * mult[0];
  for (std::int64_t n = 1; n < max_ngram_size; ++n) {
    rolling ^= lookback[static_cast<std::size_t>(n)] * mult[static_cast<std::size_t>(n)];
    for (std::int64_t h = 0; h < n_heads; ++h) {
      const auto col = static_cast<std::size_t>((n - 1) * n_heads + h);
      out[col] = rolling % pr[col] + off[col];
    }
  }
}

}  // namespace troupe::kernels
