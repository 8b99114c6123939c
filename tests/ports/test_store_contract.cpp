// The store port's contract (runtime/ports/store.hpp), written once and run against both
// implementations: the simulated store on the deterministic scheduler and the POSIX store on
// a real actor system (tests/ports/store_drivers.hpp); and in tests/launch against the POSIX
// store behind a launched cluster's store bridge. A test here states what an actor may
// rely on whichever world it runs in.
#include "runtime/errors.hpp"
#include "store_drivers.hpp"

#include <doctest/doctest.h>

#include <xxhash.h>

#include <vector>

using namespace troupe;
using namespace troupe::runtime;
using namespace std::chrono_literals;
using test::bytes;
using test::key;

namespace {

/// A small synchronous client over a driver `D`.
template <class D>
struct client {
  D d;

  explicit client(std::uint64_t capacity) : d(capacity) {}

  /// What an object of `size` payload bytes costs against the capacity.
  static std::uint64_t cost(std::uint64_t size) { return size + D::overhead; }

  caf::expected<store_stats> put(store_key k, std::vector<std::uint8_t> payload,
                                 duration ttl = duration{0}) {
    auto size = payload.size();
    return d.template call<store_stats>(store_put{k, size, std::move(payload), ttl});
  }

  /// A put that must succeed.
  store_stats must_put(store_key k, std::vector<std::uint8_t> payload,
                       duration ttl = duration{0}) {
    auto r = put(k, std::move(payload), ttl);
    REQUIRE(r);
    return *r;
  }

  caf::expected<store_object> get(store_key k) {
    return d.template call<store_object>(store_get{k});
  }

  bool has(store_key k) {
    auto r = d.template call<bool>(store_has{k});
    REQUIRE(r);
    return *r;
  }

  caf::expected<store_stats> del(store_key k) {
    return d.template call<store_stats>(store_delete{k});
  }

  std::vector<store_entry> list() {
    auto r = d.template call<std::vector<store_entry>>(store_list{});
    REQUIRE(r);
    return *r;
  }

  store_stats stats() {
    auto r = d.template call<store_stats>(store_stats_atom::value);
    REQUIRE(r);
    return *r;
  }
};

// tests/launch/test_store_bridge.cpp runs the same suite against the store as a launched
// cluster's instance processes reach it (through the store bridge) by defining this first.
#ifndef STORE_IMPLEMENTATIONS
#define STORE_IMPLEMENTATIONS test::sim_store_driver, test::posix_store_driver
#endif

} // namespace

// -- put, get, has, delete ------------------------------------------------------------------

TEST_CASE_TEMPLATE("a store returns the payload and size of every object put before", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(1'000'000);
  std::vector<std::size_t> sizes{0, 1, 4096, 114'044};
  for (std::size_t i = 0; i < sizes.size(); ++i)
    c.must_put(key(i), bytes(sizes[i], static_cast<std::uint8_t>(i)));
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    auto got = c.get(key(i));
    REQUIRE(got);
    CHECK(got->key == key(i));
    CHECK(got->size == sizes[i]);
    CHECK(got->payload == bytes(sizes[i], static_cast<std::uint8_t>(i)));
    // The checksum the store verified comes with the bytes (for end-to-end checks).
    if (sizes[i] > 0)
      CHECK(got->checksum == XXH3_64bits(got->payload.data(), got->payload.size()));
  }
}

TEST_CASE_TEMPLATE("has is true for a stored key and false for a missing or deleted one", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  c.must_put(key(5), bytes(10, 1));
  CHECK(c.has(key(5)));
  CHECK_FALSE(c.has(key(6)));
  REQUIRE(c.del(key(5)));
  CHECK_FALSE(c.has(key(5)));
}

TEST_CASE_TEMPLATE("a deleted object is not served and its bytes are freed", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  c.must_put(key(1), bytes(1000, 1));
  c.must_put(key(2), bytes(2500, 2));
  auto after = c.del(key(1));
  REQUIRE(after);
  CHECK(after->used == c.cost(2500));
  CHECK(after->objects == 1);
  auto got = c.get(key(1));
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), errc::not_found));
  CHECK(c.get(key(2)));
}

TEST_CASE_TEMPLATE("putting a key again replaces its object and frees the old size first", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(client<D>::cost(8000) + 100);
  c.must_put(key(1), bytes(6000, 1));
  // 6000 + 8000 would not fit, but the old 6000 are freed first: nothing is evicted.
  auto s = c.must_put(key(1), bytes(8000, 9));
  CHECK(s.used == c.cost(8000));
  CHECK(s.objects == 1);
  CHECK(s.evicted == 0);
  auto got = c.get(key(1));
  REQUIRE(got);
  CHECK(got->size == 8000);
  CHECK(got->payload == bytes(8000, 9));
}

TEST_CASE_TEMPLATE("getting or deleting a missing key fails with not_found", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  c.must_put(key(1), bytes(10, 1));
  auto got = c.get(key(2));
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), errc::not_found));
  auto del = c.del(key(3));
  REQUIRE_FALSE(del);
  CHECK(is(del.error(), errc::not_found));
  CHECK(c.stats().objects == 1);
}

TEST_CASE_TEMPLATE("a put whose payload differs from its declared size fails with invalid_argument",
                   D, STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  auto r = c.d.template call<store_stats>(store_put{key(1), 10, bytes(9, 0), duration{0}});
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::invalid_argument));
  CHECK(c.stats().objects == 0);
}

TEST_CASE_TEMPLATE("a put with a negative ttl fails with invalid_argument", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  auto r = c.put(key(1), bytes(10, 0), -1s);
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::invalid_argument));
  CHECK_FALSE(c.has(key(1)));
}

// -- capacity and eviction ------------------------------------------------------------------

TEST_CASE_TEMPLATE(
  "an object larger than the whole capacity fails with store_full and changes nothing", D,
  STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  c.must_put(key(1), bytes(6000, 1));
  auto before = c.stats();
  auto r = c.put(key(2), bytes(10'001, 2));
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::store_full));
  auto after = c.stats();
  CHECK(after.used == before.used);
  CHECK(after.objects == 1);
  CHECK(after.evicted == 0);
  CHECK_FALSE(c.has(key(2)));
  auto got = c.get(key(1));
  REQUIRE(got);
  CHECK(got->payload == bytes(6000, 1));
}

TEST_CASE_TEMPLATE("a replacement larger than the whole capacity fails and keeps the old object",
                   D, STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  c.must_put(key(1), bytes(6000, 1));
  auto r = c.put(key(1), bytes(11'000, 2));
  REQUIRE_FALSE(r);
  CHECK(is(r.error(), errc::store_full));
  auto got = c.get(key(1));
  REQUIRE(got);
  CHECK(got->payload == bytes(6000, 1));
  CHECK(c.stats().used == c.cost(6000));
}

TEST_CASE_TEMPLATE("a put that fills the store exactly succeeds without evicting", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(client<D>::cost(4000) + client<D>::cost(6000));
  c.must_put(key(1), bytes(4000, 1));
  auto s = c.must_put(key(2), bytes(6000, 2));
  CHECK(s.used == s.capacity);
  CHECK(s.objects == 2);
  CHECK(s.evicted == 0);
}

TEST_CASE_TEMPLATE("a put over capacity evicts the least recently used objects until it fits", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(3 * client<D>::cost(1000));
  c.must_put(key(1), bytes(1000, 1));
  c.must_put(key(2), bytes(1000, 2));
  c.must_put(key(3), bytes(1000, 3));
  REQUIRE(c.get(key(1))); // 2 is now the least recently used, then 3
  auto s = c.must_put(key(4), bytes(1000, 4));
  CHECK(s.evicted == 1);
  CHECK(s.objects == 3);
  CHECK_FALSE(c.has(key(2)));
  CHECK(c.has(key(1)));
  CHECK(c.has(key(3)));
  // A put of two objects' worth evicts the next two in LRU order: 3, then 1.
  s = c.must_put(key(5), bytes(2 * 1000 + D::overhead, 5));
  CHECK(s.evicted == 3);
  CHECK_FALSE(c.has(key(3)));
  CHECK_FALSE(c.has(key(1)));
  CHECK(c.has(key(4)));
  CHECK(c.has(key(5)));
  CHECK(s.used <= s.capacity);
}

TEST_CASE_TEMPLATE("has does not count as a use for eviction", D, STORE_IMPLEMENTATIONS) {
  client<D> c(2 * client<D>::cost(1000));
  c.must_put(key(1), bytes(1000, 1));
  c.must_put(key(2), bytes(1000, 2));
  CHECK(c.has(key(1)));
  c.must_put(key(3), bytes(1000, 3));
  CHECK_FALSE(c.has(key(1)));
  CHECK(c.has(key(2)));
}

// -- TTL ------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("an object is served until its ttl has passed and never after", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  c.must_put(key(1), bytes(100, 1), 10s);
  c.d.advance(9s);
  CHECK(c.has(key(1)));
  CHECK(c.get(key(1)));
  c.d.advance(1s); // exactly at the expiry: no longer served
  CHECK_FALSE(c.has(key(1)));
  auto got = c.get(key(1));
  REQUIRE_FALSE(got);
  CHECK(is(got.error(), errc::not_found));
  auto s = c.stats();
  CHECK(s.objects == 0);
  CHECK(s.used == 0);
  CHECK(s.expired == 1);
}

TEST_CASE_TEMPLATE("an object put with a zero ttl never expires", D, STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  c.must_put(key(1), bytes(100, 1));
  c.d.advance(std::chrono::hours(24 * 1000));
  CHECK(c.get(key(1)));
  CHECK(c.stats().expired == 0);
}

TEST_CASE_TEMPLATE("putting a key again sets its expiry from the new ttl", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  c.must_put(key(1), bytes(100, 1), 10s);
  c.d.advance(8s);
  c.must_put(key(1), bytes(100, 2), 10s);
  c.d.advance(8s); // 16 s after the first put, 8 s after the second
  auto got = c.get(key(1));
  REQUIRE(got);
  CHECK(got->payload == bytes(100, 2));
  c.d.advance(2s);
  CHECK_FALSE(c.has(key(1)));
}

TEST_CASE_TEMPLATE("an expired object frees its bytes for the next put without an eviction", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(2 * client<D>::cost(1000));
  c.must_put(key(1), bytes(1000, 1), 1min);
  c.must_put(key(2), bytes(1000, 2));
  c.d.advance(1min);
  auto s = c.must_put(key(3), bytes(1000, 3));
  CHECK(s.expired == 1);
  CHECK(s.evicted == 0);
  CHECK(c.has(key(2)));
  CHECK(c.has(key(3)));
}

// -- list -----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("list names every object with its size and expiry, ordered by key", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(100'000);
  CHECK(c.list().empty());
  auto t0 = c.d.now();
  // Put in another order than the keys'; the reply is sorted by key.
  c.must_put(key(3), bytes(300, 3));
  c.must_put(key(1), bytes(100, 1), 10s);
  c.must_put(key(2), bytes(200, 2), 1h);
  auto listed = c.list();
  auto t1 = c.d.now();
  REQUIRE(listed.size() == 3);
  for (std::size_t i = 1; i < listed.size(); ++i)
    CHECK(listed[i - 1].key < listed[i].key);
  for (const auto& e : listed) {
    if (e.key == key(3)) {
      CHECK(e.size == 300);
      CHECK(e.expires_at == store_never_expires);
    } else {
      auto ttl = e.key == key(1) ? duration{10s} : duration{1h};
      CHECK(e.size == (e.key == key(1) ? 100u : 200u));
      CHECK(e.expires_at >= t0 + ttl);
      CHECK(e.expires_at <= t1 + ttl);
    }
  }
}

TEST_CASE_TEMPLATE("list leaves out objects whose ttl has passed", D, STORE_IMPLEMENTATIONS) {
  client<D> c(100'000);
  c.must_put(key(1), bytes(100, 1), 10s);
  c.must_put(key(2), bytes(100, 2), 20s);
  c.d.advance(15s);
  auto listed = c.list();
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].key == key(2));
}

// -- stats ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("an empty store reports its capacity and nothing else", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(10'000);
  auto s = c.stats();
  CHECK(s.capacity == 10'000);
  CHECK(s.used == 0);
  CHECK(s.objects == 0);
  CHECK(s.hits == 0);
  CHECK(s.misses == 0);
  CHECK(s.corrupt == 0);
  CHECK(s.evicted == 0);
  CHECK(s.expired == 0);
}

TEST_CASE_TEMPLATE("stats count used bytes, objects, hits, misses, evictions and expirations", D,
                   STORE_IMPLEMENTATIONS) {
  client<D> c(3 * client<D>::cost(1000));
  c.must_put(key(1), bytes(1000, 1), 5s);
  c.must_put(key(2), bytes(500, 2));
  auto s = c.stats();
  CHECK(s.used == c.cost(1000) + c.cost(500));
  CHECK(s.objects == 2);
  REQUIRE(c.get(key(1)));
  REQUIRE(c.get(key(2)));
  CHECK_FALSE(c.get(key(9)));
  CHECK(c.has(key(9)) == false); // has counts neither a hit nor a miss
  c.d.advance(5s);
  CHECK_FALSE(c.get(key(1))); // expired: a miss
  c.must_put(key(3), bytes(1000, 3));
  c.must_put(key(4), bytes(1000, 4));
  c.must_put(key(5), bytes(1000, 5)); // evicts 2, the least recently used
  s = c.stats();
  CHECK(s.hits == 2);
  CHECK(s.misses == 2);
  CHECK(s.expired == 1);
  CHECK(s.evicted == 1);
  CHECK(s.corrupt == 0);
  CHECK(s.objects == 3);
  CHECK(s.used == 3 * c.cost(1000));
}
