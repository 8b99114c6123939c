#include "cluster/launch/launched_pools.hpp"

#include "actors/engine/prefill_engine.hpp"
#include "runtime/errors.hpp"
#include "runtime/supervisor.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/response_promise.hpp>
#include <caf/send.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>

namespace troupe::cluster {

namespace {

using children = std::vector<runtime::child_info>;
using start_timeout_atom = caf::atom_constant<caf::atom("starttmo")>;

/// How long an ordered instance process may take to appear in the launcher's list.
constexpr auto start_limit = std::chrono::seconds(120);
constexpr auto ask_limit = std::chrono::seconds(10);

/// The stand-in of instance process `process` ("decode/2"), index `index` of its pool.
caf::behavior instance_stand_in(caf::event_based_actor* self, std::string process,
                                std::uint32_t index, caf::actor pool, caf::actor root) {
  auto engine = std::make_shared<caf::actor>();
  self->set_down_handler([engine](caf::down_msg& m) {
    if (*engine && m.source == engine->address())
      *engine = caf::actor{};
  });
  return {
    [self, process, root, engine](runtime::which_children_atom) -> caf::result<children> {
      auto me = caf::actor_cast<caf::actor>(self);
      if (*engine)
        return children{{"engine", me, 0}};
      // The engine is known once it announced itself to its relay.
      auto rp = self->make_response_promise<children>();
      auto none = [rp](const caf::error&) mutable { rp.deliver(children{}); };
      self->request(root, ask_limit, caf::get_atom::value, process)
        .then(
          [self, rp, me, engine, none](const caf::actor& relay) mutable {
            if (!relay) {
              rp.deliver(children{});
              return;
            }
            self->request(relay, ask_limit, caf::get_atom::value)
              .then(
                [self, rp, me, engine](const caf::actor& e) mutable {
                  if (e && !*engine) {
                    *engine = e;
                    self->monitor(e);
                  }
                  rp.deliver(*engine ? children{{"engine", me, 0}} : children{});
                },
                none);
          },
          none);
      return rp;
    },
    [self, process, engine](actors::engine_stats_atom a) -> caf::result<actors::engine_stats> {
      if (!*engine)
        return runtime::make_error(runtime::errc::unavailable, process + " has no engine yet");
      auto rp = self->make_response_promise<actors::engine_stats>();
      self->request(*engine, ask_limit, a)
        .then([rp](const actors::engine_stats& s) mutable { rp.deliver(s); },
              [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
      return rp;
    },
    // The autoscaler drains a decode instance: its process drains itself on its way out. The
    // pool answers (this stand-in is gone by then).
    [self, index, pool](actors::drain_atom, runtime::duration) {
      return self->delegate(pool, scale_stop_atom::value, index);
    },
  };
}

/// An instance process of the pool, as the launcher last listed it.
struct member {
  /// The launcher's state; "ordered" until the launcher lists a process ordered here.
  std::string state;
  /// The stand-in, once listed.
  caf::actor node;
  /// start_child's answer, when the autoscaler ordered it.
  std::optional<caf::typed_response_promise<caf::actor>> started;
  /// Called once the launcher no longer lists it (its process stopped).
  std::vector<std::function<void()>> gone;
  bool stop_ordered = false;
};

/// The stand-in of the pool named `pool` whose processes have role `role`.
caf::behavior pool_stand_in(caf::event_based_actor* self, std::string pool, std::string role,
                            caf::actor root) {
  struct state {
    caf::actor launcher;
    std::map<std::uint32_t, member> members;
  };
  auto st = std::make_shared<state>();
  auto process_of = [role](std::uint32_t i) { return role + "/" + std::to_string(i); };
  auto forget = [self, st](std::map<std::uint32_t, member>::iterator it) {
    auto m = std::move(it->second);
    st->members.erase(it);
    if (m.node) {
      self->unlink_from(m.node);  // its exit is not the pool's
      self->send_exit(m.node, caf::exit_reason::user_shutdown);
    }
    if (m.started)
      m.started->deliver(runtime::make_error(runtime::errc::child_start_failed,
                                             "the launcher did not start it"));
    for (auto& f : m.gone)
      f();
  };
  // Orders the stop of member `i` (once) and calls `then` when its process is gone.
  auto stop = [self, st, role](std::uint32_t i, std::function<void()> then) {
    auto& m = st->members.at(i);
    m.gone.push_back(std::move(then));
    if (!m.stop_ordered) {
      m.stop_ordered = true;
      self->send(st->launcher, scale_stop_atom::value, role, i);
    }
  };
  return {
    [st](launcher_atom, const caf::actor& l) {
      st->launcher = l;
      if (l)
        return;
      // The launcher is gone: what it was asked is not coming.
      for (auto it = st->members.begin(); it != st->members.end();) {
        auto& m = it->second;
        if (m.started) {
          m.started->deliver(runtime::make_error(runtime::errc::unavailable, "the launcher left"));
          m.started.reset();
        }
        if (m.state == "ordered") {
          it = st->members.erase(it);
          continue;
        }
        m.stop_ordered = false;
        ++it;
      }
    },
    [self, st, role, root, process_of, forget](instances_atom,
                                               const std::vector<launched_instance>& all) {
      std::map<std::uint32_t, const launched_instance*> listed;
      for (const auto& x : all)
        if (x.role == role)
          listed[x.index] = &x;
      for (auto it = st->members.begin(); it != st->members.end();) {
        auto next = std::next(it);
        auto l = listed.find(it->first);
        // Ordered here and not listed yet: the list may predate the order.
        if (l == listed.end() && it->second.state != "ordered")
          forget(it);
        else if (l != listed.end() && l->second->state == "failed")
          forget(it);
        it = next;
      }
      for (auto& [i, x] : listed) {
        if (x->state == "failed")
          continue;
        auto& m = st->members[i];
        m.state = x->state;
        if (!m.node)
          m.node = self->spawn<caf::linked>(instance_stand_in, process_of(i), i,
                                            caf::actor_cast<caf::actor>(self), root);
        if (m.started) {
          m.started->deliver(m.node);
          m.started.reset();
        }
      }
    },
    [st, pool](runtime::which_children_atom) {
      children rows;
      for (auto& [i, m] : st->members)
        if (m.state != "ordered")
          rows.push_back({pool + "/" + std::to_string(i),
                          m.state == "running" || m.state == "moving" ? m.node : caf::actor{}, 0});
      return rows;
    },
    [self, st, role](runtime::start_child_atom, runtime::child_spec& spec) -> caf::result<caf::actor> {
      auto slash = spec.id.rfind('/');
      std::uint32_t i = 0;
      try {
        i = static_cast<std::uint32_t>(std::stoul(spec.id.substr(slash + 1)));
      } catch (const std::exception&) {
        return runtime::make_error(runtime::errc::invalid_argument, "not an instance: " + spec.id);
      }
      if (!st->launcher)
        return runtime::make_error(runtime::errc::unavailable, "no launcher to start " + spec.id);
      if (st->members.count(i) != 0)
        return runtime::make_error(runtime::errc::duplicate_child, spec.id);
      auto& m = st->members[i];
      m.state = "ordered";
      m.started = self->make_response_promise<caf::actor>();
      self->send(st->launcher, scale_start_atom::value, role, i);
      self->delayed_send(self, start_limit, start_timeout_atom::value, i);
      return *m.started;
    },
    [st, forget](start_timeout_atom, std::uint32_t i) {
      if (auto it = st->members.find(i); it != st->members.end() && it->second.state == "ordered")
        forget(it);
    },
    [self, st, stop](runtime::stop_child_atom, const std::string& id) -> caf::result<caf::unit_t> {
      auto slash = id.rfind('/');
      std::uint32_t i = 0;
      try {
        i = static_cast<std::uint32_t>(std::stoul(id.substr(slash + 1)));
      } catch (const std::exception&) {
        return runtime::make_error(runtime::errc::unknown_child, id);
      }
      if (st->members.count(i) == 0)
        return caf::unit;  // gone already (a drained decode instance's process)
      if (!st->launcher)
        return runtime::make_error(runtime::errc::unavailable, "no launcher to stop " + id);
      auto rp = self->make_response_promise();
      stop(i, [rp]() mutable { rp.deliver(caf::unit); });
      return rp;
    },
    // An instance stand-in's drain: the process's stop, answered with what it forwarded.
    [self, st, root, stop, process_of](scale_stop_atom,
                                       std::uint32_t i) -> caf::result<std::uint64_t> {
      if (!st->launcher)
        return runtime::make_error(runtime::errc::unavailable, "no launcher to drain " + process_of(i));
      if (st->members.count(i) == 0)
        return runtime::make_error(runtime::errc::unknown_child, process_of(i));
      auto rp = self->make_response_promise<std::uint64_t>();
      stop(i, [self, rp, root, name = process_of(i)]() mutable {
        self->request(root, ask_limit, left_atom::value, name)
          .then([rp](std::uint64_t n) mutable { rp.deliver(n); },
                [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
      });
      return rp;
    },
  };
}

} // namespace

caf::actor spawn_launched_pools(caf::actor_system& sys, std::string prefill_pool,
                                std::string decode_pool) {
  return sys.spawn([prefill_pool, decode_pool](caf::event_based_actor* self) -> caf::behavior {
    struct state {
      caf::actor launcher;
      caf::actor pools[2];
      /// Instance process name -> its balancer relay.
      std::map<std::string, caf::actor> relays;
      /// Instance process name -> requests it forwarded draining.
      std::map<std::string, std::uint64_t> left;
    };
    auto st = std::make_shared<state>();
    auto me = caf::actor_cast<caf::actor>(self);
    st->pools[0] = self->spawn<caf::linked>(pool_stand_in, prefill_pool, "prefill", me);
    st->pools[1] = self->spawn<caf::linked>(pool_stand_in, decode_pool, "decode", me);
    self->set_down_handler([self, st](caf::down_msg& m) {
      if (st->launcher && m.source == st->launcher.address()) {
        st->launcher = caf::actor{};
        for (auto& p : st->pools)
          self->send(p, launcher_atom::value, caf::actor{});
      }
      for (auto it = st->relays.begin(); it != st->relays.end();)
        it = it->second.address() == m.source ? st->relays.erase(it) : std::next(it);
    });
    return {
      [st, prefill_pool, decode_pool](runtime::which_children_atom) -> caf::result<children> {
        if (!st->launcher)
          return runtime::make_error(runtime::errc::unavailable,
                                     "no launcher has registered with the control process");
        return children{{prefill_pool, st->pools[0], 0}, {decode_pool, st->pools[1], 0}};
      },
      [self, st](launcher_atom, const caf::actor& l) {
        if (st->launcher)
          self->demonitor(st->launcher);
        st->launcher = l;
        self->monitor(l);
        for (auto& p : st->pools)
          self->send(p, launcher_atom::value, l);
        return caf::ok_atom::value;
      },
      [self, st](instances_atom a, const std::vector<launched_instance>& all) {
        for (auto& p : st->pools)
          self->send(p, a, all);
      },
      [self, st](caf::put_atom, const std::string& name, const caf::actor& relay) {
        st->relays[name] = relay;
        self->monitor(relay);
      },
      [st](caf::get_atom, const std::string& name) {
        auto it = st->relays.find(name);
        return it == st->relays.end() ? caf::actor{} : it->second;
      },
      [st](left_atom, const std::string& name, std::uint64_t forwarded) {
        st->left[name] = forwarded;
        return caf::ok_atom::value;
      },
      [st](left_atom, const std::string& name) {
        auto it = st->left.find(name);
        std::uint64_t n = it == st->left.end() ? 0 : it->second;
        if (it != st->left.end())
          st->left.erase(it);
        return n;
      },
    };
  });
}

} // namespace troupe::cluster
