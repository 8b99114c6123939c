// prefill_lb's record of which instance keeps which prefix's window state (prefill_kept), and
// the keeper it names with a route (docs/serve.md, "Window-state pulls").
#include "actors/lb/prefill_lb.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <thread>

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

/// An engine that only has to exist: the balancer names it, nobody sends it work here.
prefill_engine_actor::behavior_type idle_engine(prefill_engine_actor::pointer) {
  return {
    [](const prefill_job& j) { return prefill_done{j.request}; },
    [](engine_stats_atom) { return engine_stats{}; },
    [](drain_atom, runtime::duration) { return std::uint64_t{0}; },
    [](cancel_atom, std::uint64_t) {},
    [](const kept_state_get&) { return kept_state{}; },
  };
}

} // namespace

TEST_CASE("the prefill balancer names the instance that last kept a prefix's window state, never "
          "the one it routes to, and forgets the oldest keys and gone instances") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  prefill_lb_params p;
  p.balancer.bucket_bounds = {200};  // instance 0 takes short prompts, instance 1 long ones
  p.kept_records = 2;
  auto lb = spawn_prefill_lb(sys, p);
  auto e0 = sys.spawn(idle_engine);
  auto e1 = sys.spawn(idle_engine);
  self->send(lb, add_instance_atom::value, instance_id{0}, e0);
  self->send(lb, add_instance_atom::value, instance_id{1}, e1);
  auto route = [&](std::uint64_t uncached, block_key kept) {
    prefill_assignment a;
    self->request(lb, 10s, prefill_route{7, uncached, kept})
      .receive([&](prefill_assignment& x) { a = std::move(x); },
               [&](const caf::error& e) { FAIL(caf::to_string(e)); });
    self->send(lb, prefill_release{a.instance, uncached});
    return a;
  };
  const block_key k1{1, 1}, k2{2, 2}, k3{3, 3};

  self->send(lb, prefill_kept{1, k1});
  auto a = route(50, k1);
  CHECK(a.instance == 0);
  CHECK(a.keeper == e1);
  auto b = route(500, k1);  // routed to the keeper itself: nothing to pull
  CHECK(b.instance == 1);
  CHECK_FALSE(b.keeper);
  CHECK_FALSE(route(50, k2).keeper);  // nobody kept it
  CHECK_FALSE(route(50, block_key{}).keeper);  // no cached prefix

  // The newest report wins.
  self->send(lb, prefill_kept{0, k1});
  CHECK(route(500, k1).keeper == e0);
  CHECK_FALSE(route(50, k1).keeper);

  // Two records: two newer keys push k1 out (its two reports counted as two).
  self->send(lb, prefill_kept{1, k2});
  self->send(lb, prefill_kept{1, k3});
  CHECK_FALSE(route(500, k1).keeper);
  CHECK(route(50, k3).keeper == e1);

  // An instance that is gone is named no more.
  self->send_exit(e1, caf::exit_reason::user_shutdown);
  bool forgotten = false;
  for (int i = 0; i < 200 && !forgotten; ++i) {
    forgotten = !route(50, k3).keeper;
    if (!forgotten)
      std::this_thread::sleep_for(5ms);
  }
  CHECK(forgotten);
  self->send_exit(lb, caf::exit_reason::user_shutdown);
  self->send_exit(e0, caf::exit_reason::user_shutdown);
}

TEST_CASE("a decode instance's report names the handle to ask; the balancer names it for any "
          "route, the newest incarnation's, and forgets it once it is down") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto lb = spawn_prefill_lb(sys, prefill_lb_params{});
  auto e0 = sys.spawn(idle_engine);
  self->send(lb, add_instance_atom::value, instance_id{0}, e0);
  // Stand-ins for decode instance 0's engine, before and after a restart: not prefill member
  // 0, which every route here chooses.
  auto d1 = sys.spawn(idle_engine);
  auto d2 = sys.spawn(idle_engine);
  auto keeper_of = [&](block_key kept) {
    prefill_assignment a;
    self->request(lb, 10s, prefill_route{7, 50, kept})
      .receive([&](prefill_assignment& x) { a = std::move(x); },
               [&](const caf::error& e) { FAIL(caf::to_string(e)); });
    self->send(lb, prefill_release{a.instance, 50});
    CHECK(a.instance == 0);
    return a.keeper;
  };
  const block_key k1{1, 1}, k2{2, 2};
  self->send(lb, prefill_kept{0, k1, caf::actor_cast<caf::strong_actor_ptr>(d1)});
  CHECK(keeper_of(k1) == d1);
  // Restarted: the new engine's reports name it, for every key the instance kept.
  self->send(lb, prefill_kept{0, k2, caf::actor_cast<caf::strong_actor_ptr>(d2)});
  CHECK(keeper_of(k2) == d2);
  CHECK(keeper_of(k1) == d2);
  // The old incarnation's end changes nothing; the new one's forgets the instance.
  self->send_exit(d1, caf::exit_reason::user_shutdown);
  std::this_thread::sleep_for(20ms);
  CHECK(keeper_of(k2) == d2);
  self->send_exit(d2, caf::exit_reason::user_shutdown);
  bool forgotten = false;
  for (int i = 0; i < 200 && !forgotten; ++i) {
    forgotten = !keeper_of(k2);
    if (!forgotten)
      std::this_thread::sleep_for(5ms);
  }
  CHECK(forgotten);
  CHECK_FALSE(keeper_of(k1));
  self->send_exit(lb, caf::exit_reason::user_shutdown);
  self->send_exit(e0, caf::exit_reason::user_shutdown);
}
