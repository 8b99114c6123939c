// capacity: whether a topology's instances can hold the model, and how much KV they hold.
//
// A topology file says how many GPUs an instance has; whether those GPUs can hold the
// model's weights, how much HBM is left for KV, and whether the EP group can form at all
// depend on the model and the hardware profiles, which the topology loader does not read.
// These checks join the three, so that `troupe topology check` and `troupe sim` reject an
// instance that could never start (an EP group larger than the model has experts, weights
// larger than the GPUs' memory) before a run, instead of a run whose requests fail with a
// misleading reason. The decode balancer and the simulation's memory invariant take each
// decode instance's KV capacity from here.
#pragma once

#include "cluster/sim/hardware.hpp"
#include "cluster/sim/model_profile.hpp"
#include "cluster/topology.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cluster::sim {

/// One problem of a pool: which pool, what is wrong, and whether it is fatal (the instance
/// cannot start) or a warning (the simulation runs it, but the figures are not physical).
struct capacity_problem {
  std::string pool;
  std::string message;
  bool fatal = true;
};

/// Every problem of `topo`'s pools against `model` on `hw`, in pool order: an instance whose
/// EP group cannot form (expert_placement.hpp: resized_ep of its configured size is 0; fatal),
/// and a prefill or decode instance whose weights and workspace leave no HBM for KV
/// (memory_of_instance; a warning: the simulation then gives a decode instance the fallback
/// KV capacity `fallback_kv_tokens`). Empty when every instance can start and hold the model.
std::vector<capacity_problem> check_capacity(const topology& topo, const model_profile& model,
                                             const hardware_profile& hw);

/// The same for a topology whose model and hardware are resolved from its [cluster] section
/// (the shipped model configs, the built-in hardware profiles or a profile file). A topology
/// for the CPU backend (`hardware = "cpu"`) has nothing to check: empty. A model or hardware
/// that does not resolve is one problem with an empty pool.
std::vector<capacity_problem> check_capacity(const topology& topo);

/// The KV capacity, in tokens, a decode instance that cannot hold the model's weights is run
/// with (the simulator's former constant): such a topology is reported with a warning.
inline constexpr std::uint64_t fallback_kv_tokens = std::uint64_t{64} << 20;

/// Block-KV tokens an instance of `gpus` GPUs with EP `ep` holds (memory_of_instance's
/// kv_tokens); `fallback_kv_tokens` when its weights leave no room.
std::uint64_t kv_capacity_tokens(const model_profile& model, const hardware_profile& hw,
                                 std::uint32_t gpus, std::uint32_t ep);

} // namespace troupe::cluster::sim
