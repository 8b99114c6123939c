#include "cluster/sim/capacity.hpp"

#include "cluster/sim/expert_placement.hpp"
#include "cluster/sim/perf_model.hpp"

#include <fmt/format.h>

namespace troupe::cluster::sim {

std::vector<capacity_problem> check_capacity(const topology& topo, const model_profile& model,
                                             const hardware_profile& hw) {
  std::vector<capacity_problem> out;
  for (const auto& p : topo.pools) {
    auto g = p.gpus_per_instance;
    if (p.role != pool_role::vision && resized_ep(g, g, model.routed_experts) == 0) {
      out.push_back({p.name, fmt::format("an instance of {} GPUs cannot form an EP group: {} has "
                                         "{} routed experts, and a group needs an expert on "
                                         "every rank and at least half its GPUs (docs/faults.md,"
                                         " \"EP resize on restart\")",
                                         g, model.name, model.routed_experts)});
      continue;
    }
    if (p.role == pool_role::vision)
      continue;
    // Each GPU holds 1/ep_size of the routed experts, whether an instance holds several EP
    // groups or one group spans several instances.
    auto m = memory_of_instance(model, hw, g, p.ep_size);
    if (!m)
      out.push_back({p.name, m.error(), false});
  }
  return out;
}

std::vector<capacity_problem> check_capacity(const topology& topo) {
  if (topo.cluster.hardware == "cpu")
    return {};
  auto model = resolve_model(topo.cluster.model, default_models_dir());
  if (!model)
    return {{"", model.error()}};
  auto hw = resolve_hardware(topo.cluster.hardware);
  if (!hw)
    return {{"", hw.error()}};
  return check_capacity(topo, *model, *hw);
}

std::uint64_t kv_capacity_tokens(const model_profile& model, const hardware_profile& hw,
                                 std::uint32_t gpus, std::uint32_t ep) {
  auto m = memory_of_instance(model, hw, gpus, ep);
  return m ? m->kv_tokens : fallback_kv_tokens;
}

} // namespace troupe::cluster::sim
