// The block store as a launched cluster's processes reach it (store_bridge.hpp): the store
// port's whole contract (tests/ports/test_store_contract.cpp), run against a store proxy in
// front of a POSIX store and its store front, found through a store registry, once with
// payloads crossing over two fabric endpoints (libfabric tcp on loopback: an instance
// process's and the store process's) and once without a fabric (payloads in the messages).
// Then what the fabric path adds (the offers a get or a put makes are withdrawn once the bytes
// have crossed), and what a store process that dies and comes back means for a proxy: every
// operation answered at once while there is no store, none left waiting on the dead one, the
// next store served, and the registry's mirrored metrics never going back. Last, a store of
// two shards in two stores (as two store processes): each block on its shard, a dead shard
// failing only its own blocks, and each shard's figures under its label.
#include "cluster/launch/control_directory.hpp"
#include "cluster/launch/store_bridge.hpp"
#include "ports/fabric_link.hpp"
#include "runtime/errors.hpp"
#include "ports/store_router.hpp"
#include "runtime/metrics.hpp"

#include "../ports/store_drivers.hpp"

#include <doctest/doctest.h>

#include <sstream>
#include <thread>

namespace troupe::test {

/// Registers `store` and `front` with `registry` as its shard `shard`, and waits until it
/// took them.
inline void register_store(caf::scoped_actor& self, const caf::actor& registry,
                           const caf::actor& store, const caf::actor& front,
                           std::uint32_t shard = 0) {
  self->request(registry, caf::infinite, caf::put_atom::value,
                cluster::store_binding{store, front, shard})
    .receive([](caf::ok_atom) {}, [](caf::error& e) { FAIL(caf::to_string(e)); });
  self->request(registry, caf::infinite, caf::get_atom::value, shard)
    .receive([&](const cluster::store_binding& b) { REQUIRE(b.store == store); },
             [](caf::error& e) { FAIL(caf::to_string(e)); });
}

/// The POSIX store (as the store process holds it: the base's `store`) behind a store front,
/// registered with a store registry, and a store proxy, which `call` asks; `Fabric`: payloads
/// over fabric endpoints, else in the messages.
template <bool Fabric>
struct bridged_store_driver : posix_store_driver {
  runtime::fabric_link_port control_link, instance_link;
  caf::actor front;
  caf::actor registry;
  runtime::store_port proxy;

  explicit bridged_store_driver(std::uint64_t capacity) : posix_store_driver(capacity) {
    if (Fabric) {
      ports::fabric_params p;
      p.provider = "tcp";
      auto a = ports::spawn_fabric_link(world.system(), p);
      auto b = ports::spawn_fabric_link(world.system(), p);
      REQUIRE(a);
      REQUIRE(b);
      control_link = *a;
      instance_link = *b;
      front = cluster::spawn_store_front(world.system(), store, control_link);
    }
    registry = cluster::spawn_store_registry(world.system(), 1);
    register_store(self, registry, caf::actor_cast<caf::actor>(store), front);
    proxy = cluster::spawn_store_proxy(world.system(), registry, instance_link);
  }

  ~bridged_store_driver() {
    for (auto h : {caf::actor_cast<caf::actor>(proxy), front, registry,
                   caf::actor_cast<caf::actor>(control_link),
                   caf::actor_cast<caf::actor>(instance_link)})
      if (h)
        self->send_exit(h, caf::exit_reason::user_shutdown);
  }

  template <class T, class... Ts>
  caf::expected<T> call(Ts... xs) {
    return request<T>(self, proxy, std::move(xs)...);
  }
};

} // namespace troupe::test

#define STORE_IMPLEMENTATIONS \
  troupe::test::bridged_store_driver<true>, troupe::test::bridged_store_driver<false>
#include "../ports/test_store_contract.cpp"

TEST_CASE("a store get or put over the fabric leaves no offer behind") {
  test::bridged_store_driver<true> d(1 << 20);
  auto activity = [&](const runtime::fabric_link_port& link) {
    runtime::fabric_activity out;
    d.self->request(link, caf::infinite, caf::get_atom::value)
      .receive([&](runtime::fabric_activity& a) { out = a; },
               [](caf::error& e) { FAIL(caf::to_string(e)); });
    return out;
  };
  for (std::uint64_t i = 0; i < 4; ++i) {
    REQUIRE(d.call<store_stats>(store_put{key(i), 1000, bytes(1000, 1), duration{0}}));
    auto got = d.call<store_object>(store_get{key(i)});
    REQUIRE(got);
    CHECK(got->payload == bytes(1000, 1));
    CHECK(got->checksum == XXH3_64bits(got->payload.data(), got->payload.size()));
  }
  // The instance's link served four puts' payloads, the control's four gets'; each
  // withdrawal follows its reply by a message, so the counts settle shortly after.
  for (int tries = 0; tries < 200; ++tries) {
    if (activity(d.instance_link).offers == 0 && activity(d.control_link).offers == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(activity(d.instance_link).served == 4);
  CHECK(activity(d.control_link).served == 4);
  CHECK(activity(d.instance_link).offers == 0);
  CHECK(activity(d.control_link).offers == 0);
}

TEST_CASE("a proxy with 4 transfers at a time serves 64 puts and then 64 gets sent at once") {
  test::bridged_store_driver<true> d(64 << 20);
  auto proxy = cluster::spawn_store_proxy(d.world.system(), d.registry, d.instance_link,
                                          std::chrono::seconds(30), 4);
  constexpr std::uint64_t n = 64;
  std::vector<decltype(d.self->request(proxy, caf::infinite, store_get{}))> gets;
  std::vector<decltype(d.self->request(proxy, caf::infinite, store_put{}))> puts;
  for (std::uint64_t i = 0; i < n; ++i)
    puts.push_back(d.self->request(proxy, caf::infinite,
                                   store_put{key(i), 3000, bytes(3000, static_cast<std::uint8_t>(i)),
                                             duration{0}}));
  std::size_t stored = 0;
  for (auto& p : puts)
    p.receive([&](store_stats&) { ++stored; }, [](caf::error& e) { FAIL(caf::to_string(e)); });
  CHECK(stored == n);
  for (std::uint64_t i = 0; i < n; ++i)
    gets.push_back(d.self->request(proxy, caf::infinite, store_get{key(i)}));
  std::size_t right = 0;
  for (std::uint64_t i = 0; i < n; ++i)
    gets[i].receive(
      [&](store_object& o) {
        right += o.payload == bytes(3000, static_cast<std::uint8_t>(i)) ? 1 : 0;
      },
      [](caf::error& e) { FAIL(caf::to_string(e)); });
  CHECK(right == n);
  d.self->send_exit(proxy, caf::exit_reason::user_shutdown);
}

namespace {

/// A store that takes every get and never answers it (a store process about to die).
caf::actor spawn_silent_store(caf::actor_system& sys) {
  return sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    return {[self](runtime::store_get&) { return self->make_response_promise<store_object>(); }};
  });
}

} // namespace

TEST_CASE("a proxy answers at once while there is no store, and when its store dies") {
  test::bridged_store_driver<true> d(1 << 20);
  auto& sys = d.world.system();
  auto registry = cluster::spawn_store_registry(sys, 1);
  auto proxy = cluster::spawn_store_proxy(sys, registry, d.instance_link);
  // Each answer must come long before the proxy's 30 s timeout: a timeout here is a failure.
  auto get = [&](std::uint64_t i) {
    return test::request<store_object>(d.self, proxy, store_get{key(i)});
  };
  auto answered_within = [&](auto&& f) {
    auto start = std::chrono::steady_clock::now();
    auto r = f();
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    return r;
  };

  // No store registered yet: unavailable, not a wait.
  auto none = answered_within([&] { return get(1); });
  REQUIRE_FALSE(none);
  CHECK(runtime::is(none.error(), errc::unavailable));

  // A store that dies with gets in flight: they all fail as soon as it is down. (It has no
  // front, as a store process without a fabric: the gets go to the store itself.)
  auto silent = spawn_silent_store(sys);
  test::register_store(d.self, registry, silent, {});
  std::vector<decltype(d.self->request(proxy, caf::infinite, store_get{}))> stuck;
  for (std::uint64_t i = 0; i < 3; ++i)
    stuck.push_back(d.self->request(proxy, std::chrono::seconds(10), store_get{key(i)}));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  d.self->send_exit(silent, caf::exit_reason::kill);
  std::size_t unavailable = 0;
  auto start = std::chrono::steady_clock::now();
  for (auto& r : stuck)
    r.receive([](store_object&) { FAIL("a silent store answered"); },
              [&](caf::error& e) { unavailable += runtime::is(e, errc::unavailable) ? 1 : 0; });
  CHECK(unavailable == 3);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));

  // The store is gone and nothing replaced it: unavailable at once again.
  auto gone = answered_within([&] { return get(1); });
  REQUIRE_FALSE(gone);
  CHECK(runtime::is(gone.error(), errc::unavailable));

  // The store process comes back: the same proxy uses it, no new handle given to it, its
  // payloads over the fabric again.
  test::register_store(d.self, registry, caf::actor_cast<caf::actor>(d.store), d.front);
  REQUIRE(test::request<store_stats>(d.self, proxy,
                                     store_put{key(7), 500, bytes(500, 7), duration{0}}));
  auto back = test::request<store_object>(d.self, proxy, store_get{key(7)});
  REQUIRE(back);
  CHECK(back->payload == bytes(500, 7));
  for (auto h : {caf::actor_cast<caf::actor>(proxy), registry})
    d.self->send_exit(h, caf::exit_reason::user_shutdown);
}

TEST_CASE("the registry mirrors its store's figures, and they never go back after a restart") {
  test::posix_store_driver d(1 << 20);
  auto& sys = d.world.system();
  runtime::registry metrics;
  auto registry = cluster::spawn_store_registry(sys, 1, &metrics, std::chrono::milliseconds(20));
  auto value = [&](const std::string& name) {
    double v = -1;
    std::istringstream text{metrics.expose()};
    for (std::string line; std::getline(text, line);)
      if (line.rfind(name + " ", 0) == 0)
        v = std::stod(line.substr(name.size() + 1));
    return v;
  };
  auto settle = [&](const std::string& name, double want) {
    for (int i = 0; i < 250 && value(name) != want; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return value(name);
  };
  const std::string blocks = "troupe_store_blocks";
  const std::string hits = "troupe_store_reads_total{outcome=\"hit\"}";
  test::register_store(d.self, registry, caf::actor_cast<caf::actor>(d.store), {});
  for (std::uint64_t i = 0; i < 3; ++i) {
    REQUIRE(test::request<store_stats>(d.self, d.store,
                                       store_put{key(i), 100, bytes(100, 1), duration{0}}));
    REQUIRE(test::request<store_object>(d.self, d.store, store_get{key(i)}));
  }
  CHECK(settle(blocks, 3) == 3);
  CHECK(settle(hits, 3) == 3);

  // The store restarts on its directory (a new process): it counts its reads from zero, the
  // mirrored counter goes on from where it was.
  test::stop(d.self, d.store);
  d.store = d.spawn(1 << 20);
  test::register_store(d.self, registry, caf::actor_cast<caf::actor>(d.store), {});
  REQUIRE(test::request<store_object>(d.self, d.store, store_get{key(0)}));
  CHECK(settle(hits, 4) == 4);
  CHECK(settle(blocks, 3) == 3);
  d.self->send_exit(registry, caf::exit_reason::user_shutdown);
}

TEST_CASE("a store of two shards: each block on its shard, a dead shard fails only its own") {
  // Shard 0 is the driver's store (behind a front, over the fabric); shard 1 a second store
  // in a directory of its own, registered without a front (payloads in the messages).
  test::bridged_store_driver<true> d(1 << 20);
  auto& sys = d.world.system();
  test::temp_dir second_dir;
  auto spawn_second = [&] {
    ports::posix_store_params p;
    p.directory = second_dir.path();
    p.capacity = 1 << 20;
    return ports::spawn_posix_store(sys, std::move(p));
  };
  auto second = spawn_second();
  runtime::registry metrics;
  auto registry = cluster::spawn_store_registry(sys, 2, &metrics, std::chrono::milliseconds(20));
  test::register_store(d.self, registry, caf::actor_cast<caf::actor>(d.store), d.front, 0);
  test::register_store(d.self, registry, caf::actor_cast<caf::actor>(second), {}, 1);
  // A third shard does not exist: the registry says so, and keeps the two.
  d.self->request(registry, caf::infinite, caf::put_atom::value,
                  cluster::store_binding{caf::actor_cast<caf::actor>(second), {}, 2})
    .receive([](caf::ok_atom) { FAIL("a store for shard 2 of 2 was taken"); },
             [](caf::error& e) { CHECK(runtime::is(e, errc::invalid_argument)); });

  auto store = cluster::spawn_cluster_store(sys, registry, 2, 1, d.instance_link);
  constexpr std::uint64_t n = 12;
  for (std::uint64_t i = 0; i < n; ++i)
    REQUIRE(test::request<store_stats>(
      d.self, store, store_put{key(i), 200, bytes(200, static_cast<std::uint8_t>(i)), duration{0}}));
  // Each block went to shard key.lo % 2 and to no other.
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto& owner = ports::store_shard_of(key(i), 2) == 0 ? d.store : second;
    const auto& other = ports::store_shard_of(key(i), 2) == 0 ? second : d.store;
    CHECK(*test::request<bool>(d.self, owner, store_has{key(i)}));
    CHECK_FALSE(*test::request<bool>(d.self, other, store_has{key(i)}));
  }
  auto listed = test::request<std::vector<store_entry>>(d.self, store, store_list{});
  REQUIRE(listed);
  REQUIRE(listed->size() == n);
  CHECK(std::is_sorted(listed->begin(), listed->end(),
                       [](const store_entry& a, const store_entry& b) { return a.key < b.key; }));
  auto sum = test::request<store_stats>(d.self, store, store_stats_atom::value);
  REQUIRE(sum);
  CHECK(sum->objects == n);
  CHECK(sum->capacity == 2u << 20);

  // Each shard's figures under its label.
  auto blocks_of = [&](int shard) {
    const std::string name = "troupe_store_blocks{shard=\"" + std::to_string(shard) + "\"} ";
    std::istringstream text{metrics.expose()};
    for (std::string line; std::getline(text, line);)
      if (line.rfind(name, 0) == 0)
        return std::stod(line.substr(name.size()));
    return -1.0;
  };
  for (int i = 0; i < 250 && blocks_of(0) + blocks_of(1) != double(n); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(blocks_of(0) == 6);
  CHECK(blocks_of(1) == 6);

  // Shard 1's process dies: its blocks fail at once (unavailable: a miss), shard 0's are
  // served, and the whole-store list and stats say the store is not whole.
  test::stop(d.self, runtime::store_port{second});
  for (std::uint64_t i = 0; i < n; ++i) {
    auto got = test::request<store_object>(d.self, store, store_get{key(i)});
    if (ports::store_shard_of(key(i), 2) == 0) {
      REQUIRE(got);
      CHECK(got->payload == bytes(200, static_cast<std::uint8_t>(i)));
    } else {
      REQUIRE_FALSE(got);
      CHECK(runtime::is(got.error(), errc::unavailable));
    }
  }
  CHECK_FALSE(test::request<store_stats>(d.self, store, store_stats_atom::value));

  // It comes back on its directory: its blocks are served again through the same store.
  second = spawn_second();
  test::register_store(d.self, registry, caf::actor_cast<caf::actor>(second), {}, 1);
  for (std::uint64_t i = 0; i < n; ++i) {
    auto got = test::request<store_object>(d.self, store, store_get{key(i)});
    REQUIRE(got);
    CHECK(got->payload == bytes(200, static_cast<std::uint8_t>(i)));
  }
  for (auto h : {caf::actor_cast<caf::actor>(store), caf::actor_cast<caf::actor>(second),
                 registry})
    d.self->send_exit(h, caf::exit_reason::user_shutdown);
}
