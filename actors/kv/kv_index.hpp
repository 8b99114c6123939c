// kv_index: the metadata index of the cluster KV cache (one shard), without an actor.
//
// The CHECK role answers "how many leading blocks of this prompt are cached?" on the critical
// path of every request, and records the blocks that decode instances persist. It keeps
// metadata only (the bytes live in the store behind the store port): for each block key, when
// it expires and whether it is visible yet. The cache is bounded twice: by time (a TTL per
// traffic class: chatbot 7 days, agent 3 days) and by space (a byte capacity, each block
// costing the model's bytes per block). This class is that bookkeeping, as plain C++ so it can
// be tested with plain time values; `kv_store` wraps it in an actor.
//
// Rules (docs/kv-store.md says why):
// - A block is a *hit* when present, committed and unexpired; `match` counts the leading run
//   of hits of a chain. A block expires at `expiry` (`now >= expiry` is expired): an entry
//   whose age reached its class TTL is not a hit.
// - Expiry is lazy: an expired entry is removed when a lookup finds it, or when room is made.
// - Audited: each lookup re-checks the blocks it serves against their expiry and counts any
//   expired one (`served_expired`, which the simulation's invariant checker requires to be 0).
// - A hit refreshes: expiry becomes max(expiry, now + TTL of the asking request's class, less
//   the block's depth in the call in ns, below), so the TTL counts from the last use, and a
//   block's parents never expire before it.
// - When full, room is made oldest-expiry first, a chain's deeper blocks before its prefix
//   (a prefix without its tail is still useful and a tail without its prefix is not): the
//   i-th block of one call's span expires i nanoseconds before the call's expiry, so a chain
//   written or refreshed at one instant leaves from its tail. Equal expiries go by key. A
//   block is never placed by evicting one that expires no earlier than itself: it is rejected
//   instead, with the rest of its chain.
// - Blocks may be inserted visible at once (`insert`), or reserved first and made visible once
//   their bytes are in the store (`reserve`, then `commit`), so a match never names a block
//   whose bytes are not written yet.
// Everything observable is deterministic: lookups use a flat hash table (block_table, 16 bytes
// per slot, keys told apart by their high 64 bits), but every decision that iterates
// (eviction, expiry) walks an ordered set.
#pragma once

#include "actors/kv/block_key.hpp"
#include "actors/kv/block_table.hpp"
#include "actors/history.hpp"
#include "runtime/time.hpp"
#include "schemas/convert.hpp"

#include <caf/meta/type_name.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <span>

namespace troupe::actors {

using schemas::traffic_class;

/// Approximate bytes of one persisted 128-token block of DeepSeek-V4.1-Flash: ~890 bytes of
/// block KV (FP4 main KV plus indexer keys) per token, 113,920 bytes ≈ 111 KiB per block.
inline constexpr std::uint64_t v41_flash_block_bytes = 890ull * block_tokens;

/// How long a block lives after its last write or hit, per traffic class.
struct kv_ttls {
  runtime::duration chatbot = std::chrono::hours(24 * 7);
  runtime::duration agent = std::chrono::hours(24 * 3);
  /// The design names no batch TTL; batch prompts rarely recur, so one day.
  runtime::duration batch = std::chrono::hours(24);

  /// The TTL of `c`.
  runtime::duration of(traffic_class c) const;
};

struct kv_index_params {
  /// Bytes of block data this shard may account for (the store's share behind it).
  std::uint64_t capacity_bytes = 0;
  /// Bytes per block, from the model; > 0.
  std::uint64_t block_bytes = v41_flash_block_bytes;
  kv_ttls ttl;
  /// The modelled time of one shard operation (a metadata round trip): a `kv_store` shard
  /// answers a match, probe or insert this long after it arrives (times the shard's
  /// `store_slow` factor; reserve and commit answer at once). The index ignores it. 0: at once.
  runtime::duration op_latency{0};
  /// TEST ONLY — a planted bug that proves the TTL audit is checked end to end: lookups
  /// serve expired blocks as hits (and leave them in place). Never set it otherwise.
  bool test_ignore_expiry = false;
  /// Where a `kv_store` shard records what it does with each block (history.hpp); none when
  /// null. The index ignores it.
  run_history_ptr history;
};

/// The answer to a match: the leading run of hit blocks and the tokens they hold.
struct kv_match_result {
  std::uint32_t hit_blocks = 0;
  std::uint64_t hit_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_match_result& x) {
  return f(caf::meta::type_name("kv_match_result"), x.hit_blocks, x.hit_tokens);
}

/// The outcome of an insert or reserve, in blocks.
struct kv_insert_result {
  /// New entries, plus (for insert) pending ones made visible, or (for reserve) pending ones
  /// reserved again: the caller should write these blocks' bytes.
  std::uint32_t inserted = 0;
  /// Already present and committed: their expiry was extended; nothing to write.
  std::uint32_t refreshed = 0;
  /// Not placed for lack of room (the first such block and every block after it).
  std::uint32_t rejected = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_insert_result& x) {
  return f(caf::meta::type_name("kv_insert_result"), x.inserted, x.refreshed, x.rejected);
}

/// The outcome of a commit, in blocks.
struct kv_commit_result {
  /// Visible now (were pending, or already committed).
  std::uint32_t committed = 0;
  /// Gone (never reserved, evicted or expired meanwhile): their bytes may be deleted.
  std::uint32_t missing = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_commit_result& x) {
  return f(caf::meta::type_name("kv_commit_result"), x.committed, x.missing);
}

/// Counters and occupancy of an index (or, summed, of a sharded cache).
struct kv_stats {
  std::uint64_t entries = 0;     ///< entries held, pending ones included
  std::uint64_t pending = 0;     ///< reserved, not committed yet
  std::uint64_t bytes = 0;       ///< entries × block_bytes
  std::uint64_t capacity_bytes = 0;
  std::uint64_t lookups = 0;     ///< match calls
  std::uint64_t hit_blocks = 0;  ///< blocks in the leading hit runs of all matches
  std::uint64_t miss_blocks = 0; ///< the chains' other blocks
  std::uint64_t hit_tokens = 0;
  std::uint64_t miss_tokens = 0; ///< prompt tokens not hit, partial last blocks included
  std::uint64_t inserted = 0;
  std::uint64_t refreshed = 0;   ///< by insert/reserve of a present block (not by hits)
  std::uint64_t rejected = 0;
  std::uint64_t committed = 0;
  std::uint64_t evictions = 0;   ///< unexpired entries removed to make room
  std::uint64_t expirations = 0; ///< expired entries removed (lazily)
  /// The TTL audit: blocks a lookup served as hits at or after their expiry (counted as each
  /// hit is decided, in the same pass); the invariant checker requires 0.
  std::uint64_t served_expired = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_stats& x) {
  return f(caf::meta::type_name("kv_stats"), x.entries, x.pending, x.bytes, x.capacity_bytes,
           x.lookups, x.hit_blocks, x.miss_blocks, x.hit_tokens, x.miss_tokens, x.inserted,
           x.refreshed, x.rejected, x.committed, x.evictions, x.expirations,
           x.served_expired);
}

/// Adds one match to the hit accounting of `s`: `hits` leading blocks of a chain of
/// `chain_blocks` full blocks, for a prompt of `prompt_tokens` tokens (0, or fewer than the
/// chain's tokens, counts as exactly the chain's tokens).
void account_match(kv_stats& s, std::uint32_t hits, std::size_t chain_blocks,
                   std::uint64_t prompt_tokens);

class kv_index {
public:
  /// Requires params.block_bytes > 0.
  explicit kv_index(kv_index_params params);

  /// The leading run of hits of `chain` at `now`; refreshes those blocks' expiry with the TTL
  /// of `cls` and counts the match (by block, and by token over `prompt_tokens`, see
  /// account_match). Expired entries met on the way are removed.
  kv_match_result match(std::span<const block_key> chain, traffic_class cls,
                        runtime::time_point now, std::uint64_t prompt_tokens = 0);

  /// The leading run of hits of `blocks` at `now`, without counting hits (the first phase of a
  /// sharded match), refreshing each hit's expiry to `extend_to` when given (match's single
  /// pass). Expired entries met on the way are removed.
  std::size_t probe(std::span<const block_key> blocks, runtime::time_point now,
                    std::optional<runtime::time_point> extend_to = std::nullopt);

  /// Refreshes every block of `blocks` that is a hit at `now` with the TTL of `cls` (the
  /// second phase of a sharded match); others are left alone.
  void touch(std::span<const block_key> blocks, traffic_class cls, runtime::time_point now);

  /// Makes `blocks` visible at once, in order, with the TTL of `cls`: new ones are added
  /// (making room when full), present ones refreshed, pending ones committed. Stops at the
  /// first block that finds no room.
  kv_insert_result insert(std::span<const block_key> blocks, traffic_class cls,
                          runtime::time_point now);

  /// Like insert, but new blocks are added pending: they take room, and are not hits until
  /// committed. Pending blocks reserved again count as inserted (whoever writes first wins).
  kv_insert_result reserve(std::span<const block_key> blocks, traffic_class cls,
                           runtime::time_point now);

  /// Makes reserved blocks visible; expiry becomes max(expiry, now + TTL of their class).
  kv_commit_result commit(std::span<const block_key> blocks, runtime::time_point now);

  /// True when `k` is a hit at `now`. No side effects.
  bool contains(const block_key& k, runtime::time_point now) const;

  /// When `k` expires, if held (pending or not, expired or not).
  std::optional<runtime::time_point> expiry(const block_key& k) const;

  kv_stats stats() const;
  const kv_index_params& params() const noexcept { return params_; }

private:
  /// Eviction order: expiry first, then key (the table's 64 bits of it).
  struct order_key {
    std::int64_t expiry_ns = 0;
    std::uint64_t key = 0;
    friend auto operator<=>(const order_key&, const order_key&) = default;
  };

  kv_insert_result put(std::span<const block_key> blocks, traffic_class cls,
                       runtime::time_point now, bool pending);
  void place(block_slot& e, runtime::time_point expiry);
  void extend(block_slot& e, runtime::time_point expiry);
  void remove(block_slot* e, bool expired);
  bool make_room(runtime::time_point now, runtime::time_point expiry);

  /// Builds `order_` from `entries_` (the first time room must be made).
  void build_order();

  kv_index_params params_;
  /// The entries: 16 bytes per slot in a flat ordered linear-probing table (block_table.hpp).
  block_table entries_;
  /// The eviction order, {expiry, key} of every entry. It is derived from `entries_`, so
  /// it is kept only once a shard has had to make room (`ordered_`): a shard that never fills
  /// (the usual case for a petabyte store) does not pay a tree node per block.
  std::set<order_key> order_;
  bool ordered_ = false;
  kv_stats stats_;
};

} // namespace troupe::actors
