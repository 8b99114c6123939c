// invariants: the end-of-run checks of "nothing lost" over a simulation's request outcomes.
//
// A simulated run is only evidence if its end state is checked, not just summarised: a
// request that never ended, ended twice, streamed a token twice or "completed" short of its
// output would hide behind healthy percentiles. The checker takes the ids the entrypoint
// admitted and the outcomes the request actors reported, and returns every violation with the
// request it concerns and what happened: every admitted request ends in exactly one terminal
// state (completed, or failed with a reason the client sees); a completed request delivered
// exactly its output length and carries no failure; no request delivered more tokens than its
// output (a token delivered twice); outcome times are ordered (admitted ≤ first token ≤
// finished); when decoding is deterministic (the simulated world: runtime::modelled_token), a
// completed request's delivered stream equals its fault-free run's, token for token — so a
// rerouted or forwarded request that repeated, skipped or reordered a token is caught even
// when its count is right. With the autoscaler, its decisions are checked too
// (check_autoscaler). `troupe sim` runs the checks at the end of every simulation and exits
// non-zero on a violation.
#pragma once

#include "actors/autoscaler/autoscaler.hpp"
#include "actors/request/request.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::cluster::sim {

/// One broken invariant: the request it concerns and what happened, in words.
struct violation {
  std::uint64_t request = 0;
  std::string what;
  /// What it concerns when that is not a request (e.g. "autoscaler"); empty for requests.
  std::string about;

  /// `request <id>: <what>`, or `<about>: <what>`.
  std::string to_string() const;
};

/// What the checker found.
struct invariant_report {
  /// Requests checked: the admitted ones plus any outcome whose id was never admitted.
  std::uint64_t checked = 0;
  /// Ordered by request id, then by the order of the checks.
  std::vector<violation> violations;

  bool ok() const noexcept { return violations.empty(); }

  /// `{checked, violations: [{request, what}...]}`.
  nlohmann::json to_json() const;
};

/// Checks `outcomes` against `admitted` (ids, any order, each admitted once). When
/// `run_finished` is false (the run was stopped by a deadline), an admitted request without an
/// outcome is unfinished, not a violation; every other check still applies.
invariant_report check_invariants(const std::vector<std::uint64_t>& admitted,
                                  const std::vector<actors::request_outcome>& outcomes,
                                  bool run_finished);

/// The autoscaler's invariants over its log (about "autoscaler"): no decision leaves a pool's
/// [min, max] (a target above max, or a scale-down to below min), adds more than
/// `max_step_up` or removes more than `max_step_down` instances of a pool, or scales down
/// while quota occupancy is above the limit, or before it has wanted fewer instances than it
/// had for `scale_down_after` (its consecutive decisions' own times); no pool held more than
/// max instances; and the
/// actions taken at a decision (instances ordered / told to leave) match it.
std::vector<violation> check_autoscaler(const actors::autoscaler_log& log,
                                        const actors::scale_limits& limits,
                                        runtime::time_point origin);

} // namespace troupe::cluster::sim
