// store_bridge: one block store for a launched cluster, its bytes over the fabric.
//
// The cluster KV cache's blocks live in one store (ports/posix_store.hpp), and a store owns its
// directory alone: its capacity, LRU order and TTLs count every block only when every put and
// get goes through it. In a cluster of `troupe launch` the store runs in a process of its own
// (`troupe node --role store`; under Slurm and Kubernetes, in the control process), and the
// other processes reach it through three actors:
// - a *store front* beside the store: (store_fetch) reads an object and offers its payload on
//   the store process's fabric link, answering with the ticket; (store_deposit) pulls a
//   payload another process offered and puts it; (store_release) withdraws an offer once it
//   has been pulled (an offer nobody releases is withdrawn after `offer_ttl`);
// - a *store registry* in the control process, which knows the store of the moment: the store
//   process registers its store and front there when it starts (again after each restart),
//   and the registry forgets them when that store goes down, and tells every proxy of each
//   change (a process that reaches the store through the control process, as CAF's
//   middleman routes to a third process, is not always told of the store's loss itself);
// - a *store proxy* in each process that uses the store, with the store port's interface
//   (what a prefill engine reads and a block writer writes). It asks the registry for the
//   store when it has none; a get asks the front and pulls the bytes from the ticket, a put
//   offers the payload on this process's fabric link and has the front pull it; has, delete,
//   list and stats, which carry no payload, go to the store itself. Without a fabric (`--fabric
//   none` here or in the store's process) gets and puts go to the store too, their bytes in the
//   messages over CAF's middleman.
// A store of several shards (topology `storage.shards`) runs as one store process per shard:
// each registers as its shard, and a process reaches the whole store through a router over
// one proxy per shard (`spawn_cluster_store`, ports/store_router.hpp), so a shard that is down
// fails only its own blocks.
// The store's contract is unchanged for the engines (runtime/ports/store.hpp). While there is
// no store (it died and has not come back), and for every operation in flight when it dies,
// the proxy answers errc::unavailable at once, which a prefill treats as a miss and a block
// writer as a write that did not happen; nothing waits for a store that is gone. The same
// answer comes for a payload that cannot cross (the fabric failed).
#pragma once

#include "runtime/metrics.hpp"
#include "runtime/ports/fabric.hpp"
#include "runtime/ports/store.hpp"

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace troupe::cluster {

/// Read object `key` and offer its payload (to the store front).
struct store_fetch {
  runtime::store_key key;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_fetch& x) {
  return f(caf::meta::type_name("store_fetch"), x.key);
}

/// The front's answer to store_fetch: the object without its payload, and the ticket its
/// payload is offered under (id 0: the object has no payload).
struct store_fetched {
  runtime::store_key key;
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;
  runtime::fabric_ticket ticket;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_fetched& x) {
  return f(caf::meta::type_name("store_fetched"), x.key, x.size, x.checksum, x.ticket);
}

/// Pull the payload of `ticket` and put it as object `key` (to the store front); answered
/// with the store's stats, as a store_put.
struct store_deposit {
  runtime::store_key key;
  std::uint64_t size = 0;
  runtime::fabric_ticket ticket;
  runtime::duration ttl{0};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_deposit& x) {
  return f(caf::meta::type_name("store_deposit"), x.key, x.size, x.ticket, x.ttl);
}

/// The payload offered under this id has been pulled (or given up on): withdraw it.
using store_release_atom = caf::atom_constant<caf::atom("strelease")>;

/// A store and its front, as the store's process registers them with the store registry
/// (`front` invalid: that process has no fabric link, payloads travel in the messages), and
/// the shard of the cluster's store it is.
struct store_binding {
  caf::actor store;
  caf::actor front;
  std::uint32_t shard = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, store_binding& x) {
  return f(caf::meta::type_name("store_binding"), x.store, x.front, x.shard);
}

/// Spawns the store front of `store`; it offers payloads on `link`.
caf::actor spawn_store_front(caf::actor_system& sys, runtime::store_port store,
                             runtime::fabric_link_port link,
                             std::chrono::seconds offer_ttl = std::chrono::seconds(120),
                             std::chrono::seconds pull_timeout = std::chrono::seconds(30));

/// Spawns the store registry of a store of `shards` shards (at least 1):
/// - (caf::put_atom, store_binding) makes that store its shard's and monitors it (a store
///   going down is forgotten, unless another was registered for its shard since); answers
///   caf::ok_atom, or errc::invalid_argument for a shard the store does not have;
/// - (caf::get_atom, shard) answers that shard's current store_binding (an invalid store:
///   none now);
/// - (caf::join_atom, subscriber) sends the subscriber (caf::put_atom, store_binding) for each
///   shard now and at every change, until the subscriber is down (the store proxies
///   subscribe).
/// With `metrics`, every `poll` it asks each shard's store for its stats and publishes them
/// there as the store's metrics (ports/store_metrics.hpp; under a `shard` label when there
/// are several): for a store in other processes, so that they appear on this process's
/// /metrics.
caf::actor spawn_store_registry(caf::actor_system& sys, std::uint32_t shards,
                                runtime::registry* metrics = nullptr,
                                std::chrono::milliseconds poll = std::chrono::seconds(1));

/// Spawns a store proxy of the store that `registry` names. Payloads cross over the fabric
/// when `link` and the store's front are both valid, at most `max_transfers` gets and puts at
/// a time (the others wait their turn: a prefill of a long cached prompt asks for thousands of
/// blocks at once, and each transfer holds an offer of its payload until it is pulled);
/// otherwise in the messages. `timeout` bounds each step of an operation once it has started.
/// The proxy reaches shard `shard` of the store.
runtime::store_port spawn_store_proxy(caf::actor_system& sys, caf::actor registry,
                                      runtime::fabric_link_port link,
                                      std::chrono::seconds timeout = std::chrono::seconds(30),
                                      std::size_t max_transfers = 32, std::uint32_t shard = 0);

/// The whole store of `shards` shards that `registry` names, with `replicas` copies of each
/// block: one proxy per shard behind a router (ports/store_router.hpp; its repairs counted in
/// `metrics` when given); for one shard, its proxy.
runtime::store_port spawn_cluster_store(caf::actor_system& sys, caf::actor registry,
                                        std::uint32_t shards, std::uint32_t replicas,
                                        runtime::fabric_link_port link,
                                        runtime::registry* metrics = nullptr);

} // namespace troupe::cluster
