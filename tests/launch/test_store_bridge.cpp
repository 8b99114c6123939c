// The block store as a launched cluster's instance processes reach it (store_bridge.hpp): the
// store port's whole contract (tests/ports/test_store_contract.cpp), run against a store proxy
// in front of a POSIX store and its store front, once with payloads crossing over two fabric
// endpoints (libfabric tcp on loopback: an instance process's and the control process's) and
// once without a fabric (payloads in the messages). Then what the fabric path adds: the
// offers a get or a put makes are withdrawn once the bytes have crossed.
#include "cluster/launch/store_bridge.hpp"
#include "ports/fabric_link.hpp"

#include "../ports/store_drivers.hpp"

#include <doctest/doctest.h>

#include <thread>

namespace troupe::test {

/// The POSIX store (as the control process holds it: the base's `store`) behind a store
/// front and a store proxy, which `call` asks; `Fabric`: payloads over fabric endpoints, else
/// in the messages.
template <bool Fabric>
struct bridged_store_driver : posix_store_driver {
  runtime::fabric_link_port control_link, instance_link;
  caf::actor front;
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
    proxy = cluster::spawn_store_proxy(world.system(), store, front, instance_link);
  }

  ~bridged_store_driver() {
    for (auto h : {caf::actor_cast<caf::actor>(proxy), front,
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
  auto proxy = cluster::spawn_store_proxy(d.world.system(), d.store, d.front, d.instance_link,
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
