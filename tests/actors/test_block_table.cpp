// block_table: the flat entry store of kv_index, checked against std::map.
#include "actors/kv/block_table.hpp"

#include <doctest/doctest.h>

#include <cstdint>
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
  std::map<block_key, std::uint64_t> ref; // key -> seq
  std::vector<block_key> keys;
  std::uint64_t seq = 0;
  for (std::size_t i = 0; i < steps; ++i) {
    auto op = rng() % 10;
    if (op < 6 || keys.empty()) {
      auto k = make_key(rng);
      if (ref.count(k) == 0) {
        auto& s = t.insert(k);
        REQUIRE(s.key == k);
        s.set_seq(++seq);
        s.expiry_ns = static_cast<std::int64_t>(seq) * 3;
        ref[k] = seq;
        keys.push_back(k);
      }
    } else if (op < 8) {
      auto k = keys[rng() % keys.size()];
      auto* s = t.find(k);
      auto it = ref.find(k);
      REQUIRE((s != nullptr) == (it != ref.end()));
      if (s != nullptr) {
        REQUIRE(s->seq() == it->second);
        REQUIRE(s->expiry_ns == static_cast<std::int64_t>(it->second) * 3);
      }
    } else {
      auto at = rng() % keys.size();
      auto k = keys[at];
      keys[at] = keys.back();
      keys.pop_back();
      auto* s = t.find(k);
      REQUIRE(s != nullptr);
      t.erase(s);
      ref.erase(k);
      REQUIRE(t.find(k) == nullptr);
    }
    REQUIRE(t.size() == ref.size());
  }
  // Every key held is found, and for_each walks them in key order.
  std::vector<block_key> walked;
  t.for_each([&](const block_slot& s) { walked.push_back(s.key); });
  REQUIRE(walked.size() == ref.size());
  std::size_t i = 0;
  for (const auto& [k, s] : ref) {
    CHECK(walked[i++] == k);
    auto* found = t.find(k);
    REQUIRE(found != nullptr);
    CHECK(found->seq() == s);
  }
}

} // namespace

TEST_CASE("a block table agrees with an ordered map through growth and erasure") {
  check_against_map(1, 60000, [](std::mt19937_64& rng) { return block_key{rng(), rng()}; });
}

TEST_CASE("a block table stays correct when keys crowd a few home slots") {
  // Few distinct `hi` values, many near the top of the key space: long runs, runs that reach
  // the end of the array.
  check_against_map(2, 20000, [](std::mt19937_64& rng) {
    std::uint64_t his[] = {0, 1, std::uint64_t{1} << 63, ~std::uint64_t{0} - 1, ~std::uint64_t{0}};
    return block_key{his[rng() % 5], rng() % 4000};
  });
}

TEST_CASE("a block slot packs sequence number, class and pending flag apart") {
  block_slot s;
  CHECK(s.empty());
  s.set_seq(block_slot::max_seq);
  s.set_cls(troupe::schemas::traffic_class::batch);
  s.set_pending(true);
  CHECK(!s.empty());
  CHECK(s.seq() == block_slot::max_seq);
  CHECK(s.cls() == troupe::schemas::traffic_class::batch);
  CHECK(s.pending());
  s.set_pending(false);
  s.set_cls(troupe::schemas::traffic_class::agent);
  CHECK(s.seq() == block_slot::max_seq);
  CHECK(s.cls() == troupe::schemas::traffic_class::agent);
  CHECK(!s.pending());
  s.set_seq(1);
  CHECK(s.seq() == 1);
  CHECK(s.cls() == troupe::schemas::traffic_class::agent);
}

TEST_CASE("a copied block table holds the same entries, apart from the original") {
  block_table t;
  std::mt19937_64 rng(3);
  std::vector<block_key> keys;
  for (int i = 0; i < 5000; ++i) {
    keys.push_back(block_key{rng(), rng()});
    t.insert(keys.back()).set_seq(static_cast<std::uint64_t>(i) + 1);
  }
  block_table c = t;
  t.erase(t.find(keys[0]));
  CHECK(c.size() == 5000);
  CHECK(t.size() == 4999);
  for (int i = 0; i < 5000; ++i) {
    auto* s = c.find(keys[static_cast<std::size_t>(i)]);
    REQUIRE(s != nullptr);
    CHECK(s->seq() == static_cast<std::uint64_t>(i) + 1);
  }
  CHECK(t.find(keys[0]) == nullptr);
  c = t;
  CHECK(c.size() == 4999);
  CHECK(c.find(keys[0]) == nullptr);
}
