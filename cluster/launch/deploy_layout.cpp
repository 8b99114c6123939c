// How an instance of a pool maps onto machines (see deploy_layout.hpp).
#include "cluster/launch/deploy_layout.hpp"

#include "cluster/sim/hardware.hpp"

#include <fmt/format.h>

namespace troupe::cluster {

sim::result<std::uint32_t> gpus_per_machine(const topology& topo, std::uint32_t override_gpus) {
  if (topo.cluster.hardware == "cpu")
    return std::uint32_t{0};
  if (override_gpus != 0)
    return override_gpus;
  auto hw = sim::resolve_hardware(topo.cluster.hardware);
  if (!hw)
    return sim::result<std::uint32_t>::failure(
      fmt::format("{} (give the machines' GPU count with --gpus-per-node)", hw.error()));
  if (hw->gpus_per_node <= 0)
    return sim::result<std::uint32_t>::failure(fmt::format(
      "hardware {} has no GPU count per machine; give it with --gpus-per-node", hw->name));
  return static_cast<std::uint32_t>(hw->gpus_per_node);
}

sim::result<instance_layout> layout_of(const pool_spec& pool, std::uint32_t gpus_per_machine) {
  if (gpus_per_machine == 0)
    return instance_layout{1, 0};
  const auto g = pool.gpus_per_instance;
  if (g <= gpus_per_machine)
    return instance_layout{1, g};
  if (g % gpus_per_machine != 0)
    return sim::result<instance_layout>::failure(fmt::format(
      "pool {}: an instance of {} GPUs spans machines of {} GPUs but is not a whole number of "
      "them (make gpus_per_instance a multiple of {}, or at most {})",
      pool.name, g, gpus_per_machine, gpus_per_machine, gpus_per_machine));
  return instance_layout{g / gpus_per_machine, gpus_per_machine};
}

} // namespace troupe::cluster
