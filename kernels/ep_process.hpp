// An expert-parallel group whose ranks live in several processes of one machine: the leader's
// process holds some ranks as threads (kernels/ep_group_backend.hpp) and each peer process
// holds others, reached over a connected stream socket (a socketpair made before the peer was
// started: ports/cpu_device.hpp's ranks_per_process).
//
// One socket per peer carries, in frames (a 16-byte header: kind, payload length), the group's
// calls (leader -> peer: every call that changes a sequence, encoded), its exchanges (at every
// MoE each peer sends its ranks' row segments, the leader gathers them with its own ranks' and
// sends every peer the whole buffer: a star through the leader) and each call's outcome (peer
// -> leader: one error, or none, per rank of the peer). A peer that exits ends its socket: the
// leader's exchange aborts, the call fails and so does the group for good (an NCCL
// communicator whose member died is aborted the same way); the group's instance re-forms.
// The leader exiting ends every peer's socket, and a peer then returns.
//
// The frames hold native-endian integers and floats: the processes of a group are on one
// machine. Between machines a group's exchange would be an RDMA all-to-all (NCCL on GPUs).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/ep_dispatch.hpp"
#include "kernels/model.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels {

/// A peer process of an EP group, seen from the leader: the connected socket to it, and the
/// ranks it holds (ascending; never rank 0, which is the leader's).
struct ep_peer {
  int fd = -1;
  std::vector<std::int32_t> ranks;
  /// How long the leader waits, within a call, for the peer's next word (its rows at an
  /// exchange, the call's outcome) before it counts the peer gone: a process that hangs
  /// (stopped, deadlocked) fails its group as one that died does.
  std::chrono::milliseconds answer_within{std::chrono::seconds(60)};
};

/// Runs ranks `ranks` (ascending) of an EP group in this process, a peer of the leader at the
/// other end of `fd`: loads their models of the checkpoint in `dir` with `options` (as
/// open_ep_group does, sharing tensors), calls `prepare` on each, tells the leader it is ready
/// (or why it could not load), then runs the leader's calls until the leader closes the socket.
/// Returns the load error, or true once the leader is gone. Closes `fd`.
result<bool> serve_ep_peer(int fd, const std::filesystem::path& dir, model_options options,
                           const expert_placement& placement, std::vector<std::int32_t> ranks,
                           const std::function<result<bool>(model&)>& prepare = {});

/// Tells the leader at the other end of `fd` that this peer's `ranks` ranks cannot load, and
/// why (what serve_ep_peer does when a load fails); closes `fd`.
void refuse_ep_peer(int fd, std::size_t ranks, const std::string& why);

}  // namespace troupe::kernels
