// Drain of a decode instance on the deterministic scheduler: the leave notice (the fault
// injector's drain order) has decode_lb exclude the instance at once; it serves for its grace,
// then forwards every unfinished request with its KV to another decode instance in one step
// (no re-prefill; the tokens generated there are counted exactly) and is stopped through the
// pools supervisor (removed, not restarted). An instance whose work ends within the grace
// leaves at that moment, forwarding nothing. The fixture's costs: prefill 1 µs per token, a
// decode step 10 ms, 1 GB/s links. With two decode instances, instance 0 serves short
// requests and instance 1 long ones (decode_balancer), so short requests start on 0.
#include "serving_fixture.hpp"

#include <doctest/doctest.h>

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;
using testing::cluster_shape;

namespace {

using serving = testing::serving_cluster;

cluster_shape two_decode() {
  cluster_shape s;
  s.prefill_instances = 1;
  s.decode_instances = 2;
  s.restart_delay = 10s;
  return s;
}

bool has_child(serving& s, const std::string& id) {
  for (auto& c : s.children())
    if (c.id == id)
      return true;
  return false;
}

/// Requests routed by the prefill balancer (every prefill job there was).
std::uint64_t prefill_routed(serving& s) {
  auto c = testing::ask<lb_counters>(s.sys, s.plb, lb_stats_atom::value);
  s.run();
  REQUIRE(c->has_value());
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < (*c)->names.size(); ++i)
    if ((*c)->names[i].rfind("routed", 0) == 0)
      n += (*c)->values[i];
  return n;
}

/// A decode_lb counter, asked without moving the clock.
std::uint64_t decode_counter(serving& s, const std::string& name) {
  auto c = testing::ask<lb_counters>(s.sys, s.dlb, lb_stats_atom::value);
  s.world.driver().run_for(0s);
  REQUIRE(c->has_value());
  for (std::size_t i = 0; i < (*c)->names.size(); ++i)
    if ((*c)->names[i] == name)
      return (*c)->values[i];
  return 0;
}

} // namespace

TEST_CASE("drain: requests that finish within the grace are not forwarded; it leaves when empty") {
  serving s{two_decode()};
  s.subscribe();
  s.submit(1, 1024, 101);
  // 100 decode steps from ~1.2 ms: done at ~1001 ms, well within a 60 s grace from 500 ms.
  s.drain(500ms, 0, 60s);
  s.run();
  auto& o = s.outcomes->at(1);
  CHECK(o.completed);
  CHECK(o.decode_instance == 0);
  CHECK(o.forwards == 0);
  CHECK(o.reroutes == 0);
  CHECK(o.delivered_tokens == 101);
  REQUIRE(s.faults->size() == 1);
  CHECK(s.faults->at(0).injected);
  REQUIRE(s.faults->at(0).forwarded);
  CHECK(s.faults->at(0).forwarded->forwarded == 0);
  // Stopped (removed from the pools, not restarted) when its last request ended, not at
  // the end of the grace.
  CHECK(!has_child(s, "decode/0"));
  CHECK(has_child(s, "decode/1"));
  runtime::time_point exited{};
  for (auto& e : *s.events)
    if (e.child == "decode/0" && e.kind == runtime::supervisor_event_kind::exited)
      exited = runtime::time_point{runtime::duration{e.at_ns}};
  CHECK(s.ms(exited) == doctest::Approx(s.ms(o.finished)).epsilon(0.001));
  for (auto& e : *s.events)
    CHECK(e.kind != runtime::supervisor_event_kind::restarted);
}

TEST_CASE("drain: long requests are forwarded with their KV at grace end, none re-prefilled") {
  auto sh = two_decode();
  serving base{sh};
  base.submit(1, 1024, 10001);
  base.run();
  auto& b = base.outcomes->at(1);
  REQUIRE(b.completed);
  REQUIRE(b.decode_instance == 0);

  serving s{sh};
  for (std::uint64_t id = 1; id <= 3; ++id)
    s.submit(id, 1024, 10001, 1000 * id);
  // 10,000 decode steps of 10 ms: 100 s. Drained at 1 s with a 5 s grace: at the step
  // boundary at or after 6 s each has generated exactly 600 tokens here (the batch steps
  // together from ~1.2 ms... and later joiners a step behind at most).
  s.drain(1s, 0, 5s);
  s.run();
  REQUIRE(s.faults->size() == 1);
  REQUIRE(s.faults->at(0).forwarded);
  CHECK(s.faults->at(0).forwarded->forwarded == 3);
  for (std::uint64_t id = 1; id <= 3; ++id) {
    CAPTURE(id);
    auto& o = s.outcomes->at(id);
    CHECK(o.completed);
    CHECK(o.failure.empty());
    CHECK(o.forwards == 1);
    CHECK(o.reroutes == 0);
    CHECK(o.decode_instance == 1);
    // Exactly its output: what was generated on instance 0 is not generated again.
    CHECK(o.delivered_tokens == 10001);
    CHECK(o.token_digest == modelled_digest(0, id, 1024, 0, 10001));
    // Forwarded at ~6 s with (1024 + ~600) × 100 bytes of KV (~0.16 ms at 1 GB/s), no
    // re-prefill: it ends within a few steps of the fault-free run.
    CHECK(s.ms(o.finished) > s.ms(b.finished));
    CHECK(s.ms(o.finished) < s.ms(b.finished) + 40);
  }
  // One prefill per request: the forwards re-prefilled nothing.
  CHECK(prefill_routed(s) == 3);
  CHECK(!has_child(s, "decode/0"));
}

TEST_CASE("drain: the exact token count at the hand-off") {
  serving s{two_decode()};
  s.submit(1, 1024, 10001);
  s.drain(1s, 0, 5s);
  // Just after the hand-off (the step in flight at 6 s ends at ~6.0012 s).
  s.world.driver().run_until(s.origin + 6s + 5ms);
  // The request is on instance 1 now; the client has the first token and 600 decoded ones.
  s.run();
  auto& o = s.outcomes->at(1);
  CHECK(o.completed);
  CHECK(o.forwards == 1);
  CHECK(o.delivered_tokens == 10001);
  // 600 tokens on instance 0 (to ~6.0012 s), the hand-off of 1624 tokens of KV (0.16 ms),
  // then 9400 steps on instance 1: 94 s.
  CHECK(s.ms(o.finished) == doctest::Approx(6001.2 + 0.16 + 94000).epsilon(0.0001));
}

TEST_CASE("drain: with overlapped steps the hand-off waits for the step in flight, and counts "
          "exactly") {
  auto sh = two_decode();
  sh.overlap = true;
  serving s{sh};
  for (std::uint64_t id = 1; id <= 3; ++id)
    s.submit(id, 1024, 2001, 1000 * id);
  s.drain(1s, 0, 5s);
  s.run();
  REQUIRE(s.faults->size() == 1);
  REQUIRE(s.faults->at(0).forwarded);
  CHECK(s.faults->at(0).forwarded->forwarded == 3);
  for (std::uint64_t id = 1; id <= 3; ++id) {
    CAPTURE(id);
    auto& o = s.outcomes->at(id);
    CHECK(o.completed);
    CHECK(o.forwards == 1);
    CHECK(o.decode_instance == 1);
    // Nothing generated twice, nothing skipped: the tokens of the step built ahead are
    // counted where they were generated.
    CHECK(o.delivered_tokens == 2001);
    CHECK(o.token_digest == modelled_digest(0, id, 1024, 0, 2001));
  }
  CHECK(!has_child(s, "decode/0"));
}

TEST_CASE("drain: a draining instance is excluded from routing at once") {
  serving s{two_decode()};
  s.submit(1, 1024, 10001);
  s.drain(1s, 0, 60s);
  s.world.driver().run_until(s.origin + 2s);
  CHECK(decode_counter(s, "drained") == 1);
  // A short request would go to instance 0 (the short class); with 0 excluded, instance 1
  // is the only one (and serves every class).
  s.submit(2, 1024, 11, 7000);
  s.world.driver().run_until(s.origin + 3s);
  REQUIRE(s.outcomes->count(2) == 1);
  auto& second = s.outcomes->at(2);
  CHECK(second.completed);
  CHECK(second.decode_instance == 1);
  CHECK(second.forwards == 0);
  s.run();
  auto& first = s.outcomes->at(1);
  CHECK(first.completed);
  CHECK(first.forwards == 1);
  CHECK(first.decode_instance == 1);
  CHECK(first.delivered_tokens == 10001);
}

TEST_CASE("drain: a forwarded request carries its sliding-window rings with its KV") {
  // The same forward as above, once without rings and once with 1 GB of them: at 1 GB/s the
  // hand-off takes one second longer, so the request ends ~1 s later (and nothing else
  // changes: the same tokens, no re-prefill).
  auto sh = two_decode();
  serving plain{sh};
  plain.submit(1, 1024, 10001);
  plain.drain(1s, 0, 5s);
  plain.run();
  sh.swa_ring_bytes = 1'000'000'000;
  serving rings{sh};
  rings.submit(1, 1024, 10001);
  rings.drain(1s, 0, 5s);
  rings.run();
  auto& a = plain.outcomes->at(1);
  auto& b = rings.outcomes->at(1);
  REQUIRE(a.completed);
  REQUIRE(b.completed);
  CHECK(a.forwards == 1);
  CHECK(b.forwards == 1);
  CHECK(b.delivered_tokens == a.delivered_tokens);
  CHECK(rings.ms(b.finished) - plain.ms(a.finished) == doctest::Approx(1000).epsilon(0.01));
  CHECK(prefill_routed(rings) == 1);
}

TEST_CASE("drain of a prefill instance: it finishes its work, takes no more, and is removed") {
  cluster_shape sh;
  sh.prefill_instances = 2;
  sh.restart_delay = 10s;
  // A long prefill (200,000 tokens at 1 µs each: ~0.2 s) in flight when the notice comes, on
  // the instance a fault-free run puts it on.
  serving base{sh};
  base.submit(1, 200000, 4);
  base.run();
  auto target = base.outcomes->at(1).prefill_instance;
  serving s{sh};
  s.submit(1, 200000, 4);
  s.drain(10ms, target, 0s, "prefill");
  // Requests that come after the notice go to the other instance.
  s.world.driver().run_until(s.origin + 20ms);
  for (std::uint64_t id = 2; id <= 5; ++id)
    s.submit(id, 1024, 4, 1000 * id);
  s.run();
  for (std::uint64_t id = 2; id <= 5; ++id)
    CHECK(s.outcomes->at(id).prefill_instance != target);
  REQUIRE(s.faults->size() == 1);
  CHECK(s.faults->at(0).injected);
  REQUIRE(s.faults->at(0).forwarded);
  CHECK(s.faults->at(0).forwarded->done);
  CHECK(s.faults->at(0).forwarded->forwarded == 0);
  auto& first = s.outcomes->at(1);
  CHECK(first.completed);
  CHECK(first.prefill_instance == target);
  CHECK(first.first_token == base.outcomes->at(1).first_token);
  CHECK(first.reroutes == 0);
  // It left when its last job was done, not before.
  CHECK(s.ms(s.faults->at(0).forwarded->at) >= s.ms(first.first_token) - 1);
  for (std::uint64_t id = 1; id <= 5; ++id)
    CHECK(s.outcomes->at(id).completed);
  CHECK(!has_child(s, "prefill/" + std::to_string(target)));
  for (auto& e : *s.events)
    CHECK(e.kind != runtime::supervisor_event_kind::restarted);
}

TEST_CASE("decode_lb counts a request refused for want of room as waiting until its retry is "
          "overdue, once however often it retries") {
  runtime::world w{runtime::world_options{runtime::world_mode::sim, 1, 0, false,
                                          register_actor_types}};
  auto& sys = w.system();
  decode_balancer_params p;
  p.waiting_window = 2s;
  auto dlb = spawn_decode_lb(sys, p);  // no instance: every route is refused
  auto waiting = [&] {
    auto load = testing::ask<pool_load>(sys, dlb, pool_load_atom::value);
    w.driver().run_for(0s);
    REQUIRE(load->has_value());
    return (*load)->waiting;
  };
  auto route = [&](std::uint64_t request) {
    auto refused = std::make_shared<bool>(false);
    sys.spawn([dlb, request, refused](caf::event_based_actor* self) {
      self->request(dlb, caf::infinite, decode_route{request, 100, 10})
        .then([](const decode_assignment&) {}, [refused](const caf::error&) { *refused = true; });
    });
    w.driver().run_for(0s);
    CHECK(*refused);
  };
  CHECK(waiting() == 0);
  route(7);
  CHECK(waiting() == 1);
  w.driver().run_for(1s);
  route(7);  // its retry: still one request waiting
  route(8);
  CHECK(waiting() == 2);
  w.driver().run_for(2500ms);  // neither retried within the window: served elsewhere, or gone
  CHECK(waiting() == 0);
}

TEST_CASE("decode_lb tells the oldest request it refused for want of room when a booking ends, "
          "and every one waiting when an instance joins") {
  runtime::world w{runtime::world_options{runtime::world_mode::sim, 1, 0, false,
                                          register_actor_types}};
  auto& sys = w.system();
  decode_balancer_params p;
  p.max_requests = 1;
  auto dlb = spawn_decode_lb(sys, p);
  auto idle_engine = [&] {  // never asked anything here
    return caf::actor_cast<decode_engine_actor>(
      sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
        self->set_default_handler(caf::drop);
        return {[](int) {}};
      }));
  };
  caf::anon_send(dlb, add_instance_atom::value, instance_id{0}, idle_engine());
  w.driver().run_for(0s);
  struct told {
    bool booked = false, refused = false;
    int rooms = 0;
  };
  // A request: asks for a route, and counts the room messages it gets (kept alive here, as a
  // waiting request is by its retry timer).
  std::vector<caf::actor> alive;
  auto request = [&](std::uint64_t id, bool waits = true) {
    auto t = std::make_shared<told>();
    alive.push_back(sys.spawn([dlb, id, waits, t](caf::event_based_actor* self) -> caf::behavior {
      self->request(dlb, caf::infinite, decode_route{id, 100, 10, waits})
        .then([t](const decode_assignment&) { t->booked = true; },
              [t](const caf::error&) { t->refused = true; });
      return {[t](decode_room_atom) { ++t->rooms; }};
    }));
    w.driver().run_for(0s);
    return t;
  };
  auto a = request(1);
  auto b = request(2);
  auto c = request(3);
  CHECK(a->booked);
  CHECK((b->refused && c->refused));
  caf::anon_send(dlb, decode_release{0, 100, 10, 0});  // a ends: b, refused first, is told
  w.driver().run_for(0s);
  CHECK(b->rooms == 1);
  CHECK(c->rooms == 0);
  auto d = request(4);  // room for one: d takes it; b never asked again
  CHECK(d->booked);
  auto early = request(6, false);  // an early booking, which the request goes on without
  CHECK(early->refused);
  caf::anon_send(dlb, add_instance_atom::value, instance_id{1}, idle_engine());
  w.driver().run_for(0s);
  CHECK(b->rooms == 1);  // told already
  CHECK(c->rooms == 1);
  CHECK(early->rooms == 0);
  auto e = request(5);
  CHECK(e->booked);  // the new instance's room
  caf::anon_send(dlb, decode_release{0, 100, 10, 0});  // nobody refused is left to tell
  w.driver().run_for(0s);
  CHECK((b->rooms == 1 && c->rooms == 1));
  for (auto& r : alive)
    caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  w.driver().run_for(0s);
}
