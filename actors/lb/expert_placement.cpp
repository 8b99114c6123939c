// The expert placement policy (see expert_placement.hpp).
#include "actors/lb/expert_placement.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace troupe::actors {

namespace {

/// Places `experts` (logical ids, with their loads in `load`) over ranks [first, first + ranks)
/// of `out`, with `slots` slots each: copies by load per copy, then packing (the header).
void place(const std::vector<double>& load, const std::vector<std::uint32_t>& experts,
           std::uint32_t first, std::uint32_t ranks, std::uint32_t slots, expert_placement& out) {
  // 1. Copies: each spare slot to the expert with the highest load per copy.
  const auto spare = static_cast<std::size_t>(ranks) * slots - experts.size();
  for (auto e : experts)
    out.copies[e] = 1;
  for (std::size_t k = 0; k < spare; ++k) {
    auto best = experts.front();
    for (auto e : experts) {
      const double per = load[e] / out.copies[e], top = load[best] / out.copies[best];
      if (per > top || (per == top && e < best))
        best = e;
    }
    ++out.copies[best];
  }
  // 2. Packing: copies heaviest first onto the least-loaded rank with room.
  struct copy {
    double weight;
    std::uint32_t expert, index;
  };
  std::vector<copy> all;
  for (auto e : experts)
    for (std::uint32_t i = 0; i < out.copies[e]; ++i)
      all.push_back({load[e] / out.copies[e], e, i});
  std::sort(all.begin(), all.end(), [](const copy& a, const copy& b) {
    if (a.weight != b.weight)
      return a.weight > b.weight;
    return a.expert != b.expert ? a.expert < b.expert : a.index < b.index;
  });
  for (const auto& c : all) {
    std::uint32_t pick = first + ranks;
    bool pick_holds = true;
    for (auto r = first; r < first + ranks; ++r) {
      if (out.slots[r].size() >= slots)
        continue;
      const bool holds = std::find(out.slots[r].begin(), out.slots[r].end(), c.expert)
                         != out.slots[r].end();
      // A rank without the expert first, then the least load, then the lower rank.
      if (pick == first + ranks || (!holds && pick_holds)
          || (holds == pick_holds && out.rank_load[r] < out.rank_load[pick])) {
        pick = r;
        pick_holds = holds;
      }
    }
    out.slots[pick].push_back(c.expert);
    out.rank_load[pick] += c.weight;
  }
}

} // namespace

double expert_placement::balancedness() const {
  if (rank_load.empty())
    return 1.0;
  const double top = *std::max_element(rank_load.begin(), rank_load.end());
  if (top <= 0.0)
    return 1.0;
  const double mean = std::accumulate(rank_load.begin(), rank_load.end(), 0.0)
                      / static_cast<double>(rank_load.size());
  return mean / top;
}

std::variant<expert_placement, std::string> place_experts(const placement_request& q) {
  const auto E = static_cast<std::uint32_t>(q.load.size());
  if (E == 0)
    return std::string("no experts");
  if (q.ranks == 0 || q.slots_per_rank == 0)
    return std::string("ranks and slots_per_rank must be > 0");
  if (static_cast<std::uint64_t>(q.ranks) * q.slots_per_rank < E)
    return "ranks x slots_per_rank = " + std::to_string(std::uint64_t{q.ranks} * q.slots_per_rank)
           + " slots for " + std::to_string(E) + " experts";
  for (std::uint32_t e = 0; e < E; ++e)
    if (!(q.load[e] >= 0.0) || !std::isfinite(q.load[e]))
      return "expert " + std::to_string(e) + " has load " + std::to_string(q.load[e])
             + ", expected a finite value >= 0";
  expert_placement out;
  out.slots.resize(q.ranks);
  out.copies.assign(E, 0);
  out.rank_load.assign(q.ranks, 0.0);
  if (q.nodes <= 1) {
    std::vector<std::uint32_t> experts(E);
    std::iota(experts.begin(), experts.end(), 0u);
    place(q.load, experts, 0, q.ranks, q.slots_per_rank, out);
    return out;
  }
  // Hierarchical: groups onto nodes, then each node's experts over its ranks.
  if (q.ranks % q.nodes != 0)
    return "ranks " + std::to_string(q.ranks) + " are not a multiple of nodes "
           + std::to_string(q.nodes);
  if (q.groups == 0 || q.groups % q.nodes != 0 || E % q.groups != 0)
    return "groups " + std::to_string(q.groups) + " must be a multiple of nodes "
           + std::to_string(q.nodes) + " and divide the " + std::to_string(E) + " experts";
  const std::uint32_t per_group = E / q.groups, groups_per_node = q.groups / q.nodes;
  // (Each node's share of the experts fits its share of the slots, as the whole does.)
  const std::uint32_t ranks_per_node = q.ranks / q.nodes;
  std::vector<double> group_load(q.groups, 0.0);
  for (std::uint32_t e = 0; e < E; ++e)
    group_load[e / per_group] += q.load[e];
  std::vector<std::uint32_t> order(q.groups);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](auto a, auto b) { return group_load[a] > group_load[b]; });
  std::vector<std::vector<std::uint32_t>> node_groups(q.nodes);
  std::vector<double> node_load(q.nodes, 0.0);
  for (auto g : order) {
    std::uint32_t pick = q.nodes;
    for (std::uint32_t n = 0; n < q.nodes; ++n)
      if (node_groups[n].size() < groups_per_node
          && (pick == q.nodes || node_load[n] < node_load[pick]))
        pick = n;
    node_groups[pick].push_back(g);
    node_load[pick] += group_load[g];
  }
  for (std::uint32_t n = 0; n < q.nodes; ++n) {
    std::vector<std::uint32_t> experts;
    std::sort(node_groups[n].begin(), node_groups[n].end());
    for (auto g : node_groups[n])
      for (std::uint32_t i = 0; i < per_group; ++i)
        experts.push_back(g * per_group + i);
    place(q.load, experts, n * ranks_per_node, ranks_per_node, q.slots_per_rank, out);
  }
  return out;
}

double balancedness_under(const expert_placement& placement, const std::vector<double>& load) {
  expert_placement p;
  p.rank_load.assign(placement.slots.size(), 0.0);
  for (std::size_t r = 0; r < placement.slots.size(); ++r)
    for (auto e : placement.slots[r])
      if (e < load.size() && e < placement.copies.size() && placement.copies[e] > 0)
        p.rank_load[r] += load[e] / placement.copies[e];
  return p.balancedness();
}

expert_placement contiguous_placement(const std::vector<double>& load, std::uint32_t ranks) {
  expert_placement out;
  const auto E = static_cast<std::uint32_t>(load.size());
  out.slots.resize(ranks);
  out.copies.assign(E, 1);
  out.rank_load.assign(ranks, 0.0);
  if (ranks == 0)
    return out;
  std::uint32_t e = 0;
  for (std::uint32_t r = 0; r < ranks; ++r)
    for (std::uint32_t i = 0; i < E / ranks + (r < E % ranks ? 1 : 0); ++i, ++e) {
      out.slots[r].push_back(e);
      out.rank_load[r] += load[e];
    }
  return out;
}

kernels::expert_placement dispatch_placement(const expert_placement& placement) {
  kernels::expert_placement out;
  out.experts = static_cast<std::int32_t>(placement.copies.size());
  out.ranks = static_cast<std::int32_t>(placement.slots.size());
  out.homes.resize(placement.copies.size());
  for (std::size_t r = 0; r < placement.slots.size(); ++r) {
    auto& local = out.local.emplace_back();
    for (auto e : placement.slots[r]) {
      local.push_back(static_cast<std::int32_t>(e));
      auto& homes = out.homes[e];
      if (homes.empty() || homes.back() != static_cast<std::int32_t>(r))
        homes.push_back(static_cast<std::int32_t>(r));
    }
  }
  return out;
}

} // namespace troupe::actors
