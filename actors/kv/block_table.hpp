// block_table: the compact entry store of one kv_index shard, 16 bytes per slot.
//
// A CHECK shard of a large store holds tens of millions of block entries (the 1k-GPU
// simulation: ~44 M after an hour over 8 shards). A node-based `std::unordered_map` pays a
// heap node, a cached hash and a bucket pointer per entry (~72 bytes). This table keeps each
// entry in one fixed 16-byte slot of a flat array: the key's high 64 bits, and one word packing
// the expiry in nanoseconds, the traffic class and the pending flag.
//
// Keys are told apart by their high 64 bits only: two blocks whose keys share them are one
// entry. Keys are XXH3-128 hashes, so among n entries a lookup of a block not held finds a
// false match with probability n / 2^64 (2.4e-12 at 44 M entries); the index would then call
// the block cached, and its fetch from the store, which names blocks by the whole key, would
// miss and the tokens be recomputed, as for a block the store lost. Nothing is served wrong.
//
// Layout: an *ordered linear-probing* table (Amble & Knuth). The key is already a uniform hash,
// so it is used directly: an entry's home slot is `key * capacity / 2^64` (monotone in the
// key), and the occupied slots are kept sorted by key with every entry at or after its home and
// no empty slot between its home and itself. A lookup scans from the home slot and stops at an
// empty slot or a larger key; an insert shifts the run after its place right by one slot; an
// erase shifts the displaced entries after it left by one (backward-shift deletion, no
// tombstones). The array ends with a tail of spare slots instead of wrapping around; its last
// slot is always empty, so every scan ends (a run that reaches it doubles the tail). Growth
// (load above 0.93) rehashes into 1/16 more home slots, in place (the array is realloc'ed, then
// the entries, still in key order, are packed to its end and spread to their new places), so
// the load stays between 0.875 and 0.93 (17.2-18.3 bytes per entry) and a growing table never
// holds two arrays. (At 0.8-0.9 the 1k-GPU hour ran ~5-8 % faster and peaked 38 MiB higher.)
//
// Nothing observable depends on the slot order: kv_index only looks keys up, and the one
// iteration (`for_each`, building the eviction order) feeds an ordered set.
#pragma once

#include "actors/kv/block_key.hpp"
#include "schemas/convert.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace troupe::actors {

/// One entry of a block_table: the key's high 64 bits, then pending << 63 | traffic class << 61 |
/// (expiry in ns + 1). An expiry field of 0 marks an empty slot.
struct block_slot {
  std::uint64_t key = 0;
  std::uint64_t word = 0;

  /// The latest expiry a slot holds: 2^61 - 2 ns, 73 years of the actor clock (steady time
  /// since boot; virtual time since the simulation's start); later ones are held as this.
  static constexpr std::int64_t max_expiry_ns = (std::int64_t{1} << 61) - 2;

  bool empty() const noexcept { return (word & expiry_bits) == 0; }
  /// Nanoseconds since the clock's epoch; requires !empty().
  std::int64_t expiry_ns() const noexcept {
    return static_cast<std::int64_t>(word & expiry_bits) - 1;
  }
  schemas::traffic_class cls() const noexcept {
    return static_cast<schemas::traffic_class>((word >> 61) & 3u);
  }
  bool pending() const noexcept { return (word >> 63) != 0; }

  /// Clamped to 0..max_expiry_ns (an expiry before the epoch has passed already).
  void set_expiry_ns(std::int64_t ns) noexcept {
    const auto held = static_cast<std::uint64_t>(std::clamp<std::int64_t>(ns, 0, max_expiry_ns));
    word = (word & ~expiry_bits) | (held + 1);
  }
  void set_cls(schemas::traffic_class c) noexcept {
    word = (word & ~(std::uint64_t{3} << 61)) | ((static_cast<std::uint64_t>(c) & 3u) << 61);
  }
  void set_pending(bool p) noexcept {
    word = (word & ~(std::uint64_t{1} << 63)) | (std::uint64_t{p ? 1u : 0u} << 63);
  }

private:
  static constexpr std::uint64_t expiry_bits = (std::uint64_t{1} << 61) - 1;
};

static_assert(sizeof(block_slot) == 16, "block_slot: one entry must take 16 bytes");

class block_table {
public:
  block_table() = default;
  block_table(const block_table& other);
  block_table& operator=(const block_table& other);
  block_table(block_table&&) noexcept = default;
  block_table& operator=(block_table&&) noexcept = default;

  /// The slot holding `k` (matched by `k.hi`), or nullptr. Valid until the next insert or erase.
  block_slot* find(const block_key& k) noexcept;
  const block_slot* find(const block_key& k) const noexcept;

  /// Asks the CPU to bring `k`'s home slot into its cache: the lookups of a chain's blocks
  /// land on random slots, and asking a few blocks ahead overlaps their cache misses.
  void prefetch(const block_key& k) const noexcept {
    if (length_ != 0)
      __builtin_prefetch(&slots_[home(k.hi)]);
  }

  /// Adds `k`, which must be absent, and returns its slot: key set, still marked empty (the
  /// caller sets its expiry before the next insert or erase). May rehash: every slot pointer
  /// is invalidated.
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
