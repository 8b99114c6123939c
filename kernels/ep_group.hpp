// The bookkeeping of an instance's expert-parallel group: ranks, the NCCL unique-id exchange,
// and what must be rebuilt when the group re-forms.
//
// An instance's GPUs are one EP group with one NCCL communicator. A communicator has a fixed
// size and fixed members, so when the instance re-forms after a failure (its supervisor
// restarts it with EP = the healthy GPUs it can get, docs/faults.md) the old communicator is
// useless: every member must join a new one, created from a fresh unique id that the root
// rank draws (ncclGetUniqueId) and every other member receives in a message before calling
// ncclCommInitRank. Messages of the previous formation may still be in flight, so each
// formation carries a generation number and a member accepts only its own generation's id.
// The expert placement is recomputed for the new size, so each surviving GPU learns which
// experts it must load and which it may drop. Everything here is a pure function on plain
// values (no NCCL, no device): kernels/cuda/nccl_comm.hpp feeds it the real unique id, and
// tests run it on the CPU.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/ep_dispatch.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels {

/// A GPU's identity across formations (its index in the topology), unlike a rank, which is
/// its position in one formation.
using gpu_id = std::uint32_t;

/// Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES; kernels/cuda checks it against nccl.h).
inline constexpr std::size_t nccl_unique_id_bytes = 128;

/// One formation of an instance's EP group.
struct ep_group_plan {
  std::uint64_t instance = 0;
  std::uint64_t generation = 0;
  /// members[r]: the GPU of rank r (ascending GPU ids, so rank order is the same whoever
  /// computes it and in whatever order the healthy GPUs were reported).
  std::vector<gpu_id> members;
  expert_placement placement;

  std::int32_t size() const { return static_cast<std::int32_t>(members.size()); }
  /// The rank of `gpu`, or -1 when it is not a member.
  std::int32_t rank_of(gpu_id gpu) const;
  /// The root: rank 0, the member that draws the unique id.
  gpu_id root() const { return members.front(); }
};

/// Forms generation `generation` of instance `instance` on the `healthy` GPUs (any order,
/// no duplicates) with `experts` routed experts placed by place_experts (hot replicas in
/// `replicated`). Errors: no GPU, a duplicate GPU, or a placement error (more ranks than
/// experts, a bad replica).
result<ep_group_plan> form_ep_group(std::uint64_t instance, std::uint64_t generation,
                                    std::span<const gpu_id> healthy, std::int32_t experts,
                                    std::span<const std::int32_t> replicated = {});

/// The root's unique id on its way to the other members: one message per formation.
struct nccl_id_message {
  std::uint64_t instance = 0;
  std::uint64_t generation = 0;
  std::int32_t size = 0;
  gpu_id root = 0;
  std::array<std::uint8_t, nccl_unique_id_bytes> id{};
};

/// The message the root of `plan` sends, carrying `id` (the bytes ncclGetUniqueId wrote).
nccl_id_message unique_id_message(const ep_group_plan& plan,
                                  const std::array<std::uint8_t, nccl_unique_id_bytes>& id);

/// A message as bytes (fixed little-endian layout, 4-byte tag "TEPG" first) and back. decode
/// fails on a wrong length or tag.
std::string encode(const nccl_id_message& m);
result<nccl_id_message> decode_nccl_id_message(std::string_view bytes);

/// What a member passes to ncclCommInitRank.
struct comm_init_args {
  std::int32_t nranks = 0;
  std::int32_t rank = 0;
  std::array<std::uint8_t, nccl_unique_id_bytes> id{};
};

/// What member `self` of `plan` does with a received id message: the arguments of its
/// ncclCommInitRank. Errors (the member must ignore the message): another instance, another
/// generation (a stale or early message), a size or root that disagrees with the plan, or
/// `self` not a member.
result<comm_init_args> accept_unique_id(const ep_group_plan& plan, gpu_id self,
                                        const nccl_id_message& m);

/// One member's part of a re-formation.
struct rank_rebuild {
  gpu_id gpu = 0;
  std::int32_t old_rank = -1;  // -1: not in the old formation
  std::int32_t new_rank = 0;
  std::vector<std::int32_t> load;  // experts it must load (held now, not before), ascending
  std::vector<std::int32_t> drop;  // experts it held and no longer does, ascending
};

/// Everything that changes from formation `from` to formation `to`.
struct ep_rebuild {
  /// A new communicator is needed: the members changed, or the old communicator did not
  /// survive (see plan_rebuild). When false the old one serves.
  bool new_communicator = false;
  /// GPUs of `from` that are not in `to`, ascending.
  std::vector<gpu_id> lost;
  /// Per rank of `to`, in rank order.
  std::vector<rank_rebuild> ranks;
  /// Experts no surviving GPU held before: they must come from the checkpoint, not a peer.
  std::vector<std::int32_t> from_checkpoint;
};

/// The rebuild from `from` to `to`. `communicator_alive` says whether `from`'s communicator is
/// still usable: false after a member failed (it was aborted) or the instance's ranks
/// restarted; true when the group re-forms on purpose with every process intact. Errors:
/// another instance, `to` not a later generation, or a different expert count.
result<ep_rebuild> plan_rebuild(const ep_group_plan& from, const ep_group_plan& to,
                                bool communicator_alive = false);

}  // namespace troupe::kernels
