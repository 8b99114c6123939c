// The collective an expert-parallel group's ranks run at every MoE: each rank computes the
// expert rows of the copies dispatched to it, and every rank then needs every rank's rows to
// add each token's expert outputs back in its own order (kernels/ep_dispatch.hpp's
// combine_rows). On GPUs that is NCCL's all-to-all; here it is an all-gather of row segments,
// because every rank of a CPU group computes the same tokens' attention and routing (its
// memory holds 1/N of the routed experts, the rest of the model whole).
//
// An exchange is shared by the ranks of one formation. `local_exchange` joins threads of one
// process (kernels/ep_process.hpp joins those of several); a member that fails calls abort, and every call then fails (one communication
// domain, as an NCCL communicator that was aborted: the group must re-form).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "kernels/ep_dispatch.hpp"
#include "kernels/result.hpp"

namespace troupe::kernels {

class ep_exchange {
 public:
  virtual ~ep_exchange() = default;
  /// Ranks in the group.
  virtual std::int32_t ranks() const = 0;
  /// Collective over the group: `buffer` holds the floats of every rank's segment, segment r
  /// being [offsets[r], offsets[r + 1]) (offsets: ranks + 1 entries, the same on every rank);
  /// the caller's own segment is filled. Returns once every segment holds its owner's floats.
  /// Errors: the group was aborted (before or while waiting), or arguments of the wrong size.
  virtual result<bool> all_gather(std::int32_t rank, std::span<float> buffer,
                                  std::span<const std::int64_t> offsets) = 0;
  /// Ends the group: every waiting and later call fails with `why`. The first reason stays.
  virtual void abort(const std::string& why) = 0;
  /// Undoes an abort once no rank is inside a call, for a group whose members all failed the
  /// same call before their first exchange (a refused input): their states still agree.
  virtual void reset() = 0;
};

/// An exchange among `ranks` threads of this process (ranks >= 1).
std::shared_ptr<ep_exchange> local_exchange(std::int32_t ranks);

/// A model's membership of an EP group (model_options::ep): its rank, the formation's
/// placement (which experts each rank holds) and the exchange the ranks share.
struct ep_member {
  std::int32_t rank = 0;
  expert_placement placement;
  std::shared_ptr<ep_exchange> exchange;
};

/// What a rank's forward throws when its group's exchange fails (the forward cannot go on
/// without the other ranks' rows). model::forward turns it into its error; the group is
/// unusable from then on.
struct ep_group_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace troupe::kernels
