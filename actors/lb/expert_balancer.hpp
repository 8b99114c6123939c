// expert_balancer: the expert-parallel load balancer (EPLB) of a pool, the fourth of
// troupe's balancers (beside prefill_lb, decode_lb and vision_lb).
//
// Each instance of a pool is one EP group whose ranks hold the routed experts, plus redundant
// copies of hot experts in spare slots (expert_placement.hpp). Which experts are hot drifts
// with the traffic, so the balancer re-places them while the pool serves:
//
//  1. every `interval` it reads the experts' load over the last `window` through `load` (the
//     ranks' router top-k counts in the real world; the simulated world's drifting load model);
//  2. it places the experts for the pool's EP size (place_experts: copies of the hottest in
//     the spare slots, packed onto the least-loaded ranks);
//  3. the ranks load the new copies in the background, which takes `load_time`; then it
//     publishes the placement (`publish`, with the load it was computed from, so that an
//     instance re-formed at another EP size after a failure places by the same load), and the
//     instances switch to it at their next step boundary. Serving never stops.
//
// At start it places once from the load at that instant and publishes at once (the pool
// starts balanced). A window in which no token was routed (the real world's idle server)
// leaves the placement as it is. `(lb_stats_atom)` answers its counters: placements computed
// and published, idle windows, and the last placement's balancedness under the load it was
// computed from (× 1e6).
#pragma once

#include "actors/lb/expert_placement.hpp"
#include "actors/lb/lb_protocol.hpp"
#include "runtime/time.hpp"

#include <caf/fwd.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::actors {

struct expert_balancer_params {
  /// The EP group: ranks, expert slots per rank (the experts plus the spare ones), and for a
  /// hierarchical placement the nodes it spans and the expert groups (placement_request).
  std::uint32_t ranks = 1;
  std::uint32_t slots_per_rank = 1;
  std::uint32_t nodes = 1;
  std::uint32_t groups = 1;
  /// How often it re-places, over how much recent load, and how long the ranks take to load
  /// the new copies before the switch. An interval of 0: place once at start only.
  runtime::duration interval = std::chrono::minutes(5);
  runtime::duration window = std::chrono::minutes(5);
  runtime::duration load_time = std::chrono::seconds(10);
  /// The experts' load over [from, to) (tokens routed to each logical expert).
  std::function<std::vector<double>(runtime::time_point from, runtime::time_point to)> load;
  /// Receives each placement when the instances may switch to it, with its load.
  std::function<void(const std::vector<double>& load, const expert_placement& placement)> publish;
};

/// The balancer's own timers: time to re-place; the ranks have loaded placement N.
using eplb_tick_atom = caf::atom_constant<caf::atom("eplbtick")>;
using eplb_switch_atom = caf::atom_constant<caf::atom("eplbswitch")>;

using expert_balancer_actor
  = caf::typed_actor<caf::replies_to<lb_stats_atom>::with<lb_counters>,
                     caf::reacts_to<eplb_tick_atom>, caf::reacts_to<eplb_switch_atom, std::uint64_t>>;

/// Spawns the balancer of one pool. Bad parameters (a placement place_experts refuses) make
/// it exit with the reason at its first placement.
expert_balancer_actor spawn_expert_balancer(caf::actor_system& sys, expert_balancer_params params);

} // namespace troupe::actors
