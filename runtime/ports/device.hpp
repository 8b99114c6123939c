// The device port: how a GPU rank actor runs a step of model compute.
//
// A gpu_rank actor never touches a GPU or a clock itself: it sends a `device_step` to its
// device port and gets a `device_result` back as an ordinary reply. In the simulated world
// the port is an actor that replies after a modelled duration; in the real world it runs CPU
// (OpenBLAS) or CUDA kernels. Both implement `device_port`, so the rank cannot tell them
// apart. A device runs one step at a time: steps queue in arrival order.
#pragma once

#include "runtime/time.hpp"

#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <functional>
#include <string>

namespace troupe::runtime {

enum class step_phase : std::uint8_t { prefill, decode, encode };

std::string to_string(step_phase p);

/// One step of device work: what a perf model needs to cost it and a real device to run it.
struct device_step {
  /// Caller-chosen id, echoed in the result.
  std::uint64_t id = 0;
  step_phase phase = step_phase::prefill;
  /// Tokens computed in this step (summed over sequences).
  std::uint64_t tokens = 0;
  /// Sequences in the batch.
  std::uint32_t sequences = 0;
  /// Total KV length the step attends over (summed over sequences).
  std::uint64_t context_tokens = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_step& x) {
  return f(caf::meta::type_name("device_step"), x.id, x.phase, x.tokens, x.sequences,
           x.context_tokens);
}

/// The outcome of a step: when it started and finished on the device's clock.
struct device_result {
  std::uint64_t id = 0;
  time_point started{};
  time_point finished{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_result& x) {
  return f(caf::meta::type_name("device_result"), x.id, x.started, x.finished);
}

/// Replies to each step once it has run; steps run one at a time in arrival order.
using device_port = caf::typed_actor<caf::replies_to<device_step>::with<device_result>>;

/// How long a step takes on a simulated device (the perf model plugs in here).
using step_cost_fn = std::function<duration(const device_step&)>;

/// A simulated device: each step occupies the device for cost(step), after any steps queued
/// before it, and is answered when it finishes. A negative cost counts as zero.
device_port spawn_sim_device(caf::actor_system& sys, step_cost_fn cost);

} // namespace troupe::runtime
