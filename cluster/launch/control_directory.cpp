#include "cluster/launch/control_directory.hpp"
#include "cluster/launch/node_agent.hpp"

#include "actors/lb/lb_protocol.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <memory>
#include <vector>

namespace troupe::cluster {

namespace {

/// A joined process's name as a metrics source: its watcher's address.
std::string source_of(const caf::actor_addr& watcher) {
  return to_string(watcher);
}

} // namespace

caf::actor spawn_control_directory(caf::actor_system& sys, const control_graph& control,
                                   caf::actor store_registry, std::uint32_t store_shards,
                                   std::uint32_t store_replicas, caf::actor fetchers,
                                   caf::actor scaler,
                                   std::chrono::milliseconds watcher_timeout,
                                   runtime::registry* metrics) {
  control_directory dir{caf::actor_cast<caf::actor>(control.kv),
                        caf::actor_cast<caf::actor>(control.prefill_lb),
                        caf::actor_cast<caf::actor>(control.decode_lb),
                        std::move(store_registry), store_shards, store_replicas,
                        std::move(fetchers), std::move(scaler)};
  return sys.spawn([dir, watcher_timeout, metrics](caf::event_based_actor* self) -> caf::behavior {
    auto watchers = std::make_shared<std::vector<caf::actor>>();
    // The launcher, and the latest re-formation of each instance process (pid, ranks).
    struct reforms {
      caf::actor launcher;
      std::map<std::string, std::pair<std::int32_t, std::uint32_t>> latest;
    };
    auto re = std::make_shared<reforms>();
    auto mirror = std::make_shared<runtime::metrics_mirror>(metrics);
    self->set_down_handler([watchers, mirror](caf::down_msg& m) {
      mirror->forget(source_of(m.source));
      watchers->erase(std::remove_if(watchers->begin(), watchers->end(),
                                     [&](const caf::actor& w) { return w.address() == m.source; }),
                      watchers->end());
    });
    if (metrics != nullptr)
      self->send(self, mirror_tick_atom::value);
    return {
      [dir](directory_atom) { return dir; },
      [self, watchers, mirror](mirror_tick_atom) {
        for (const auto& w : *watchers)
          self->request(w, std::chrono::seconds(5), metrics_atom::value)
            .then(
              [mirror, source = source_of(w.address())](
                std::vector<runtime::metric_samples>& samples) { mirror->apply(source, samples); },
              [](const caf::error&) {});
        self->delayed_send(self, std::chrono::seconds(1), mirror_tick_atom::value);
      },
      [self, re](launcher_atom, const caf::actor& launcher) {
        re->launcher = launcher;
        for (const auto& [name, r] : re->latest)
          self->send(launcher, reformed_atom::value, name, r.first, r.second);
        return caf::ok_atom::value;
      },
      [self, re](reformed_atom a, const std::string& name, std::int32_t pid, std::uint32_t ranks) {
        re->latest[name] = {pid, ranks};
        if (re->launcher)
          self->send(re->launcher, a, name, pid, ranks);
      },
      [self, watchers](caf::join_atom, const caf::actor& watcher) {
        self->monitor(watcher);
        watchers->push_back(watcher);
      },
      [self, watchers, watcher_timeout](stopping_atom) -> caf::result<caf::ok_atom> {
        if (watchers->empty())
          return caf::ok_atom::value;
        auto rp = self->make_response_promise<caf::ok_atom>();
        auto left = std::make_shared<std::size_t>(watchers->size());
        auto answered = [rp, left]() mutable {
          if (--*left == 0)
            rp.deliver(caf::ok_atom::value);
        };
        for (const auto& w : *watchers)
          self->request(w, watcher_timeout, stopping_atom::value)
            .then([answered](caf::ok_atom) mutable { answered(); },
                  [answered](const caf::error&) mutable { answered(); });
        return rp;
      },
    };
  });
}

caf::actor spawn_balancer_relay(caf::actor_system& sys, caf::actor lb, caf::actor kept_to,
                                kv_bridge_params bridge) {
  return sys.spawn([lb, kept_to, bridge](caf::event_based_actor* self) -> caf::behavior {
    auto engine = std::make_shared<caf::actor>();
    auto decode_bridge = std::make_shared<caf::actor>();
    return {
      [self, lb, engine, bridge](actors::add_instance_atom a, actors::instance_id id,
                                 const actors::prefill_engine_actor& e) {
        *engine = caf::actor_cast<caf::actor>(e);
        self->send(lb, a, id, spawn_prefill_bridge(self->system(), e, bridge));
      },
      [self, lb, engine, decode_bridge, bridge](actors::add_instance_atom a,
                                                actors::instance_id id,
                                                const actors::decode_engine_actor& e) {
        *engine = caf::actor_cast<caf::actor>(e);
        auto b = spawn_decode_bridge(self->system(), e, bridge);
        *decode_bridge = caf::actor_cast<caf::actor>(b);
        self->send(lb, a, id, std::move(b));
      },
      [self, lb](actors::drain_instance_atom a, actors::instance_id id) {
        self->send(lb, a, id);
      },
      // A decode engine names itself as the keeper: other processes ask its bridge instead.
      [self, kept_to, engine, decode_bridge](actors::prefill_kept& k) {
        if (k.keeper && *decode_bridge && caf::actor_cast<caf::actor>(k.keeper) == *engine)
          k.keeper = caf::actor_cast<caf::strong_actor_ptr>(*decode_bridge);
        self->send(kept_to, std::move(k));
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
