// fault_injector: makes parts of the actor graph fail at given virtual times.
//
// A failure is an actor exit (DESIGN.md, "Failure and elasticity"), so injecting one is
// sending an exit to the right actor at the right time. The injector finds its target by
// walking the supervision tree with `which_children` (one child id per level, e.g.
// {"decode", "decode/0", "rank3"} from the cluster's supervisor), at the moment the fault
// falls due — so it hits whatever incarnation is current — and sends it `reason`. A rank
// has no exit handler and quits with that reason, which takes its instance down (one_for_all,
// intensity 0); an instance supervisor stops its children and exits with it; either way the
// pool's supervisor restarts the instance after its restart delay. A target that is down at
// that moment (or does not exist) is skipped, and the log says so.
//
// A drain order (`drain` set) targets an instance supervisor ({"decode", "decode/0"}): the
// injector gives the instance's engine the leave notice (drain_atom with the grace; the engine
// has its balancer exclude it, serves for the grace, then forwards what is left with its KV —
// decode_engine.hpp), and when the engine answers that the hand-off is done it stops the
// instance through its pool supervisor's stop_child: the instance is removed, not restarted
// (a drain is a departure, not a failure).
//
// An order may also carry an `effect`, run when it falls due before anything is sent (the
// world's own bookkeeping: a GPU marked failed or healthy, a slowdown starting, a KV shard
// failing); an order with an effect and no path is only that. A path whose last id is "*"
// hits every running child at that level (a whole pool).
//
// Every delay goes through the actor clock: in the simulated world the faults fall on exact
// virtual times.
#pragma once

#include "runtime/time.hpp"

#include <caf/actor.hpp>
#include <caf/error.hpp>
#include <caf/fwd.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace troupe::actors {

/// One exit to inject: when (since the injector's start), the child-id path from the root
/// supervisor to the target, and the exit reason it gets.
struct fault_order {
  runtime::duration at{0};
  std::vector<std::string> path;
  caf::error reason;
  /// A drain notice with this grace period instead of an exit (the path names an instance).
  std::optional<runtime::duration> drain;
  /// Run when the order falls due, before the walk (may be empty; with an empty path the
  /// order is only this).
  std::function<void()> effect;
};

/// A drain's hand-off, filled in when the instance has handed its requests over.
struct drain_handoff {
  bool done = false;
  runtime::time_point at{};
  /// The jobs the instance forwarded.
  std::uint64_t forwarded = 0;
};

/// What the injector did with an order (appended when the order fell due and was resolved).
struct fault_record {
  std::size_t order = 0;
  runtime::time_point at{};
  /// The path joined with '/'.
  std::string target;
  bool injected = false;
  /// Why not, when it was not ("target down", "no child 'x'").
  std::string skipped;
  /// Drains: the hand-off (filled in when it is done; a second record is not made).
  std::shared_ptr<drain_handoff> forwarded;
};

/// Spawns an injector over the supervision tree under `root`; the caller keeps the handle.
caf::actor spawn_fault_injector(caf::actor_system& sys, caf::actor root,
                                std::vector<fault_order> orders,
                                std::shared_ptr<std::vector<fault_record>> log);

} // namespace troupe::actors
