// The routing policies of the load balancers: prefill buckets, engines per bucket following
// load, decode long/short separation and least-loaded choice, no starvation.
#include "actors/lb/decode_balancer.hpp"
#include "actors/lb/prefill_balancer.hpp"

#include <doctest/doctest.h>

using namespace troupe::actors;

TEST_CASE("a prefill request goes to the bucket of its uncached length") {
  prefill_balancer lb{{}};
  CHECK(lb.buckets() == 4);
  CHECK(lb.bucket_of(0) == 0);
  CHECK(lb.bucket_of(16383) == 0);
  CHECK(lb.bucket_of(16384) == 1);
  CHECK(lb.bucket_of(65535) == 1);
  CHECK(lb.bucket_of(65536) == 2);
  CHECK(lb.bucket_of(262144) == 3);
  CHECK(lb.bucket_of(1u << 30) == 3);
  CHECK(lb.bucket_name(1) == "16K-64K");
  CHECK(lb.bucket_name(3) == "256K-inf");
}

TEST_CASE("new prefill instances spread over the buckets") {
  prefill_balancer lb{{}};
  for (instance_id i = 0; i < 8; ++i)
    lb.add_instance(i);
  CHECK(lb.instances_per_bucket() == std::vector<std::uint32_t>{2, 2, 2, 2});
}

TEST_CASE("within a bucket the instance with the least outstanding compute is chosen") {
  prefill_balancer lb{{}};
  for (instance_id i = 0; i < 8; ++i)
    lb.add_instance(i);
  auto first = lb.route(1000, 5.0);
  auto second = lb.route(1000, 1.0);
  REQUIRE(first);
  REQUIRE(second);
  CHECK(*first != *second);
  CHECK(lb.bucket_of_instance(*first) == 0);
  CHECK(lb.bucket_of_instance(*second) == 0);
  // The second instance holds less work now, so it gets the next one.
  CHECK(lb.route(1000, 1.0) == second);
  lb.complete(*first, 5.0);
  CHECK(lb.outstanding(*first) == 0.0);
  CHECK(lb.route(1000, 1.0) == first);
}

TEST_CASE("engine counts per bucket follow the measured load with bounded moves") {
  prefill_balancer lb{{{16384, 65536, 262144}, 1, 1.0}};
  for (instance_id i = 0; i < 8; ++i)
    lb.add_instance(i);
  // All the load is short prompts.
  for (int r = 0; r < 100; ++r) {
    auto id = lb.route(2000, 1.0);
    REQUIRE(id);
    lb.complete(*id, 1.0);
  }
  CHECK(lb.rebalance() == 1); // bounded: one move per rebalance
  CHECK(lb.instances_per_bucket()[0] == 3);
  for (int round = 0; round < 10; ++round) {
    for (int r = 0; r < 100; ++r)
      lb.complete(*lb.route(2000, 1.0), 1.0);
    lb.rebalance();
  }
  // Buckets without load give their instances up; the loaded bucket gets them all.
  CHECK(lb.instances_per_bucket() == std::vector<std::uint32_t>{8, 0, 0, 0});
  CHECK(lb.stats().moves == 6);
}

TEST_CASE("a bucket with load keeps an instance and the split follows load shares") {
  prefill_balancer lb{{{16384, 65536, 262144}, 4, 1.0}};
  for (instance_id i = 0; i < 8; ++i)
    lb.add_instance(i);
  for (int round = 0; round < 5; ++round) {
    for (int r = 0; r < 30; ++r)
      lb.complete(*lb.route(1000, 1.0), 1.0); // 30 units short
    for (int r = 0; r < 10; ++r)
      lb.complete(*lb.route(100000, 1.0), 1.0); // 10 units in the 64K-256K bucket
    lb.rebalance();
  }
  auto counts = lb.instances_per_bucket();
  CHECK(counts[0] == 6);
  CHECK(counts[2] == 2);
  CHECK(counts[1] + counts[3] == 0);
}

TEST_CASE("a request whose bucket has no instance spills to the nearest one") {
  prefill_balancer lb{{}};
  lb.add_instance(7); // lands in bucket 0
  REQUIRE(lb.bucket_of_instance(7) == 0);
  CHECK(lb.route(300000, 1.0) == instance_id{7});
  CHECK(lb.stats().spilled == 1);
  lb.remove_instance(7);
  CHECK(!lb.route(10, 1.0));
  CHECK(lb.stats().rejected == 1);
}

TEST_CASE("decode keeps long and short requests on different instances") {
  decode_balancer lb{{32768, 0.25, 4096, 1ull << 30}};
  for (instance_id i = 0; i < 8; ++i)
    lb.add_instance(i);
  int long_instances = 0;
  for (instance_id i = 0; i < 8; ++i)
    long_instances += *lb.is_long(i) ? 1 : 0;
  CHECK(long_instances == 2);
  for (int r = 0; r < 50; ++r) {
    auto s = lb.route(4000);
    REQUIRE(s);
    CHECK(!*lb.is_long(*s));
    auto l = lb.route(100000);
    REQUIRE(l);
    CHECK(*lb.is_long(*l));
  }
  CHECK(lb.stats().routed_long == 50);
  CHECK(lb.stats().routed_short == 50);
  CHECK(lb.stats().spilled == 0);
}

TEST_CASE("decode balances both request count and KV length") {
  decode_balancer lb{{1ull << 40, 0.0, 100, 1000000}};
  lb.add_instance(0);
  lb.add_instance(1);
  // Instance 0 takes one request with a lot of KV; 1 then takes several small ones before
  // 0 becomes the lighter again.
  REQUIRE(lb.route(500000) == instance_id{0});
  int to_one = 0;
  for (int r = 0; r < 60; ++r)
    to_one += lb.route(1000) == instance_id{1} ? 1 : 0;
  // Scores: 0 holds 0.01 + 0.5; each small request adds 0.01 + 0.001 to 1's score, so 1
  // takes the first 47 and then the two alternate.
  CHECK(to_one > 45);
  CHECK(to_one < 60);
  CHECK(lb.requests(0) + lb.requests(1) == 61);
}

TEST_CASE("decode spills to the other class only when its own has no room") {
  decode_balancer lb{{32768, 0.5, 2, 1ull << 30}};
  lb.add_instance(0);
  lb.add_instance(1);
  REQUIRE(*lb.is_long(1));
  CHECK(lb.route(100) == instance_id{0});
  CHECK(lb.route(100) == instance_id{0});
  CHECK(lb.route(100) == instance_id{1}); // 0 is full
  CHECK(lb.stats().spilled == 1);
  CHECK(lb.route(100) == instance_id{1});
  CHECK(!lb.route(100));
  CHECK(lb.stats().rejected == 1);
  lb.complete(0, 100);
  CHECK(lb.route(100) == instance_id{0});
}

TEST_CASE("decode counts the KV a request appends while decoding") {
  decode_balancer lb{{1ull << 40, 0.0, 100, 1000000}};
  lb.add_instance(0);
  lb.add_instance(1);
  // Two requests of the same context; the one on 0 generates 50000 tokens, so 0 holds more
  // KV and the next request goes to 1.
  REQUIRE(lb.route(1000, 60000) == instance_id{0});
  REQUIRE(lb.route(1000, 60000) == instance_id{1});
  lb.grow(0, 50000);
  CHECK(lb.kv_tokens(0) == 51000);
  CHECK(lb.kv_tokens(1) == 1000);
  CHECK(lb.load(0) > lb.load(1));
  CHECK(lb.route(1000) == instance_id{1});
  // Leaving, the request releases what it appended with its booking.
  lb.complete(0, 1000, 60000, 50000);
  CHECK(lb.kv_tokens(0) == 0);
  CHECK(lb.reserved_tokens(0) == 0);
  CHECK(lb.requests(0) == 0);
}

TEST_CASE("decode reserves KV to the end of the output budget and never exceeds the limit") {
  decode_balancer lb{{1ull << 40, 0.0, 100, 10000}};
  lb.add_instance(0);
  // 4000 held and 4000 more to come: 8000 reserved; a request needing 3000 more has no room
  // even though only 4000 tokens are held now.
  REQUIRE(lb.route(4000, 4000) == instance_id{0});
  CHECK(lb.kv_tokens(0) == 4000);
  CHECK(lb.reserved_tokens(0) == 8000);
  CHECK(!lb.route(1000, 2000));
  CHECK(lb.route(1000, 1000) == instance_id{0});
  // One whose own KV is beyond the limit is never routed.
  lb.complete(0, 4000, 4000);
  lb.complete(0, 1000, 1000);
  CHECK(!lb.route(9000, 2000));
  CHECK(lb.stats().rejected == 2);
}

TEST_CASE("under steady load no prefill instance is starved or overloaded") {
  prefill_balancer lb{{}};
  for (instance_id i = 0; i < 4; ++i)
    lb.add_instance(i);
  // Keep the short bucket busy: each step routes a request and completes the oldest.
  std::vector<std::pair<instance_id, double>> inflight;
  std::map<instance_id, int> served;
  for (int step = 0; step < 1000; ++step) {
    auto id = lb.route(1000 + static_cast<std::uint64_t>(step % 7) * 1000, 1.0);
    REQUIRE(id);
    ++served[*id];
    inflight.emplace_back(*id, 1.0);
    if (inflight.size() > 6) {
      lb.complete(inflight.front().first, inflight.front().second);
      inflight.erase(inflight.begin());
    }
    if (step % 50 == 49)
      lb.rebalance();
  }
  // Every instance ends up in the short bucket and serves a fair share.
  CHECK(lb.instances_per_bucket()[0] == 4);
  for (instance_id i = 0; i < 4; ++i)
    CHECK(served[i] > 100);
}
