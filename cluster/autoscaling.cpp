// The autoscaler's settings from a topology (cluster/autoscaling.hpp).
#include "cluster/autoscaling.hpp"

namespace troupe::cluster {

actors::scale_limits scale_limits_of(const autoscaler_spec& a) {
  actors::scale_limits l;
  l.max_step_up = a.max_step_up;
  l.max_step_down = a.max_step_down;
  l.over_provision = a.over_provision;
  l.occupancy_limit = a.scale_down_occupancy_limit;
  l.quota = a.quota;
  l.inventory = a.ready_inventory;
  l.scale_down_after = a.scale_down_after;
  return l;
}

bool autoscaled(const topology& topo, const pool_spec& pool) {
  return topo.autoscaler.enabled && pool.role != pool_role::vision
         && pool.instances.min != pool.instances.max;
}

bool prefill_or_decode_scales(const topology& topo) {
  for (const auto& p : topo.pools)
    if (autoscaled(topo, p))
      return true;
  return false;
}

actors::autoscaled_pool autoscaled_pool_of(
  const pool_spec& pool, double capacity,
  std::function<runtime::child_spec(actors::instance_id)> make_instance) {
  const bool decode = pool.role == pool_role::decode;
  return actors::autoscaled_pool{pool.name,
                                 decode,
                                 pool.instances.min,
                                 pool.instances.initial,
                                 pool.instances.max,
                                 pool.gpus_per_instance,
                                 capacity,
                                 decode ? pool.grace : runtime::duration{0},
                                 std::move(make_instance)};
}

} // namespace troupe::cluster
