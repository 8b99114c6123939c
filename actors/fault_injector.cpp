#include "actors/fault_injector.hpp"

#include "actors/engine/decode_engine.hpp"
#include "runtime/supervisor.hpp"

#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

namespace troupe::actors {

namespace {

using inject_atom = caf::atom_constant<caf::atom("inject")>;

struct injector_state {
  caf::actor root;
  std::vector<fault_order> orders;
  std::shared_ptr<std::vector<fault_record>> log;
  static inline const char* name = "fault_injector";
};

using injector_ptr = caf::stateful_actor<injector_state>*;

std::string joined(const std::vector<std::string>& path) {
  std::string out;
  for (auto& p : path)
    out += (out.empty() ? "" : "/") + p;
  return out;
}

fault_record& record(injector_ptr self, std::size_t i, bool injected, std::string skipped) {
  auto& st = self->state;
  static fault_record unlogged;
  if (!st.log)
    return unlogged;
  st.log->push_back(fault_record{i, self->clock().now(), joined(st.orders[i].path), injected,
                                 std::move(skipped), nullptr});
  return st.log->back();
}

/// Drain order `i` reached its instance supervisor `node` (a child of `parent`): the notice
/// goes to the instance's engine; when its hand-off is done, the instance is stopped.
void drain(injector_ptr self, std::size_t i, caf::actor parent, caf::actor node) {
  self->request(node, caf::infinite, runtime::which_children_atom::value)
    .then(
      [self, i, parent](const std::vector<runtime::child_info>& children) {
        auto& order = self->state.orders[i];
        for (auto& c : children)
          if (c.id == "engine" && c.handle) {
            auto forwarded = std::make_shared<drain_handoff>();
            record(self, i, true, "").forwarded = forwarded;
            auto id = order.path.back();
            self->request(c.handle, caf::infinite, drain_atom::value, *order.drain)
              .then(
                [self, parent, id, forwarded](std::uint64_t n) {
                  forwarded->done = true;
                  forwarded->at = self->clock().now();
                  forwarded->forwarded = n;
                  // Anonymous: the supervisor's answer is not for the injector.
                  caf::anon_send(parent, runtime::stop_child_atom::value, id);
                },
                [](const caf::error&) {});
            return;
          }
        record(self, i, false, "target down");
      },
      [self, i](const caf::error&) { record(self, i, false, "target down"); });
}

/// Resolves level `depth` of order `i`'s path under `node`, then goes on or strikes.
void walk(injector_ptr self, std::size_t i, std::size_t depth, caf::actor node,
          caf::actor parent = {}) {
  auto& path = self->state.orders[i].path;
  if (depth + 1 == path.size() && path[depth] == "*") {
    // Every running child at this level.
    self->request(node, caf::infinite, runtime::which_children_atom::value)
      .then(
        [self, i](const std::vector<runtime::child_info>& children) {
          std::size_t hit = 0;
          for (auto& c : children)
            if (c.handle) {
              self->send_exit(c.handle, self->state.orders[i].reason);
              ++hit;
            }
          record(self, i, hit > 0, hit > 0 ? "" : "target down");
        },
        [self, i](const caf::error&) { record(self, i, false, "target down"); });
    return;
  }
  if (depth == path.size() && self->state.orders[i].drain) {
    drain(self, i, parent, node);
    return;
  }
  if (depth == path.size()) {
    self->send_exit(node, self->state.orders[i].reason);
    record(self, i, true, "");
    return;
  }
  self->request(node, caf::infinite, runtime::which_children_atom::value)
    .then(
      [self, i, depth, node](const std::vector<runtime::child_info>& children) {
        auto& id = self->state.orders[i].path[depth];
        for (auto& c : children)
          if (c.id == id) {
            if (!c.handle)
              record(self, i, false, "target down");
            else
              walk(self, i, depth + 1, c.handle, node);
            return;
          }
        record(self, i, false, "no child '" + id + "'");
      },
      [self, i](const caf::error&) { record(self, i, false, "target down"); });
}

caf::behavior injector_fn(injector_ptr self, caf::actor root, std::vector<fault_order> orders,
                          std::shared_ptr<std::vector<fault_record>> log) {
  auto& st = self->state;
  st.root = std::move(root);
  st.orders = std::move(orders);
  st.log = std::move(log);
  for (std::size_t i = 0; i < st.orders.size(); ++i)
    self->delayed_send(self, st.orders[i].at, inject_atom::value, i);
  return {
    [self](inject_atom, std::size_t i) {
      if (i >= self->state.orders.size())
        return;
      auto& order = self->state.orders[i];
      if (order.effect)
        order.effect();
      if (order.path.empty())
        record(self, i, true, "");
      else
        walk(self, i, 0, self->state.root);
    },
  };
}

} // namespace

caf::actor spawn_fault_injector(caf::actor_system& sys, caf::actor root,
                                std::vector<fault_order> orders,
                                std::shared_ptr<std::vector<fault_record>> log) {
  return sys.spawn(injector_fn, std::move(root), std::move(orders), std::move(log));
}

} // namespace troupe::actors
