// block_table: the flat entry store of kv_index, checked against std::map.
#include "actors/kv/block_table.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <vector>

using namespace troupe::actors;

namespace {

/// Applies a seeded mix of inserts, finds and erases to a table and a std::map, and checks
/// after every step that they agree; `make_key` draws keys (uniform or crowded).
template <class MakeKey>
void check_against_map(std::uint64_t seed, std::size_t steps, MakeKey make_key) {
  std::mt19937_64 rng(seed);
  block_table t;
  std::map<std::uint64_t, std::int64_t> ref; // key's hi -> expiry
  std::vector<block_key> keys;
  std::int64_t expiry = 0;
  for (std::size_t i = 0; i < steps; ++i) {
    auto op = rng() % 10;
    if (op < 6 || keys.empty()) {
      auto k = make_key(rng);
      if (ref.count(k.hi) == 0) {
        auto& s = t.insert(k);
        REQUIRE(s.key == k.hi);
        REQUIRE(s.empty());
        s.set_expiry_ns(expiry += 3);
        ref[k.hi] = expiry;
        keys.push_back(k);
      } else {
        // Keys are told apart by their hi half: another lo finds the same entry.
        auto* s = t.find(block_key{k.hi, ~k.lo});
        REQUIRE(s != nullptr);
        REQUIRE(s->expiry_ns() == ref[k.hi]);
      }
    } else if (op < 8) {
      auto k = keys[rng() % keys.size()];
      auto* s = t.find(k);
      auto it = ref.find(k.hi);
      REQUIRE((s != nullptr) == (it != ref.end()));
      if (s != nullptr)
        REQUIRE(s->expiry_ns() == it->second);
    } else {
      auto at = rng() % keys.size();
      auto k = keys[at];
      keys[at] = keys.back();
      keys.pop_back();
      auto* s = t.find(k);
      REQUIRE(s != nullptr);
      t.erase(s);
      ref.erase(k.hi);
      REQUIRE(t.find(k) == nullptr);
    }
    REQUIRE(t.size() == ref.size());
  }
  // Every key held is found, and for_each walks them in key order.
  std::vector<std::uint64_t> walked;
  t.for_each([&](const block_slot& s) { walked.push_back(s.key); });
  REQUIRE(walked.size() == ref.size());
  std::size_t i = 0;
  for (const auto& [hi, e] : ref) {
    CHECK(walked[i++] == hi);
    auto* found = t.find(block_key{hi, 0});
    REQUIRE(found != nullptr);
    CHECK(found->expiry_ns() == e);
  }
}

} // namespace

TEST_CASE("a block table agrees with an ordered map through growth and erasure") {
  check_against_map(1, 60000, [](std::mt19937_64& rng) { return block_key{rng(), rng()}; });
}

TEST_CASE("a block table stays correct when keys crowd a few home slots") {
  // Keys packed into a few narrow ranges, one at the top of the key space: long runs, runs
  // that reach the end of the array; and the same hi drawn again with another lo.
  check_against_map(2, 20000, [](std::mt19937_64& rng) {
    std::uint64_t bases[] = {0, std::uint64_t{1} << 63, ~std::uint64_t{0} - 3999};
    return block_key{bases[rng() % 3] + rng() % 4000, rng()};
  });
}

TEST_CASE("a block slot packs expiry, class and pending flag apart") {
  using troupe::schemas::traffic_class;
  block_slot s;
  CHECK(s.empty());
  s.set_cls(traffic_class::batch);
  s.set_pending(true);
  CHECK(s.empty()); // no expiry yet
  s.set_expiry_ns(block_slot::max_expiry_ns);
  CHECK(!s.empty());
  CHECK(s.expiry_ns() == block_slot::max_expiry_ns);
  CHECK(s.cls() == traffic_class::batch);
  CHECK(s.pending());
  s.set_pending(false);
  s.set_cls(traffic_class::agent);
  CHECK(s.expiry_ns() == block_slot::max_expiry_ns);
  CHECK(s.cls() == traffic_class::agent);
  CHECK(!s.pending());
  // An expiry at the epoch is held (and expired at once); before it or past the range, clamped.
  s.set_expiry_ns(0);
  CHECK(!s.empty());
  CHECK(s.expiry_ns() == 0);
  CHECK(s.cls() == traffic_class::agent);
  s.set_expiry_ns(-5);
  CHECK(s.expiry_ns() == 0);
  s.set_expiry_ns(std::numeric_limits<std::int64_t>::max());
  CHECK(s.expiry_ns() == block_slot::max_expiry_ns);
  CHECK(s.cls() == traffic_class::agent);
  CHECK(!s.pending());
}

TEST_CASE("a copied block table holds the same entries, apart from the original") {
  block_table t;
  std::mt19937_64 rng(3);
  std::vector<block_key> keys;
  for (int i = 0; i < 5000; ++i) {
    keys.push_back(block_key{rng(), rng()});
    t.insert(keys.back()).set_expiry_ns(i);
  }
  block_table c = t;
  t.erase(t.find(keys[0]));
  CHECK(c.size() == 5000);
  CHECK(t.size() == 4999);
  for (int i = 0; i < 5000; ++i) {
    auto* s = c.find(keys[static_cast<std::size_t>(i)]);
    REQUIRE(s != nullptr);
    CHECK(s->expiry_ns() == i);
  }
  CHECK(t.find(keys[0]) == nullptr);
  c = t;
  CHECK(c.size() == 4999);
  CHECK(c.find(keys[0]) == nullptr);
}
