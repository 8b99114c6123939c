// Tests of cluster/launch/launched_pools: the stand-ins through which the control process's
// autoscaler acts on a launched cluster's pools. A scoped actor plays the launcher (it takes
// the orders and reports the instance processes), small actors play an instance process's
// balancer relay and engine; the autoscaler's side is the supervisor protocol it speaks.
#include "cluster/launch/launched_pools.hpp"

#include "actors/engine/prefill_engine.hpp"
#include "runtime/supervisor.hpp"
#include "runtime/world.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

using namespace troupe;
using namespace troupe::cluster;
using namespace std::chrono_literals;

namespace {

using children = std::vector<runtime::child_info>;
using answer_atom = caf::atom_constant<caf::atom("answer")>;

/// Asks `dest` with `xs...` as the autoscaler does (an event-based request) and sends the
/// answer to `to` as (answer_atom, T) — (answer_atom, caf::ok_atom) for an empty one — or
/// (answer_atom, caf::error), so that the test can go on playing the launcher meanwhile.
template <class T, class... Ts>
void ask(caf::actor_system& sys, caf::actor to, caf::actor dest, Ts... xs) {
  sys.spawn([=](caf::event_based_actor* self) {
    auto failed = [self, to](caf::error& e) { self->send(to, answer_atom::value, std::move(e)); };
    if constexpr (std::is_same_v<T, caf::ok_atom>)
      self->request(dest, caf::infinite, xs...)
        .then([self, to]() { self->send(to, answer_atom::value, caf::ok_atom::value); }, failed);
    else
      self->request(dest, caf::infinite, xs...)
        .then([self, to](T& x) { self->send(to, answer_atom::value, std::move(x)); }, failed);
  });
}

struct fixture {
  runtime::world world{runtime::world_options{runtime::world_mode::real, 1, 2, false, nullptr}};
  caf::scoped_actor launcher{world.system()};
  caf::scoped_actor autoscaler{world.system()};
  caf::actor root = spawn_launched_pools(world.system(), "prefill-pool", "decode-pool");

  ~fixture() { autoscaler->send_exit(root, caf::exit_reason::user_shutdown); }

  caf::expected<children> list(const caf::actor& who) {
    caf::expected<children> out{children{}};
    autoscaler->request(who, 5s, runtime::which_children_atom::value)
      .receive([&](const children& c) { out = c; }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  caf::actor pool(const std::string& name) {
    auto pools = list(root);
    REQUIRE(pools);
    for (auto& c : *pools)
      if (c.id == name)
        return c.handle;
    FAIL("no pool " << name);
    return {};
  }

  /// The launcher's list; returns once the pools have it (the root forwards it to them before
  /// it answers the launcher's next request).
  void report(std::vector<launched_instance> all) {
    launcher->send(root, instances_atom::value, std::move(all));
    launcher->request(root, 5s, caf::get_atom::value, std::string("none"))
      .receive([](const caf::actor&) {}, [](caf::error&) { FAIL("no barrier"); });
  }

  /// The launcher's next order: (start?, role, index).
  std::tuple<bool, std::string, std::uint32_t> order() {
    std::tuple<bool, std::string, std::uint32_t> o{false, "", 0};
    launcher->receive(
      [&](scale_start_atom, const std::string& role, std::uint32_t i) { o = {true, role, i}; },
      [&](scale_stop_atom, const std::string& role, std::uint32_t i) { o = {false, role, i}; },
      caf::after(5s) >> [] { FAIL("no order"); });
    return o;
  }

  /// The answer to an `ask` of the autoscaler's.
  template <class T>
  caf::expected<T> answer() {
    caf::expected<T> out{caf::make_error(caf::sec::request_timeout)};
    autoscaler->receive([&](answer_atom, T& x) { out = std::move(x); },
                        [&](answer_atom, caf::error& e) { out = std::move(e); },
                        caf::after(5s) >> [] { FAIL("no answer"); });
    return out;
  }

  caf::actor me() { return caf::actor_cast<caf::actor>(autoscaler); }

  /// The members of a pool, "id:valid handle".
  std::vector<std::string> members(const caf::actor& p) {
    std::vector<std::string> out;
    auto c = list(p);
    REQUIRE(c);
    for (auto& x : *c)
      out.push_back(x.id + (x.handle ? ":up" : ":down"));
    return out;
  }
};

caf::behavior fake_engine(caf::event_based_actor*) {
  return {[](actors::engine_stats_atom) {
    actors::engine_stats s;
    s.tokens = 4321;
    return s;
  }};
}

caf::behavior fake_relay(caf::event_based_actor*, caf::actor engine) {
  return {[engine](caf::get_atom) { return engine; }};
}

} // namespace

TEST_CASE("the pools are listed once a launcher has registered, with its instance processes") {
  fixture f;
  // No launcher: no pools to decide on.
  CHECK_FALSE(f.list(f.root));
  f.launcher->request(f.root, 5s, launcher_atom::value, caf::actor_cast<caf::actor>(f.launcher))
    .receive([](caf::ok_atom) {}, [](caf::error&) { FAIL("not registered"); });
  f.report({{"prefill", 0, "running"}, {"decode", 0, "running"}, {"decode", 1, "restarting"},
            {"decode", 2, "moving"}});
  auto pools = f.list(f.root);
  REQUIRE(pools);
  REQUIRE(pools->size() == 2);
  CHECK((*pools)[0].id == "prefill-pool");
  CHECK((*pools)[1].id == "decode-pool");
  CHECK(f.members(f.pool("prefill-pool")) == std::vector<std::string>{"prefill-pool/0:up"});
  // A process that does not run is a member without a handle: down capacity. One moving to
  // another host keeps its handle: the autoscaler counts it as starting, not as down (it would
  // replace it and retire it).
  CHECK(f.members(f.pool("decode-pool"))
        == std::vector<std::string>{"decode-pool/0:up", "decode-pool/1:down", "decode-pool/2:up"});
  // A launcher that goes away (it stopped, or its process died): no pools again.
  {
    caf::scoped_actor other{f.world.system()};
    other->request(f.root, 5s, launcher_atom::value, caf::actor_cast<caf::actor>(other))
      .receive([](caf::ok_atom) {}, [](caf::error&) { FAIL("not registered"); });
  }
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (f.list(f.root) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  CHECK_FALSE(f.list(f.root));
}

TEST_CASE("start_child orders a process and answers once the launcher lists it") {
  fixture f;
  f.launcher->request(f.root, 5s, launcher_atom::value, caf::actor_cast<caf::actor>(f.launcher))
    .receive([](caf::ok_atom) {}, [](caf::error&) {});
  f.report({{"prefill", 0, "running"}, {"decode", 0, "running"}});
  auto decode = f.pool("decode-pool");
  auto spec = [](std::string id) {
    return runtime::child_spec{std::move(id), [](caf::local_actor*) { return caf::actor{}; }};
  };
  ask<caf::actor>(f.world.system(), f.me(), decode, runtime::start_child_atom::value,
                  spec("decode-pool/2"));
  CHECK(f.order() == std::tuple<bool, std::string, std::uint32_t>{true, "decode", 2});
  // A list from before the order does not name it: still ordered, not listed, not answered.
  f.report({{"prefill", 0, "running"}, {"decode", 0, "running"}});
  CHECK(f.members(decode) == std::vector<std::string>{"decode-pool/0:up"});
  f.report({{"prefill", 0, "running"}, {"decode", 0, "running"}, {"decode", 2, "running"}});
  auto started = f.answer<caf::actor>();
  REQUIRE(started);
  CHECK(*started);
  CHECK(f.members(decode) == std::vector<std::string>{"decode-pool/0:up", "decode-pool/2:up"});
  // A number in use is refused.
  f.autoscaler->request(decode, 5s, runtime::start_child_atom::value, spec("decode-pool/2"))
    .receive([](const caf::actor&) { FAIL("started twice"); }, [](caf::error&) {});
  // One the launcher could not start is an error.
  ask<caf::actor>(f.world.system(), f.me(), decode, runtime::start_child_atom::value,
                  spec("decode-pool/3"));
  CHECK(f.order() == std::tuple<bool, std::string, std::uint32_t>{true, "decode", 3});
  f.report({{"decode", 0, "running"}, {"decode", 2, "running"}, {"decode", 3, "failed"}});
  CHECK_FALSE(f.answer<caf::actor>());
  CHECK(f.members(decode) == std::vector<std::string>{"decode-pool/0:up", "decode-pool/2:up"});
}

TEST_CASE("an instance's engine is its process's; its drain is its process's stop") {
  fixture f;
  f.launcher->request(f.root, 5s, launcher_atom::value, caf::actor_cast<caf::actor>(f.launcher))
    .receive([](caf::ok_atom) {}, [](caf::error&) {});
  f.report({{"prefill", 0, "running"}, {"decode", 0, "running"}, {"decode", 1, "running"}});
  auto decode = f.pool("decode-pool");
  auto node = [&](const std::string& id) {
    auto c = f.list(decode);
    REQUIRE(c);
    for (auto& x : *c)
      if (x.id == id)
        return x.handle;
    return caf::actor{};
  };
  auto one = node("decode-pool/1");
  REQUIRE(one);
  // Before its relay registered (its engine not announced): no engine child.
  CHECK(f.list(one)->empty());
  auto engine = f.world.system().spawn(fake_engine);
  auto relay = f.world.system().spawn(fake_relay, engine);
  f.launcher->send(f.root, caf::put_atom::value, std::string("decode/1"), relay);
  auto rows = f.list(one);
  REQUIRE(rows);
  REQUIRE(rows->size() == 1);
  CHECK((*rows)[0].id == "engine");
  auto stand_in = (*rows)[0].handle;
  f.autoscaler->request(stand_in, 5s, actors::engine_stats_atom::value)
    .receive([](const actors::engine_stats& s) { CHECK(s.tokens == 4321); },
             [](caf::error&) { FAIL("no stats"); });
  // The drain: the launcher is told to stop decode/1; the process reports what it forwarded
  // and exits; once the launcher no longer lists it, the drain answers with that count.
  ask<std::uint64_t>(f.world.system(), f.me(), stand_in, actors::drain_atom::value,
                     runtime::duration{1s});
  CHECK(f.order() == std::tuple<bool, std::string, std::uint32_t>{false, "decode", 1});
  f.report({{"prefill", 0, "running"}, {"decode", 0, "running"}, {"decode", 1, "draining"}});
  CHECK(f.members(decode)
        == std::vector<std::string>{"decode-pool/0:up", "decode-pool/1:down"});
  f.launcher->request(f.root, 5s, left_atom::value, std::string("decode/1"), std::uint64_t{3})
    .receive([](caf::ok_atom) {}, [](caf::error&) { FAIL("not taken"); });
  f.report({{"prefill", 0, "running"}, {"decode", 0, "running"}});
  auto forwarded = f.answer<std::uint64_t>();
  REQUIRE(forwarded);
  CHECK(*forwarded == 3);
  // stop_child after the drain: gone already, done.
  f.autoscaler->request(decode, 5s, runtime::stop_child_atom::value, std::string("decode-pool/1"))
    .receive([]() {}, [](caf::error&) { FAIL("stop_child failed"); });
  // stop_child of a running one: a stop order, answered once it is no longer listed.
  ask<caf::ok_atom>(f.world.system(), f.me(), decode, runtime::stop_child_atom::value,
                    std::string("decode-pool/0"));
  CHECK(f.order() == std::tuple<bool, std::string, std::uint32_t>{false, "decode", 0});
  f.report({{"prefill", 0, "running"}});
  CHECK(f.answer<caf::ok_atom>());
  CHECK(f.members(decode).empty());
  for (auto& a : {engine, relay})
    f.autoscaler->send_exit(a, caf::exit_reason::user_shutdown);
}
