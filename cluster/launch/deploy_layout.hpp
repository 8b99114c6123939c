// How an instance of a pool maps onto machines when an external orchestrator places it.
//
// Kubernetes and Slurm place processes on machines, not GPUs on instances: an instance of 4
// GPUs fits on one 8-GPU machine (two of them share it), an instance of 128 GPUs spans 16
// machines with one process per machine. The Kubernetes manifests (k8s_manifests.hpp) and the
// Slurm job (slurm_job.hpp) both need the same answer to "how many processes does one instance
// of this pool have, and how many GPUs does each hold", so it is computed once here, from the
// pool's gpus_per_instance and the machines' GPU count (the hardware profile's gpus_per_node
// unless the operator overrides it). An instance larger than a machine must be a whole number
// of machines: a 12-GPU instance on 8-GPU machines is rejected, not silently rounded.
#pragma once

#include "cluster/sim/result.hpp"
#include "cluster/topology.hpp"

#include <cstdint>

namespace troupe::cluster {

/// The processes of one instance of a pool.
struct instance_layout {
  std::uint32_t processes = 1;        // ≥ 1: one per machine the instance spans
  std::uint32_t gpus_per_process = 0; // 0 on the CPU backend (no accelerator to request)
};

/// GPUs per machine of `topo`'s hardware: 0 for hardware "cpu" (the CPU backend requests no
/// GPUs, whatever the override), else `override_gpus` when non-zero, else the hardware
/// profile's gpus_per_node.
/// Fails only when the hardware has no built-in profile and no override was given.
sim::result<std::uint32_t> gpus_per_machine(const topology& topo, std::uint32_t override_gpus);

/// The layout of one instance of `pool` on machines of `gpus_per_machine` GPUs (0: CPU
/// backend, one process holding gpus_per_instance CPU devices). Fails, naming the pool, when
/// the instance is larger than a machine and not a whole number of machines.
sim::result<instance_layout> layout_of(const pool_spec& pool, std::uint32_t gpus_per_machine);

} // namespace troupe::cluster
