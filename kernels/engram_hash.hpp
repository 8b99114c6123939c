// The Engram n-gram hash of DeepSeek-V4.1: which table rows a token position reads.
//
// A position is hashed with the max_ngram_size - 1 tokens before it (ids first mapped onto the
// tokenizer-normalised compressed vocabulary; look-back stops at the sequence start, where the
// pad id stands in). For every Engram layer, each n-gram size 2..N is hashed by XOR-folding
// the ids times per-layer odd multipliers, then reduced modulo one prime per hash head; every
// (n-gram, head) column owns a disjoint range of the layer's table (primes taken in order above
// engram_vocab_size, offsets their running sum). The multipliers come from NumPy's default
// generator seeded with 10007 · layer id; numpy_rng reproduces it bit for bit so the released
// tables are addressed exactly as in training.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/model_config.hpp"

namespace troupe::kernels {

/// NumPy's `default_rng(seed)` (SeedSequence + PCG64) for what the Engram hash needs.
class numpy_rng {
 public:
  explicit numpy_rng(std::uint64_t seed);
  std::uint64_t next_uint64();
  /// `Generator.integers(0, high, dtype=int64)` for high > 2^32 (NumPy's 64-bit Lemire path;
  /// smaller ranges take a 32-bit path there that the Engram bounds never reach).
  std::int64_t integers(std::int64_t high);

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 inc_ = 0;
};

struct engram_hash_layout {
  std::int64_t max_ngram_size = 0;
  std::int64_t n_heads = 0;
  std::int64_t columns = 0;  // (max_ngram_size - 1) · n_heads
  // Per Engram layer (in engram_layer_ids order):
  std::vector<std::vector<std::int64_t>> multipliers;  // [max_ngram_size]
  std::vector<std::vector<std::int64_t>> primes;       // [columns]
  std::vector<std::vector<std::int64_t>> offsets;      // [columns]

  static engram_hash_layout from_config(const text_config& c);

  /// The table rows of one position for Engram layer `layer_index`: `lookback[s]` is the
  /// compressed id `s` positions back (s = 0 the token itself), already replaced by the pad id
  /// where the look-back is cut. Writes `columns` ids to `out`.
  void hash(std::int64_t layer_index, std::span<const std::int64_t> lookback,
            std::int64_t* out) const;
};

}  // namespace troupe::kernels
