// engine_watch: the watchers of an engine hear of its end as monitors would, and a watch that
// ended (reset, moved from, or destroyed) leaves nothing behind.
#include "actors/request/engine_watch.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <vector>

using namespace troupe;
using namespace std::chrono_literals;

namespace {

caf::behavior idle(caf::event_based_actor*) {
  return {[](int) {}};
}

// The next message of `self` is a down_msg from `engine` with `reason`.
void expect_down(caf::scoped_actor& self, const caf::actor& engine, caf::exit_reason reason) {
  self->receive(
    [&](caf::down_msg& d) {
      CHECK(d.source == engine.address());
      CHECK(d.reason == caf::make_error(reason));
    },
    caf::after(10s) >> [] { FAIL("no down message"); });
}

void expect_nothing(caf::scoped_actor& self) {
  self->receive([](caf::down_msg&) { FAIL("a down message for an ended watch"); },
                caf::after(200ms) >> [] {});
}

} // namespace

TEST_CASE("engine_watch: every live watch hears of the engine's end, once, with its reason") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto registry = std::make_shared<actors::engine_watch>();
  auto engine = sys.spawn(idle);
  auto other = sys.spawn(idle);
  caf::scoped_actor a{sys}, b{sys}, c{sys};
  auto ta = registry->watch(engine.address(), a->address());
  auto tb = registry->watch(engine.address(), b->address());
  auto tc = registry->watch(engine.address(), c->address());
  auto on_other = registry->watch(other.address(), a->address());
  CHECK(ta.engine() == engine.address());
  CHECK(registry->size() == 4);
  tc.reset();
  CHECK_FALSE(tc);
  CHECK(registry->size() == 3);

  caf::anon_send_exit(engine, caf::exit_reason::kill);
  expect_down(a, engine, caf::exit_reason::kill);
  expect_down(b, engine, caf::exit_reason::kill);
  expect_nothing(c);
  expect_nothing(a); // once only
  CHECK(registry->size() == 1); // the other engine's watch
  // Ending a watch whose engine is gone is harmless.
  ta.reset();
  tb.reset();
  CHECK(registry->size() == 1);
  caf::anon_send_exit(other, caf::exit_reason::user_shutdown);
  expect_down(a, other, caf::exit_reason::user_shutdown);
  CHECK(registry->size() == 0);
}

TEST_CASE("engine_watch: a watch of an engine that already ended is answered at once") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto registry = std::make_shared<actors::engine_watch>();
  caf::scoped_actor self{sys};
  auto engine = sys.spawn(idle);
  self->monitor(engine);
  caf::anon_send_exit(engine, caf::exit_reason::kill);
  self->receive([](caf::down_msg&) {}); // it has ended
  auto t = registry->watch(engine.address(), self->address());
  expect_down(self, engine, caf::exit_reason::kill);
  CHECK(registry->size() == 0);
}

TEST_CASE("engine_watch: moved, destroyed and oldest-first ended tickets leave nothing") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto registry = std::make_shared<actors::engine_watch>();
  auto engine = sys.spawn(idle);
  caf::scoped_actor self{sys};
  std::vector<caf::actor> watchers;
  std::vector<actors::engine_watch::ticket> tickets;
  for (int i = 0; i < 2000; ++i) {
    watchers.push_back(sys.spawn(idle));
    tickets.push_back(registry->watch(engine.address(), watchers.back().address()));
  }
  CHECK(registry->size() == 2000);
  // A moved ticket is the one that counts: the moved-from one ends nothing.
  actors::engine_watch::ticket kept = std::move(tickets.back());
  tickets.pop_back();
  CHECK(registry->size() == 2000);
  CHECK(kept.engine() == engine.address());
  // Jobs end roughly oldest first: each end is an erase, not a scan.
  for (auto& t : tickets)
    t.reset();
  CHECK(registry->size() == 1);
  kept = actors::engine_watch::ticket{}; // reassigned: the watch ends
  CHECK(registry->size() == 0);
  {
    auto scoped = registry->watch(engine.address(), self->address());
    CHECK(registry->size() == 1);
  }
  CHECK(registry->size() == 0);
  caf::anon_send_exit(engine, caf::exit_reason::kill);
  expect_nothing(self);
  for (auto& w : watchers)
    caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
}
