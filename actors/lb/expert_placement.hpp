// expert_placement: where an EP group's routed experts live, given how much work each gets —
// the placement policy of the expert-parallel load balancer (EPLB), a pure function both
// worlds call with their measured (real: the router's top-k counts; simulated: the model
// profile's load distribution) expert loads.
//
// An EP group of R ranks has S expert slots per rank, R·S >= E for E routed (logical)
// experts; the R·S − E spare slots hold redundant copies of hot experts, and a token routed
// to an expert with c copies goes to one of them (its load splits evenly). A step waits for
// the rank with the most work, so the quality of a placement is its balancedness: mean rank
// load / max rank load (1 is perfect).
//
// The policy, two greedy passes:
//   1. copies: every expert gets one; each spare slot then goes to the expert whose load per
//      copy is the highest (ties: the lower expert id), one at a time;
//   2. packing: the copies, heaviest first (ties: expert id, then copy), each go to the rank
//      with free slots and the least load so far (ties: the lower rank), preferring a rank
//      that does not hold that expert yet.
// With `nodes` > 1 (a group spanning nodes whose scale-up domain is the node, with node-limited
// routing by expert groups) it is hierarchical: the expert groups are first packed onto nodes
// by their total load (heaviest first, onto the least-loaded node with room for a group), then
// each node places its own groups' experts over its R / nodes ranks as above, so that a
// token's traffic stays within the nodes its groups live on.
#pragma once

#include "kernels/ep_dispatch.hpp"

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace troupe::actors {

struct expert_placement {
  /// The logical expert in each slot, rank by rank: slots[r][s].
  std::vector<std::vector<std::uint32_t>> slots;
  /// Copies per logical expert (>= 1 each, summing to R·S).
  std::vector<std::uint32_t> copies;
  /// Each rank's load under this placement (each copy of expert e carries load[e] / copies[e]).
  std::vector<double> rank_load;

  /// Mean rank load / max rank load, in (0, 1]; 1 when there is no load.
  double balancedness() const;
};

struct placement_request {
  /// Load per logical expert (tokens routed to it over the window; >= 0).
  std::vector<double> load;
  /// Ranks of the EP group and expert slots per rank: ranks · slots_per_rank >= load.size().
  std::uint32_t ranks = 0;
  std::uint32_t slots_per_rank = 0;
  /// Nodes the group spans (1: global placement) and expert groups (node-limited routing);
  /// with nodes > 1, the ranks and the groups must be multiples of nodes, and the groups must
  /// divide the experts.
  std::uint32_t nodes = 1;
  std::uint32_t groups = 1;
};

/// The placement of `request`, or a message saying which input is wrong.
std::variant<expert_placement, std::string> place_experts(const placement_request& request);

/// The balancedness of `placement` when the experts' load is `load` (which may differ from the
/// load it was placed by: the load drifts): each copy of expert e carries load[e] / copies[e].
double balancedness_under(const expert_placement& placement, const std::vector<double>& load);

/// The placement EP ranks start from, without load or spare slots: contiguous expert ranges in
/// rank order, E / R experts each and one more on the first E % R ranks (as kernels' expert
/// shards and the simulator's EP resize hold them), one copy each, with its rank loads under
/// `load`.
expert_placement contiguous_placement(const std::vector<double>& load, std::uint32_t ranks);

/// `placement` as the EP dispatch plans take it (kernels/ep_dispatch.hpp): each rank's local
/// experts in its slot order; each expert's homes, the ranks holding it, ascending (a rank
/// holding an expert in two slots is one home; dispatch uses the first slot).
kernels::expert_placement dispatch_placement(const expert_placement& placement);

} // namespace troupe::actors
