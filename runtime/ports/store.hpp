// The store port: persistent objects (KV blocks) by 64-bit key.
//
// The cluster-wide KV cache persists full 128-token blocks under their hash-chain key. The
// store port is the only way actors reach that storage: put, get, has and delete, each an
// ordinary request answered after the store's modelled (simulated) or real (files on a POSIX
// mount) latency. A store has a capacity; a put that does not fit fails with
// errc::store_full, a get or delete of a missing key with errc::not_found.
#pragma once

#include "runtime/time.hpp"

#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <vector>

namespace troupe::runtime {

/// Stores an object. `size` is its byte size (the simulated world may carry no payload);
/// when `payload` is not empty, its size must equal `size`. Replacing a key is allowed.
struct store_put {
  std::uint64_t key = 0;
  std::uint64_t size = 0;
  std::vector<std::uint8_t> payload;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_put& x) {
  return f(caf::meta::type_name("store_put"), x.key, x.size, x.payload);
}

/// Reads an object.
struct store_get {
  std::uint64_t key = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_get& x) {
  return f(caf::meta::type_name("store_get"), x.key);
}

/// Asks whether a key is present (metadata only: no payload moves).
struct store_has {
  std::uint64_t key = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_has& x) {
  return f(caf::meta::type_name("store_has"), x.key);
}

/// Removes an object.
struct store_delete {
  std::uint64_t key = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_delete& x) {
  return f(caf::meta::type_name("store_delete"), x.key);
}

/// An object read back (payload empty if it was stored without one).
struct store_object {
  std::uint64_t key = 0;
  std::uint64_t size = 0;
  std::vector<std::uint8_t> payload;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_object& x) {
  return f(caf::meta::type_name("store_object"), x.key, x.size, x.payload);
}

/// Occupancy of a store.
struct store_stats {
  std::uint64_t capacity = 0;
  std::uint64_t used = 0;
  std::uint64_t objects = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_stats& x) {
  return f(caf::meta::type_name("store_stats"), x.capacity, x.used, x.objects);
}

using store_stats_atom = caf::atom_constant<caf::atom("storestats")>;

using store_port = caf::typed_actor<
  caf::replies_to<store_put>::with<store_stats>, caf::replies_to<store_get>::with<store_object>,
  caf::replies_to<store_has>::with<bool>, caf::replies_to<store_delete>::with<store_stats>,
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
/// `latency` after their bytes moved; has, delete and stats take `latency`. Capacity is
/// checked when a put arrives (a replaced key's old size is freed first).
store_port spawn_sim_store(caf::actor_system& sys, sim_store_params params);

} // namespace troupe::runtime
