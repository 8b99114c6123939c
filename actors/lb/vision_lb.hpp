// vision_lb: the actor that routes image-encoding work to vision instances.
//
// Requests with images are encoded before their prompt is prefilled, so the vision tier sits
// on the time to first token of every multimodal request. Image jobs differ in size (one
// image or many), so counting requests per instance is not enough: the balancer books each
// job's image tokens on the instance it picks and releases them when the job ends, and picks
// the instance with the least outstanding encoder work (ties: the lowest instance id, so the
// choice is deterministic). Membership follows supervision like the other balancers: engines
// announce themselves with add_instance_atom and are monitored; a dead engine is forgotten
// with its bookings.
#pragma once

#include "actors/engine/vision_engine.hpp"
#include "actors/lb/lb_protocol.hpp"

#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>

namespace troupe::actors {

/// Where to encode a request's images, `image_tokens` tokens of encoder work in all.
struct vision_route {
  std::uint64_t request = 0;
  std::uint64_t image_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vision_route& x) {
  return f(caf::meta::type_name("vision_route"), x.request, x.image_tokens);
}

struct vision_assignment {
  instance_id instance = 0;
  vision_engine_actor engine;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vision_assignment& x) {
  return f(caf::meta::type_name("vision_assignment"), x.instance, x.engine);
}

/// The job routed with `image_tokens` left `instance` (finished or failed). Releasing more
/// than is booked, or on an instance the balancer no longer knows, books nothing below zero.
struct vision_release {
  instance_id instance = 0;
  std::uint64_t image_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, vision_release& x) {
  return f(caf::meta::type_name("vision_release"), x.instance, x.image_tokens);
}

/// Replies: vision_route -> vision_assignment (booking its image tokens on the instance), or
/// errc::unavailable when no vision engine is up. lb_stats_atom -> lb_counters named
/// "vision" with `routed`, `rejected`, `released`, `instances`, `outstanding_tokens`.
using vision_lb_actor
  = caf::typed_actor<caf::replies_to<vision_route>::with<vision_assignment>,
                     caf::reacts_to<vision_release>,
                     caf::reacts_to<add_instance_atom, instance_id, vision_engine_actor>,
                     caf::replies_to<lb_stats_atom>::with<lb_counters>>;

vision_lb_actor spawn_vision_lb(caf::actor_system& sys);

} // namespace troupe::actors
