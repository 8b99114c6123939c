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

std::vector<std::uint8_t> bytes(std::size_t n, std::uint8_t seed) {
  std::vector<std::uint8_t> out(n);
  for (std::size_t i = 0; i < n; ++i)
    out[i] = static_cast<std::uint8_t>(seed + i);
  return out;
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

namespace {

/// 1 MB/s and 100 us latency: a 1000-byte object moves in 1 ms.
sim_store_params small_store(std::uint64_t capacity = 10'000) {
  return {capacity, 100us, 1e6};
}

struct store_fixture : test::sim_fixture {
  store_port store = spawn_sim_store(sys, small_store());

  store_stats put(std::uint64_t key, std::uint64_t size,
                  std::vector<std::uint8_t> payload = {}) {
    auto r = ask<store_stats>(store, store_put{key, size, std::move(payload)});
    run();
    REQUIRE(r.value->has_value());
    return **r.value;
  }

  store_stats stats() {
    auto r = ask<store_stats>(store, store_stats_atom::value);
    run();
    REQUIRE(r.value->has_value());
    return **r.value;
  }

  bool has(std::uint64_t key) {
    auto r = ask<bool>(store, store_has{key});
    run();
    REQUIRE(r.value->has_value());
    return **r.value;
  }
};

} // namespace

TEST_CASE_FIXTURE(store_fixture, "a sim store returns the payload and size of an object put before") {
  auto payload = bytes(1000, 3);
  put(42, 1000, payload);
  auto r = ask<store_object>(store, store_get{42});
  run();
  REQUIRE(r.value->has_value());
  CHECK((*r.value)->key == 42);
  CHECK((*r.value)->size == 1000);
  CHECK((*r.value)->payload == payload);
}

TEST_CASE_FIXTURE(store_fixture, "a sim store keeps the size of an object put without a payload") {
  put(1, 4096);
  auto r = ask<store_object>(store, store_get{1});
  run();
  REQUIRE(r.value->has_value());
  CHECK((*r.value)->size == 4096);
  CHECK((*r.value)->payload.empty());
}

TEST_CASE_FIXTURE(store_fixture, "getting or deleting a missing key fails with not_found after the latency") {
  put(1, 10);
  auto t0 = world.now();
  auto get = ask<store_object>(store, store_get{2});
  auto del = ask<store_stats>(store, store_delete{3});
  run();
  CHECK_FALSE(get.value->has_value());
  CHECK(is(*get.error, errc::not_found));
  CHECK_FALSE(del.value->has_value());
  CHECK(is(*del.error, errc::not_found));
  CHECK(*get.at == t0 + 100us);
  CHECK(*del.at == t0 + 100us);
  CHECK(stats().objects == 1);
}

TEST_CASE_FIXTURE(store_fixture, "a put over capacity fails with store_full and changes nothing") {
  put(1, 6000, bytes(6000, 1));
  auto before = stats();
  auto r = ask<store_stats>(store, store_put{2, 5000, {}});
  run();
  CHECK_FALSE(r.value->has_value());
  CHECK(is(*r.error, errc::store_full));
  auto after = stats();
  CHECK(after.used == before.used);
  CHECK(after.objects == before.objects);
  CHECK_FALSE(has(2));
  // The object already there is untouched.
  auto got = ask<store_object>(store, store_get{1});
  run();
  REQUIRE(got.value->has_value());
  CHECK((*got.value)->payload == bytes(6000, 1));
}

TEST_CASE_FIXTURE(store_fixture, "a failed replacement over capacity keeps the old object") {
  put(1, 6000);
  auto r = ask<store_stats>(store, store_put{1, 11'000, {}});
  run();
  CHECK(is(*r.error, errc::store_full));
  auto s = stats();
  CHECK(s.used == 6000);
  CHECK(s.objects == 1);
}

TEST_CASE_FIXTURE(store_fixture, "a put that fills the store exactly succeeds") {
  auto s = put(1, 10'000);
  CHECK(s.used == 10'000);
  CHECK(s.capacity == 10'000);
}

TEST_CASE_FIXTURE(store_fixture, "replacing a key frees the old size") {
  put(1, 6000);
  // 6000 + 8000 would not fit, but the old 6000 are freed first.
  auto s = put(1, 8000);
  CHECK(s.used == 8000);
  CHECK(s.objects == 1);
  auto r = ask<store_object>(store, store_get{1});
  run();
  REQUIRE(r.value->has_value());
  CHECK((*r.value)->size == 8000);
}

TEST_CASE_FIXTURE(store_fixture, "store stats count capacity, used bytes and objects through puts and deletes") {
  auto s0 = stats();
  CHECK(s0.capacity == 10'000);
  CHECK(s0.used == 0);
  CHECK(s0.objects == 0);
  put(1, 1000);
  auto s = put(2, 2500);
  CHECK(s.used == 3500);
  CHECK(s.objects == 2);
  auto del = ask<store_stats>(store, store_delete{1});
  run();
  REQUIRE(del.value->has_value());
  CHECK((*del.value)->used == 2500);
  CHECK((*del.value)->objects == 1);
  CHECK(stats().used == 2500);
}

TEST_CASE_FIXTURE(store_fixture, "has is true for a stored key and false otherwise") {
  put(5, 10);
  CHECK(has(5));
  CHECK_FALSE(has(6));
  auto del = ask<store_stats>(store, store_delete{5});
  run();
  REQUIRE(del.value->has_value());
  CHECK_FALSE(has(5));
}

TEST_CASE_FIXTURE(store_fixture, "a sim store put and get take bytes / bandwidth plus latency") {
  auto t0 = world.now();
  auto p = ask<store_stats>(store, store_put{1, 1000, {}});
  run();
  REQUIRE(p.value->has_value());
  CHECK(*p.at == t0 + 1ms + 100us);
  auto t1 = world.now();
  auto g = ask<store_object>(store, store_get{1});
  run();
  REQUIRE(g.value->has_value());
  CHECK(*g.at == t1 + 1ms + 100us);
}

TEST_CASE_FIXTURE(store_fixture, "has, delete and stats take only the latency, whatever the object size") {
  put(1, 5000);
  auto t0 = world.now();
  auto h = ask<bool>(store, store_has{1});
  auto s = ask<store_stats>(store, store_stats_atom::value);
  auto d = ask<store_stats>(store, store_delete{1});
  run();
  REQUIRE(d.value->has_value());
  CHECK(*h.at == t0 + 100us);
  CHECK(*s.at == t0 + 100us);
  CHECK(*d.at == t0 + 100us);
}

TEST_CASE_FIXTURE(store_fixture, "concurrent puts and gets share the store bandwidth in arrival order") {
  put(1, 2000);
  auto t0 = world.now();
  auto get = ask<store_object>(store, store_get{1});       // 2 ms of bandwidth
  auto put2 = ask<store_stats>(store, store_put{2, 1000, {}}); // 1 ms, after the get
  run();
  REQUIRE(get.value->has_value());
  REQUIRE(put2.value->has_value());
  CHECK(*get.at == t0 + 2ms + 100us);
  CHECK(*put2.at == t0 + 3ms + 100us);
}

TEST_CASE_FIXTURE(store_fixture, "a put whose payload differs from its declared size fails with invalid_argument") {
  auto r = ask<store_stats>(store, store_put{1, 10, bytes(9, 0)});
  run();
  CHECK(is(*r.error, errc::invalid_argument));
  CHECK(stats().objects == 0);
}
