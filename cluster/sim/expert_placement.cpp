#include "cluster/sim/expert_placement.hpp"

#include <algorithm>

namespace troupe::cluster::sim {

std::uint32_t resized_ep(std::uint32_t configured, std::uint32_t healthy, std::uint32_t experts) {
  if (configured == 0)
    return 0;
  const std::uint32_t unit = std::max<std::uint32_t>(1, std::min<std::uint32_t>(8, configured / 2));
  auto cap = std::min(healthy, configured);
  if (experts > 0)
    cap = std::min(cap, experts);
  const std::uint32_t size = cap / unit * unit;
  const std::uint32_t least = (configured + 1) / 2;
  return size >= least && size > 0 ? size : 0;
}

std::vector<std::uint32_t> balanced_placement(std::uint32_t experts, std::uint32_t ranks) {
  std::vector<std::uint32_t> out(ranks, 0);
  for (std::uint32_t r = 0; r < ranks; ++r)
    out[r] = experts / ranks + (r < experts % ranks ? 1 : 0);
  return out;
}

std::uint32_t max_experts_per_rank(std::uint32_t experts, std::uint32_t ranks) {
  return ranks == 0 ? 0 : (experts + ranks - 1) / ranks;
}

} // namespace troupe::cluster::sim
