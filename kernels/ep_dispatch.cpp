// Expert-parallel dispatch planning (kernels/ep_dispatch.hpp).
#include "kernels/ep_dispatch.hpp"

#include <algorithm>
#include <string>

namespace troupe::kernels {

namespace {
using std::size_t;
size_t sz(std::int64_t v) { return static_cast<size_t>(v); }
}  // namespace

std::int32_t expert_placement::slot_of(std::int32_t rank, std::int32_t expert) const {
  if (rank < 0 || rank >= ranks) return -1;
  const auto& l = local[sz(rank)];
  for (size_t s = 0; s < l.size(); ++s)
    if (l[s] == expert) return static_cast<std::int32_t>(s);
  return -1;
}

result<expert_placement> place_experts(std::int32_t experts, std::int32_t ranks,
                                       std::span<const std::int32_t> replicated) {
  using r = result<expert_placement>;
  if (ranks < 1) return r::failure("place_experts: " + std::to_string(ranks) + " ranks");
  if (experts < ranks)
    return r::failure("place_experts: " + std::to_string(experts) + " experts cannot give each of " +
                      std::to_string(ranks) + " ranks one");
  expert_placement p;
  p.experts = experts;
  p.ranks = ranks;
  p.homes.resize(sz(experts));
  p.local.resize(sz(ranks));
  std::int32_t e = 0;
  for (std::int32_t rank = 0; rank < ranks; ++rank) {
    const std::int32_t n = experts / ranks + (rank < experts % ranks ? 1 : 0);
    for (std::int32_t i = 0; i < n; ++i, ++e) {
      p.homes[sz(e)].push_back(rank);
      p.local[sz(rank)].push_back(e);
    }
  }
  std::vector<bool> seen(sz(experts), false);
  for (auto hot : replicated) {
    if (hot < 0 || hot >= experts)
      return r::failure("place_experts: replicated expert " + std::to_string(hot) +
                        " out of range [0, " + std::to_string(experts) + ")");
    if (seen[sz(hot)])
      return r::failure("place_experts: expert " + std::to_string(hot) + " replicated twice");
    seen[sz(hot)] = true;
    auto& homes = p.homes[sz(hot)];
    std::int32_t best = -1;
    for (std::int32_t rank = 0; rank < ranks; ++rank) {
      if (std::find(homes.begin(), homes.end(), rank) != homes.end()) continue;
      if (best < 0 || p.local[sz(rank)].size() < p.local[sz(best)].size()) best = rank;
    }
    if (best < 0)
      return r::failure("place_experts: expert " + std::to_string(hot) +
                        " already lives on every rank");
    homes.push_back(best);
    p.local[sz(best)].push_back(hot);
  }
  return p;
}

result<bool> check_placement(const expert_placement& p, std::int32_t experts) {
  using r = result<bool>;
  const auto E = static_cast<std::size_t>(experts);
  if (p.experts != experts)
    return r::failure("expert placement: it places " + std::to_string(p.experts) +
                      " experts, the model has " + std::to_string(experts) + " routed experts");
  if (p.ranks < 1 || p.homes.size() != E || p.local.size() != static_cast<std::size_t>(p.ranks))
    return r::failure("expert placement: " + std::to_string(p.ranks) + " ranks with " +
                      std::to_string(p.local.size()) + " slot lists and " +
                      std::to_string(p.homes.size()) + " home lists for " +
                      std::to_string(p.experts) + " experts");
  for (std::int32_t e = 0; e < experts; ++e) {
    const auto& homes = p.homes[static_cast<std::size_t>(e)];
    if (homes.empty())
      return r::failure("expert placement: expert " + std::to_string(e) + " has no home");
    for (auto rank : homes)
      if (p.slot_of(rank, e) < 0)
        return r::failure("expert placement: expert " + std::to_string(e) + " lists rank " +
                          std::to_string(rank) + ", which does not hold it");
  }
  for (std::int32_t rank = 0; rank < p.ranks; ++rank)
    for (auto e : p.local[static_cast<std::size_t>(rank)])
      if (e < 0 || e >= experts)
        return r::failure("expert placement: rank " + std::to_string(rank) + " holds expert " +
                          std::to_string(e) + ", out of range [0, " + std::to_string(experts) +
                          ")");
  return true;
}

result<dispatch_plan> plan_dispatch(const expert_placement& placement,
                                    std::span<const std::int32_t> topk_ids, std::int32_t top_k) {
  using r = result<dispatch_plan>;
  if (top_k < 1) return r::failure("plan_dispatch: top_k " + std::to_string(top_k));
  if (topk_ids.size() % sz(top_k) != 0)
    return r::failure("plan_dispatch: " + std::to_string(topk_ids.size()) +
                      " expert ids are not a whole number of rows of " + std::to_string(top_k));
  dispatch_plan p;
  p.top_k = top_k;
  p.tokens = static_cast<std::int32_t>(topk_ids.size() / sz(top_k));
  p.ranks = placement.ranks;
  const auto copies = topk_ids.size();
  // Each copy's destination (rank, slot).
  std::vector<std::int32_t> dest_rank(copies), dest_slot(copies);
  p.expert_counts.resize(sz(placement.ranks));
  for (std::int32_t rank = 0; rank < placement.ranks; ++rank)
    p.expert_counts[sz(rank)].assign(placement.local[sz(rank)].size(), 0);
  for (size_t c = 0; c < copies; ++c) {
    const std::int32_t e = topk_ids[c];
    if (e < 0 || e >= placement.experts)
      return r::failure("plan_dispatch: token " + std::to_string(c / sz(top_k)) + " slot " +
                        std::to_string(c % sz(top_k)) + ": expert " + std::to_string(e) +
                        " out of range [0, " + std::to_string(placement.experts) + ")");
    const auto& homes = placement.homes[sz(e)];
    const size_t t = c / sz(top_k), j = c % sz(top_k);
    const std::int32_t rank = homes[(t + j) % homes.size()];
    dest_rank[c] = rank;
    dest_slot[c] = placement.slot_of(rank, e);
    ++p.expert_counts[sz(rank)][sz(dest_slot[c])];
  }
  p.send_counts.assign(sz(placement.ranks), 0);
  p.send_offsets.assign(sz(placement.ranks), 0);
  // Every (rank, slot) segment's first row, in rank then slot order.
  std::vector<std::vector<std::int32_t>> next(sz(placement.ranks));
  std::int32_t row = 0;
  for (std::int32_t rank = 0; rank < placement.ranks; ++rank) {
    p.send_offsets[sz(rank)] = row;
    for (auto n : p.expert_counts[sz(rank)]) {
      next[sz(rank)].push_back(row);
      row += n;
    }
    p.send_counts[sz(rank)] = row - p.send_offsets[sz(rank)];
  }
  p.send_copy.assign(copies, 0);
  p.copy_row.assign(copies, 0);
  for (size_t c = 0; c < copies; ++c) {  // copy number ascending inside each segment
    const std::int32_t at = next[sz(dest_rank[c])][sz(dest_slot[c])]++;
    p.send_copy[sz(at)] = static_cast<std::int32_t>(c);
    p.copy_row[c] = at;
  }
  return p;
}

result<receive_plan> plan_receive(const std::vector<std::vector<std::int32_t>>& counts) {
  using r = result<receive_plan>;
  receive_plan p;
  const size_t slots = counts.empty() ? 0 : counts.front().size();
  for (size_t s = 0; s < counts.size(); ++s) {
    if (counts[s].size() != slots)
      return r::failure("plan_receive: source " + std::to_string(s) + " lists " +
                        std::to_string(counts[s].size()) + " slots, source 0 " +
                        std::to_string(slots));
    for (auto n : counts[s])
      if (n < 0) return r::failure("plan_receive: negative count from source " + std::to_string(s));
  }
  // first[s][slot]: the received row where source s's rows for `slot` start.
  std::vector<std::vector<std::int32_t>> first(counts.size());
  std::int32_t row = 0;
  for (size_t s = 0; s < counts.size(); ++s)
    for (auto n : counts[s]) {
      first[s].push_back(row);
      row += n;
    }
  p.order.reserve(sz(row));
  p.slot_offsets.push_back(0);
  for (size_t slot = 0; slot < slots; ++slot) {
    for (size_t s = 0; s < counts.size(); ++s)
      for (std::int32_t i = 0; i < counts[s][slot]; ++i) p.order.push_back(first[s][slot] + i);
    p.slot_offsets.push_back(static_cast<std::int32_t>(p.order.size()));
  }
  return p;
}

void gather_rows(const dispatch_plan& plan, const float* x, std::int64_t width, float* out) {
  for (size_t i = 0; i < plan.send_copy.size(); ++i) {
    const float* src = x + static_cast<std::int64_t>(plan.send_copy[i] / plan.top_k) * width;
    std::copy(src, src + width, out + static_cast<std::int64_t>(i) * width);
  }
}

void combine_rows(const dispatch_plan& plan, const float* returned, std::span<const float> weights,
                  std::int64_t width, float* y) {
  const std::int64_t k = plan.top_k;
  for (std::int64_t t = 0; t < plan.tokens; ++t) {
    float* out = y + t * width;
    std::fill(out, out + width, 0.0f);
    for (std::int64_t j = 0; j < k; ++j) {
      const float w = weights[sz(t * k + j)];
      const float* src = returned + static_cast<std::int64_t>(plan.copy_row[sz(t * k + j)]) * width;
      for (std::int64_t d = 0; d < width; ++d) {
        const float prod = w * src[d];  // rounded before the add, as the CUDA kernel does
        out[d] = out[d] + prod;
      }
    }
  }
}

}  // namespace troupe::kernels
