#include "cluster/sim/trace_source.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include <map>

namespace troupe::cluster::sim {

namespace {

using next_atom = caf::atom_constant<caf::atom("nextarr")>;

struct source_state {
  admission_stream pull;
  /// The next admission not yet due (none once the stream is exhausted).
  std::optional<admission> next;
  actors::request_services services;
  std::shared_ptr<source_log> log;
  runtime::time_point start{};
  std::map<std::uint64_t, caf::actor> in_flight;
  static inline const char* name = "trace_source";
};

using source_ptr = caf::stateful_actor<source_state>*;

void schedule_next(source_ptr self) {
  auto& st = self->state;
  if (!st.next)
    return;
  auto due = st.start + st.next->arrival;
  auto now = self->clock().now();
  self->delayed_send(self, due > now ? due - now : runtime::duration{0}, next_atom::value);
}

caf::behavior source_fn(source_ptr self, admission_stream pull, actors::request_services services,
                        std::shared_ptr<source_log> log) {
  auto& st = self->state;
  st.pull = std::move(pull);
  st.next = st.pull();
  st.services = std::move(services);
  st.services.sink = caf::actor_cast<caf::actor>(self);
  st.log = std::move(log);
  st.start = self->clock().now();
  schedule_next(self);
  return {
    [self](next_atom) {
      auto& st = self->state;
      auto now = self->clock().now();
      while (st.next && st.start + st.next->arrival <= now) {
        auto& a = *st.next;
        st.log->admitted_ids.push_back(a.spec.id);
        st.in_flight.emplace(a.spec.id,
                             actors::spawn_request(self, std::move(a.spec), st.services));
        ++st.log->admitted;
        st.next = st.pull();
      }
      schedule_next(self);
    },
    [self](actors::request_outcome& outcome) {
      auto& st = self->state;
      st.in_flight.erase(outcome.id);
      st.log->outcomes.push_back(std::move(outcome));
      if (!st.next && st.in_flight.empty())
        self->quit();
    },
  };
}

} // namespace

caf::actor spawn_trace_source(caf::actor_system& sys,
                              std::shared_ptr<const std::vector<admission>> workload,
                              actors::request_services services,
                              std::shared_ptr<source_log> log) {
  auto i = std::make_shared<std::size_t>(0);
  admission_stream next = [workload = std::move(workload), i]() -> std::optional<admission> {
    if (*i >= workload->size())
      return std::nullopt;
    return (*workload)[(*i)++];
  };
  return spawn_trace_source(sys, std::move(next), std::move(services), std::move(log));
}

caf::actor spawn_trace_source(caf::actor_system& sys, admission_stream next,
                              actors::request_services services,
                              std::shared_ptr<source_log> log) {
  return sys.spawn(source_fn, std::move(next), std::move(services), std::move(log));
}

} // namespace troupe::cluster::sim
