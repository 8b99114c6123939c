// gpu_rank: one GPU of an instance, as an actor.
//
// A rank owns its device (through the device port) and, in the real world, its share of the
// experts' weights. An instance's engine runs its steps on the leader rank's device (it holds
// that device's port: a step is one message to the device, not two through the rank); in the
// simulated world the perf model's step time for the leader covers the whole EP group
// (compute of every rank plus the all-to-all), so the other ranks hold no work of their own
// but still fail, and a rank's exit takes its instance down (one communication domain). A
// rank exits when its device exits. A rank is itself a device port that forwards to its
// device, for pipelines that hold ranks rather than devices.
#pragma once

#include "actors/lb/prefill_balancer.hpp"
#include "runtime/ports/device.hpp"

#include <caf/fwd.hpp>

#include <cstdint>

namespace troupe::actors {

struct gpu_rank_params {
  instance_id instance = 0;
  std::uint32_t rank = 0;
};

/// Spawns a rank that implements the device port by forwarding each step, release, KV export
/// and KV import to `device` (replies come straight from the device).
runtime::device_port spawn_gpu_rank(caf::local_actor* parent, gpu_rank_params params,
                                    runtime::device_port device);

} // namespace troupe::actors
