// store_bridge: one block store for a launched cluster, its bytes over the fabric.
//
// The cluster KV cache's blocks live in one store (ports/posix_store.hpp), and a store owns its
// directory alone: its capacity, LRU order and TTLs count every block only when every put and
// get goes through it. So in a launched cluster the control process (the KV CHECK role) opens
// the store, and the instance processes reach it through two actors:
// - a *store front* beside the store in the control process: (store_fetch) reads an object
//   and offers its payload on the control process's fabric link, answering with the ticket;
//   (store_deposit) pulls a payload an instance offered and puts it; (store_release) withdraws
//   an offer once the instance has pulled it (an offer nobody releases is withdrawn after
//   `offer_ttl`);
// - a *store proxy* in each instance process, with the store port's interface (what its
//   prefill engine reads and its block writer writes): a get asks the front and pulls the
//   bytes from the ticket, a put offers the payload on this process's fabric link and has the
//   front pull it; has, delete, list and stats, which carry no payload, go to the store itself.
//   Without a fabric (`--fabric none` here or in the control process) gets and puts go to the
//   store too, their bytes in the messages over CAF's middleman.
// The store's contract is unchanged for the engines (runtime/ports/store.hpp); a payload that
// cannot cross (the fabric failed) is an errc::unavailable answer, which a prefill treats as a
// miss and a block writer as a write that did not happen.
#pragma once

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

/// Spawns the store front of `store` in the control process; it offers payloads on `link`.
caf::actor spawn_store_front(caf::actor_system& sys, runtime::store_port store,
                             runtime::fabric_link_port link,
                             std::chrono::seconds offer_ttl = std::chrono::seconds(120),
                             std::chrono::seconds pull_timeout = std::chrono::seconds(30));

/// Spawns an instance process's store proxy of the cluster's `store`. With `front` and `link`
/// both valid, payloads cross over the fabric, at most `max_transfers` gets and puts at a
/// time (the others wait their turn: a prefill of a long cached prompt asks for thousands of
/// blocks at once, and each transfer holds an offer of its payload until it is pulled);
/// otherwise in the messages. `timeout` bounds each step of a transfer once it has started.
runtime::store_port spawn_store_proxy(caf::actor_system& sys, runtime::store_port store,
                                      caf::actor front, runtime::fabric_link_port link,
                                      std::chrono::seconds timeout = std::chrono::seconds(30),
                                      std::size_t max_transfers = 32);

} // namespace troupe::cluster
