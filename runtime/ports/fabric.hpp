// The fabric link port's interface: offer bytes under an id, pull them from another process.
//
// Inside one process the KV of a request moves between instances as an in-process handle
// (kv_snapshot_ptr). Across processes (`troupe launch`: one OS process per instance) the
// bytes must cross a fabric: the producer (a prefill instance, or the machine holding an SWA
// ring) *offers* them under a 64-bit id and sends the resulting ticket in an ordinary control
// message; the consumer (a decode instance) *pulls* the ticket's bytes straight from the
// producer's endpoint, and the producer withdraws the offer when the consumer is done (or the
// request is gone). The control message stays small; the bytes never go through CAF's
// middleman. These messages are the port's protocol; the real implementation (libfabric, shm
// and tcp providers here, verbs / efa / cxi in production) is ports/fabric_link.hpp. Every
// message type has a type id (runtime/type_ids.hpp), so a ticket may cross the middleman.
#pragma once

#include "runtime/time.hpp"

#include <caf/actor_control_block.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>

namespace troupe::runtime {

/// Where offered bytes can be pulled from: the offering endpoint's fabric address (opaque
/// bytes, fi_getname), the offer's id and its size in bytes, and for an offer made `once` the
/// offering link port, which the puller's link port tells (fabric_withdraw) once it holds the
/// bytes.
struct fabric_ticket {
  std::string address;
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;
  caf::strong_actor_ptr confirm_to;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fabric_ticket& x) {
  return f(caf::meta::type_name("fabric_ticket"), x.address, x.id, x.bytes, x.confirm_to);
}

/// Offer `bytes` to peers under `id` (replacing an earlier offer of that id). With `once`, the
/// offer is a hand-off that one peer pulls once: it is withdrawn when the puller's link port
/// has received the whole bytes and says so (the ticket's `confirm_to`), so an offer still
/// held means bytes not delivered yet. (Withdrawing it when the answer was sent was not
/// enough: a process that left then could take the answer with it.)
struct fabric_offer {
  std::uint64_t id = 0;
  std::string bytes;
  bool once = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fabric_offer& x) {
  return f(caf::meta::type_name("fabric_offer"), x.id, x.bytes, x.once);
}

/// Withdraw the offer `id`; pulls that arrive afterwards get errc::not_found.
struct fabric_withdraw {
  std::uint64_t id = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fabric_withdraw& x) {
  return f(caf::meta::type_name("fabric_withdraw"), x.id);
}

/// Pull the bytes of `ticket`; fail after `timeout` (caf::sec::request_timeout).
struct fabric_pull {
  fabric_ticket ticket;
  duration timeout = std::chrono::seconds(10);
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fabric_pull& x) {
  return f(caf::meta::type_name("fabric_pull"), x.ticket, x.timeout);
}

/// The pulled bytes of offer `id`.
struct fabric_pulled {
  std::uint64_t id = 0;
  std::string bytes;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fabric_pulled& x) {
  return f(caf::meta::type_name("fabric_pulled"), x.id, x.bytes);
}

/// What the port's endpoint has served (get_atom): offers held now, pull requests answered
/// with data since it opened, and answers whose sends have not all completed yet. A producer
/// that must stay up until its hand-offs are taken (a draining decode process) waits for
/// `offers` and `sending` to be 0 (its `once` offers go when their pullers hold the bytes).
struct fabric_activity {
  std::uint64_t offers = 0;
  std::uint64_t served = 0;
  std::uint64_t sending = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fabric_activity& x) {
  return f(caf::meta::type_name("fabric_activity"), x.offers, x.served, x.sending);
}

/// The fabric link port:
/// - fabric_offer -> the ticket a peer pulls it with;
/// - fabric_withdraw -> true if the id was offered (false: nothing to withdraw);
/// - fabric_pull -> the bytes, or an error: errc::not_found (the peer has no such offer),
///   errc::unavailable (the peer is unreachable, or its address is malformed),
///   caf::sec::request_timeout (no complete answer within the pull's timeout);
/// - get_atom -> its fabric_activity.
using fabric_link_port =
  caf::typed_actor<caf::replies_to<fabric_offer>::with<fabric_ticket>,
                   caf::replies_to<fabric_withdraw>::with<bool>,
                   caf::replies_to<fabric_pull>::with<fabric_pulled>,
                   caf::replies_to<caf::get_atom>::with<fabric_activity>>;

} // namespace troupe::runtime
