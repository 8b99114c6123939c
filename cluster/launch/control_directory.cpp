#include "cluster/launch/control_directory.hpp"
#include "cluster/launch/node_agent.hpp"

#include "actors/lb/lb_protocol.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

namespace troupe::cluster {

caf::actor spawn_control_directory(caf::actor_system& sys, const control_graph& control) {
  control_directory dir{caf::actor_cast<caf::actor>(control.kv),
                        caf::actor_cast<caf::actor>(control.prefill_lb),
                        caf::actor_cast<caf::actor>(control.decode_lb)};
  return sys.spawn([dir](caf::event_based_actor*) -> caf::behavior {
    return {[dir](directory_atom) { return dir; }};
  });
}

caf::actor spawn_balancer_relay(caf::actor_system& sys, caf::actor lb, kv_bridge_params bridge) {
  return sys.spawn([lb, bridge](caf::event_based_actor* self) -> caf::behavior {
    auto engine = std::make_shared<caf::actor>();
    return {
      [self, lb, engine, bridge](actors::add_instance_atom a, actors::instance_id id,
                                 const actors::prefill_engine_actor& e) {
        *engine = caf::actor_cast<caf::actor>(e);
        self->send(lb, a, id, spawn_prefill_bridge(self->system(), e, bridge));
      },
      [self, lb, engine, bridge](actors::add_instance_atom a, actors::instance_id id,
                                 const actors::decode_engine_actor& e) {
        *engine = caf::actor_cast<caf::actor>(e);
        self->send(lb, a, id, spawn_decode_bridge(self->system(), e, bridge));
      },
      [self, lb](actors::drain_instance_atom a, actors::instance_id id) {
        self->send(lb, a, id);
      },
      [engine](caf::get_atom) { return *engine; },
    };
  });
}

void register_launch_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::troupe_launch>();
  cfg.add_message_types<caf::id_block::troupe_launch_agent>();
}

} // namespace troupe::cluster
