// Supervision semantics on the deterministic scheduler, in virtual time.
#include "runtime/errors.hpp"
#include "runtime/supervisor.hpp"
#include "sim_fixture.hpp"

#include <doctest/doctest.h>

#include <algorithm>

using namespace troupe;
using namespace troupe::runtime;
using namespace std::chrono_literals;
using test::journal;

namespace {

using crash_atom = caf::atom_constant<caf::atom("crash")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;

std::string reason_text(caf::actor_system& sys, const caf::error& e) {
  return e ? sys.render(e) : "normal";
}

/// A worker child. Without `drain` it dies at once on user_shutdown; with it, it traps the
/// exit and finishes its in-flight work `drain` later.
caf::behavior worker(caf::event_based_actor* self, std::string id, journal j,
                     std::optional<duration> drain) {
  j->push_back("start:" + id);
  self->attach_functor([j, id, sys = &self->system()](const caf::error& reason) {
    j->push_back("stop:" + id + ":" + reason_text(*sys, reason));
  });
  if (drain) {
    self->set_exit_handler([self, id, j, d = *drain](caf::exit_msg& msg) {
      if (msg.reason == caf::exit_reason::user_shutdown) {
        j->push_back("draining:" + id);
        self->delayed_send(self, d, finish_atom::value);
      } else {
        self->quit(msg.reason);
      }
    });
  }
  return {
    [self](crash_atom) { self->quit(caf::sec::runtime_error); },
    [self](finish_atom) { self->quit(); },
  };
}

child_spec worker_spec(std::string id, journal j,
                       restart_policy policy = restart_policy::permanent,
                       duration shutdown = 5s, std::optional<duration> drain = std::nullopt) {
  child_spec spec;
  spec.id = id;
  spec.restart = policy;
  spec.shutdown = shutdown;
  spec.start = [id, j, drain](caf::local_actor* self) { return self->spawn(worker, id, j, drain); };
  return spec;
}

/// Collects supervisor events as "t=<seconds> <kind> <child> <reason>".
caf::behavior recorder(caf::event_based_actor* self, journal events, time_point origin) {
  return {
    [events, origin](const supervisor_event& ev) {
      events->push_back(std::to_string(to_seconds(duration{ev.at_ns} - origin.time_since_epoch()))
                        + " " + to_string(ev.kind) + " " + ev.child + " " + ev.reason);
    },
  };
}

struct supervised : test::sim_fixture {
  journal j = test::make_journal();
  journal events = test::make_journal();
  caf::actor sup;
  std::vector<caf::actor> watchers; // an actor nobody references is gone

  void start(supervisor_config cfg) {
    sup = spawn_supervisor(sys, std::move(cfg));
    auto rec = sys.spawn(recorder, events, world.now());
    caf::anon_send(sup, subscribe_atom::value, rec);
    run();
    j->clear(); // only what happens after the initial start matters to most tests
  }

  caf::actor child(const std::string& id) {
    auto rows = ask<std::vector<child_info>>(sup, which_children_atom::value);
    run();
    REQUIRE(rows.value->has_value());
    for (auto& row : **rows.value)
      if (row.id == id)
        return row.handle;
    return {};
  }

  std::vector<std::string> child_ids() {
    auto rows = ask<std::vector<child_info>>(sup, which_children_atom::value);
    run();
    std::vector<std::string> ids;
    for (auto& row : **rows.value)
      ids.push_back(row.id);
    return ids;
  }

  /// The exit reason of `who`, once it has exited (watched from a monitoring actor).
  std::shared_ptr<std::optional<caf::error>> watch(const caf::actor& who) {
    auto out = std::make_shared<std::optional<caf::error>>();
    watchers.push_back(sys.spawn([who, out](caf::event_based_actor* self) {
      self->monitor(who);
      self->set_down_handler([out](caf::down_msg& msg) { *out = msg.reason; });
      return caf::behavior{[](int) {}};
    }));
    return out;
  }

  /// Virtual seconds (since start) of the first event containing `text`, or -1.
  double event_time(const std::string& text) {
    for (auto& e : *events)
      if (e.find(text) != std::string::npos)
        return std::stod(e);
    return -1;
  }
};

supervisor_config three(strategy how, journal j) {
  return {"sup", {how, 3, 5s}, {worker_spec("a", j), worker_spec("b", j), worker_spec("c", j)}};
}

} // namespace

TEST_CASE_FIXTURE(supervised, "children start in the order of their specs") {
  auto jj = test::make_journal();
  sup = spawn_supervisor(sys, three(strategy::one_for_one, jj));
  run();
  CHECK(*jj == std::vector<std::string>{"start:a", "start:b", "start:c"});
}

TEST_CASE_FIXTURE(supervised, "one_for_one restarts only the failed child") {
  start(three(strategy::one_for_one, j));
  auto a = child("a");
  auto c = child("c");
  caf::anon_send(child("b"), crash_atom::value);
  run();
  REQUIRE(j->size() == 2);
  CHECK((*j)[0].starts_with("stop:b:"));
  CHECK((*j)[0].find("runtime_error") != std::string::npos);
  CHECK((*j)[1] == "start:b");
  CHECK(child("a") == a);
  CHECK(child("c") == c);
}

TEST_CASE_FIXTURE(supervised, "one_for_all stops the others in reverse order and restarts all in start order") {
  start(three(strategy::one_for_all, j));
  caf::anon_send(child("b"), crash_atom::value);
  run();
  REQUIRE(j->size() == 6);
  CHECK((*j)[0].starts_with("stop:b:"));
  CHECK((*j)[1] == "stop:c:" + reason_text(sys, caf::exit_reason::user_shutdown));
  CHECK((*j)[2] == "stop:a:" + reason_text(sys, caf::exit_reason::user_shutdown));
  CHECK(std::vector<std::string>(j->begin() + 3, j->end())
        == std::vector<std::string>{"start:a", "start:b", "start:c"});
}

TEST_CASE_FIXTURE(supervised, "rest_for_one restarts the failed child and those started after it") {
  start({"sup",
         {strategy::rest_for_one, 3, 5s},
         {worker_spec("a", j), worker_spec("b", j), worker_spec("c", j), worker_spec("d", j)}});
  auto a = child("a");
  caf::anon_send(child("b"), crash_atom::value);
  run();
  REQUIRE(j->size() == 6);
  CHECK((*j)[0].starts_with("stop:b:"));
  CHECK((*j)[1].starts_with("stop:d:"));
  CHECK((*j)[2].starts_with("stop:c:"));
  CHECK(std::vector<std::string>(j->begin() + 3, j->end())
        == std::vector<std::string>{"start:b", "start:c", "start:d"});
  CHECK(child("a") == a);
}

TEST_CASE_FIXTURE(supervised, "a transient child is not restarted after a normal exit") {
  start({"sup", {}, {worker_spec("t", j, restart_policy::transient)}});
  caf::anon_send(child("t"), finish_atom::value);
  run();
  CHECK(*j == std::vector<std::string>{"stop:t:normal"});
  CHECK(!child("t"));
  CHECK(child_ids() == std::vector<std::string>{"t"});
}

TEST_CASE_FIXTURE(supervised, "a transient child is restarted after an abnormal exit") {
  start({"sup", {}, {worker_spec("t", j, restart_policy::transient)}});
  caf::anon_send(child("t"), crash_atom::value);
  run();
  REQUIRE(j->size() == 2);
  CHECK((*j)[1] == "start:t");
}

TEST_CASE_FIXTURE(supervised, "a temporary child is never restarted and is forgotten") {
  start({"sup", {}, {worker_spec("x", j), worker_spec("tmp", j, restart_policy::temporary)}});
  caf::anon_send(child("tmp"), crash_atom::value);
  run();
  REQUIRE(j->size() == 1);
  CHECK((*j)[0].starts_with("stop:tmp:"));
  CHECK(child_ids() == std::vector<std::string>{"x"});
}

TEST_CASE_FIXTURE(supervised, "exceeding restart intensity escalates and stops children in reverse start order") {
  start({"sup",
         {strategy::one_for_one, 2, 10s},
         {worker_spec("a", j), worker_spec("b", j), worker_spec("c", j)}});
  auto down = watch(sup);
  run();
  for (int i = 0; i < 3; ++i) {
    caf::anon_send(child("b"), crash_atom::value);
    run_for(1s);
  }
  run();
  REQUIRE(down->has_value());
  CHECK(is(**down, errc::restart_intensity_exceeded));
  // Two restarts were allowed; the third failure stops a and c, c first.
  std::vector<std::string> tail(j->end() - 2, j->end());
  CHECK(tail[0].starts_with("stop:c:"));
  CHECK(tail[1].starts_with("stop:a:"));
  CHECK(std::count_if(j->begin(), j->end(), [](auto& s) { return s == "start:b"; }) == 2);
  CHECK(std::any_of(events->begin(), events->end(),
                    [](auto& e) { return e.find(" escalated ") != std::string::npos; }));
}

TEST_CASE_FIXTURE(supervised, "restarts spread wider than the period do not escalate") {
  start({"sup", {strategy::one_for_one, 2, 10s}, {worker_spec("a", j)}});
  auto down = watch(sup);
  run();
  for (int i = 0; i < 6; ++i) {
    caf::anon_send(child("a"), crash_atom::value);
    run_for(6s);
  }
  CHECK(!down->has_value());
  CHECK(std::count(j->begin(), j->end(), "start:a") == 6);
}

TEST_CASE_FIXTURE(supervised, "a child that traps the shutdown drains within its grace and exits normally") {
  start({"sup", {}, {worker_spec("d", j, restart_policy::permanent, 60s, 20s)}});
  auto down = watch(sup);
  auto t0 = seconds();
  caf::anon_send_exit(sup, caf::exit_reason::user_shutdown);
  run();
  CHECK(*j == std::vector<std::string>{"draining:d", "stop:d:normal"});
  CHECK(event_time(" exited d normal") - t0 == doctest::Approx(20.0));
  REQUIRE(down->has_value());
  CHECK(**down == caf::exit_reason::user_shutdown);
}

TEST_CASE_FIXTURE(supervised, "a child that does not finish within its grace is killed at grace end") {
  start({"sup", {}, {worker_spec("d", j, restart_policy::permanent, 60s, 90s)}});
  auto t0 = seconds();
  caf::anon_send_exit(sup, caf::exit_reason::user_shutdown);
  run();
  REQUIRE(j->size() == 2);
  CHECK((*j)[0] == "draining:d");
  CHECK((*j)[1] == "stop:d:" + reason_text(sys, caf::exit_reason::kill));
  // Killed at the end of the 60 s grace; its 90 s drain timer still fires into a dead actor.
  CHECK(event_time(" exited d") - t0 == doctest::Approx(60.0));
}

TEST_CASE_FIXTURE(supervised, "shutdown stops children in reverse start order, each within its grace") {
  start({"sup",
         {},
         {worker_spec("a", j, restart_policy::permanent, 30s, 5s),
          worker_spec("b", j, restart_policy::permanent, 30s, 5s)}});
  caf::anon_send_exit(sup, caf::exit_reason::user_shutdown);
  run();
  CHECK(*j == std::vector<std::string>{"draining:b", "stop:b:normal", "draining:a",
                                       "stop:a:normal"});
}

TEST_CASE_FIXTURE(supervised, "restart delay grows by the backoff factor in virtual time") {
  start({"sup", {strategy::one_for_one, 10, 60s, 1s, 2.0, 3s}, {worker_spec("a", j)}});
  std::vector<double> gaps;
  for (int i = 0; i < 4; ++i) {
    auto t0 = seconds();
    caf::anon_send(child("a"), crash_atom::value);
    run();
    gaps.push_back(seconds() - t0);
  }
  REQUIRE(gaps.size() == 4);
  CHECK(gaps[0] == doctest::Approx(1.0));
  CHECK(gaps[1] == doctest::Approx(2.0));
  CHECK(gaps[2] == doctest::Approx(3.0)); // capped at max_restart_delay
  CHECK(gaps[3] == doctest::Approx(3.0));
}

TEST_CASE_FIXTURE(supervised, "a parent sees a nested supervisor's escalation and restarts it") {
  supervisor_config inner{"inner", {strategy::one_for_one, 0, 10s}, {worker_spec("w", j)}};
  start({"outer", {strategy::one_for_one, 3, 10s}, {supervisor_child(inner)}});
  auto inner_sup = child("inner");
  REQUIRE(inner_sup);
  auto rows = ask<std::vector<child_info>>(inner_sup, which_children_atom::value);
  run();
  REQUIRE(rows.value->has_value());
  caf::anon_send((**rows.value)[0].handle, crash_atom::value);
  run();
  auto exited = std::find_if(events->begin(), events->end(), [](auto& e) {
    return e.find(" exited inner ") != std::string::npos;
  });
  REQUIRE(exited != events->end());
  CHECK(exited->find("restart_intensity_exceeded") != std::string::npos);
  CHECK(events->back().find(" restarted inner") != std::string::npos);
  CHECK(j->back() == "start:w");
}

TEST_CASE_FIXTURE(supervised, "start_child adds a child and stop_child removes it within its grace") {
  start({"sup", {}, {worker_spec("a", j)}});
  auto added = ask<caf::actor>(sup, start_child_atom::value,
                               worker_spec("n", j, restart_policy::permanent, 10s, 3s));
  run();
  REQUIRE(added.value->has_value());
  CHECK(child_ids() == std::vector<std::string>{"a", "n"});
  auto dup = ask<caf::actor>(sup, start_child_atom::value, worker_spec("n", j));
  run();
  CHECK(is(*dup.error, errc::duplicate_child));
  sys.spawn([s = sup](caf::event_based_actor* self) {
    self->send(s, stop_child_atom::value, std::string{"n"});
  });
  run();
  CHECK(child_ids() == std::vector<std::string>{"a"});
  CHECK(j->back() == "stop:n:normal");
}
