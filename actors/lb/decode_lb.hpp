// decode_lb: the actor that routes requests to decode instances.
//
// It owns a decode_balancer (request count and KV length per instance, long and short
// requests on different instances, least-loaded within the class) and keeps its membership in
// step with the engines that are alive (engines announce themselves; the balancer monitors
// them). A draining instance is excluded at once (`drain_instance_atom`, sent by its engine
// when a drain notice reaches it): no new request is routed to it, and the requests it still
// holds release their bookings as they leave.
#pragma once

#include "actors/engine/decode_engine.hpp"
#include "actors/history.hpp"
#include "actors/lb/decode_balancer.hpp"
#include "actors/lb/lb_protocol.hpp"

#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace troupe::actors {

/// Where to decode a request whose KV is `kv_tokens` long and that may generate up to
/// `max_new_tokens` more (the balancer reserves room for both: decode_balancer.hpp).
struct decode_route {
  std::uint64_t request = 0;
  std::uint64_t kv_tokens = 0;
  std::uint64_t max_new_tokens = 0;
  /// Refused, the request waits for room (and is told when it may have come: decode_room_atom);
  /// false: a booking tried early (as the prefill begins), which the request goes on without.
  bool waits = true;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_route& x) {
  return f(caf::meta::type_name("decode_route"), x.request, x.kv_tokens, x.max_new_tokens,
           x.waits);
}

struct decode_assignment {
  instance_id instance = 0;
  decode_engine_actor engine;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_assignment& x) {
  return f(caf::meta::type_name("decode_assignment"), x.instance, x.engine);
}

/// The request routed to `instance` with `kv_tokens` and `max_new_tokens` (as in its
/// decode_route) left it, after appending `grown` tokens of KV there.
struct decode_release {
  instance_id instance = 0;
  std::uint64_t kv_tokens = 0;
  std::uint64_t max_new_tokens = 0;
  std::uint64_t grown = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_release& x) {
  return f(caf::meta::type_name("decode_release"), x.instance, x.kv_tokens, x.max_new_tokens,
           x.grown);
}

/// A request decoding on `instance` appended `tokens` more tokens of KV there (sent as its
/// progress notices come: decode_engine.hpp).
struct decode_grow {
  instance_id instance = 0;
  std::uint64_t tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_grow& x) {
  return f(caf::meta::type_name("decode_grow"), x.instance, x.tokens);
}

/// Sent by decode_lb to a request it refused for want of room once room may have come (a
/// booking ended, an instance joined): the request asks again at once instead of at its next
/// retry (request.hpp). The oldest refused request is told per booking that ends; every one
/// when an instance joins.
using decode_room_atom = caf::atom_constant<caf::atom("decroom")>;

/// Replies: decode_route -> decode_assignment, or errc::unavailable when no engine has room.
using decode_lb_actor
  = caf::typed_actor<caf::replies_to<decode_route>::with<decode_assignment>,
                     caf::reacts_to<decode_release>, caf::reacts_to<decode_grow>,
                     caf::reacts_to<add_instance_atom, instance_id, decode_engine_actor>,
                     caf::reacts_to<drain_instance_atom, instance_id>,
                     caf::replies_to<lb_stats_atom>::with<lb_counters>,
                     caf::replies_to<pool_load_atom>::with<pool_load>>;

/// With `history`, decode_lb records each booking it makes and releases and each instance
/// that joins or leaves its routing (history.hpp).
decode_lb_actor spawn_decode_lb(caf::actor_system& sys, decode_balancer_params params,
                                run_history_ptr history = nullptr);

} // namespace troupe::actors
