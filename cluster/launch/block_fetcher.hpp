// block_fetcher: a prefill instance's block reads in a process of its own, handed over in
// POSIX shared memory.
//
// A prefill engine that finds a prompt's prefix in the cluster KV cache reads its blocks from
// the block store (a get per block, thousands for a long prompt). Under `troupe launch` those
// reads run in a *block fetcher* process beside the instance (`troupe node --role fetcher`,
// process `fetcher/<i>` on prefill/<i>'s host), as the seeds' block fetchers do: the store
// traffic (the proxies, the fabric pulls) stays out of the engine's process, and the bytes
// reach it through memory both processes map.
//
// - The *fetcher* (in the fetcher process) reaches the store as any process does (a store
//   proxy per shard behind a router, store_bridge.hpp) and registers with the control
//   process's fetcher registry under its instance's name ("prefill/0").
// - The engine's process wraps its store port in a *fetching store* that follows the
//   registry. When a fetcher is registered it joins it (fetcher_join, giving the slot size:
//   one block): the fetcher creates a shared memory segment of `slots` slots and answers its
//   name; the fetching store maps it and unlinks the name (both processes keep their mapping;
//   nothing is left in /dev/shm when either dies). A get is then a fetch_block to the
//   fetcher: it reads the block from the store into a free slot (a fetch waits for one when
//   all are taken) and answers the slot; the fetching store copies the bytes out of its
//   mapping — the engine's copy into its device memory — and gives the slot back.
// - Everything else (put, has, delete, list, stats) goes to the store port as before. A get
//   goes there too while no fetcher is registered or joined, when the segment cannot be
//   mapped (the fetcher runs on another host), and when the fetcher fails a fetch other than
//   with not_found (it died meanwhile): a fetcher is never the reason a block is missed.
#pragma once

#include "runtime/ports/store.hpp"

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace troupe::cluster {

/// Join a fetcher: make a segment of `slots` slots of `slot_bytes` bytes for this client.
struct fetcher_join {
  std::uint64_t slot_bytes = 0;
  std::uint32_t slots = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fetcher_join& x) {
  return f(caf::meta::type_name("fetcher_join"), x.slot_bytes, x.slots);
}

/// The fetcher's answer to fetcher_join: the POSIX shared memory name of the segment.
struct fetcher_segment {
  std::string name;
  std::uint64_t slot_bytes = 0;
  std::uint32_t slots = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fetcher_segment& x) {
  return f(caf::meta::type_name("fetcher_segment"), x.name, x.slot_bytes, x.slots);
}

/// Read block `key` from the store into a slot of the segment of `segment`.
struct fetch_block {
  runtime::store_key key;
  std::string segment;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fetch_block& x) {
  return f(caf::meta::type_name("fetch_block"), x.key, x.segment);
}

/// A fetched block: its size and checksum, and the slot its payload is in (until released).
struct fetched_block {
  runtime::store_key key;
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;
  std::uint32_t slot = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fetched_block& x) {
  return f(caf::meta::type_name("fetched_block"), x.key, x.size, x.checksum, x.slot);
}

/// (fetch_release_atom, segment, slot): the client has copied the slot's bytes out.
using fetch_release_atom = caf::atom_constant<caf::atom("fetchrel")>;

/// What a fetcher or a fetching store counted (read when its process stops).
struct fetch_counters {
  std::atomic<std::uint64_t> fetched{0};  ///< blocks handed over in shared memory
  std::atomic<std::uint64_t> bytes{0};    ///< their payload bytes
  std::atomic<std::uint64_t> direct{0};   ///< gets that went to the store port instead
};

/// Spawns the registry of a cluster's block fetchers: (caf::put_atom, name, fetcher)
/// registers a fetcher under its instance's name and monitors it; (caf::join_atom, name,
/// subscriber) sends the subscriber (caf::put_atom, name, fetcher) now and whenever that
/// name's fetcher changes (an invalid fetcher: none), until the subscriber is down.
caf::actor spawn_fetcher_registry(caf::actor_system& sys);

/// Spawns a block fetcher that reads blocks from `store` (counting into `counters`, if any).
caf::actor spawn_block_fetcher(caf::actor_system& sys, runtime::store_port store,
                               std::shared_ptr<fetch_counters> counters = nullptr);

/// Spawns the fetching store of instance `name`: `store`'s port, with gets through the
/// fetcher that `registry` names (slots of `slot_bytes`, `slots` of them; counting into
/// `counters`, if any).
runtime::store_port spawn_fetching_store(caf::actor_system& sys, runtime::store_port store,
                                         caf::actor registry, std::string name,
                                         std::uint64_t slot_bytes, std::uint32_t slots = 64,
                                         std::shared_ptr<fetch_counters> counters = nullptr);

} // namespace troupe::cluster
