// Expert-parallel dispatch planning: where each routed token copy goes and how it comes back.
//
// With expert parallelism (EP) the routed experts of a MoE layer are spread over the ranks of
// an instance, so each token's top-k copies must be sent to the ranks holding their experts
// (dispatch), run through those experts, and the results summed back into the token's row
// (combine). On a GPU both moves are one all-to-all each over contiguous per-rank segments of a
// send buffer, so the host must know, before the collective, every rank's send count and
// offset and the permutation that gathers token copies into those segments; the receiving rank
// must know how its received rows split by local expert (the grouped GEMM's segments). This
// file computes all of it on the CPU, as plain vectors the CUDA kernels consume
// (kernels/cuda/moe_permute.cu mirrors `gather_rows` and `combine_rows`):
//   - `expert_placement`: which ranks hold each routed expert. Each rank holds a contiguous
//     range of experts (the first `experts % ranks` ranks one more, as the simulator's balanced
//     placement, cluster/sim/expert_placement.hpp) plus optional redundant replicas of hot
//     experts on the ranks with the fewest experts. The shared expert is not placed: every
//     rank runs it on its own tokens.
//   - `dispatch_plan`: for one source rank's T tokens and their top-k expert ids, the per-rank
//     send counts and offsets, the per-(rank, local expert) counts, the send-buffer row of every
//     copy and its inverse.
//   - `combine_rows`: the weighted sum back into token order, each token's k copies added in
//     ascending top-k slot order. The order depends on nothing but the token's own routing, so
//     a token's combined row is the same bits whatever else is in the batch (batch invariance),
//     provided the experts' per-row outputs are.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/result.hpp"

namespace troupe::kernels {

/// Which ranks hold each routed expert.
struct expert_placement {
  std::int32_t experts = 0;
  std::int32_t ranks = 0;
  /// homes[e]: the ranks holding expert e, its primary rank first, replicas in the order they
  /// were added; never empty.
  std::vector<std::vector<std::int32_t>> homes;
  /// local[r]: the experts rank r holds, in its local slot order (its primary range ascending,
  /// then its replicas in the order they were added). A rank's grouped GEMM runs them in this
  /// order.
  std::vector<std::vector<std::int32_t>> local;

  /// The local slot of expert e on rank r, or -1 when r does not hold e.
  std::int32_t slot_of(std::int32_t rank, std::int32_t expert) const;
};

/// The balanced placement of `experts` routed experts over `ranks` ranks, then one replica of
/// each expert in `replicated` (hot experts, in priority order) on the rank holding the fewest
/// experts that does not hold it yet (ties: the lowest rank). Errors: ranks < 1, experts <
/// ranks, a replicated id out of range or listed twice, more replicas of an expert than ranks.
result<expert_placement> place_experts(std::int32_t experts, std::int32_t ranks,
                                       std::span<const std::int32_t> replicated = {});

/// Whether `p` places exactly `experts` routed experts consistently: every expert has a home,
/// every home holds it, every held expert is in range. Errors name the first problem
/// ("expert placement: ...").
result<bool> check_placement(const expert_placement& p, std::int32_t experts);

/// Where one source rank's token copies go. A copy is (token t, top-k slot j), numbered
/// c = t·k + j.
struct dispatch_plan {
  std::int32_t tokens = 0;
  std::int32_t top_k = 0;
  std::int32_t ranks = 0;
  /// Rows sent to each rank, and the first send-buffer row of each rank's segment.
  std::vector<std::int32_t> send_counts, send_offsets;
  /// expert_counts[r][s]: rows sent to rank r for its local slot s (rows of one slot are
  /// adjacent, slots ascending inside the rank's segment).
  std::vector<std::vector<std::int32_t>> expert_counts;
  /// send_copy[i]: the copy in send-buffer row i (rank segments in rank order; inside one,
  /// local slot ascending, then copy number ascending). Gather: row i = x[send_copy[i] / k].
  std::vector<std::int32_t> send_copy;
  /// copy_row[c]: the send-buffer row of copy c (the inverse of send_copy); the combine reads
  /// copy c's expert output back from the same row of the returned buffer.
  std::vector<std::int32_t> copy_row;
};

/// The plan for `tokens` tokens whose routed experts are `topk_ids` [tokens, top_k] (row-major)
/// under `placement`. A copy of expert e goes to its home (t + j) mod |homes[e]| (replicas
/// share the load by token; the choice never changes a result, only where it is computed).
/// Errors: top_k < 1, a size mismatch, an expert id out of range.
result<dispatch_plan> plan_dispatch(const expert_placement& placement,
                                    std::span<const std::int32_t> topk_ids, std::int32_t top_k);

/// How the rows a rank received split by local expert: received from every source in source
/// order, each source's segment in the sender's slot order (`dispatch_plan::expert_counts` of
/// each source for this rank). `order[i]` is the received row that goes to grouped-GEMM row i
/// (slot-major, then source, then the sender's order), `slot_offsets` each slot's first row
/// ([slots + 1]).
struct receive_plan {
  std::vector<std::int32_t> order;
  std::vector<std::int32_t> slot_offsets;
};

/// `counts[s][slot]`: rows from source s for local slot `slot` (every source lists the same
/// number of slots). Errors: ragged or negative counts.
result<receive_plan> plan_receive(const std::vector<std::vector<std::int32_t>>& counts);

/// out[i] = x[send_copy[i] / k] for every send-buffer row i: x is [tokens, width], out
/// [plan.send_copy.size(), width].
void gather_rows(const dispatch_plan& plan, const float* x, std::int64_t width, float* out);

/// y[t] = Σ_{j = 0..k-1, in that order} weights[t·k + j] · returned[copy_row[t·k + j]] (fp32,
/// one multiply and one add per term, no fused multiply-add): `returned` holds the expert
/// outputs in send-buffer order [rows, width]; y is [tokens, width], overwritten.
void combine_rows(const dispatch_plan& plan, const float* returned, std::span<const float> weights,
                  std::int64_t width, float* y);

}  // namespace troupe::kernels
