// store_index: the bookkeeping of one store (capacity, LRU order, expiry order, counters).
//
// The simulated and the real store must agree on which object a full store evicts, when an
// object stops being served and what their stats count, or the contract suite that runs
// against both would test two behaviours. This class holds that policy once: per key the
// bytes charged against the capacity, the payload size, the expiry and the recency of the
// last get or put. It never touches payloads or files; a store asks it what to remove and
// then removes the bytes itself. Instants are plain nanosecond counts on the store's own
// clock (the actor clock for the sim store, the wall clock for the POSIX store), so both use
// it unchanged. Iteration is ordered (by key, by expiry, by recency): nothing observable
// depends on hash order.
#pragma once

#include "runtime/ports/store.hpp"

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace troupe::runtime {

class store_index {
public:
  /// An instant on the store's clock, in nanoseconds.
  using instant = std::int64_t;

  /// The expiry of an object that never expires.
  static constexpr instant never = std::numeric_limits<instant>::max();

  struct entry {
    /// Bytes charged against the capacity (payload, plus any per-object overhead).
    std::uint64_t bytes = 0;
    /// The payload's size as put.
    std::uint64_t size = 0;
    /// Not served at or after this instant.
    instant expiry = never;
  };

  explicit store_index(std::uint64_t capacity) : capacity_(capacity) {}

  /// `now + ttl`, or `never` for a zero ttl; saturates at `never - 1`. Requires ttl >= 0.
  static instant expiry_after(instant now, std::int64_t ttl_ns);

  /// The entry under `key`, or nullptr. Does not look at expiry (call `sweep` first).
  const entry* find(const store_key& key) const;

  /// Removes every entry whose expiry is at or before `now`, counts each in `expired`, and
  /// returns their keys (earliest expiry first) so the store can drop their bytes.
  std::vector<store_key> sweep(instant now);

  /// Makes room for an object of `bytes` stored under `key` (replacing `key`'s current entry,
  /// whose bytes count as freed and which is never evicted). Returns nullopt, changing
  /// nothing, when `bytes` exceeds the capacity. Otherwise removes least-recently-used
  /// entries until `used − old bytes of key + bytes <= capacity`, counts each in `evicted`,
  /// and returns their keys (least recent first).
  std::optional<std::vector<store_key>> make_room(const store_key& key, std::uint64_t bytes);

  /// Inserts or replaces `key` as the most recently used entry. Requires room for it (see
  /// make_room): the capacity is never exceeded (checked).
  void insert(const store_key& key, entry e);

  /// Marks `key` as the most recently used entry; no-op when absent.
  void touch(const store_key& key);

  /// Removes `key`; false when absent. Counts nothing.
  bool erase(const store_key& key);

  void count_hit() noexcept { ++stats_.hits; }
  void count_miss() noexcept { ++stats_.misses; }
  void count_corrupt() noexcept { ++stats_.corrupt; }
  void count_expired() noexcept { ++stats_.expired; }
  void count_evicted() noexcept { ++stats_.evicted; }

  /// Capacity, occupancy and counters.
  store_stats stats() const;

  std::uint64_t capacity() const noexcept { return capacity_; }
  std::uint64_t used() const noexcept { return used_; }
  std::size_t objects() const noexcept { return entries_.size(); }

  /// Calls `f(key, entry)` for every entry, ordered by key.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [key, slot] : entries_)
      f(key, slot.e);
  }

private:
  struct slot {
    entry e;
    std::uint64_t last_use = 0;
  };

  void remove(std::map<store_key, slot>::iterator i);
  std::vector<store_key> evict_until(std::uint64_t target, const store_key& keep);

  std::uint64_t capacity_;
  std::uint64_t used_ = 0;
  std::uint64_t clock_ = 0; // recency ticks: one per insert or touch
  std::map<store_key, slot> entries_;
  std::map<std::uint64_t, store_key> lru_;          // last_use → key, least recent first
  std::set<std::pair<instant, store_key>> expiry_;  // entries that expire, earliest first
  store_stats stats_;
};

} // namespace troupe::runtime
