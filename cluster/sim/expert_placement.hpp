// expert_placement: how big an EP group re-forms after GPUs fail, and where its experts go.
//
// An instance is one EP group. When its supervisor restarts it after a failure, it comes
// back on the GPUs of the instance that are healthy, rounded down to a valid EP size
// (`resized_ep`), and its routed experts are spread over the new group by a balanced
// placement (`balanced_placement`). Both are pure functions of their arguments
// (docs/faults.md, "EP resize on restart").
//
// The rule for a valid size, for an instance configured with n GPUs and a model with E routed
// experts:
//   - the unit is u = max(1, min(8, n / 2)): whole multiples of 8 GPUs (a node's worth of
//     an H-class scale-up domain) for wide EP, finer for small instances;
//   - the size is the largest multiple of u at most min(healthy, n, E) (no rank without an
//     expert);
//   - it must be at least ceil(n / 2): each rank then holds at most about twice its
//     configured share of the experts, which is what its memory leaves room for; below that
//     the instance cannot re-form and stays down (size 0) until GPUs recover.
// So EP 128 with one failed GPU re-forms as 120, EP 16 as 8, EP 8 as 4; a one-GPU instance
// with its GPU failed stays down.
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::cluster::sim {

/// The EP size an instance configured with `configured` GPUs re-forms with when `healthy` of
/// its GPUs are healthy, for a model with `experts` routed experts (0: no MoE limit); 0 when
/// it cannot re-form (see the rule above).
std::uint32_t resized_ep(std::uint32_t configured, std::uint32_t healthy, std::uint32_t experts);

/// The number of routed experts each of `ranks` ranks holds: `experts / ranks` each, and one
/// more on the first `experts % ranks` ranks (expert e lives on the rank whose range holds
/// it, ranges in rank order). Empty when `ranks` is 0.
std::vector<std::uint32_t> balanced_placement(std::uint32_t experts, std::uint32_t ranks);

/// The most experts any rank holds under the balanced placement (what a step waits for):
/// ceil(experts / ranks); 0 when `ranks` is 0.
std::uint32_t max_experts_per_rank(std::uint32_t experts, std::uint32_t ranks);

} // namespace troupe::cluster::sim
