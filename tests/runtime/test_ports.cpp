// The simulated ports (device, link, store) reply after their modelled time, in virtual time.
#include "runtime/errors.hpp"
#include "runtime/ports/device.hpp"
#include "runtime/ports/link.hpp"
#include "runtime/ports/store.hpp"
#include "sim_fixture.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace troupe;
using namespace troupe::runtime;
using namespace std::chrono_literals;

namespace {

/// A step costs 1 ms per token.
duration per_token(const device_step& s) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(s.tokens));
}

device_step step(std::uint64_t id, std::uint64_t tokens) {
  device_step s;
  s.id = id;
  s.tokens = tokens;
  return s;
}

} // namespace

// -- device ---------------------------------------------------------------------------------

TEST_CASE_FIXTURE(test::sim_fixture, "a sim device replies to a step after its cost") {
  auto dev = spawn_sim_device(sys, per_token);
  auto r = ask<device_result>(dev, step(7, 250));
  run();
  REQUIRE(r.value->has_value());
  CHECK((*r.value)->id == 7);
  CHECK((*r.value)->started == start);
  CHECK((*r.value)->finished == start + 250ms);
  CHECK(r.seconds_since(start) == doctest::Approx(0.25));
}

TEST_CASE_FIXTURE(test::sim_fixture, "a sim device runs steps one at a time in arrival order") {
  auto dev = spawn_sim_device(sys, per_token);
  auto first = ask<device_result>(dev, step(1, 100));
  auto second = ask<device_result>(dev, step(2, 30));
  run();
  REQUIRE(first.value->has_value());
  REQUIRE(second.value->has_value());
  auto& a = **first.value;
  auto& b = **second.value;
  CHECK(a.id == 1);
  CHECK(b.id == 2);
  CHECK(a.finished == start + 100ms);
  CHECK(b.started == a.finished);
  CHECK(b.finished == start + 130ms);
  CHECK(first.seconds_since(start) == doctest::Approx(0.100));
  CHECK(second.seconds_since(start) == doctest::Approx(0.130));
}

TEST_CASE_FIXTURE(test::sim_fixture, "a sim device that has gone idle starts the next step on arrival") {
  auto dev = spawn_sim_device(sys, per_token);
  auto first = ask<device_result>(dev, step(1, 10));
  run();
  run_for(1s);
  auto t1 = world.now();
  auto second = ask<device_result>(dev, step(2, 20));
  run();
  REQUIRE(second.value->has_value());
  CHECK((*second.value)->started == t1);
  CHECK((*second.value)->finished == t1 + 20ms);
}

TEST_CASE_FIXTURE(test::sim_fixture, "a sim device counts a negative cost as zero") {
  auto dev = spawn_sim_device(sys, [](const device_step&) { return duration{-5s}; });
  auto r = ask<device_result>(dev, step(1, 1));
  auto next = ask<device_result>(dev, step(2, 1));
  run();
  REQUIRE(r.value->has_value());
  REQUIRE(next.value->has_value());
  CHECK((*r.value)->finished == start);
  CHECK((*next.value)->started == start);
  CHECK(*r.at == start);
}

TEST_CASE_FIXTURE(
  test::sim_fixture,
  "a sim device answers hand-offs after queued steps with one shared empty snapshot") {
  auto dev = spawn_sim_device(sys, per_token);
  auto busy = ask<device_result>(dev, step(1, 40));
  auto first = ask<kv_snapshot_ptr>(dev, kv_export{7});
  auto second = ask<kv_snapshot_ptr>(dev, kv_export{8});
  auto imported = ask<caf::ok_atom>(dev, kv_import{9, nullptr});
  run();
  REQUIRE(first.value->has_value());
  REQUIRE(second.value->has_value());
  REQUIRE(imported.value->has_value());
  const auto& snap = **first.value;
  CHECK(snap->model == "sim");
  CHECK(snap->length == 0);
  CHECK(snap->blocks.empty());
  CHECK(snap.get() == (*second.value)->get()); // nothing allocated per hand-off
  CHECK(*first.at == start + 40ms);            // after the queued step, taking no time
  CHECK(*imported.at == start + 40ms);
}

// -- link -----------------------------------------------------------------------------------

TEST_CASE_FIXTURE(test::sim_fixture, "a sim link delivers after bytes / bandwidth plus latency") {
  auto link = spawn_sim_link(sys, {1e9, 10us});
  auto r = ask<link_delivery>(link, link_transfer{3, 5'000'000}); // 5 ms on the wire
  run();
  REQUIRE(r.value->has_value());
  auto& d = **r.value;
  CHECK(d.id == 3);
  CHECK(d.bytes == 5'000'000);
  CHECK(d.started == start);
  CHECK(d.arrived == start + 5ms + 10us);
  CHECK(*r.at == start + 5ms + 10us);
}

TEST_CASE_FIXTURE(test::sim_fixture, "concurrent transfers on a sim link share its bandwidth in arrival order") {
  auto link = spawn_sim_link(sys, {1e9, 10us});
  auto first = ask<link_delivery>(link, link_transfer{1, 2'000'000});  // 2 ms
  auto second = ask<link_delivery>(link, link_transfer{2, 1'000'000}); // 1 ms
  run();
  REQUIRE(first.value->has_value());
  REQUIRE(second.value->has_value());
  CHECK((*first.value)->arrived == start + 2ms + 10us);
  // The second starts when the first's last byte left, not when it arrived.
  CHECK((*second.value)->started == start + 2ms);
  CHECK((*second.value)->arrived == start + 3ms + 10us);
  CHECK(*second.at == start + 3ms + 10us);
}

TEST_CASE_FIXTURE(test::sim_fixture, "an empty transfer on a sim link takes only the latency") {
  auto link = spawn_sim_link(sys, {1e9, 25us});
  auto r = ask<link_delivery>(link, link_transfer{1, 0});
  run();
  REQUIRE(r.value->has_value());
  CHECK((*r.value)->arrived == start + 25us);
}

// -- store ----------------------------------------------------------------------------------
//
// What every store does (round trip, capacity and eviction, TTL, list, stats) is the port's
// contract, tested against the sim and the POSIX store in tests/ports/test_store_contract.cpp.
// Here: what only the simulated store models, its timing in virtual time.

namespace {

/// 1 MB/s and 100 us latency: a 1000-byte object moves in 1 ms.
sim_store_params small_store(std::uint64_t capacity = 10'000) {
  return {capacity, 100us, 1e6};
}

store_key key(std::uint64_t n) {
  return {0, n};
}

struct store_fixture : test::sim_fixture {
  store_port store = spawn_sim_store(sys, small_store());

  store_stats put(std::uint64_t k, std::uint64_t size, std::vector<std::uint8_t> payload = {},
                  duration ttl = duration{0}) {
    auto r = ask<store_stats>(store, store_put{key(k), size, std::move(payload), ttl});
    run();
    REQUIRE(r.value->has_value());
    return **r.value;
  }
};

} // namespace

TEST_CASE_FIXTURE(store_fixture, "a sim store keeps the size of an object put without a payload") {
  put(1, 4096);
  auto r = ask<store_object>(store, store_get{key(1)});
  run();
  REQUIRE(r.value->has_value());
  CHECK((*r.value)->size == 4096);
  CHECK((*r.value)->payload.empty());
}

TEST_CASE_FIXTURE(store_fixture, "a sim store answers not_found and store_full after the latency") {
  put(1, 10);
  auto t0 = world.now();
  auto get = ask<store_object>(store, store_get{key(2)});
  auto del = ask<store_stats>(store, store_delete{key(3)});
  auto full = ask<store_stats>(store, store_put{key(4), 10'001, {}, duration{0}});
  run();
  CHECK(is(*get.error, errc::not_found));
  CHECK(is(*del.error, errc::not_found));
  CHECK(is(*full.error, errc::store_full));
  CHECK(*get.at == t0 + 100us);
  CHECK(*del.at == t0 + 100us);
  CHECK(*full.at == t0 + 100us);
}

TEST_CASE_FIXTURE(store_fixture, "a sim store put and get take bytes / bandwidth plus latency") {
  auto t0 = world.now();
  auto p = ask<store_stats>(store, store_put{key(1), 1000, {}, duration{0}});
  run();
  REQUIRE(p.value->has_value());
  CHECK(*p.at == t0 + 1ms + 100us);
  auto t1 = world.now();
  auto g = ask<store_object>(store, store_get{key(1)});
  run();
  REQUIRE(g.value->has_value());
  CHECK(*g.at == t1 + 1ms + 100us);
}

TEST_CASE_FIXTURE(store_fixture,
                  "has, delete, list and stats take only the latency, whatever the object size") {
  put(1, 5000);
  auto t0 = world.now();
  auto h = ask<bool>(store, store_has{key(1)});
  auto s = ask<store_stats>(store, store_stats_atom::value);
  auto l = ask<std::vector<store_entry>>(store, store_list{});
  auto d = ask<store_stats>(store, store_delete{key(1)});
  run();
  REQUIRE(d.value->has_value());
  CHECK(*h.at == t0 + 100us);
  CHECK(*s.at == t0 + 100us);
  CHECK(*l.at == t0 + 100us);
  CHECK(*d.at == t0 + 100us);
}

TEST_CASE_FIXTURE(store_fixture,
                  "concurrent puts and gets share the store bandwidth in arrival order") {
  put(1, 2000);
  auto t0 = world.now();
  auto get = ask<store_object>(store, store_get{key(1)});                     // 2 ms
  auto put2 = ask<store_stats>(store, store_put{key(2), 1000, {}, duration{0}}); // 1 ms after
  run();
  REQUIRE(get.value->has_value());
  REQUIRE(put2.value->has_value());
  CHECK(*get.at == t0 + 2ms + 100us);
  CHECK(*put2.at == t0 + 3ms + 100us);
}

TEST_CASE_FIXTURE(store_fixture,
                  "a sim store's expiry is the put's arrival plus its ttl, in virtual time") {
  run_for(5s);
  auto t0 = world.now();
  put(1, 1000, {}, 1h);
  auto l = ask<std::vector<store_entry>>(store, store_list{});
  run();
  REQUIRE(l.value->has_value());
  REQUIRE((*l.value)->size() == 1);
  CHECK((**l.value)[0].expires_at == t0 + 1h);
}

TEST_CASE_FIXTURE(store_fixture,
                  "a sim store sets no expiry timer: a world with expiring objects goes quiet") {
  put(1, 1000, {}, 24h);
  auto reason = run();
  CHECK(reason == stop_reason::quiescent);
  CHECK(world.now() < start + 1s);
}

TEST_CASE_FIXTURE(test::sim_fixture,
                  "a sim device verifies drafts as its draft model says and proposes the next") {
  sim_draft_model model;
  auto dev = spawn_sim_device(sys, per_token, model);
  // Sequence 9 at position 100 verifies 5 drafts; sequence 4 at 50 verifies none but proposes.
  device_step s{3, step_phase::decode, 7, 2, 0, 0, {}};
  step_sequence a{4, 50, 1, {}, true, {}};
  a.propose = true;
  step_sequence b{9, 100, 6, {}, true, {}};
  b.verify = 5;
  b.propose = true;
  s.batch = {a, b};
  auto r = ask<device_result>(dev, s);
  run();
  REQUIRE(r.value->has_value());
  const auto& out = **r.value;
  // Sequence 4: one token, the one after position 50.
  REQUIRE(!out.sampled.empty());
  CHECK(out.sampled[0].sequence == 4);
  CHECK(out.sampled[0].token == modelled_token(4, 51));
  // Sequence 9: the token after its first new one (position 101), then one per draft accepted
  // in a row: draft j sits at position 100 + j.
  std::uint32_t accepted = 0;
  while (accepted < 5 && model.accepted(9, 101 + accepted, accepted + 1))
    ++accepted;
  REQUIRE(out.sampled.size() == 2 + accepted);
  for (std::uint32_t i = 0; i <= accepted; ++i) {
    CHECK(out.sampled[1 + i].sequence == 9);
    CHECK(out.sampled[1 + i].token == modelled_token(9, 101 + i));
  }
  // Proposals: five confidences each, for the positions after the last token answered.
  REQUIRE(out.drafts.size() == 2);
  CHECK(out.drafts[0].sequence == 4);
  CHECK(out.drafts[1].sequence == 9);
  for (std::uint32_t j = 1; j <= 5; ++j) {
    CHECK(out.drafts[0].confidences[j - 1] == model.confidence(4, 51 + j, j));
    CHECK(out.drafts[1].confidences[j - 1] == model.confidence(9, 101 + accepted + j, j));
    CHECK(out.drafts[1].confidences[j - 1] >= 0.01f);
    CHECK(out.drafts[1].confidences[j - 1] <= 0.99f);
  }
  CHECK(out.drafts[1].tokens.empty());
}

TEST_CASE("the sim draft model is calibrated: drafts are accepted as often as their confidence says") {
  sim_draft_model model;
  for (std::uint32_t depth = 1; depth <= 5; ++depth) {
    double confidence = 0.0, accepted = 0.0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
      confidence += model.confidence(static_cast<std::uint64_t>(i % 97), 1000 + i, depth);
      accepted += model.accepted(static_cast<std::uint64_t>(i % 97), 1000 + i, depth) ? 1 : 0;
    }
    CAPTURE(depth);
    CHECK(confidence / n == doctest::Approx(model.mean[depth - 1]).epsilon(0.02));
    CHECK(accepted / n == doctest::Approx(confidence / n).epsilon(0.03));
  }
}
