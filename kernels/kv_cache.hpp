// The per-sequence state of the DeepSeek-V4.1 forward pass: what a sequence must keep between
// calls so that prefill, chunked prefill and decode all compute the same logits.
//
// Three parts (each serialised by kernels/kv_blocks.hpp):
//   - SWA KV, every layer's sliding-window ring: the last window rows of the layer's shared K=V
//     latent (post-RoPE, FP8-rounded), by absolute position, plus room for the rollback of a
//     rejected speculative draft;
//   - Block KV, per KV-source layer (CSA2): the compressed KV — one rotated, FP4-rounded latent
//     per completed group — and the indexer keys (when the source is also an index source), in
//     blocks that each cover 128 source tokens (128 / ratio rows): pages of a block_pool listed
//     in a block table;
//   - State KV: the compressor state (the projected rows of the unfinished group, fewer than
//     `ratio` tokens, and the recent rows a rollback needs), the rows of the unfinished block,
//     the length, and the Engram n-gram look-back (the last max_ngram_size - 1 + 6 compressed
//     token ids).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
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

/// Identifies a page of a block_pool.
using block_id = std::int64_t;

/// Pages of floats shared by the sequences of one model (one pool per rank): a page holds one
/// 128-token block of one layer's compressed KV or indexer keys. Freed pages are reused.
/// Allocation and release are thread-safe; a page's address is stable while it is allocated.
class block_pool {
 public:
  block_id allocate(std::int64_t floats);
  void release(block_id id);
  float* data(block_id id);
  std::int64_t pages_in_use() const;
  std::int64_t pages_allocated() const;

 private:
  mutable std::mutex mutex_;
  std::deque<std::vector<float>> pages_;
  std::vector<block_id> free_;
};

/// How a sequence stores its compressed KV and indexer keys: in pages of a block_pool through a
/// block table (the default), or in one contiguous array per layer (a peer layout the tests
/// compare against).
enum class kv_layout { paged, contiguous };

/// Fixed-width rows appended one at a time, grouped in blocks of `rows_per_block` rows (128
/// source tokens). Paged: every block is a page of a shared block_pool, listed in the block
/// table; copying allocates new pages. Contiguous: one array.
class paged_rows {
 public:
  paged_rows() = default;
  /// A paged store drawing pages from `pool`, or a contiguous one when `pool` is null.
  paged_rows(std::int64_t width, std::int64_t rows_per_block, std::shared_ptr<block_pool> pool);
  paged_rows(const paged_rows& other);
  paged_rows& operator=(const paged_rows& other);
  paged_rows(paged_rows&& other) noexcept;
  paged_rows& operator=(paged_rows&& other) noexcept;
  ~paged_rows();

  void append(const float* row);
  /// Drops the last n rows (n <= size()).
  void pop_back(std::int64_t n);
  std::int64_t size() const { return size_; }
  std::int64_t width() const { return width_; }
  std::int64_t rows_per_block() const { return rows_per_block_; }
  std::int64_t block_count() const { return (size_ + rows_per_block_ - 1) / rows_per_block_; }
  bool paged() const { return pool_ != nullptr; }
  /// The block table (paged layout): the pool page of each block.
  const std::vector<block_id>& block_table() const { return table_; }
  /// Row i (0 <= i < size()); rows of one block are adjacent in memory.
  const float* row(std::int64_t i) const;

 private:
  void clear();
  std::int64_t width_ = 0;
  std::int64_t rows_per_block_ = 1;
  std::int64_t size_ = 0;
  std::shared_ptr<block_pool> pool_;
  std::vector<block_id> table_;
  std::vector<float*> pages_;  // pool_->data(table_[b])
  std::vector<float> flat_;    // the contiguous layout
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
  /// Empties the ring, whose next row is that of `position` (bounded replay starts there).
  void reset(std::int64_t position) { first_ = end_ = position; }
  /// Positions pushed so far.
  std::int64_t end() const { return end_; }
  /// The oldest position still held.
  std::int64_t begin() const { return std::max(first_, end_ - capacity_); }
  std::int64_t capacity() const { return capacity_; }
  std::int64_t width() const { return width_; }
  /// The row of `position` (begin() <= position < end()).
  const float* at(std::int64_t position) const;

 private:
  std::int64_t width_ = 0;
  std::int64_t capacity_ = 0;
  std::int64_t end_ = 0;
  std::int64_t first_ = 0;  // no row before it (reset)
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
