// surge: the `surge` fault kind as a warp of the workload's clock.
//
// A surge multiplies the whole workload's traffic by `factor` for `duration`. The simulation
// applies it at admission, to generated workloads and trace replays alike, by running the
// workload's clock `factor` times faster while the surge lasts: the requests the workload would
// have sent in factor × duration arrive within duration, with their own prompts, lengths and
// prefixes (no request is invented or copied). After the surge the workload goes on at its
// own rate from where its clock got to, so the run has the same requests, in the same order,
// just earlier. Overlapping surges multiply.
#pragma once

#include "cluster/sim/fault_plan.hpp"
#include "runtime/time.hpp"

#include <vector>

namespace troupe::cluster::sim {

class surge_clock {
public:
  /// The surges of `timeline` (other kinds are ignored); `offset` is the virtual time at which
  /// the workload's clock starts, since the start of the run (fault times count from there).
  surge_clock(const std::vector<fault>& timeline, runtime::duration offset);

  /// The virtual arrival (since the workload's start) of a request that arrives at
  /// `workload_time` on the workload's own clock. The identity without surges, and before
  /// the first one.
  runtime::duration arrival(runtime::duration workload_time) const;

  bool empty() const noexcept { return segments_.empty(); }

private:
  struct segment {
    double start_s = 0; // virtual seconds since the workload's start
    double rate = 1;    // workload seconds per virtual second, until the next segment
  };
  std::vector<segment> segments_;
};

} // namespace troupe::cluster::sim
