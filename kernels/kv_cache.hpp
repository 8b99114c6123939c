// The per-sequence state of the DeepSeek-V4.1 forward pass: what a sequence must keep between
// calls so that prefill, chunked prefill and decode all compute the same logits.
//
// Per layer:
//   - the sliding-window ring (every layer): the last window rows of the layer's shared K=V
//     latent (post-RoPE, FP8-rounded), by absolute position, plus room for the rollback of a
//     rejected speculative draft;
// and per KV-source layer (CSA2):
//   - the compressor state: the projected rows of the unfinished group (fewer than `ratio`
//     tokens; empty at ratio 1);
//   - the compressed KV: one rotated, FP4-rounded latent per completed group, paged in blocks
//     that each cover 128 source tokens (128 / ratio rows), the unit a later step serialises and
//     pages through a block table;
//   - the indexer keys (when the source is also an index source): one key per completed group,
//     paged the same way.
// The Engram n-gram look-back keeps the last max_ngram_size - 1 compressed token ids.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace troupe::kernels {

/// Tokens covered by one block of compressed KV (the paging unit).
inline constexpr std::int64_t kv_block_tokens = 128;
/// Extra window rows kept beyond the sliding window, so that a rejected draft of up to this many
/// tokens can be rolled back.
inline constexpr std::int64_t swa_rollback_tokens = 6;

/// Fixed-width rows appended one at a time, stored in blocks of `rows_per_block` rows.
class paged_rows {
 public:
  paged_rows() = default;
  paged_rows(std::int64_t width, std::int64_t rows_per_block);

  void append(const float* row);
  /// Drops the last n rows (n <= size()).
  void pop_back(std::int64_t n);
  std::int64_t size() const { return size_; }
  std::int64_t width() const { return width_; }
  std::int64_t rows_per_block() const { return rows_per_block_; }
  std::int64_t block_count() const { return static_cast<std::int64_t>(blocks_.size()); }
  /// Row i (0 <= i < size()).
  const float* row(std::int64_t i) const;
  /// Block b's rows (the last block may be partly filled: only its first rows are valid).
  std::span<const float> block(std::int64_t b) const;

 private:
  std::int64_t width_ = 0;
  std::int64_t rows_per_block_ = 1;
  std::int64_t size_ = 0;
  std::vector<std::vector<float>> blocks_;
};

/// The last `capacity` rows pushed, addressed by absolute position.
class swa_ring {
 public:
  swa_ring() = default;
  swa_ring(std::int64_t width, std::int64_t capacity);

  /// Stores the row of position end().
  void push(const float* row);
  /// Forgets the rows of positions >= end (begin() <= end <= end()); the rows before stay.
  void truncate(std::int64_t end) { end_ = end; }
  /// Positions pushed so far.
  std::int64_t end() const { return end_; }
  /// The oldest position still held.
  std::int64_t begin() const { return end_ > capacity_ ? end_ - capacity_ : 0; }
  /// The row of `position` (begin() <= position < end()).
  const float* at(std::int64_t position) const;

 private:
  std::int64_t width_ = 0;
  std::int64_t capacity_ = 0;
  std::int64_t end_ = 0;
  std::vector<float> rows_;
};

/// A KV-source layer's pooling state and published caches.
struct compressed_cache {
  std::int64_t ratio = 0;
  std::int64_t groups = 0;          // groups emitted so far
  std::int64_t pending_tokens = 0;  // tokens of the unfinished group
  std::vector<float> pending_kv;    // [pending_tokens, head_dim]
  std::vector<float> pending_gate;  // [pending_tokens, head_dim] (ratio > 1)
  // The projected rows of the last recent_tokens tokens (ratio > 1; at most ratio - 1 +
  // swa_rollback_tokens): what a rollback needs to rebuild the unfinished group.
  std::int64_t recent_tokens = 0;
  std::vector<float> recent_kv, recent_gate;
  paged_rows kv;          // [groups, head_dim]: rotated, FP4-rounded latents
  paged_rows index_keys;  // [groups, index_head_dim] when an index source
};

struct layer_cache {
  swa_ring window;
  bool is_kv_source = false;
  compressed_cache compressed;  // only used on KV-source layers
};

/// Everything one sequence carries between forward calls.
struct sequence_cache {
  const void* owner = nullptr;      // the model that made it (model::new_sequence)
  std::int64_t length = 0;          // tokens processed so far (the next token's position)
  std::int64_t rollback_floor = 0;  // a rollback cannot go below the previous one's point
  std::vector<layer_cache> layers;
  // Compressed ids of the last max_ngram_size - 1 + swa_rollback_tokens tokens.
  std::vector<std::int64_t> engram_recent;
};

/// Rolls `s` back by `k` tokens (a rejected speculative draft): afterwards it is exactly the
/// cache of the sequence without its last k tokens — window rows, compressed KV and indexer
/// keys of groups those tokens completed, the unfinished group's rows, the Engram look-back.
/// Only tokens added since the previous rollback can be rolled back (the window ring and the
/// recent rows hold swa_rollback_tokens beyond what the next tokens read, not more).
/// Errors: k < 0, k > swa_rollback_tokens, k more than the tokens since the previous rollback.
result<bool> rollback(sequence_cache& s, std::int64_t k);

}  // namespace troupe::kernels
