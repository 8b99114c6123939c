#include "actors/lb/vision_lb.hpp"

#include "runtime/errors.hpp"

#include <caf/actor_system.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <map>

namespace troupe::actors {

namespace {

struct vision_member {
  vision_engine_actor engine;
  /// Image tokens booked and not yet released.
  std::uint64_t outstanding = 0;
};

struct vision_lb_state {
  /// Ordered by instance id: the first of equally loaded instances wins.
  std::map<instance_id, vision_member> members;
  std::uint64_t routed = 0;
  std::uint64_t rejected = 0;
  std::uint64_t released = 0;
  static inline const char* name = "vision_lb";
};

using lb_ptr = vision_lb_actor::stateful_pointer<vision_lb_state>;

vision_lb_actor::behavior_type vision_lb_fn(lb_ptr self) {
  self->set_down_handler([self](caf::down_msg& msg) {
    forget_member(self->state.members, msg.source, [](auto& m) -> auto& { return m.engine; });
  });
  return {
    [self](const vision_route& r) -> caf::result<vision_assignment> {
      auto& st = self->state;
      auto best = st.members.end();
      for (auto i = st.members.begin(); i != st.members.end(); ++i)
        if (best == st.members.end() || i->second.outstanding < best->second.outstanding)
          best = i;
      if (best == st.members.end()) {
        ++st.rejected;
        return runtime::make_error(runtime::errc::unavailable, "no vision instance is up");
      }
      best->second.outstanding += r.image_tokens;
      ++st.routed;
      return vision_assignment{best->first, best->second.engine};
    },
    [self](const vision_release& r) {
      auto& st = self->state;
      ++st.released;
      auto i = st.members.find(r.instance);
      if (i == st.members.end())
        return;
      auto& o = i->second.outstanding;
      o -= std::min(o, r.image_tokens);
    },
    [self](add_instance_atom, instance_id id, vision_engine_actor& engine) {
      self->monitor(engine);
      // A restarted instance comes back with a new engine and nothing booked.
      self->state.members[id] = vision_member{std::move(engine), 0};
    },
    [self](lb_stats_atom) {
      auto& st = self->state;
      std::uint64_t outstanding = 0;
      for (auto& [id, m] : st.members)
        outstanding += m.outstanding;
      lb_counters c;
      c.lb = "vision";
      c.add("routed", st.routed);
      c.add("rejected", st.rejected);
      c.add("released", st.released);
      c.add("instances", st.members.size());
      c.add("outstanding_tokens", outstanding);
      return c;
    },
  };
}

} // namespace

vision_lb_actor spawn_vision_lb(caf::actor_system& sys) {
  return sys.spawn(vision_lb_fn);
}

} // namespace troupe::actors
