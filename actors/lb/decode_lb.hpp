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
#include "actors/lb/decode_balancer.hpp"
#include "actors/lb/lb_protocol.hpp"

#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace troupe::actors {

/// Where to decode a request whose KV is `kv_tokens` long.
struct decode_route {
  std::uint64_t request = 0;
  std::uint64_t kv_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_route& x) {
  return f(caf::meta::type_name("decode_route"), x.request, x.kv_tokens);
}

struct decode_assignment {
  instance_id instance = 0;
  decode_engine_actor engine;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_assignment& x) {
  return f(caf::meta::type_name("decode_assignment"), x.instance, x.engine);
}

/// The request routed with `kv_tokens` left `instance`.
struct decode_release {
  instance_id instance = 0;
  std::uint64_t kv_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_release& x) {
  return f(caf::meta::type_name("decode_release"), x.instance, x.kv_tokens);
}

/// Replies: decode_route -> decode_assignment, or errc::unavailable when no engine has room.
using decode_lb_actor
  = caf::typed_actor<caf::replies_to<decode_route>::with<decode_assignment>,
                     caf::reacts_to<decode_release>,
                     caf::reacts_to<add_instance_atom, instance_id, decode_engine_actor>,
                     caf::reacts_to<drain_instance_atom, instance_id>,
                     caf::replies_to<lb_stats_atom>::with<lb_counters>>;

decode_lb_actor spawn_decode_lb(caf::actor_system& sys, decode_balancer_params params);

} // namespace troupe::actors
