// The autoscaler's policy (decide_scale) rule by rule: bounds, step limits, the
// over-provision margin, the quota and the ready inventory, and no scale-down above the
// occupancy limit. The actor acting on a simulated cluster is tested end to end in
// tests/cluster/test_autoscaler_sim.cpp.
#include "actors/autoscaler/autoscaler.hpp"

#include <doctest/doctest.h>

using namespace troupe::actors;

namespace {

scale_pool_input pool(double demand, double capacity, std::uint32_t online,
                      std::uint32_t min = 1, std::uint32_t max = 8) {
  scale_pool_input p;
  p.pool = "decode";
  p.min = min;
  p.max = max;
  p.gpus_per_instance = 8;
  p.demand = demand;
  p.capacity = capacity;
  p.online = online;
  return p;
}

scale_limits limits(std::uint32_t up = 2, std::uint32_t down = 1, double margin = 0) {
  scale_limits l;
  l.max_step_up = up;
  l.max_step_down = down;
  l.over_provision = margin;
  l.occupancy_limit = 0.8;
  l.quota = 1000;
  l.inventory = 0;
  return l;
}

scale_inputs inputs(scale_pool_input p, std::uint64_t held = 100) {
  scale_inputs in;
  in.pools.push_back(std::move(p));
  in.gpus_held = held;
  in.slot_gpus = 8;
  return in;
}

} // namespace

TEST_CASE("the need is demand over capacity, rounded up; the margin keeps online above it") {
  // 250 requests in compute at 100 per instance: 3 needed.
  auto d = decide_scale(inputs(pool(250, 100, 3)), limits(8, 8, 0));
  CHECK(d.pools[0].need == 3);
  CHECK(d.pools[0].desired == 3);
  CHECK(d.pools[0].up == 0);
  CHECK(d.pools[0].down == 0);
  // A 10% margin on 3 is 3.3: rounded up, and strictly above the need.
  d = decide_scale(inputs(pool(250, 100, 3)), limits(8, 8, 0.1));
  CHECK(d.pools[0].desired == 4);
  CHECK(d.pools[0].up == 1);
  // A 50% margin on 4 is 6.
  d = decide_scale(inputs(pool(400, 100, 6)), limits(8, 8, 0.5));
  CHECK(d.pools[0].need == 4);
  CHECK(d.pools[0].desired == 6);
  CHECK(d.pools[0].target == 6);
  // Exactly at capacity is not one more.
  d = decide_scale(inputs(pool(300, 100, 3)), limits(8, 8, 0));
  CHECK(d.pools[0].need == 3);
}

TEST_CASE("the target stays within the pool's min and max") {
  // Demand for 50 instances, max 8: the pool grows to 8 at most, even with a large step.
  auto d = decide_scale(inputs(pool(5000, 100, 6)), limits(10, 10));
  CHECK(d.pools[0].need == 50);
  CHECK(d.pools[0].desired == 8);
  CHECK(d.pools[0].up == 2);
  CHECK(d.pools[0].target == 8);
  CHECK(d.pools[0].reason.find("bounds [1, 8]") != std::string::npos);
  // No demand at all: down to min, never below.
  d = decide_scale(inputs(pool(0, 100, 3, 2, 8)), limits(10, 10));
  CHECK(d.pools[0].desired == 2);
  CHECK(d.pools[0].down == 1);
  CHECK(d.pools[0].target == 2);
  // Below min (instances lost): grows back even without demand.
  d = decide_scale(inputs(pool(0, 100, 0, 2, 8)), limits(10, 10));
  CHECK(d.pools[0].up == 2);
}

TEST_CASE("at most max_step_up added and max_step_down removed per interval") {
  auto d = decide_scale(inputs(pool(800, 100, 2)), limits(2, 1));
  CHECK(d.pools[0].desired == 8);
  CHECK(d.pools[0].up == 2);
  CHECK(d.pools[0].target == 4);
  CHECK(d.pools[0].reason.find("limited by max_step_up 2") != std::string::npos);
  d = decide_scale(inputs(pool(100, 100, 8)), limits(2, 1));
  CHECK(d.pools[0].desired == 1);
  CHECK(d.pools[0].down == 1);
  CHECK(d.pools[0].target == 7);
  CHECK(d.pools[0].reason.find("limited by max_step_down 1") != std::string::npos);
  d = decide_scale(inputs(pool(100, 100, 8)), limits(2, 3));
  CHECK(d.pools[0].down == 3);
}

TEST_CASE("instances starting count as capacity; only online ones are removed") {
  auto p = pool(400, 100, 2);
  p.starting = 2;
  auto d = decide_scale(inputs(p), limits(4, 4));
  CHECK(d.pools[0].current == 4);
  CHECK(d.pools[0].up == 0);
  // Desired 1 with 1 online and 3 starting: the one online cannot go.
  p = pool(0, 100, 1);
  p.starting = 3;
  d = decide_scale(inputs(p), limits(4, 4));
  CHECK(d.pools[0].desired == 1);
  CHECK(d.pools[0].down == 1);
  CHECK(d.pools[0].target == 3);
}

TEST_CASE("no scale-down while quota occupancy is above the limit") {
  // 850 of 1000 GPUs held: 85% > 80%, so an idle pool keeps its instances.
  auto d = decide_scale(inputs(pool(0, 100, 5), 850), limits(2, 2));
  CHECK(d.occupancy == doctest::Approx(0.85));
  CHECK(d.pools[0].desired == 1);
  CHECK(d.pools[0].down == 0);
  CHECK(d.pools[0].target == 5);
  CHECK(d.pools[0].reason.find("blocks scale-down") != std::string::npos);
  // At exactly the limit it may shrink; and growing is never blocked by occupancy.
  d = decide_scale(inputs(pool(0, 100, 5), 800), limits(2, 2));
  CHECK(d.pools[0].down == 2);
  d = decide_scale(inputs(pool(800, 100, 5), 900), limits(2, 2));
  CHECK(d.pools[0].up == 2);
}

TEST_CASE("a pool shrinks only after wanting fewer instances for scale_down_after") {
  auto l = limits(2, 1);
  l.scale_down_after = std::chrono::seconds(60);
  auto p = pool(100, 100, 4);
  auto d = decide_scale(inputs(p), l);
  CHECK(d.pools[0].desired == 1);
  CHECK(d.pools[0].down == 0);
  CHECK(d.pools[0].reason.find("below current for 0 s of the 60 s") != std::string::npos);
  p.below_for = std::chrono::seconds(50);
  CHECK(decide_scale(inputs(p), l).pools[0].down == 0);
  p.below_for = std::chrono::seconds(60);
  CHECK(decide_scale(inputs(p), l).pools[0].down == 1);
  // Growing is never delayed.
  p = pool(800, 100, 4);
  CHECK(decide_scale(inputs(p), l).pools[0].up == 2);
}

TEST_CASE("growth comes from the ready inventory first, then from the quota while it lasts") {
  auto l = limits(3, 1);
  l.quota = 110;
  l.inventory = 2;
  auto in = inputs(pool(800, 100, 2), 100);
  in.inventory_ready = 1;
  auto d = decide_scale(in, l);
  // One from the inventory (already held), one from the quota (100 + 8 <= 110), a third
  // would need 108 + 8 > 110.
  CHECK(d.pools[0].up == 2);
  CHECK(d.pools[0].from_inventory == 1);
  CHECK(d.pools[0].reason.find("limited by the quota") != std::string::npos);
  // The used slot is not refilled: the quota is spent (108 + 8 > 110 for a slot of 8).
  CHECK(d.refill == 0);
  // With room, the inventory is refilled to its size.
  l.quota = 1000;
  d = decide_scale(in, l);
  CHECK(d.pools[0].up == 3);
  CHECK(d.pools[0].from_inventory == 1);
  CHECK(d.refill == 2);
  // Slots being refilled count: nothing more is ordered.
  in.inventory_refilling = 1;
  in.pools[0] = pool(200, 100, 2); // hold
  d = decide_scale(in, l);
  CHECK(d.refill == 0);
}

TEST_CASE("pools share the inventory and the quota in order") {
  auto l = limits(2, 1);
  l.quota = 200;
  auto in = inputs(pool(400, 100, 2), 184);
  auto second = pool(400, 100, 2);
  second.pool = "prefill";
  in.pools.push_back(second);
  in.inventory_ready = 1;
  auto d = decide_scale(in, l);
  // decode: one from the inventory, one from the quota (184 + 8 = 192); prefill: one more
  // (200), then the quota is full.
  CHECK(d.pools[0].up == 2);
  CHECK(d.pools[0].from_inventory == 1);
  CHECK(d.pools[1].up == 1);
  CHECK(d.pools[1].from_inventory == 0);
}
