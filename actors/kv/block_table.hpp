// block_table: the compact entry store of one kv_index shard, 32 bytes per slot.
//
// A CHECK shard of a large store holds tens of millions of block entries (the 1k-GPU
// simulation: ~47 M after an hour over 8 shards). A node-based `std::unordered_map` pays a
// heap node, a cached hash and a bucket pointer per entry (~72 bytes). This table keeps each
// entry in one fixed 32-byte slot of a flat array: the 128-bit key, the expiry in nanoseconds,
// and one word packing the placement sequence number, the traffic class and the pending flag.
//
// Layout: an *ordered linear-probing* table (Amble & Knuth). The key is already a uniform hash,
// so its `hi` bits are used directly: an entry's home slot is `hi * capacity / 2^64` (monotone
// in the key), and the occupied slots are kept sorted by key with every entry at or after its
// home and no empty slot between its home and itself. A lookup scans from the home slot and
// stops at an empty slot or a larger key; an insert shifts the run after its place right by one
// slot; an erase shifts the displaced entries after it left by one (backward-shift deletion, no
// tombstones). The array ends with a tail of spare slots instead of wrapping around; its last
// slot is always empty, so every scan ends (a run that reaches it doubles the tail). Growth
// (load above 0.9) rehashes into 1/8 more home slots, in place (the array is realloc'ed, then
// the entries, still in key order, are packed to its end and spread to their new places), so
// the load stays between 0.8 and 0.9 (35.6-40 bytes per entry) and a growing table never
// holds two arrays.
//
// Nothing observable depends on the slot order: kv_index only looks keys up, and the one
// iteration (`for_each`, building the eviction order) feeds an ordered set.
#pragma once

#include "actors/kv/block_key.hpp"
#include "schemas/convert.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace troupe::actors {

/// One entry of a block_table. `meta == 0` marks an empty slot; a held entry always has a
/// sequence number >= 1.
struct block_slot {
  block_key key;
  /// Expiry, nanoseconds since the clock's epoch.
  std::int64_t expiry_ns = 0;
  /// seq << 3 | traffic class << 1 | pending.
  std::uint64_t meta = 0;

  /// The largest sequence number a slot holds (2^61 - 1).
  static constexpr std::uint64_t max_seq = (std::uint64_t{1} << 61) - 1;

  bool empty() const noexcept { return meta == 0; }
  std::uint64_t seq() const noexcept { return meta >> 3; }
  schemas::traffic_class cls() const noexcept {
    return static_cast<schemas::traffic_class>((meta >> 1) & 3u);
  }
  bool pending() const noexcept { return (meta & 1u) != 0; }

  /// Requires seq <= max_seq (checked by the caller).
  void set_seq(std::uint64_t s) noexcept { meta = (s << 3) | (meta & 7u); }
  void set_cls(schemas::traffic_class c) noexcept {
    meta = (meta & ~std::uint64_t{6}) | ((static_cast<std::uint64_t>(c) & 3u) << 1);
  }
  void set_pending(bool p) noexcept { meta = (meta & ~std::uint64_t{1}) | (p ? 1u : 0u); }
};

static_assert(sizeof(block_slot) == 32, "block_slot: one entry must take 32 bytes");

class block_table {
public:
  block_table() = default;
  block_table(const block_table& other);
  block_table& operator=(const block_table& other);
  block_table(block_table&&) noexcept = default;
  block_table& operator=(block_table&&) noexcept = default;

  /// The slot holding `k`, or nullptr. Valid until the next insert or erase.
  block_slot* find(const block_key& k) noexcept;
  const block_slot* find(const block_key& k) const noexcept;

  /// Asks the CPU to bring `k`'s home slot into its cache: the lookups of a chain's blocks
  /// land on random slots, and asking a few blocks ahead overlaps their cache misses.
  void prefetch(const block_key& k) const noexcept {
    if (length_ != 0)
      __builtin_prefetch(&slots_[home(k.hi)]);
  }

  /// Adds `k`, which must be absent, and returns its slot: key set, expiry 0, meta 0 (the
  /// caller sets a sequence number >= 1 before the next insert or erase). May rehash: every
  /// slot pointer is invalidated.
  block_slot& insert(const block_key& k);

  /// Removes the entry in `s` (a pointer from find). Other slot pointers are invalidated.
  void erase(block_slot* s) noexcept;

  /// Entries held.
  std::size_t size() const noexcept { return size_; }

  /// Bytes of the slot array (capacity and tail included).
  std::size_t allocated_bytes() const noexcept { return length_ * sizeof(block_slot); }

  /// Calls `f(const block_slot&)` for every entry, in key order.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < length_; ++i)
      if (!slots_[i].empty())
        f(slots_[i]);
  }

private:
  struct free_deleter {
    void operator()(block_slot* p) const noexcept { std::free(p); }
  };

  std::size_t home(std::uint64_t hi) const noexcept {
    return static_cast<std::size_t>((static_cast<unsigned __int128>(hi) * capacity_) >> 64);
  }

  /// Moves the entries into a fresh array of `capacity` home slots and at least `min_length`
  /// slots in all (and as many as the entries' runs need, plus the empty last slot).
  void rehash(std::size_t capacity, std::size_t min_length);

  std::unique_ptr<block_slot[], free_deleter> slots_;
  /// Home slots; the array holds length_ >= capacity_ + 1024 slots (the rest is the tail).
  std::size_t capacity_ = 0;
  std::size_t length_ = 0;
  std::size_t size_ = 0;
};

} // namespace troupe::actors
