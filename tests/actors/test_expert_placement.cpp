// The EPLB placement policy (actors/lb/expert_placement.hpp): every expert placed, slots
// filled exactly, copies to the hot experts, balance against the contiguous start, the
// hierarchical variant keeping groups within nodes, and bad input refused.
#include "actors/lb/expert_placement.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

using namespace troupe::actors;

namespace {

/// Zipf-like loads over `n` experts, shuffled by a fixed permutation (hot experts anywhere).
std::vector<double> skewed(std::uint32_t n, double exponent) {
  std::vector<double> load(n);
  for (std::uint32_t i = 0; i < n; ++i)
    load[(i * 37 + 11) % n] = 1000.0 / std::pow(i + 1.0, exponent);
  return load;
}

expert_placement placed(const placement_request& q) {
  auto r = place_experts(q);
  if (auto* why = std::get_if<std::string>(&r))
    FAIL(*why);
  return std::get<expert_placement>(std::move(r));
}

/// The placement's own account agrees with its slots: each rank's load is the sum of its
/// slots' expert loads over their copy counts; copies count the slots.
void check_consistent(const placement_request& q, const expert_placement& p) {
  REQUIRE(p.slots.size() == q.ranks);
  std::vector<std::uint32_t> seen(q.load.size(), 0);
  for (std::uint32_t r = 0; r < q.ranks; ++r) {
    CHECK(p.slots[r].size() == q.slots_per_rank);
    double load = 0.0;
    for (auto e : p.slots[r]) {
      REQUIRE(e < q.load.size());
      ++seen[e];
      load += q.load[e] / p.copies[e];
    }
    CHECK(p.rank_load[r] == doctest::Approx(load));
  }
  for (std::size_t e = 0; e < q.load.size(); ++e) {
    CAPTURE(e);
    CHECK(seen[e] >= 1);
    CHECK(seen[e] == p.copies[e]);
  }
}

} // namespace

TEST_CASE("uniform loads spread evenly: perfect balance, one copy each") {
  placement_request q{std::vector<double>(64, 5.0), 8, 8};
  auto p = placed(q);
  check_consistent(q, p);
  CHECK(p.balancedness() == doctest::Approx(1.0));
  CHECK(std::all_of(p.copies.begin(), p.copies.end(), [](auto c) { return c == 1; }));
}

TEST_CASE("on skewed loads the placement beats the contiguous one, and spare slots help more") {
  const auto load = skewed(64, 1.0);
  const double start = contiguous_placement(load, 8).balancedness();
  placement_request q{load, 8, 8};
  auto moved = placed(q);
  check_consistent(q, moved);
  placement_request r{load, 8, 10};  // 16 spare slots for copies of hot experts
  auto copied = placed(r);
  check_consistent(r, copied);
  MESSAGE("balancedness: contiguous " << start << ", placed " << moved.balancedness()
                                      << ", with 16 copies " << copied.balancedness());
  CHECK(moved.balancedness() > start);
  CHECK(copied.balancedness() > moved.balancedness());
  // The hottest expert (1000 against 16 per rank on average) needs copies to stop dominating.
  const auto hottest = static_cast<std::uint32_t>(
    std::max_element(load.begin(), load.end()) - load.begin());
  CHECK(copied.copies[hottest] > 1);
  // Without copies the rank holding the hottest expert sets the step: balance <= mean / 1000.
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / 8;
  CHECK(moved.balancedness() <= mean / 1000.0 + 1e-9);
  CHECK(copied.balancedness() > 0.95);
  // Copies go by load per copy: no expert has fewer copies than a lighter one.
  for (std::size_t a = 0; a < load.size(); ++a)
    for (std::size_t b = 0; b < load.size(); ++b)
      if (load[a] > load[b])
        CHECK(copied.copies[a] >= copied.copies[b]);
}

TEST_CASE("copies of one expert go to different ranks while there is a choice") {
  std::vector<double> load(8, 1.0);
  load[3] = 100.0;
  placement_request q{load, 4, 4};  // 8 spare slots: expert 3 gets them all
  auto p = placed(q);
  check_consistent(q, p);
  CHECK(p.copies[3] == 9);
  for (const auto& rank : p.slots)
    CHECK(std::count(rank.begin(), rank.end(), 3u) <= 3);  // 9 copies over 4 ranks
  std::set<std::uint32_t> holders;
  for (std::uint32_t r = 0; r < 4; ++r)
    if (std::count(p.slots[r].begin(), p.slots[r].end(), 3u) > 0)
      holders.insert(r);
  CHECK(holders.size() == 4);
}

TEST_CASE("hierarchical: each node holds whole expert groups, balanced across nodes") {
  const auto load = skewed(64, 0.8);
  placement_request q{load, 16, 5, 2, 8};  // 2 nodes of 8 ranks, 8 groups of 8 experts
  auto p = placed(q);
  check_consistent(q, p);
  std::map<std::uint32_t, std::set<std::uint32_t>> nodes_of_group;
  for (std::uint32_t r = 0; r < 16; ++r)
    for (auto e : p.slots[r])
      nodes_of_group[e / 8].insert(r / 8);
  for (const auto& [g, nodes] : nodes_of_group) {
    CAPTURE(g);
    CHECK(nodes.size() == 1);
  }
  const double node0 = std::accumulate(p.rank_load.begin(), p.rank_load.begin() + 8, 0.0);
  const double node1 = std::accumulate(p.rank_load.begin() + 8, p.rank_load.end(), 0.0);
  CHECK(std::min(node0, node1) / std::max(node0, node1) > 0.8);
  CHECK(p.balancedness() > contiguous_placement(load, 16).balancedness());
}

TEST_CASE("the placement is a pure function of its request") {
  placement_request q{skewed(48, 1.2), 6, 9, 1, 1};
  auto a = placed(q), b = placed(q);
  CHECK(a.slots == b.slots);
  CHECK(a.copies == b.copies);
}

TEST_CASE("bad placement requests are refused with the reason") {
  auto why = [](placement_request q) {
    auto r = place_experts(q);
    REQUIRE(std::holds_alternative<std::string>(r));
    return std::get<std::string>(r);
  };
  CHECK(why({{}, 4, 4}) == "no experts");
  CHECK(why({std::vector<double>(8, 1.0), 0, 4}) == "ranks and slots_per_rank must be > 0");
  CHECK(why({std::vector<double>(20, 1.0), 4, 4}) == "ranks x slots_per_rank = 16 slots for 20 experts");
  CHECK(why({{1.0, -2.0}, 1, 2}).find("expert 1 has load") == 0);
  CHECK(why({{1.0, NAN}, 1, 2}).find("expert 1 has load") == 0);
  CHECK(why({std::vector<double>(16, 1.0), 6, 4, 4, 4}) == "ranks 6 are not a multiple of nodes 4");
  CHECK(why({std::vector<double>(16, 1.0), 4, 4, 2, 3}).find("groups 3 must be") == 0);
}

TEST_CASE("a placement's balancedness under another load: its own load gives its own figure") {
  const placement_request q{skewed(64, 1.0), 8, 9};
  const auto p = placed(q);
  CHECK(balancedness_under(p, q.load) == doctest::Approx(p.balancedness()));
  // The hot set moved on (the same law over other experts): the copies sit on the wrong ones.
  std::vector<double> moved(64);
  for (std::uint32_t e = 0; e < 64; ++e)
    moved[e] = q.load[(e + 5) % 64];
  CHECK(balancedness_under(p, moved) < p.balancedness() - 0.1);
  // Placed for the moved load, it is balanced again.
  CHECK(placed({moved, 8, 9}).balancedness() == doctest::Approx(p.balancedness()));
}
