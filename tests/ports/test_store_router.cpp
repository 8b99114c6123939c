// A block store of several shards (ports/store_router.hpp): the blocks spread by key over
// shard directories of their own, the router answering as one store, a shard that stops
// failing only its own blocks, and with replicas, none.
#include "ports/store_router.hpp"
#include "runtime/errors.hpp"
#include "runtime/metrics.hpp"
#include "store_drivers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <sstream>
#include <thread>

using namespace troupe;
using namespace troupe::runtime;
using test::bytes;
using test::key;

namespace {

struct sharded_fixture {
  test::temp_dir dir;
  runtime::registry metrics;
  runtime::world world{runtime::world_options{runtime::world_mode::real, 42, 2, false, nullptr}};
  caf::scoped_actor self{world.system()};

  store_port open(std::uint32_t shards, std::uint64_t capacity, std::uint32_t replicas = 1) {
    ports::posix_store_params p;
    p.directory = dir.path();
    p.capacity = capacity;
    p.metrics = &metrics;
    return ports::spawn_sharded_posix_store(world.system(), std::move(p), shards, replicas);
  }

  /// The keys a plain store on `directory` holds.
  std::vector<store_key> keys_in(const std::filesystem::path& directory) {
    auto store = ports::spawn_posix_store(world.system(), {directory, 1 << 30, {}});
    auto listed = test::request<std::vector<store_entry>>(self, store, store_list{});
    REQUIRE(listed);
    test::stop(self, store);
    std::vector<store_key> out;
    for (const auto& e : *listed)
      out.push_back(e.key);
    return out;
  }
};

} // namespace

TEST_CASE("a store of one shard is the plain store on its directory") {
  CHECK(ports::store_shard_directory("/kv", 0, 1) == std::filesystem::path("/kv"));
  CHECK(ports::store_shard_directory("/kv", 2, 3) == std::filesystem::path("/kv/shard-2-of-3"));
  CHECK(ports::store_shard_of(key(7), 1) == 0);
  CHECK(ports::store_shard_of(store_key{5, 7}, 3) == 1);
  CHECK(ports::store_copies_of(store_key{5, 7}, 3, 1) == std::vector<std::uint32_t>{1});
  CHECK(ports::store_copies_of(store_key{5, 8}, 3, 2) == std::vector<std::uint32_t>{2, 0});
  CHECK(ports::store_copies_of(store_key{5, 8}, 3, 9) == std::vector<std::uint32_t>{2, 0, 1});
  CHECK(ports::store_copies_of(store_key{5, 8}, 1, 2) == std::vector<std::uint32_t>{0});
}

TEST_CASE("a sharded store puts each block in its shard's directory and answers as one store") {
  sharded_fixture f;
  constexpr std::uint32_t shards = 3;
  constexpr std::uint64_t n = 30;
  auto store = f.open(shards, 3'000'000);
  for (std::uint64_t i = 0; i < n; ++i)
    REQUIRE(test::request<store_stats>(
      f.self, store, store_put{key(i), 500, bytes(500, static_cast<std::uint8_t>(i)), duration{0}}));
  for (std::uint64_t i = 0; i < n; ++i) {
    auto got = test::request<store_object>(f.self, store, store_get{key(i)});
    REQUIRE(got);
    CHECK(got->payload == bytes(500, static_cast<std::uint8_t>(i)));
  }
  REQUIRE(test::request<store_stats>(f.self, store, store_delete{key(0)}));
  CHECK_FALSE(*test::request<bool>(f.self, store, store_has{key(0)}));
  CHECK(*test::request<bool>(f.self, store, store_has{key(1)}));

  auto listed = test::request<std::vector<store_entry>>(f.self, store, store_list{});
  REQUIRE(listed);
  CHECK(listed->size() == n - 1);
  CHECK(std::is_sorted(listed->begin(), listed->end(),
                       [](const store_entry& a, const store_entry& b) { return a.key < b.key; }));
  auto sum = test::request<store_stats>(f.self, store, store_stats_atom::value);
  REQUIRE(sum);
  CHECK(sum->objects == n - 1);
  CHECK(sum->hits == n);
  CHECK(sum->capacity == 3'000'000);

  // Each shard's figures under its label: 10 blocks each, but for the one deleted from shard 0.
  const auto text = f.metrics.expose();
  CHECK(text.find("troupe_store_blocks{shard=\"0\"} 9") != std::string::npos);
  CHECK(text.find("troupe_store_blocks{shard=\"1\"} 10") != std::string::npos);
  CHECK(text.find("troupe_store_blocks{shard=\"2\"} 10") != std::string::npos);

  // On disk: shard i's directory holds exactly the blocks whose key.lo % 3 is i.
  test::stop(f.self, store);
  std::size_t seen = 0;
  for (std::uint32_t i = 0; i < shards; ++i) {
    auto keys = f.keys_in(f.dir.path() / ("shard-" + std::to_string(i) + "-of-3"));
    CHECK(keys.size() == (i == 0 ? 9u : 10u));
    for (const auto& k : keys)
      CHECK(ports::store_shard_of(k, shards) == i);
    seen += keys.size();
  }
  CHECK(seen == n - 1);

  // Opened again with the same count, the store finds every block.
  store = f.open(shards, 3'000'000);
  auto again = test::request<std::vector<store_entry>>(f.self, store, store_list{});
  REQUIRE(again);
  CHECK(again->size() == n - 1);
  test::stop(f.self, store);
}

TEST_CASE("each shard keeps its share of the capacity") {
  sharded_fixture f;
  // Two shards of 5,000 bytes: a 4,000-byte block fits in one, a 6,000-byte block in neither.
  auto store = f.open(2, 10'000);
  CHECK(test::request<store_stats>(f.self, store, store_put{key(0), 4000, bytes(4000, 1), duration{0}}));
  auto big = test::request<store_stats>(f.self, store, store_put{key(1), 6000, bytes(6000, 2), duration{0}});
  REQUIRE_FALSE(big);
  CHECK(runtime::is(big.error(), errc::store_full));
  test::stop(f.self, store);
}

TEST_CASE("a shard that stops fails only its own blocks; the router stops its shards") {
  test::temp_dir a, b;
  runtime::world world{runtime::world_options{runtime::world_mode::real, 42, 2, false, nullptr}};
  caf::scoped_actor self{world.system()};
  auto shard0 = ports::spawn_posix_store(world.system(), {a.path(), 1 << 20, {}});
  auto shard1 = ports::spawn_posix_store(world.system(), {b.path(), 1 << 20, {}});
  auto store = ports::spawn_store_router(world.system(), {shard0, shard1});
  for (std::uint64_t i = 0; i < 6; ++i)
    REQUIRE(test::request<store_stats>(self, store, store_put{key(i), 100, bytes(100, 3), duration{0}}));
  test::stop(self, shard1);
  for (std::uint64_t i = 0; i < 6; ++i) {
    auto got = test::request<store_object>(self, store, store_get{key(i)});
    CHECK(static_cast<bool>(got) == (i % 2 == 0));
  }
  // The whole store's list and stats are not whole without shard 1.
  CHECK_FALSE(test::request<std::vector<store_entry>>(self, store, store_list{}));
  CHECK_FALSE(test::request<store_stats>(self, store, store_stats_atom::value));
  // Stopping the router stops the shard left.
  self->monitor(shard0);
  self->send_exit(store, caf::exit_reason::user_shutdown);
  bool down = false;
  self->receive([&](const caf::down_msg&) { down = true; },
                caf::after(std::chrono::seconds(10)) >> [] {});
  CHECK(down);
}

TEST_CASE("with replicas a block is on its shard and the next, and a stopped shard loses none") {
  sharded_fixture f;
  constexpr std::uint32_t shards = 3;
  constexpr std::uint64_t n = 12;
  auto store = f.open(shards, 3'000'000, 2);
  for (std::uint64_t i = 0; i < n; ++i)
    REQUIRE(test::request<store_stats>(
      f.self, store, store_put{key(i), 500, bytes(500, static_cast<std::uint8_t>(i)), duration{0}}));
  // A list names each block once; stats count every copy.
  auto listed = test::request<std::vector<store_entry>>(f.self, store, store_list{});
  REQUIRE(listed);
  CHECK(listed->size() == n);
  auto sum = test::request<store_stats>(f.self, store, store_stats_atom::value);
  REQUIRE(sum);
  CHECK(sum->objects == 2 * n);
  // A delete removes every copy.
  REQUIRE(test::request<store_stats>(f.self, store, store_delete{key(0)}));
  test::stop(f.self, store);
  std::size_t copies = 0;
  for (std::uint32_t i = 0; i < shards; ++i)
    for (const auto& k : f.keys_in(f.dir.path() / ("shard-" + std::to_string(i) + "-of-3"))) {
      auto holders = ports::store_copies_of(k, shards, 2);
      CHECK(std::find(holders.begin(), holders.end(), i) != holders.end());
      CHECK(k != key(0));
      ++copies;
    }
  CHECK(copies == 2 * (n - 1));

  // Shard 1 stops: every block is still served, from its other copy, and written to it.
  test::temp_dir a, b, c;
  auto s0 = ports::spawn_posix_store(f.world.system(), {a.path(), 1 << 20, {}});
  auto s1 = ports::spawn_posix_store(f.world.system(), {b.path(), 1 << 20, {}});
  auto s2 = ports::spawn_posix_store(f.world.system(), {c.path(), 1 << 20, {}});
  store = ports::spawn_store_router(f.world.system(), {s0, s1, s2}, 2);
  for (std::uint64_t i = 0; i < n; ++i)
    REQUIRE(test::request<store_stats>(f.self, store,
                                       store_put{key(i), 100, bytes(100, 3), duration{0}}));
  test::stop(f.self, s1);
  for (std::uint64_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(test::request<store_object>(f.self, store, store_get{key(i)}));
    CHECK(*test::request<bool>(f.self, store, store_has{key(i)}));
  }
  auto late = key(n + 1);
  REQUIRE(ports::store_shard_of(late, shards) == 1); // its first copy's shard is the stopped one
  CHECK(test::request<store_stats>(f.self, store, store_put{late, 100, bytes(100, 4), duration{0}}));
  CHECK(test::request<store_object>(f.self, store, store_get{late}));
  // A block absent from every copy is a miss, as without replicas.
  auto missing = test::request<store_object>(f.self, store, store_get{key(n + 4)});
  REQUIRE_FALSE(missing);
  CHECK(runtime::is(missing.error(), errc::not_found));
  test::stop(f.self, store);
}

namespace {

/// A shard that can go down and come back: it forwards to its store while `up`, and answers
/// errc::unavailable while not (what a launched cluster's store proxy answers while the
/// shard's process is gone).
store_port switchable(caf::actor_system& sys, store_port inner,
                      std::shared_ptr<std::atomic<bool>> up) {
  return sys.spawn([inner, up](store_port::pointer self) -> store_port::behavior_type {
    auto down = [] { return make_error(errc::unavailable, "the shard is down"); };
    return {
      [=](store_put& p) -> caf::result<store_stats> {
        if (!*up)
          return down();
        return self->delegate(inner, std::move(p));
      },
      [=](const store_get& g) -> caf::result<store_object> {
        if (!*up)
          return down();
        return self->delegate(inner, g);
      },
      [=](const store_has& h) -> caf::result<bool> {
        if (!*up)
          return down();
        return self->delegate(inner, h);
      },
      [=](const store_delete& d) -> caf::result<store_stats> {
        if (!*up)
          return down();
        return self->delegate(inner, d);
      },
      [=](const store_list& l) -> caf::result<std::vector<store_entry>> {
        if (!*up)
          return down();
        return self->delegate(inner, l);
      },
      [=](store_stats_atom a) -> caf::result<store_stats> {
        if (!*up)
          return down();
        return self->delegate(inner, a);
      },
    };
  });
}

double metric(const runtime::registry& r, const std::string& line_start) {
  std::istringstream in{r.expose()};
  for (std::string line; std::getline(in, line);)
    if (line.rfind(line_start + " ", 0) == 0)
      return std::stod(line.substr(line_start.size() + 1));
  return -1;
}

} // namespace

TEST_CASE("a shard that was down gets the blocks it missed copied to it when it answers again") {
  sharded_fixture f;
  constexpr std::uint32_t shards = 3;
  test::temp_dir a, b, c;
  auto s0 = ports::spawn_posix_store(f.world.system(), {a.path(), 1 << 24, {}});
  auto inner1 = ports::spawn_posix_store(f.world.system(), {b.path(), 1 << 24, {}});
  auto s2 = ports::spawn_posix_store(f.world.system(), {c.path(), 1 << 24, {}});
  auto up = std::make_shared<std::atomic<bool>>(true);
  auto s1 = switchable(f.world.system(), inner1, up);
  auto store = ports::spawn_store_router(f.world.system(), {s0, s1, s2}, 2,
                                         std::chrono::seconds(10), &f.metrics);
  auto put = [&](std::uint64_t i, duration ttl = duration{0}) {
    REQUIRE(test::request<store_stats>(
      f.self, store, store_put{key(i), 300, bytes(300, static_cast<std::uint8_t>(i)), ttl}));
  };
  auto on_shard1 = [&](std::uint64_t i) {
    auto copies = ports::store_copies_of(key(i), shards, 2);
    return std::find(copies.begin(), copies.end(), 1u) != copies.end();
  };
  for (std::uint64_t i = 0; i < 6; ++i)
    put(i);
  // Shard 1 goes down: the blocks written meanwhile reach only their other copy.
  *up = false;
  std::vector<std::uint64_t> missed;
  std::uint64_t short_lived = 0;
  for (std::uint64_t i = 6; i < 30; ++i) {
    if (on_shard1(i) && short_lived == 0) {
      short_lived = i;  // expires before shard 1 is back: nothing to copy
      put(i, std::chrono::milliseconds(1));
      continue;
    }
    put(i);
    if (on_shard1(i))
      missed.push_back(i);
  }
  REQUIRE(missed.size() >= 8);
  // (A put is answered by its first copy; its hint is kept once every copy has answered.)
  const double hinted = double(missed.size() + 1);
  for (int i = 0; i < 500 && metric(f.metrics, "troupe_store_repairs_pending") < hinted; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(metric(f.metrics, "troupe_store_repairs_pending") == hinted);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // Back: its next answer (here to a get of a block whose first copy it holds) starts the
  // repair.
  *up = true;
  std::uint64_t probe = 0;
  while (ports::store_shard_of(key(probe), shards) != 1)
    ++probe;
  REQUIRE(probe < 6);
  REQUIRE(test::request<store_object>(f.self, store, store_get{key(probe)}));
  const std::string repaired = R"(troupe_store_repairs_total{outcome="repaired"})";
  for (int i = 0; i < 500 && metric(f.metrics, repaired) < double(missed.size()); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(metric(f.metrics, repaired) == double(missed.size()));
  CHECK(metric(f.metrics, R"(troupe_store_repairs_total{outcome="lost"})") == 0);
  CHECK(metric(f.metrics, "troupe_store_repairs_pending") == 0);
  // Shard 1 holds every block whose copies include it, with its bytes, except the expired one.
  for (std::uint64_t i = 0; i < 30; ++i) {
    CAPTURE(i);
    if (!on_shard1(i) || i == short_lived)
      continue;
    auto got = test::request<store_object>(f.self, inner1, store_get{key(i)});
    REQUIRE(got);
    CHECK(got->payload == bytes(300, static_cast<std::uint8_t>(i)));
  }
  CHECK_FALSE(*test::request<bool>(f.self, inner1, store_has{key(short_lived)}));
  test::stop(f.self, store);
  test::stop(f.self, inner1);
}
