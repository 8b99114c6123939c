// A scripted failure scenario on the deterministic scheduler: the same seed gives the same
// event log, byte for byte; another seed gives another; an added actor leaves the others'
// random streams alone.
#include "runtime/supervisor.hpp"
#include "runtime/world.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>
#include <xxhash.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace troupe::runtime;
using namespace std::chrono_literals;

namespace {

using crash_atom = caf::atom_constant<caf::atom("crash")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;

struct scenario_log {
  std::vector<std::string> lines;
  void add(time_point t, const std::string& what) {
    lines.push_back(std::to_string(t.time_since_epoch().count()) + " " + what);
  }
  std::uint64_t hash() const {
    XXH3_state_t* st = XXH3_createState();
    XXH3_64bits_reset(st);
    for (auto& l : lines)
      XXH3_64bits_update(st, l.data(), l.size() + 1); // include the terminating NUL
    auto h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
  }
};

/// A worker that ticks at random intervals and crashes after a random lifetime, both drawn
/// from its own stream (split by name and incarnation).
caf::behavior worker(caf::event_based_actor* self, std::string id, rng r,
                     std::shared_ptr<scenario_log> log) {
  auto lifetime = from_seconds(r.exponential(1.0 / 40.0));
  self->delayed_send(self, lifetime, crash_atom::value);
  self->delayed_send(self, from_seconds(r.exponential(1.0 / 3.0)), tick_atom::value);
  auto state = std::make_shared<rng>(r);
  return {
    [self, id, state, log](tick_atom) {
      log->add(self->clock().now(), "tick " + id + " " + std::to_string(state->below(1000)));
      self->delayed_send(self, from_seconds(state->exponential(1.0 / 3.0)), tick_atom::value);
    },
    [self](crash_atom) { self->quit(caf::sec::runtime_error); },
  };
}

/// Runs 10 virtual minutes of `workers` under a one_for_one supervisor with a restart delay;
/// returns the log of ticks and supervisor events.
std::shared_ptr<scenario_log> run_scenario(std::uint64_t seed, std::vector<std::string> workers) {
  world w{world_options{world_mode::sim, seed, 0, false, nullptr}};
  auto log = std::make_shared<scenario_log>();
  auto incarnations = std::make_shared<std::map<std::string, std::uint64_t>>();
  supervisor_config cfg{"scenario", {strategy::one_for_one, 1000, 60s, 2s, 1.5, 30s}, {}};
  auto root = w.random().split("workers");
  for (auto& id : workers) {
    child_spec spec;
    spec.id = id;
    spec.start = [id, root, log, incarnations](caf::local_actor* self) {
      auto n = (*incarnations)[id]++;
      return self->spawn(worker, id, root.split(id, n), log);
    };
    cfg.children.push_back(std::move(spec));
  }
  auto sup = spawn_supervisor(w.system(), std::move(cfg));
  auto rec = w.system().spawn([log](caf::event_based_actor*) -> caf::behavior {
    return {[log](const supervisor_event& ev) {
      log->add(time_point{duration{ev.at_ns}},
               to_string(ev.kind) + " " + ev.child + " " + ev.reason);
    }};
  });
  caf::anon_send(sup, subscribe_atom::value, rec);
  w.driver().run_for(10min);
  return log;
}

std::vector<std::string> lines_about(const scenario_log& log, const std::string& id) {
  std::vector<std::string> out;
  for (auto& l : log.lines)
    if (l.find(" " + id + " ") != std::string::npos || l.ends_with(" " + id))
      out.push_back(l);
  return out;
}

const std::vector<std::string> eight{"a", "b", "c", "d", "e", "f", "g", "h"};

} // namespace

TEST_CASE("the same seed gives the same event log") {
  auto first = run_scenario(7, eight);
  auto second = run_scenario(7, eight);
  // The scenario is not trivial: workers tick, crash and are restarted many times.
  auto restarts = std::count_if(first->lines.begin(), first->lines.end(),
                                [](auto& l) { return l.find(" restarted ") != std::string::npos; });
  CHECK(restarts > 50);
  CHECK(first->lines.size() > 1000);
  CHECK(first->hash() == second->hash());
  CHECK(first->lines == second->lines);
}

TEST_CASE("a different seed gives a different event log") {
  CHECK(run_scenario(7, eight)->hash() != run_scenario(8, eight)->hash());
}

TEST_CASE("adding an actor does not change another actor's random stream") {
  auto without = run_scenario(7, eight);
  auto extended = eight;
  extended.insert(extended.begin(), "extra");
  auto with = run_scenario(7, extended);
  CHECK(!lines_about(*with, "extra").empty());
  for (auto& id : eight)
    CHECK(lines_about(*without, id) == lines_about(*with, id));
}
