#include "runtime/ports/delayed_reply.hpp"
#include "runtime/ports/link.hpp"

#include "runtime/check.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>

namespace troupe::runtime {

namespace {

struct sim_link_state {
  sim_link_params params;
  /// When the pipe has sent every byte queued so far.
  time_point busy_until{};
  static inline const char* name = "sim_link";
};

caf::behavior sim_link_fn(caf::stateful_actor<sim_link_state>* self, sim_link_params params) {
  TROUPE_CHECK(params.bandwidth > 0, "sim_link: bandwidth must be > 0");
  self->state.params = params;
  return {
    [self](const link_transfer& t) {
      auto& st = self->state;
      auto started = std::max(self->clock().now(), st.busy_until);
      st.busy_until = started + from_seconds(static_cast<double>(t.bytes) / st.params.bandwidth);
      auto arrived = st.busy_until + st.params.latency;
      return detail::reply_at(self, arrived, link_delivery{t.id, t.bytes, started, arrived});
    },
  };
}

} // namespace

link_port spawn_sim_link(caf::actor_system& sys, sim_link_params params) {
  return caf::actor_cast<link_port>(sys.spawn(sim_link_fn, params));
}

} // namespace troupe::runtime
