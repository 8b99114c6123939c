// history_checker: the invariants of a simulated run, recomputed from its history alone.
//
// The actors record plain facts as they act (actors/history.hpp); this checker reads them
// after the run and decides, with arithmetic of its own and the limits the topology gives,
// whether the run kept its promises. It shares no code with the actors it checks (no
// kv_index, no decode_balancer, no request state machine): a mistake in an actor's
// bookkeeping cannot hide the violation it causes, as it can from an invariant that reads the
// actor's own audit counter. What it checks:
//
// - TTL: no KV block is served as a hit unless it was made visible (written, or reserved then
//   committed) and its time-to-live has not run out. A block's expiry is recomputed from its
//   facts: a write at t with class c lives until t + TTL(c), where TTL(c) is the topology's
//   (`storage.ttl`); a later write or commit of a live block, or a refresh of a live visible
//   block by a hit of class c at t, extends it to max(expiry, t + TTL(c)); once expired, the
//   next write starts a new life. A block served at or after its expiry is a violation.
//   (Evictions and shard losses are not facts: the checker's expiry is never earlier than the
//   store's, so it may let through a hit a correct store would not give, never the converse.)
// - Tokens: the k-th token a request delivers is its output position k, and carries the
//   token the simulated device generates at that position (runtime::modelled_token at
//   input_tokens + k; a real device's tokens are not known in advance, so for `troupe serve
//   --check-history` only the positions are checked): no position twice, none skipped, none out of order, none beyond the
//   output, across reroutes and forwards; a completed request delivered exactly its output
//   length (unless a stop id ended it); nothing is delivered after the request ended.
// - Requests: every admitted request ends exactly once (when the run finished), and nothing
//   ends or delivers without having been admitted.
// - Decode KV capacity: decode_lb books a request on an instance in its routing only, and the
//   bookings live on an instance (from its booking to its release, or to the instance leaving
//   the routing) never reserve more than the instance's KV capacity in tokens, nor hold more
//   requests than its batch capacity; every release matches a booking; when the run
//   finished, no instance in the routing still holds a booking.
// - Restarts: an instance that went down (its leader's device stopped) does not come back
//   (a new incarnation of the same pool/id) sooner than half the restart time later: the
//   pool supervisors wait the restart time before a restart (half: the leader's device may stop
//   a little after the instance does; an instance restarted at once is what this catches).
#pragma once

#include "actors/history.hpp"
#include "cluster/sim/invariants.hpp"
#include "runtime/time.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace troupe::cluster::sim {

/// What the run was given, from the topology and the simulation's parameters (never from the
/// actors' own state).
struct history_expectations {
  /// The run's start (times in messages are seconds after it).
  runtime::time_point origin{};
  /// Block time-to-live per traffic class; a class missing here fails every hit of it.
  std::map<schemas::traffic_class, runtime::duration> ttl;
  /// Per decode instance: KV tokens its memory holds and requests its batch holds.
  std::uint64_t decode_kv_tokens = 0;
  std::uint64_t decode_max_requests = 0;
  /// How long a failed instance takes to come back (the pool supervisors' restart delay).
  runtime::duration restart_time{0};
  /// Every request ended (false: the run stopped at a deadline, so an admitted request
  /// without an end, and bookings still held, are not violations).
  bool run_finished = true;
  /// Tokens are the simulated device's (runtime::modelled_token), so each delivered id is
  /// checked too; false (a real device): only positions are.
  bool modelled_tokens = true;
};

/// What the checker read and found.
struct history_report {
  std::uint64_t kv_facts = 0;
  std::uint64_t token_facts = 0;
  std::uint64_t request_facts = 0;
  std::uint64_t booking_facts = 0;
  std::uint64_t instance_facts = 0;
  /// Request violations carry their request id; others `about` "kv" or "decode_lb". Each
  /// `what` starts with "history: ". At most `shown_per_check` per check, then one line
  /// counting the rest.
  std::vector<violation> violations;

  bool ok() const noexcept { return violations.empty(); }
  nlohmann::json to_json() const;
};

/// Violations listed per check before the rest are only counted.
inline constexpr std::size_t shown_per_check = 20;

history_report check_history(const actors::run_facts& history,
                             const history_expectations& expect);

/// The TTLs a topology's `storage.ttl` gives (class name → TTL), with the documented defaults
/// (docs/kv-store.md: chatbot 7 days, agent 3 days, batch 1 day) for a class it does not name.
/// Unknown class names are ignored.
std::map<schemas::traffic_class, runtime::duration>
ttl_of_classes(const std::map<std::string, runtime::duration>& storage_ttl);

} // namespace troupe::cluster::sim
