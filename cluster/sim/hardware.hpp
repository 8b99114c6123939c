// Hardware profiles of the simulated world: what one accelerator and its fabrics can do.
//
// The performance model turns a step of model compute into a duration; for that it needs the
// accelerator's peak arithmetic rates, its memory bandwidth, the bandwidth and latency of the
// scale-up fabric (NVLink, Ascend UB) and of the scale-out network (RDMA NICs), and how close
// real kernels get to those peaks. Each named profile (H800, H100, H200, B200, Ascend950)
// carries vendor figures and efficiency factors taken from published kernel measurements; the
// sources are listed in docs/perf-model.md. Every number is a plain field, so a profile can be
// loaded from a JSON file too, which is how a machine without published numbers (or a what-if)
// is described.
#pragma once

#include "cluster/sim/result.hpp"

#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::cluster::sim {

/// One accelerator (and its share of the node's fabrics). Rates are per accelerator, per
/// direction, in bytes or FLOP per second; latencies in seconds.
struct hardware_profile {
  std::string name;

  // Dense peak arithmetic (no sparsity), FLOP/s. fp4 is 0 where the chip has no FP4 units.
  double bf16_flops = 0;
  double fp8_flops = 0;
  double fp4_flops = 0;

  // Memory.
  double hbm_bytes_per_s = 0;
  double hbm_bytes = 0;

  // Scale-up fabric (NVLink / UB): unidirectional bandwidth per accelerator, per-message
  // latency of an all-to-all over it, and how many accelerators it joins.
  double scale_up_bytes_per_s = 0;
  double scale_up_latency_s = 0;
  int scale_up_domain = 8;

  // Scale-out network (RDMA): unidirectional NIC bandwidth per accelerator and the latency of an
  // all-to-all over it.
  double scale_out_bytes_per_s = 0;
  double scale_out_latency_s = 0;

  // Accelerators per node (the unit of "tokens/s per node").
  int gpus_per_node = 8;

  // Efficiency factors: the fraction of a peak that real kernels reach.
  double gemm_efficiency = 0;           // large FP8 GEMMs / grouped GEMMs vs fp8_flops
  double attention_efficiency = 0;      // attention kernels, compute-bound, vs bf16_flops
  double memory_efficiency = 0;         // memory-bound kernels vs hbm_bytes_per_s
  double scale_up_efficiency = 0;       // EP all-to-all over the scale-up fabric
  double scale_out_efficiency = 0;      // EP all-to-all over RDMA
  double comm_sm_fraction = 0;          // share of the SMs taken by prefill all-to-all kernels

  // Engram table reads: host-memory bandwidth to the device and SSD random-read rate per
  // accelerator (the tables live on local SSD with a host-memory cache).
  double host_to_device_bytes_per_s = 0;
  double ssd_read_iops = 0;
};

/// The names `hardware_by_name` knows, in canonical spelling.
const std::vector<std::string_view>& known_hardware_profiles();

/// The built-in profile called `name` (case-insensitive: "h800", "H800", "ascend950"). "cpu"
/// fails with a message saying the CPU backend is exact and not modelled; any other unknown name
/// fails with the list of known ones.
result<hardware_profile> hardware_by_name(std::string_view name);

/// A profile from a JSON object. Every field of `hardware_profile` may be given under its own
/// name; a "base" field names a built-in profile whose values fill the fields not given (without
/// it, every rate must be given). Unknown fields, wrong types and non-positive rates fail with a
/// message naming the field.
result<hardware_profile> hardware_from_json(const nlohmann::json& j);

/// `hardware_from_json` on a file; fails if the file cannot be read or is not JSON.
result<hardware_profile> load_hardware_file(const std::filesystem::path& file);

/// A name or a JSON file: a path ending in ".json" is loaded as a file, anything else is looked
/// up with `hardware_by_name`.
result<hardware_profile> resolve_hardware(std::string_view name_or_file);

} // namespace troupe::cluster::sim
