// The KV cache's CHECK role: hash chains, the index (TTL, eviction, accounting), the shard
// actor in virtual time, and a sharded store.
#include "actors/kv/block_key.hpp"
#include "actors/kv/kv_index.hpp"
#include "actors/kv/kv_store.hpp"
#include "actors/type_ids.hpp"
#include "runtime/random.hpp"
#include "runtime/world.hpp"

#include <caf/all.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <optional>
#include <vector>

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;
using runtime::duration;
using runtime::time_point;

namespace {

constexpr duration day = 24h;

std::vector<std::uint32_t> tokens(std::size_t n, std::uint32_t first = 0) {
  std::vector<std::uint32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

/// A chain of `n` blocks named by content keys `base, base+1, ...`.
std::vector<block_key> chain_of(std::size_t n, std::uint64_t base = 1) {
  std::vector<std::uint64_t> keys(n);
  std::iota(keys.begin(), keys.end(), base);
  return make_chain(keys, n * block_tokens);
}

kv_index_params params_for_blocks(std::uint64_t blocks) {
  kv_index_params p;
  p.block_bytes = 1000;
  p.capacity_bytes = blocks * 1000;
  return p;
}

const time_point t0 = time_point{} + 1000h;

/// A simulated world with the actors' types registered, and a probe that asks an actor.
struct kv_fixture {
  runtime::world world{[] {
    runtime::world_options o;
    o.mode = runtime::world_mode::sim;
    o.seed = 7;
    o.configure = register_actor_types;
    return o;
  }()};
  caf::actor_system& sys = world.system();

  template <class T>
  struct answer {
    std::shared_ptr<std::optional<T>> value = std::make_shared<std::optional<T>>();
  };

  template <class T, class Handle, class... Ts>
  answer<T> ask(const Handle& dest, Ts... xs) {
    answer<T> a;
    sys.spawn([dest, a, xs...](caf::event_based_actor* self) {
      self->request(dest, caf::infinite, xs...).then([a](T& x) { *a.value = std::move(x); });
    });
    return a;
  }

  /// Asks, runs the world until quiet, and returns the reply (fails the test if none).
  template <class T, class Handle, class... Ts>
  T call(const Handle& dest, Ts... xs) {
    auto a = ask<T>(dest, xs...);
    world.driver().run();
    REQUIRE(a.value->has_value());
    return **a.value;
  }
};

} // namespace

// -- hash chains ----------------------------------------------------------------------------

TEST_CASE("the same tokens after the same parent give the same key") {
  auto a = tokens(128, 5);
  auto b = tokens(128, 5);
  CHECK(chain_hash(block_key{}, a) == chain_hash(block_key{}, b));
  CHECK(chain_hash(block_key{1, 2}, a) != chain_hash(block_key{}, a));
}

TEST_CASE("a change in an earlier block changes the key of every later block") {
  auto prompt = tokens(4 * 128);
  auto before = make_chain(prompt);
  prompt[130] += 1; // inside block 1
  auto after = make_chain(prompt);
  REQUIRE(before.size() == 4);
  CHECK(before[0] == after[0]);
  CHECK(before[1] != after[1]);
  CHECK(before[2] != after[2]);
  CHECK(before[3] != after[3]);
}

TEST_CASE("make_chain keys full blocks only") {
  CHECK(make_chain(tokens(127)).empty());
  CHECK(make_chain(tokens(3 * 128 + 127)).size() == 3);
  std::vector<std::uint64_t> keys{11, 12, 13};
  CHECK(make_chain(keys, 3 * 128).size() == 3);
  CHECK(make_chain(keys, 2 * 128 + 1).size() == 2); // the last key covers a partial block
  CHECK(make_chain(keys, 10 * 128).size() == 3);
}

TEST_CASE("a chain continued from its last key equals the chain of the whole prompt") {
  auto prompt = tokens(5 * 128);
  auto whole = make_chain(prompt);
  auto head = make_chain(std::span<const std::uint32_t>(prompt).first(2 * 128));
  auto tail = make_chain(std::span<const std::uint32_t>(prompt).subspan(2 * 128), head.back());
  head.insert(head.end(), tail.begin(), tail.end());
  CHECK(head == whole);
}

TEST_CASE("the token and content-key forms are pinned to golden values") {
  // Token form: XXH3-128 of parent.hi | parent.lo | 128u32 | token ids 0..127 (LE).
  CHECK(to_string(chain_hash(block_key{}, tokens(128))) == "a4dd9385bae8766fb1af6a5d943a4c10");
  // Content-key form: XXH3-128 of parent.hi | parent.lo | (128 | 0x80000000)u32 | 42u64.
  CHECK(to_string(chain_hash(block_key{}, 42, 128)) == "86c9d170102abdc03073e37b413ce2ff");
}

TEST_CASE("the token and content-key forms never name the same block alike") {
  std::vector<std::uint32_t> two{42, 0}; // the same bytes as content key 42 after the count
  CHECK(chain_hash(block_key{}, two) != chain_hash(block_key{}, 42, 2));
}

// -- the index ------------------------------------------------------------------------------

TEST_CASE("match counts the longest cached prefix of a chain") {
  kv_index idx(params_for_blocks(100));
  auto cached = chain_of(5, 1);
  idx.insert(cached, traffic_class::chatbot, t0);
  std::vector<block_key> probe(cached.begin(), cached.begin() + 3);
  auto diverging = make_chain(std::vector<std::uint64_t>{99, 100}, 2 * 128, probe.back());
  probe.insert(probe.end(), diverging.begin(), diverging.end());
  auto r = idx.match(probe, traffic_class::chatbot, t0);
  CHECK(r.hit_blocks == 3);
  CHECK(r.hit_tokens == 3 * 128);
  CHECK(idx.match(chain_of(5, 2), traffic_class::chatbot, t0).hit_blocks == 0);
}

TEST_CASE("a block after a missing block is not a hit") {
  kv_index idx(params_for_blocks(100));
  auto chain = chain_of(4);
  idx.insert(std::vector<block_key>{chain[0], chain[2], chain[3]}, traffic_class::chatbot, t0);
  CHECK(idx.match(chain, traffic_class::chatbot, t0).hit_blocks == 1);
}

TEST_CASE("an entry older than its class TTL is not a hit") {
  kv_index idx(params_for_blocks(100));
  auto chain = chain_of(2);
  idx.insert(chain, traffic_class::chatbot, t0);
  // The second block expires 1 ns before the first (block i of one call, i ns early).
  CHECK(idx.probe(chain, t0 + 7 * day - 2ns) == 2);
  CHECK(idx.probe(chain, t0 + 7 * day - 1ns) == 1);
  CHECK(idx.match(chain, traffic_class::chatbot, t0 + 7 * day + 1s).hit_blocks == 0);
  // Found lazily, each where its walk ended: the second block by the probe, the first by the
  // match.
  CHECK(idx.stats().expirations == 2);
}

TEST_CASE("the TTL audit counts no block served before expiry, and catches a planted bug") {
  auto chain = chain_of(3);
  kv_index ok(params_for_blocks(100));
  ok.insert(chain, traffic_class::agent, t0);
  CHECK(ok.probe(chain, t0 + 3 * day - 3ns) == 3);
  CHECK(ok.probe(chain, t0 + 3 * day) == 0); // expired exactly at its expiry
  CHECK(ok.stats().served_expired == 0);

  // The planted bug serves expired blocks: the audit counts each one, every time.
  auto planted = params_for_blocks(100);
  planted.test_ignore_expiry = true;
  kv_index bad(planted);
  bad.insert(chain, traffic_class::agent, t0);
  CHECK(bad.probe(chain, t0 + 3 * day - 3ns) == 3);
  CHECK(bad.stats().served_expired == 0);
  CHECK(bad.match(chain, traffic_class::agent, t0 + 3 * day + 1s).hit_blocks == 3);
  CHECK(bad.stats().served_expired == 3);
  CHECK(bad.probe(std::span(chain).first(2), t0 + 4 * day) == 2);
  CHECK(bad.stats().served_expired == 5);
}

TEST_CASE("chatbot blocks outlive agent blocks") {
  kv_index idx(params_for_blocks(100));
  auto chat = chain_of(1, 1);
  auto agent = chain_of(1, 2);
  idx.insert(chat, traffic_class::chatbot, t0);
  idx.insert(agent, traffic_class::agent, t0);
  CHECK(idx.contains(agent[0], t0 + 3 * day - 1s));
  CHECK_FALSE(idx.contains(agent[0], t0 + 3 * day + 1s));
  CHECK(idx.contains(chat[0], t0 + 3 * day + 1s));
  CHECK(idx.match(agent, traffic_class::agent, t0 + 4 * day).hit_blocks == 0);
  CHECK(idx.match(chat, traffic_class::chatbot, t0 + 4 * day).hit_blocks == 1);
}

TEST_CASE("a hit extends the TTL from the time of the hit") {
  kv_index idx(params_for_blocks(100));
  auto chain = chain_of(1);
  idx.insert(chain, traffic_class::agent, t0);
  CHECK(idx.match(chain, traffic_class::agent, t0 + 2 * day).hit_blocks == 1);
  CHECK(idx.match(chain, traffic_class::agent, t0 + 4 * day).hit_blocks == 1);
  CHECK(idx.match(chain, traffic_class::agent, t0 + 7 * day + 1s).hit_blocks == 0);
}

TEST_CASE("a hit never shortens a longer expiry") {
  kv_index idx(params_for_blocks(100));
  auto chain = chain_of(1);
  idx.insert(chain, traffic_class::chatbot, t0);
  idx.match(chain, traffic_class::agent, t0 + 1s);
  CHECK(*idx.expiry(chain[0]) == t0 + 7 * day);
}

TEST_CASE("a full index evicts the entry with the oldest expiry first") {
  kv_index idx(params_for_blocks(3));
  auto a = chain_of(1, 1), b = chain_of(1, 2), c = chain_of(1, 3), d = chain_of(1, 4);
  idx.insert(b, traffic_class::chatbot, t0 + 1h);
  idx.insert(a, traffic_class::chatbot, t0);
  idx.insert(c, traffic_class::chatbot, t0 + 2h);
  auto r = idx.insert(d, traffic_class::chatbot, t0 + 3h);
  CHECK(r.inserted == 1);
  CHECK_FALSE(idx.contains(a[0], t0 + 3h));
  CHECK(idx.contains(b[0], t0 + 3h));
  CHECK(idx.contains(c[0], t0 + 3h));
  CHECK(idx.contains(d[0], t0 + 3h));
  CHECK(idx.stats().evictions == 1);
  CHECK(idx.stats().bytes == 3000);
}

TEST_CASE("a chain's blocks placed at one instant expire deepest first, a nanosecond apart") {
  kv_index idx(params_for_blocks(100));
  auto chain = chain_of(4);
  idx.insert(chain, traffic_class::agent, t0);
  for (std::size_t i = 0; i < chain.size(); ++i)
    CHECK(*idx.expiry(chain[i]) == t0 + 3 * day - std::chrono::nanoseconds(i));
  // A hit refreshes them the same way, from the time of the hit.
  CHECK(idx.match(chain, traffic_class::agent, t0 + 1h).hit_blocks == 4);
  for (std::size_t i = 0; i < chain.size(); ++i)
    CHECK(*idx.expiry(chain[i]) == t0 + 1h + 3 * day - std::chrono::nanoseconds(i));
}

TEST_CASE("a full index evicts a chain from its deepest block") {
  kv_index idx(params_for_blocks(3));
  auto chain = chain_of(3, 1);
  idx.insert(chain, traffic_class::chatbot, t0);
  idx.insert(chain_of(1, 50), traffic_class::chatbot, t0 + 1h);
  CHECK(idx.match(chain, traffic_class::chatbot, t0 + 1h).hit_blocks == 2);
}

TEST_CASE("a block that would outlive nothing in a full index is rejected with its chain") {
  kv_index idx(params_for_blocks(2));
  idx.insert(chain_of(2, 1), traffic_class::chatbot, t0);
  auto r = idx.insert(chain_of(3, 10), traffic_class::agent, t0 + 1h);
  CHECK(r.inserted == 0);
  CHECK(r.rejected == 3);
  CHECK(idx.stats().evictions == 0);
}

TEST_CASE("expired entries make room before unexpired ones are evicted") {
  kv_index idx(params_for_blocks(2));
  idx.insert(chain_of(1, 1), traffic_class::agent, t0);
  idx.insert(chain_of(1, 2), traffic_class::chatbot, t0);
  idx.insert(chain_of(1, 3), traffic_class::chatbot, t0 + 4 * day);
  CHECK(idx.stats().expirations == 1);
  CHECK(idx.stats().evictions == 0);
}

TEST_CASE("a reserved block is a hit only once committed") {
  kv_index idx(params_for_blocks(10));
  auto chain = chain_of(2);
  auto r = idx.reserve(chain, traffic_class::chatbot, t0);
  CHECK(r.inserted == 2);
  CHECK(idx.stats().pending == 2);
  CHECK(idx.match(chain, traffic_class::chatbot, t0 + 1s).hit_blocks == 0);
  auto c = idx.commit(std::span<const block_key>(chain).first(1), t0 + 2s);
  CHECK(c.committed == 1);
  CHECK(idx.match(chain, traffic_class::chatbot, t0 + 3s).hit_blocks == 1);
  CHECK(idx.commit(chain_of(1, 77), t0 + 4s).missing == 1);
}

TEST_CASE("reserving a block already cached asks for no write") {
  kv_index idx(params_for_blocks(10));
  auto chain = chain_of(2);
  idx.insert(std::span<const block_key>(chain).first(1), traffic_class::chatbot, t0);
  auto r = idx.reserve(chain, traffic_class::chatbot, t0 + 1s);
  CHECK(r.refreshed == 1);
  CHECK(r.inserted == 1);
}

TEST_CASE("hits and misses are counted by block and by token") {
  kv_index idx(params_for_blocks(10));
  auto chain = chain_of(3);
  idx.insert(std::span<const block_key>(chain).first(2), traffic_class::chatbot, t0);
  idx.match(chain, traffic_class::chatbot, t0, 3 * 128 + 50);
  idx.match(chain_of(1, 9), traffic_class::chatbot, t0); // no prompt length: the chain's
  auto s = idx.stats();
  CHECK(s.lookups == 2);
  CHECK(s.hit_blocks == 2);
  CHECK(s.miss_blocks == 2);
  CHECK(s.hit_tokens == 256);
  CHECK(s.miss_tokens == 128 + 50 + 128);
}

// -- the shard actor, in virtual time -------------------------------------------------------

TEST_CASE_FIXTURE(kv_fixture, "a shard answers a match with hit blocks and hit tokens") {
  auto shard = spawn_kv_store(sys, params_for_blocks(10));
  auto chain = chain_of(3);
  call<kv_insert_result>(shard, kv_insert{{chain[0], chain[1]}, traffic_class::chatbot});
  auto r = call<kv_match_result>(shard, kv_match{chain, traffic_class::chatbot, 3 * 128 + 1});
  CHECK(r.hit_blocks == 2);
  CHECK(r.hit_tokens == 256);
  auto s = call<kv_stats>(shard, kv_stats_atom::value);
  CHECK(s.miss_tokens == 129);
}

TEST_CASE_FIXTURE(kv_fixture, "an entry older than its class TTL is not a hit in virtual time") {
  auto shard = spawn_kv_store(sys, params_for_blocks(10));
  auto chain = chain_of(2);
  call<kv_insert_result>(shard, kv_insert{chain, traffic_class::agent});
  world.driver().run_for(3 * day - 1s);
  CHECK(call<kv_match_result>(shard, kv_match{chain, traffic_class::agent, 0}).hit_blocks == 2);
  world.driver().run_for(3 * day + 1s); // 3 days after the refresh by that hit
  CHECK(call<kv_match_result>(shard, kv_match{chain, traffic_class::agent, 0}).hit_blocks == 0);
}

TEST_CASE_FIXTURE(kv_fixture, "a sharded store sums its shards' TTL audits") {
  auto planted = params_for_blocks(10);
  planted.test_ignore_expiry = true;
  auto store = spawn_sharded_kv_store(sys, planted, 4);
  auto chain = chain_of(4);
  call<kv_insert_result>(store, kv_insert{chain, traffic_class::agent});
  world.driver().run_for(3 * day + 1s);
  CHECK(call<kv_match_result>(store, kv_match{chain, traffic_class::agent, 0}).hit_blocks == 4);
  CHECK(call<kv_stats>(store, kv_stats_atom::value).served_expired == 4);
}

TEST_CASE_FIXTURE(kv_fixture, "a shard answers after its operation latency, times a slowdown") {
  auto params = params_for_blocks(10);
  params.op_latency = 10ms;
  auto store = spawn_sharded_kv_store(sys, params, 2);
  auto chain = chain_of(4);
  // Decided on arrival, answered 10 ms later (the shards answer in parallel).
  auto inserted = ask<kv_insert_result>(store, kv_insert{chain, traffic_class::chatbot});
  world.driver().run_for(9ms);
  CHECK_FALSE(inserted.value->has_value());
  world.driver().run_for(2ms);
  REQUIRE(inserted.value->has_value());
  CHECK((*inserted.value)->inserted == 4);

  // Shard 0 slowed x3, then x5 on top: the largest applies, and a match waits for its
  // slowest shard.
  caf::anon_send(store, kv_shard_slow_atom::value, std::uint32_t{0}, 3.0, true);
  caf::anon_send(store, kv_shard_slow_atom::value, std::uint32_t{0}, 5.0, true);
  world.driver().run_for(1ms);
  auto slow = ask<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0});
  world.driver().run_for(49ms);
  CHECK_FALSE(slow.value->has_value());
  world.driver().run_for(2ms);
  REQUIRE(slow.value->has_value());
  CHECK((*slow.value)->hit_blocks == 4);

  // The x5 ends: x3 remains; then none.
  caf::anon_send(store, kv_shard_slow_atom::value, std::uint32_t{0}, 5.0, false);
  world.driver().run_for(1ms);
  auto x3 = ask<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0});
  world.driver().run_for(29ms);
  CHECK_FALSE(x3.value->has_value());
  world.driver().run_for(2ms);
  CHECK(x3.value->has_value());
  caf::anon_send(store, kv_shard_slow_atom::value, std::uint32_t{0}, 3.0, false);
  world.driver().run_for(1ms);
  auto normal = ask<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0});
  world.driver().run_for(11ms);
  CHECK(normal.value->has_value());
}

// -- a sharded store -------------------------------------------------------------------------

TEST_CASE_FIXTURE(kv_fixture, "a sharded match equals an unsharded match on random chains") {
  auto rng = world.random().split("kv-test");
  kv_index_params big = params_for_blocks(1'000'000);
  auto single = spawn_kv_store(sys, big);
  auto sharded = spawn_sharded_kv_store(sys, big, 5);
  // Prompts drawn from few block contents, so that they share prefixes of random lengths.
  std::vector<std::vector<block_key>> prompts;
  for (int i = 0; i < 60; ++i) {
    std::vector<std::uint64_t> keys(1 + rng.below(12));
    for (auto& k : keys)
      k = rng.below(3);
    prompts.push_back(make_chain(keys, keys.size() * block_tokens));
  }
  for (std::size_t i = 0; i < prompts.size(); i += 2) {
    auto n = rng.below(prompts[i].size() + 1);
    kv_insert ins{{prompts[i].begin(), prompts[i].begin() + n}, traffic_class::chatbot};
    call<kv_insert_result>(single, ins);
    call<kv_insert_result>(sharded, ins);
  }
  std::size_t total = 0;
  for (const auto& p : prompts) {
    auto a = call<kv_match_result>(single, kv_match{p, traffic_class::chatbot, 0});
    auto b = call<kv_match_result>(sharded, kv_match{p, traffic_class::chatbot, 0});
    CHECK(a.hit_blocks == b.hit_blocks);
    total += a.hit_blocks;
  }
  CHECK(total > 0); // the comparison saw hits, not only misses
  auto sa = call<kv_stats>(single, kv_stats_atom::value);
  auto sb = call<kv_stats>(sharded, kv_stats_atom::value);
  CHECK(sa.entries == sb.entries);
  CHECK(sa.hit_tokens == sb.hit_tokens);
  CHECK(sa.miss_tokens == sb.miss_tokens);
}

TEST_CASE_FIXTURE(kv_fixture, "a sharded hit refreshes only the blocks of the leading run") {
  auto sharded = spawn_sharded_kv_store(sys, params_for_blocks(100), 3);
  auto chain = chain_of(6);
  call<kv_insert_result>(sharded, kv_insert{{chain[0], chain[1], chain[3], chain[4]},
                                            traffic_class::agent});
  world.driver().run_for(2 * day);
  call<kv_match_result>(sharded, kv_match{chain, traffic_class::agent, 0});
  world.driver().run_for(2 * day); // 4 days after insert, 2 after the hit
  auto r = call<kv_match_result>(sharded, kv_match{{chain[0], chain[1]}, traffic_class::agent, 0});
  CHECK(r.hit_blocks == 2);
  auto tail = call<kv_match_result>(sharded, kv_match{{chain[3]}, traffic_class::agent, 0});
  CHECK(tail.hit_blocks == 0);
}

TEST_CASE_FIXTURE(kv_fixture, "a failed shard makes its blocks misses instead of failing a match") {
  auto store = spawn_sharded_kv_store(sys, params_for_blocks(100), 3);
  auto chain = chain_of(9);
  call<kv_insert_result>(store, kv_insert{chain, traffic_class::chatbot});
  auto dead = shard_of(chain[4], 3);
  std::size_t first_dead = 0;
  while (shard_of(chain[first_dead], 3) != dead)
    ++first_dead;
  caf::anon_send(store, kv_shard_fault_atom::value, dead, true);
  world.driver().run();
  auto r = call<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0});
  CHECK(r.hit_blocks == first_dead);
  // Its part of an insert is rejected; the other shards take theirs.
  auto ins = call<kv_insert_result>(store, kv_insert{chain, traffic_class::chatbot});
  auto on_dead = static_cast<std::uint32_t>(
    std::count_if(chain.begin(), chain.end(), [&](auto& k) { return shard_of(k, 3) == dead; }));
  CHECK(ins.rejected == on_dead);
  CHECK(ins.refreshed == chain.size() - on_dead);
  // Back up, it is empty: its blocks are misses until written again.
  caf::anon_send(store, kv_shard_fault_atom::value, dead, false);
  world.driver().run();
  CHECK(call<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0}).hit_blocks
        == first_dead);
  call<kv_insert_result>(store, kv_insert{chain, traffic_class::chatbot});
  CHECK(call<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0}).hit_blocks
        == chain.size());
}

TEST_CASE_FIXTURE(kv_fixture, "with replicas a failed shard's blocks stay hits until every copy's shard fails") {
  auto store = spawn_sharded_kv_store(sys, params_for_blocks(100), 3, 2);
  auto chain = chain_of(12);
  call<kv_insert_result>(store, kv_insert{chain, traffic_class::chatbot});
  auto first_on = [&](std::uint32_t shard) {
    std::size_t i = 0;
    while (i < chain.size() && shard_of(chain[i], 3) != shard)
      ++i;
    return i;
  };
  // Shard 1 fails: its blocks' second copies are on shard 2.
  caf::anon_send(store, kv_shard_fault_atom::value, std::uint32_t{1}, true);
  world.driver().run();
  CHECK(call<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0}).hit_blocks
        == chain.size());
  // Written while it is down, a block of shard 1 goes to its copy and is a hit.
  auto more = make_chain(std::vector<std::uint64_t>(20, 9), 20 * block_tokens);
  auto ins = call<kv_insert_result>(store, kv_insert{more, traffic_class::chatbot});
  CHECK(ins.rejected == 0);
  // Shard 2 fails too: shard 1's blocks have no copy up and are lost; shard 2's are on 0.
  caf::anon_send(store, kv_shard_fault_atom::value, std::uint32_t{2}, true);
  world.driver().run();
  CHECK(call<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0}).hit_blocks
        == first_on(1));
  // Both back: shard 2's blocks were kept by shard 0, shard 1's stay lost until written again.
  caf::anon_send(store, kv_shard_fault_atom::value, std::uint32_t{1}, false);
  caf::anon_send(store, kv_shard_fault_atom::value, std::uint32_t{2}, false);
  world.driver().run();
  CHECK(call<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0}).hit_blocks
        == first_on(1));
  std::vector<block_key> on2;
  for (const auto& k : chain)
    if (shard_of(k, 3) == 2)
      on2.push_back(k);
  REQUIRE_FALSE(on2.empty());
  CHECK(call<kv_match_result>(store, kv_match{{on2.front()}, traffic_class::chatbot, 0}).hit_blocks
        == 1);
  call<kv_insert_result>(store, kv_insert{chain, traffic_class::chatbot});
  CHECK(call<kv_match_result>(store, kv_match{chain, traffic_class::chatbot, 0}).hit_blocks
        == chain.size());
}
