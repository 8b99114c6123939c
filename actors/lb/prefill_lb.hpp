// prefill_lb: the actor that routes requests to prefill instances.
//
// It owns a prefill_balancer (buckets by uncached input length, least outstanding compute,
// engine counts per bucket re-derived from measured load) and keeps its membership in step
// with the engines that are alive. Rebalancing happens on the routing path once per
// `rebalance_interval` of actor-clock time, so an idle cluster has no timers pending.
#pragma once

#include "actors/engine/prefill_engine.hpp"
#include "actors/lb/lb_protocol.hpp"
#include "actors/lb/prefill_balancer.hpp"
#include "runtime/time.hpp"

#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

namespace troupe::actors {

/// Where to prefill a request with `uncached_tokens` tokens to compute. Real world: `kept` is
/// the key of the last cached block the request's prefill restores (zero: none), whose window
/// state an instance's device may keep (prefill_kept).
struct prefill_route {
  std::uint64_t request = 0;
  std::uint64_t uncached_tokens = 0;
  block_key kept{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefill_route& x) {
  return f(caf::meta::type_name("prefill_route"), x.request, x.uncached_tokens, x.kept);
}

/// The instance chosen, and the engine of another instance (a member, or a decode instance)
/// whose device last reported keeping the window state at the route's `kept` key: it answers
/// kept_state_get (invalid: none, or the chosen instance itself).
struct prefill_assignment {
  instance_id instance = 0;
  prefill_engine_actor engine;
  caf::actor keeper{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefill_assignment& x) {
  return f(caf::meta::type_name("prefill_assignment"), x.instance, x.engine, x.keeper);
}

/// The request routed with `uncached_tokens` left `instance` (finished or failed).
struct prefill_release {
  instance_id instance = 0;
  std::uint64_t uncached_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefill_release& x) {
  return f(caf::meta::type_name("prefill_release"), x.instance, x.uncached_tokens);
}

/// Replies: prefill_route -> prefill_assignment, or errc::unavailable when no engine is up.
/// prefill_kept records which instance keeps the window state at a key (the last report wins;
/// the newest `kept_records` keys are remembered): a member, or another instance (a decode
/// one) named by its report's handle, which the balancer monitors and forgets once it is
/// down. Routing does not prefer the keeper (the chosen instance pulls the state from it:
/// prefill_job::keeper).
/// (drain_instance_atom, id) excludes an instance that is leaving (autoscaler scale-down): no
/// new routes; it stays a member until its engine exits. pool_load_atom -> pool_load.
using prefill_lb_actor
  = caf::typed_actor<caf::replies_to<prefill_route>::with<prefill_assignment>,
                     caf::reacts_to<prefill_release>,
                     caf::reacts_to<add_instance_atom, instance_id, prefill_engine_actor>,
                     caf::reacts_to<drain_instance_atom, instance_id>,
                     caf::replies_to<lb_stats_atom>::with<lb_counters>,
                     caf::replies_to<pool_load_atom>::with<pool_load>,
                     caf::reacts_to<prefill_kept>>;

struct prefill_lb_params {
  prefill_balancer_params balancer;
  runtime::duration rebalance_interval = std::chrono::seconds(30);
  /// Keys whose keeper is remembered (the oldest reports are forgotten first).
  std::size_t kept_records = 65536;
};

prefill_lb_actor spawn_prefill_lb(caf::actor_system& sys, prefill_lb_params params);

} // namespace troupe::actors
