// One EP group's NCCL communicator and the all-to-all of MoE dispatch and combine over it.
//
// kernels/ep_group.hpp decides who is in a formation, which rank each GPU is and what the root's
// unique-id message carries; this file makes the calls: the root draws the id
// (`new_unique_id`), every member joins with the arguments accept_unique_id gave it
// (`ep_communicator::join`), and `all_to_all` moves each rank's contiguous per-rank segments
// (kernels/ep_dispatch.hpp's send counts and offsets) to their ranks with grouped
// ncclSend/ncclRecv, one pair per peer. A re-formed group joins a new communicator; the old one
// is destroyed with its owner (ncclCommDestroy; after a peer died, ncclCommAbort). NCCL refuses
// two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so a two-rank
// group needs two GPUs: bench/gpu_check.sh checks the one-GPU case with EP = 1 through NCCL and
// the two-rank exchange by device copies. Failures are values naming the NCCL result.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>

#include "kernels/ep_group.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels::cuda {

/// A fresh NCCL unique id (the root's part of a formation).
result<std::array<std::uint8_t, nccl_unique_id_bytes>> new_unique_id();

class ep_communicator {
 public:
  /// Joins the communicator described by `args` on CUDA device `device` (blocks until every
  /// member has joined, as ncclCommInitRank).
  static result<ep_communicator> join(const comm_init_args& args, int device);
  /// All `ranks` members in this process, one per device in `devices` (ncclCommInitAll).
  static result<std::vector<ep_communicator>> join_all(std::span<const int> devices);

  ep_communicator(ep_communicator&&) noexcept;
  ep_communicator& operator=(ep_communicator&&) noexcept;
  /// Destroys the communicator (ncclCommDestroy), or aborts it after abort() was asked.
  ~ep_communicator();

  std::int32_t rank() const;
  std::int32_t size() const;

  /// Sends rows [send_offsets[r], + send_counts[r]) of `send` to rank r and receives rank r's
  /// rows for this rank into [recv_offsets[r], + recv_counts[r]) of `recv`, for every r
  /// (itself included); rows are `width` floats. Enqueued on `stream`. Errors: sizes that are
  /// not one per rank, an NCCL failure.
  result<bool> all_to_all(const float* send, std::span<const std::int32_t> send_counts,
                          std::span<const std::int32_t> send_offsets, float* recv,
                          std::span<const std::int32_t> recv_counts,
                          std::span<const std::int32_t> recv_offsets, std::int64_t width,
                          void* stream);

  /// Marks the communicator for ncclCommAbort at destruction (a peer died; a clean destroy
  /// would wait for it).
  void abort_on_close();

 private:
  struct state;
  explicit ep_communicator(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

}  // namespace troupe::kernels::cuda
