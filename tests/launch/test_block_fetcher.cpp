// The block fetcher (cluster/launch/block_fetcher.hpp): a fetching store's gets go through a
// fetcher that reads each block from the store into a slot of POSIX shared memory; the bytes
// arrive whole, more gets than slots wait their turn, a missing block stays missing, and a
// fetching store without a fetcher (none registered yet, or one that died) reads from the
// store itself. The actors run in one process here, the segment mapped twice as two
// processes map it.
#include "cluster/launch/block_fetcher.hpp"
#include "runtime/errors.hpp"

#include "../ports/store_drivers.hpp"

#include <doctest/doctest.h>

#include <xxhash.h>

#include <filesystem>
#include <thread>

using namespace troupe;
using namespace troupe::runtime;
using test::bytes;
using test::key;

namespace {

constexpr std::uint64_t block = 4096;

struct fetcher_fixture : test::posix_store_driver {
  caf::actor registry = cluster::spawn_fetcher_registry(world.system());
  std::shared_ptr<cluster::fetch_counters> fetched = std::make_shared<cluster::fetch_counters>();
  std::shared_ptr<cluster::fetch_counters> client = std::make_shared<cluster::fetch_counters>();

  fetcher_fixture() : posix_store_driver(1 << 24) {
    for (std::uint64_t i = 0; i < 40; ++i)
      REQUIRE(test::request<store_stats>(
        self, store, store_put{key(i), block, bytes(block, static_cast<std::uint8_t>(i)), duration{0}}));
  }

  ~fetcher_fixture() { self->send_exit(registry, caf::exit_reason::user_shutdown); }

  /// A fetcher over this store, registered for "prefill/0".
  caf::actor start_fetcher() {
    auto f = cluster::spawn_block_fetcher(world.system(), store, fetched);
    self->send(registry, caf::put_atom::value, std::string("prefill/0"), f);
    return f;
  }

  /// Waits until `client` has read `n` blocks through a fetcher or `f` says so.
  template <class F>
  bool until(F f) {
    for (int i = 0; i < 500; ++i) {
      if (f())
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  /// Our shared memory segments in /dev/shm (their names are unlinked once mapped).
  static std::size_t segments_left() {
    std::size_t n = 0;
    const auto prefix = "troupe-fetch-" + std::to_string(::getpid()) + "-";
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      n += e.path().filename().string().rfind(prefix, 0) == 0 ? 1 : 0;
    return n;
  }
};

} // namespace

TEST_CASE("gets go through the fetcher's shared memory, more gets than slots included") {
  fetcher_fixture f;
  auto fetcher = f.start_fetcher();
  // Four slots for forty gets sent at once: the rest wait for a slot to come back.
  auto store = cluster::spawn_fetching_store(f.world.system(), f.store, f.registry, "prefill/0",
                                             block, 4, f.client);
  // The fetching store joins once the registry has told it of the fetcher.
  REQUIRE(f.until([&] {
    auto got = test::request<store_object>(f.self, store, store_get{key(0)});
    return got && f.client->fetched > 0;
  }));
  CHECK(f.segments_left() == 0);
  std::vector<decltype(f.self->request(store, caf::infinite, store_get{}))> gets;
  for (std::uint64_t i = 0; i < 40; ++i)
    gets.push_back(f.self->request(store, caf::infinite, store_get{key(i)}));
  const auto before = f.client->fetched.load();
  std::size_t right = 0;
  for (std::uint64_t i = 0; i < 40; ++i)
    gets[i].receive(
      [&](store_object& o) {
        const auto want = bytes(block, static_cast<std::uint8_t>(i));
        right += o.payload == want && o.size == block
                     && o.checksum == XXH3_64bits(want.data(), want.size())
                   ? 1
                   : 0;
      },
      [](caf::error& e) { FAIL(caf::to_string(e)); });
  CHECK(right == 40);
  CHECK(f.client->fetched - before == 40);
  CHECK(f.fetched->fetched >= 40);
  // A block the store does not have is missing, not read around the fetcher.
  auto missing = test::request<store_object>(f.self, store, store_get{key(99)});
  REQUIRE_FALSE(missing);
  CHECK(runtime::is(missing.error(), errc::not_found));
  // Puts and metadata go to the store.
  REQUIRE(test::request<store_stats>(f.self, store, store_put{key(50), 10, bytes(10, 5), duration{0}}));
  CHECK(*test::request<bool>(f.self, store, store_has{key(50)}));
  for (auto h : {caf::actor_cast<caf::actor>(store), fetcher})
    f.self->send_exit(h, caf::exit_reason::user_shutdown);
}

TEST_CASE("without a fetcher, or when it dies, the fetching store reads from the store") {
  fetcher_fixture f;
  auto store = cluster::spawn_fetching_store(f.world.system(), f.store, f.registry, "prefill/0",
                                             block, 4, f.client);
  // None registered: the store answers.
  auto got = test::request<store_object>(f.self, store, store_get{key(3)});
  REQUIRE(got);
  CHECK(got->payload == bytes(block, 3));
  CHECK(f.client->direct == 1);
  CHECK(f.client->fetched == 0);
  // A fetcher comes: gets go through it.
  auto fetcher = f.start_fetcher();
  REQUIRE(f.until([&] {
    auto r = test::request<store_object>(f.self, store, store_get{key(4)});
    return r && r->payload == bytes(block, 4) && f.client->fetched > 0;
  }));
  // It dies: every get is still answered, by the store.
  f.self->send_exit(fetcher, caf::exit_reason::kill);
  const auto direct = f.client->direct.load();
  for (std::uint64_t i = 5; i < 15; ++i) {
    auto r = test::request<store_object>(f.self, store, store_get{key(i)});
    REQUIRE(r);
    CHECK(r->payload == bytes(block, static_cast<std::uint8_t>(i)));
  }
  CHECK(f.client->direct - direct == 10);
  f.self->send_exit(store, caf::exit_reason::user_shutdown);
}

TEST_CASE("a block larger than a slot is never handed over in shared memory") {
  fetcher_fixture f;
  auto fetcher = f.start_fetcher();
  // Slots of half a block: the fetcher refuses each, the store answers.
  auto store = cluster::spawn_fetching_store(f.world.system(), f.store, f.registry, "prefill/0",
                                             block / 2, 4, f.client);
  for (std::uint64_t i = 0; i < 20; ++i) {
    auto r = test::request<store_object>(f.self, store, store_get{key(i)});
    REQUIRE(r);
    CHECK(r->payload == bytes(block, static_cast<std::uint8_t>(i)));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(f.client->direct == 20);
  CHECK(f.client->fetched == 0);
  CHECK(f.fetched->fetched == 0);
  for (auto h : {caf::actor_cast<caf::actor>(store), fetcher})
    f.self->send_exit(h, caf::exit_reason::user_shutdown);
}

TEST_CASE("gets a fetcher never answers go to the store once another fetcher registers") {
  // A fetcher whose process died may never answer: its death does not always reach the
  // instance, whose messages to it go through the control process. Here it is a stand-in that
  // joins through a real fetcher and answers the first get, then keeps every later one.
  fetcher_fixture f;
  auto real = cluster::spawn_block_fetcher(f.world.system(), f.store, f.fetched);
  auto kept = std::make_shared<std::vector<caf::response_promise>>();
  auto silent = f.world.system().spawn([real, kept](caf::event_based_actor* self) -> caf::behavior {
    auto answered = std::make_shared<bool>(false);
    return {
      [self, real](cluster::fetcher_join& j) { self->delegate(real, std::move(j)); },
      [self, real, kept, answered](cluster::fetch_block& b) {
        if (*answered) {
          kept->push_back(self->make_response_promise());  // never delivered
          return;
        }
        *answered = true;
        self->delegate(real, std::move(b));
      },
      [self, real](cluster::fetch_release_atom a, const std::string& s, std::uint32_t slot) {
        self->send(real, a, s, slot);
      },
    };
  });
  f.self->send(f.registry, caf::put_atom::value, std::string("prefill/0"), silent);
  auto store = cluster::spawn_fetching_store(f.world.system(), f.store, f.registry, "prefill/0",
                                             block, 4, f.client);
  REQUIRE(f.until([&] {
    auto r = test::request<store_object>(f.self, store, store_get{key(0)});
    return r && f.client->fetched == 1;
  }));
  const auto direct = f.client->direct.load();
  std::vector<decltype(f.self->request(store, caf::infinite, store_get{}))> gets;
  for (std::uint64_t i = 1; i <= 3; ++i)
    gets.push_back(f.self->request(store, caf::infinite, store_get{key(i)}));
  REQUIRE(f.until([&] { return kept->size() == 3; }));
  // Another fetcher registers under the name: the three waiting gets are the store's now.
  auto next = f.start_fetcher();
  std::size_t right = 0;
  for (std::uint64_t i = 1; i <= 3; ++i)
    gets[i - 1].receive(
      [&](store_object& o) { right += o.payload == bytes(block, static_cast<std::uint8_t>(i)); },
      [](caf::error& e) { FAIL(caf::to_string(e)); });
  CHECK(right == 3);
  CHECK(f.client->direct - direct == 3);
  for (auto h : {caf::actor_cast<caf::actor>(store), silent, real, next})
    f.self->send_exit(h, caf::exit_reason::user_shutdown);
  // However the join with the new fetcher ended, no segment name is left behind.
  CHECK(f.until([&] { return f.segments_left() == 0; }));
}

TEST_CASE("a segment its client never mapped leaves no name when the client or the fetcher goes") {
  // The client removes a segment's name once it has mapped it; one that never does (it died,
  // or the answer came for a fetcher it no longer uses) must not leave it in /dev/shm.
  fetcher_fixture f;
  auto fetcher = cluster::spawn_block_fetcher(f.world.system(), f.store, f.fetched);
  auto join = [&](caf::scoped_actor& client) {
    bool joined = false;
    client->request(fetcher, std::chrono::seconds(10), cluster::fetcher_join{block, 2})
      .receive([&](const cluster::fetcher_segment&) { joined = true; },
               [](const caf::error& e) { FAIL(caf::to_string(e)); });
    return joined;
  };
  {
    caf::scoped_actor client{f.world.system()};
    REQUIRE(join(client));
    CHECK(f.segments_left() == 1);
  }
  CHECK(f.until([&] { return f.segments_left() == 0; }));
  REQUIRE(join(f.self));
  CHECK(f.segments_left() == 1);
  f.self->send_exit(fetcher, caf::exit_reason::kill);
  CHECK(f.until([&] { return f.segments_left() == 0; }));
}
