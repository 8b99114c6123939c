// The autoscaler's settings from a topology's [autoscaler] section and pools, shared by the two
// worlds that run actors/autoscaler: the simulation (cluster/sim/simulation.cpp) and one
// machine's real world (cluster/real_graph.cpp, `troupe serve`), and the control process of
// `troupe launch` (cluster/launch/launched_pools.hpp).
#pragma once

#include "actors/autoscaler/autoscaler.hpp"
#include "cluster/topology.hpp"

#include <functional>

namespace troupe::cluster {

/// The policy's limits (actors::decide_scale) from the topology's [autoscaler].
actors::scale_limits scale_limits_of(const autoscaler_spec& a);

/// Whether the autoscaler is on and may move prefill or decode pool `pool` (its min differs
/// from its max): its instances may then have any index, not only those below `initial`.
bool autoscaled(const topology& topo, const pool_spec& pool);

/// Whether the autoscaler may move a prefill or decode pool of `topo`.
bool prefill_or_decode_scales(const topology& topo);

/// A pool the autoscaler manages: its bounds, GPUs and decode grace from the topology, the
/// per-instance capacity (actors::autoscaled_pool::capacity) and how to start instance `id`.
actors::autoscaled_pool autoscaled_pool_of(
  const pool_spec& pool, double capacity,
  std::function<runtime::child_spec(actors::instance_id)> make_instance);

} // namespace troupe::cluster
