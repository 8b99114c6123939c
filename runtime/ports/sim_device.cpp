#include "runtime/ports/delayed_reply.hpp"
#include "runtime/ports/device.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>

namespace troupe::runtime {

std::string to_string(step_phase p) {
  switch (p) {
    case step_phase::prefill:
      return "prefill";
    case step_phase::decode:
      return "decode";
    case step_phase::encode:
      return "encode";
  }
  return "?";
}

namespace {

struct sim_device_state {
  step_cost_fn cost;
  /// When the device finishes the work queued so far.
  time_point busy_until{};
  detail::delayed_replies replies;
  static inline const char* name = "sim_device";
};

caf::behavior sim_device_fn(caf::stateful_actor<sim_device_state>* self, step_cost_fn cost) {
  self->state.cost = std::move(cost);
  return {
    [self](const device_step& step) {
      auto& st = self->state;
      auto started = std::max(self->clock().now(), st.busy_until);
      st.busy_until = started + std::max(duration{0}, st.cost(step));
      return st.replies.at(self, st.busy_until, device_result{step.id, started, st.busy_until});
    },
    [self](detail::reply_timer_atom, std::uint64_t token) { self->state.replies.fire(token); },
  };
}

} // namespace

device_port spawn_sim_device(caf::actor_system& sys, step_cost_fn cost) {
  return caf::actor_cast<device_port>(sys.spawn(sim_device_fn, std::move(cost)));
}

} // namespace troupe::runtime
