// The virtual-time driver: ordering, stop reasons, deadlines, stop requests and progress.
#include "runtime/sim_driver.hpp"
#include "sim_fixture.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

using namespace troupe;
using namespace troupe::runtime;
using namespace std::chrono_literals;

namespace {

using tick_atom = caf::atom_constant<caf::atom("tick")>;
using stop_atom = caf::atom_constant<caf::atom("stopnow")>;

/// What an actor saw: a label and the virtual instant it saw it.
using sightings = std::shared_ptr<std::vector<std::pair<std::string, time_point>>>;

sightings make_sightings() {
  return std::make_shared<std::vector<std::pair<std::string, time_point>>>();
}

/// Sends itself each (label, delay) at start and records the label and the clock on arrival.
caf::behavior timers(caf::event_based_actor* self,
                     std::vector<std::pair<std::string, duration>> plan, sightings seen) {
  for (auto& [label, delay] : plan)
    self->delayed_send(self, delay, label);
  return {
    [self, seen](const std::string& label) { seen->emplace_back(label, self->clock().now()); },
  };
}

/// Ticks every `period` for ever, counting its ticks.
caf::behavior ticker(caf::event_based_actor* self, duration period,
                     std::shared_ptr<std::uint64_t> ticks) {
  self->delayed_send(self, period, tick_atom::value);
  return {
    [self, period, ticks](tick_atom) {
      ++*ticks;
      self->delayed_send(self, period, tick_atom::value);
    },
  };
}

std::vector<std::string> labels(const sightings& seen) {
  std::vector<std::string> out;
  for (auto& s : *seen)
    out.push_back(s.first);
  return out;
}

struct driven : test::sim_fixture {
  sim_driver& driver = world.driver();
  std::vector<caf::actor> keep; // actors nobody references are terminated

  caf::actor spawn_timers(std::vector<std::pair<std::string, duration>> plan, sightings seen) {
    keep.push_back(sys.spawn(timers, std::move(plan), seen));
    return keep.back();
  }

  std::shared_ptr<std::uint64_t> spawn_ticker(duration period) {
    auto ticks = std::make_shared<std::uint64_t>(0);
    keep.push_back(sys.spawn(ticker, period, ticks));
    return ticks;
  }
};

} // namespace

TEST_CASE_FIXTURE(driven, "delayed messages arrive in virtual time order with the clock at their due time") {
  auto seen = make_sightings();
  spawn_timers({{"c", 3s}, {"a", 1s}, {"b", 2s}, {"a2", 1s}}, seen);
  CHECK(run() == stop_reason::quiescent);
  REQUIRE(seen->size() == 4);
  // Equal due times keep their send order.
  CHECK(labels(seen) == std::vector<std::string>{"a", "a2", "b", "c"});
  CHECK((*seen)[0].second - start == 1s);
  CHECK((*seen)[1].second - start == 1s);
  CHECK((*seen)[2].second - start == 2s);
  CHECK((*seen)[3].second - start == 3s);
  CHECK(world.now() - start == 3s);
}

TEST_CASE_FIXTURE(driven, "run returns quiescent and events counts each handled message and fired timer") {
  auto seen = make_sightings();
  auto a = spawn_timers({}, seen);
  CHECK(run() == stop_reason::quiescent);
  auto before = driver.events();
  CHECK(before > 0); // the actor's start ran as an event

  caf::anon_send(a, std::string{"now"});
  CHECK(run() == stop_reason::quiescent);
  CHECK(driver.events() - before == 1);

  before = driver.events();
  caf::delayed_anon_send(a, 5s, std::string{"later"});
  CHECK(run() == stop_reason::quiescent);
  CHECK(driver.events() - before == 2); // the timer and the message it delivers
  CHECK(labels(seen) == std::vector<std::string>{"now", "later"});

  before = driver.events();
  CHECK(run() == stop_reason::quiescent); // nothing left: no event
  CHECK(driver.events() == before);
}

TEST_CASE_FIXTURE(driven, "run_until fires a timer due exactly at the deadline, stops before a later one, and can go on") {
  auto seen = make_sightings();
  spawn_timers({{"one", 1s}, {"two", 2s}, {"three", 3s}}, seen);
  CHECK(driver.run_until(start + 2s) == stop_reason::deadline);
  CHECK(world.now() == start + 2s);
  CHECK(labels(seen) == std::vector<std::string>{"one", "two"});

  CHECK(driver.run_until(start + 2500ms) == stop_reason::deadline);
  CHECK(world.now() == start + 2500ms);
  CHECK(seen->size() == 2);

  CHECK(driver.run_until(start + 10s) == stop_reason::quiescent);
  CHECK(labels(seen) == std::vector<std::string>{"one", "two", "three"});
  CHECK((*seen)[2].second == start + 3s);
  // Quiescent before the deadline: the clock still stands at the deadline.
  CHECK(world.now() == start + 10s);
}

TEST_CASE_FIXTURE(driven, "run_until on an idle world returns quiescent with the clock at the deadline") {
  CHECK(driver.run_until(start + 1h) == stop_reason::quiescent);
  CHECK(world.now() == start + 1h);
  CHECK(driver.elapsed() == 1h);
  CHECK(run_for(30s) == stop_reason::quiescent);
  CHECK(world.now() == start + 1h + 30s);
}

TEST_CASE_FIXTURE(driven, "request_stop from inside an actor makes run return stopped, and the next run goes on") {
  auto seen = make_sightings();
  auto* drv = &driver;
  keep.push_back(sys.spawn([seen, drv](caf::event_based_actor* self) -> caf::behavior {
    self->delayed_send(self, 1s, std::string{"before"});
    self->delayed_send(self, 2s, stop_atom::value);
    self->delayed_send(self, 3s, std::string{"after"});
    return {
      [self, seen](const std::string& label) { seen->emplace_back(label, self->clock().now()); },
      [self, seen, drv](stop_atom) {
        seen->emplace_back("stop", self->clock().now());
        drv->request_stop();
      },
    };
  }));
  CHECK(run() == stop_reason::stopped);
  CHECK(labels(seen) == std::vector<std::string>{"before", "stop"});
  CHECK(world.now() == start + 2s);
  // The request was consumed by that return.
  CHECK(run() == stop_reason::quiescent);
  CHECK(labels(seen) == std::vector<std::string>{"before", "stop", "after"});
}

TEST_CASE_FIXTURE(driven, "a periodic actor never becomes quiescent but run_until bounds it") {
  auto ticks = spawn_ticker(1s);
  CHECK(driver.run_until(start + 1h) == stop_reason::deadline);
  CHECK(*ticks == 3600);
  CHECK(world.now() == start + 1h);
  CHECK(run_for(10s) == stop_reason::deadline);
  CHECK(*ticks == 3610);
}

TEST_CASE_FIXTURE(driven, "the progress callback is called at each interval mark with increasing elapsed") {
  auto ticks = spawn_ticker(1s);
  std::vector<sim_progress> calls;
  driver.on_progress(10s, [&calls](const sim_progress& p) { calls.push_back(p); });
  CHECK(driver.run_until(start + 35s) == stop_reason::deadline);
  CHECK(*ticks == 35);
  // One call per 10 s mark passed (10, 20, 30), then one when the run returns.
  REQUIRE(calls.size() == 4);
  for (std::size_t i = 0; i + 1 < calls.size(); ++i) {
    // Called with the clock on the mark: the interval has passed since the last call.
    CHECK(calls[i].elapsed == 10s * static_cast<int>(i + 1));
    CHECK(calls[i + 1].elapsed > calls[i].elapsed);
    CHECK(calls[i + 1].events > calls[i].events);
  }
  CHECK(calls.back().elapsed == 35s);
  CHECK(calls.back().events == driver.events());
  REQUIRE(calls.back().deadline.has_value());
  CHECK(*calls.back().deadline == 35s);
}

TEST_CASE_FIXTURE(driven, "a jump over several interval marks is reported once, at the last mark passed") {
  auto seen = make_sightings();
  spawn_timers({{"late", 95s}}, seen);
  std::vector<duration> calls;
  driver.on_progress(10s, [&calls](const sim_progress& p) { calls.push_back(p.elapsed); });
  CHECK(run() == stop_reason::quiescent);
  // Reported at 90 s on the way to the timer at 95 s, then when run returns.
  CHECK(calls == std::vector<duration>{90s, 95s});
  REQUIRE(seen->size() == 1);
  CHECK((*seen)[0].second == start + 95s);
}

TEST_CASE_FIXTURE(driven, "an empty progress callback removes the earlier one") {
  spawn_ticker(1s);
  int calls = 0;
  driver.on_progress(1s, [&calls](const sim_progress&) { ++calls; });
  run_for(5s);
  CHECK(calls > 0);
  auto seen = calls;
  driver.on_progress(1s, {});
  run_for(5s);
  CHECK(calls == seen);
}

TEST_CASE_FIXTURE(driven, "a virtual day of one-second ticks takes no wall time") {
  auto ticks = spawn_ticker(1s);
  auto wall0 = std::chrono::steady_clock::now();
  CHECK(driver.run_until(start + 24h) == stop_reason::deadline);
  auto wall = std::chrono::steady_clock::now() - wall0;
  CHECK(*ticks == 86'400);
  CHECK(driver.elapsed() == 24h);
  CHECK(driver.events() >= 2 * 86'400);
  // ~170k events at ~1M/s is well under a second; a driver that waited in real time would
  // take a day. The bound is loose so that a slow or loaded machine cannot make it flake.
  CHECK(wall < 10s);
}

TEST_CASE("a sim world with a periodic actor still running is destroyed without running it") {
  auto ticks = std::make_shared<std::uint64_t>(0);
  {
    world w{world_options{world_mode::sim, 1, 0, false, {}}};
    auto t = w.system().spawn(ticker, duration{1s}, ticks);
    CHECK(w.driver().run_for(10s) == stop_reason::deadline);
    CHECK(*ticks == 10);
  } // must return: the pending timer is dropped, not fired
  CHECK(*ticks == 10);
}

TEST_CASE_FIXTURE(driven, "a profile counts every event by actor and message type and changes nothing") {
  driver.set_profiling(true);
  auto ticks = spawn_ticker(1s);
  auto seen = make_sightings();
  auto a = spawn_timers({}, seen);
  auto before = driver.events();
  caf::anon_send(a, std::string{"now"});
  CHECK(driver.run_until(world.now() + 10s) == stop_reason::deadline);
  CHECK(*ticks == 10);
  auto rows = driver.profile();
  std::uint64_t counted = 0, ticked = 0, timers = 0, strings = 0;
  for (auto& r : rows) {
    CAPTURE(r.actor);
    CAPTURE(r.message);
    counted += r.count;
    CHECK(r.wall_s >= 0);
    if (r.message == "(tick)")
      ticked += r.count;
    if (r.actor == "clock" && r.message.starts_with("delayed message for "))
      timers += r.count;
    if (r.message == "@str") // CAF's name of std::string
      strings += r.count;
  }
  CHECK(counted == driver.events() - before); // the actors' start events included
  CHECK(ticked == 10);
  CHECK(timers == 10);
  CHECK(strings == 1);
  // Most frequent first.
  for (std::size_t i = 1; i < rows.size(); ++i)
    CHECK(rows[i - 1].count >= rows[i].count);
}
