// The store port: persistent objects (KV blocks) by 128-bit key, with TTL and LRU eviction.
//
// The cluster-wide KV cache persists full 128-token blocks under their hash-chain key. The
// store port is the only way actors reach that storage: put, get, has, delete, list and
// stats, each an ordinary request answered after the store's modelled (simulated,
// `spawn_sim_store` here) or real (files on a POSIX mount, `ports/posix_store.hpp`) latency.
// Both implementations keep the same contract, checked by one test suite run against both
// (tests/ports/test_store_contract.cpp):
//
// - **Keys** are 128 bits (`store_key`, the same two fields as actors' `block_key`).
// - **TTL**: a put may give a time to live; an object whose expiry has passed is never
//   served (get → not_found, has → false, absent from list). Every operation first sweeps
//   the objects whose expiry has passed (counted in `store_stats::expired`).
// - **Capacity**: a put that does not fit evicts least-recently-used objects (by last get or
//   put) until it does (`evicted`); an object larger than the whole capacity fails with
//   errc::store_full and changes nothing.
// - **Errors are values**: errc::not_found for a missing or expired key, errc::store_full,
//   errc::invalid_argument for a malformed put, errc::store_corrupt for an object that failed
//   its integrity check (the real store then drops it: it is never served).
#pragma once

#include "runtime/time.hpp"

#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <compare>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace troupe::runtime {

/// The 128-bit key of a stored object. Actors' `block_key` has the same two fields (`hi`
/// first); they convert field by field. Ordered by (hi, lo).
struct store_key {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;

  friend constexpr auto operator<=>(const store_key&, const store_key&) = default;
  friend constexpr bool operator==(const store_key&, const store_key&) = default;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_key& x) {
  return f(caf::meta::type_name("store_key"), x.hi, x.lo);
}

/// 32 lowercase hex digits, `hi` first (the same text as actors' `to_string(block_key)`).
std::string to_string(const store_key& k);

/// Stores an object under `key`, replacing any object already there. `size` is its byte
/// size; when `payload` is not empty its size must equal `size` (the simulated store may
/// carry no payload; the real store requires it). `ttl` is the time to live from the put's
/// arrival: zero means the object never expires; a negative ttl is invalid. The payload is
/// moved into the message: a store takes it without copying it again.
struct store_put {
  store_key key;
  std::uint64_t size = 0;
  std::vector<std::uint8_t> payload;
  duration ttl{0};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_put& x) {
  return f(caf::meta::type_name("store_put"), x.key, x.size, x.payload, x.ttl);
}

/// Reads an object; counts a hit or a miss in the store's stats.
struct store_get {
  store_key key;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_get& x) {
  return f(caf::meta::type_name("store_get"), x.key);
}

/// Asks whether an unexpired object is stored under a key (metadata only: no payload moves,
/// no hit or miss is counted, the object's recency is unchanged).
struct store_has {
  store_key key;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_has& x) {
  return f(caf::meta::type_name("store_has"), x.key);
}

/// Removes an object.
struct store_delete {
  store_key key;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_delete& x) {
  return f(caf::meta::type_name("store_delete"), x.key);
}

/// Lists every unexpired object (metadata only), ordered by key: how the CHECK role rebuilds
/// its index after a restart.
struct store_list {};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_list&) {
  return f(caf::meta::type_name("store_list"));
}

/// An object read back (payload empty if it was stored without one), with the XXH3-64 of
/// its payload as the store verified it (0 without a payload), so a reader can pass the bytes
/// on with their checksum and have the last consumer check them end to end.
struct store_object {
  store_key key;
  std::uint64_t size = 0;
  std::vector<std::uint8_t> payload;
  std::uint64_t checksum = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_object& x) {
  return f(caf::meta::type_name("store_object"), x.key, x.size, x.payload, x.checksum);
}

/// One object in a `store_list` reply.
struct store_entry {
  store_key key;
  /// The payload's byte size (as put).
  std::uint64_t size = 0;
  /// When the object expires, on the *actor clock* of the store at the time of the reply
  /// (virtual time in simulation; in the real world the store converts its own wall-clock
  /// expiry as `actor now + (expiry − wall now)`), so the receiver can compare it with its
  /// own `self->clock().now()` without reading a wall clock. `store_never_expires` (the
  /// largest time_point) when the object was put with a zero ttl. An actor clock is
  /// steady-clock based: the instant is meaningful on the store's machine; a receiver on
  /// another host should use `expires_at − (now at the reply)`.
  time_point expires_at{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_entry& x) {
  return f(caf::meta::type_name("store_entry"), x.key, x.size, x.expires_at);
}

/// `store_entry::expires_at` of an object that never expires.
inline constexpr time_point store_never_expires = time_point::max();

/// Occupancy and counters of a store. Counters count since the store started (the real
/// store's start-up scan included).
struct store_stats {
  std::uint64_t capacity = 0;
  /// Bytes charged against the capacity: the payload sizes, plus each object's file header
  /// in the real store.
  std::uint64_t used = 0;
  std::uint64_t objects = 0;
  /// Gets answered with an object.
  std::uint64_t hits = 0;
  /// Gets answered with errc::not_found (absent or expired).
  std::uint64_t misses = 0;
  /// Objects refused because they failed their integrity check (and dropped).
  std::uint64_t corrupt = 0;
  /// Objects evicted to make room for a put (or to fit the capacity at start).
  std::uint64_t evicted = 0;
  /// Objects removed because their expiry passed.
  std::uint64_t expired = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_stats& x) {
  return f(caf::meta::type_name("store_stats"), x.capacity, x.used, x.objects, x.hits,
           x.misses, x.corrupt, x.evicted, x.expired);
}

using store_stats_atom = caf::atom_constant<caf::atom("storestats")>;

/// The store's typed interface. put and delete answer with the stats after the change.
using store_port = caf::typed_actor<
  caf::replies_to<store_put>::with<store_stats>, caf::replies_to<store_get>::with<store_object>,
  caf::replies_to<store_has>::with<bool>, caf::replies_to<store_delete>::with<store_stats>,
  caf::replies_to<store_list>::with<std::vector<store_entry>>,
  caf::replies_to<store_stats_atom>::with<store_stats>>;

/// Parameters of a simulated store (one shard).
struct sim_store_params {
  std::uint64_t capacity = 0;
  /// Latency of every operation (metadata round trip).
  duration latency = std::chrono::microseconds(100);
  /// Bytes per second for the payload of puts and gets, shared in arrival order; > 0.
  double bandwidth = 5e9;
};

/// A simulated store: puts and gets occupy its bandwidth in arrival order and complete
/// `latency` after their bytes moved; has, delete, list and stats take `latency`. Objects are
/// kept in memory (payloads when given). Capacity, TTL (on the actor clock: virtual time)
/// and eviction follow the port's contract and act when a request arrives; the store never
/// sets a timer of its own, so it never keeps a simulation from going quiet. It never
/// answers errc::store_corrupt. Bandwidth must be > 0 (checked).
store_port spawn_sim_store(caf::actor_system& sys, sim_store_params params);

} // namespace troupe::runtime

template <>
struct std::hash<troupe::runtime::store_key> {
  /// Both halves mixed: hash-chain keys are uniform, but other keys (tests, tools) may
  /// differ in `lo` only.
  std::size_t operator()(const troupe::runtime::store_key& k) const noexcept {
    return static_cast<std::size_t>(k.hi ^ (k.lo * 0x9e3779b97f4a7c15ULL));
  }
};
