#include "actors/fault_injector.hpp"

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

void record(injector_ptr self, std::size_t i, bool injected, std::string skipped) {
  auto& st = self->state;
  if (st.log)
    st.log->push_back(fault_record{i, self->clock().now(), joined(st.orders[i].path), injected,
                                   std::move(skipped)});
}

/// Resolves level `depth` of order `i`'s path under `node`, then goes on or strikes.
void walk(injector_ptr self, std::size_t i, std::size_t depth, caf::actor node) {
  auto& path = self->state.orders[i].path;
  if (depth == path.size()) {
    self->send_exit(node, self->state.orders[i].reason);
    record(self, i, true, "");
    return;
  }
  self->request(node, caf::infinite, runtime::which_children_atom::value)
    .then(
      [self, i, depth](const std::vector<runtime::child_info>& children) {
        auto& id = self->state.orders[i].path[depth];
        for (auto& c : children)
          if (c.id == id) {
            if (!c.handle)
              record(self, i, false, "target down");
            else
              walk(self, i, depth + 1, c.handle);
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
      if (i < self->state.orders.size())
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
