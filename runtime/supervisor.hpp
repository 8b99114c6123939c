// supervisor: OTP-style supervision trees for CAF actors.
//
// troupe's fault tolerance is supervision: a failure is an actor exit, and a supervisor
// decides what restarts, in which order, after what delay, and when to give up and fail
// itself so that its own supervisor decides. CAF 0.17 has links and monitors but no
// supervisor, so this file provides one with Erlang/OTP semantics:
//
//   - strategies: one_for_one (restart the failed child), one_for_all (stop the others in
//     reverse start order, restart all in start order), rest_for_one (stop and restart the
//     failed child and every child started after it);
//   - restart policies: permanent (always restarted), transient (restarted only after an
//     abnormal exit; `normal` and `user_shutdown` are normal), temporary (never restarted);
//   - shutdown: a child is sent `exit_reason::user_shutdown`, which it may trap to drain; if
//     it has not exited when its grace period ends it is sent `exit_reason::kill`;
//   - restart intensity: more than `intensity` restarts within `period` escalates: the
//     supervisor stops all children in reverse start order and exits with
//     errc::restart_intensity_exceeded, which its parent sees as the exit reason;
//   - an optional restart delay that grows by `backoff` with each consecutive restart of a
//     child, up to `max_restart_delay` (a child that stays up for `period` starts over);
//   - lifecycle events (started, exited, restarted, escalated) sent to subscribers.
//
// Every delay goes through the actor clock, so a supervisor behaves identically in the real
// world and in virtual time. The supervisor monitors its children and traps exit messages
// (they are its own shutdown requests); if it is killed, it kills its remaining children, so
// a supervision tree never leaks actors.
#pragma once

#include "runtime/time.hpp"

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace troupe::runtime {

enum class strategy : std::uint8_t { one_for_one, one_for_all, rest_for_one };
enum class restart_policy : std::uint8_t { permanent, transient, temporary };

std::string to_string(strategy s);
std::string to_string(restart_policy p);

/// A grace period meaning "wait for the child however long it takes" (use for supervisors).
constexpr duration infinite_grace = duration::max();

/// How to start, restart and stop one child.
struct child_spec {
  /// Unique among the supervisor's children; names the child in events.
  std::string id;
  /// Spawns the child and returns its handle; `self` is the supervisor (so `self->spawn`
  /// makes the child part of the supervisor's world). Return an invalid actor on failure.
  std::function<caf::actor(caf::local_actor* self)> start;
  restart_policy restart = restart_policy::permanent;
  /// Time between user_shutdown and kill; zero kills at once; infinite_grace never kills.
  duration shutdown = std::chrono::seconds(5);
};

/// How a supervisor reacts to exits.
struct supervisor_flags {
  strategy how = strategy::one_for_one;
  /// At most `intensity` restarts within any window of length `period`; one more escalates.
  std::uint32_t intensity = 3;
  duration period = std::chrono::seconds(5);
  /// Delay before a restart; zero restarts at once. The n-th consecutive restart of a child
  /// waits restart_delay * backoff^(n-1), capped at max_restart_delay.
  duration restart_delay{0};
  double backoff = 1.0;
  duration max_restart_delay = std::chrono::minutes(5);
};

/// A supervisor: its name (used in events and logs), flags, and initial children in start
/// order.
struct supervisor_config {
  std::string name;
  supervisor_flags flags;
  std::vector<child_spec> children;
};

// -- protocol -------------------------------------------------------------------------------

using start_child_atom = caf::atom_constant<caf::atom("startchild")>;
using stop_child_atom = caf::atom_constant<caf::atom("stopchild")>;
using which_children_atom = caf::atom_constant<caf::atom("children")>;
using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;

enum class supervisor_event_kind : std::uint8_t {
  /// A child was started for the first time (or added with start_child).
  started,
  /// A child exited; `reason` says why.
  exited,
  /// A child was started again after an exit.
  restarted,
  /// Restart intensity was exceeded; the supervisor stops its children and exits.
  escalated,
};

std::string to_string(supervisor_event_kind k);

/// A lifecycle event, sent to every subscriber.
struct supervisor_event {
  std::string supervisor;
  supervisor_event_kind kind = supervisor_event_kind::started;
  /// The child's id (empty for `escalated`).
  std::string child;
  /// The exit reason as rendered text (empty for starts).
  std::string reason;
  /// Actor-clock time of the event, in nanoseconds since the clock's epoch.
  std::int64_t at_ns = 0;
  /// How many times this child has been restarted so far.
  std::uint32_t restarts = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, supervisor_event& x) {
  return f(caf::meta::type_name("supervisor_event"), x.supervisor, x.kind, x.child, x.reason,
           x.at_ns, x.restarts);
}

/// One row of `which_children`: a child's id, its current handle (invalid while it is down)
/// and its restart count.
struct child_info {
  std::string id;
  caf::actor handle;
  std::uint32_t restarts = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, child_info& x) {
  return f(caf::meta::type_name("child_info"), x.id, x.handle, x.restarts);
}

/// Spawns a top-level supervisor and starts its children in order. Messages it handles:
///   (start_child_atom, child_spec)  -> caf::actor of the new child, or errc::duplicate_child
///   (stop_child_atom, std::string)  -> unit after the child stopped (its grace applies);
///                                      the child is removed, not restarted
///   (which_children_atom)           -> std::vector<child_info> in start order
///   (subscribe_atom, caf::actor)    -> unit; the subscriber gets every supervisor_event
/// An exit message from anyone but a child (e.g. user_shutdown from its parent) stops the
/// children in reverse start order, each within its grace, and the supervisor then exits
/// with that reason. If a child fails to start initially, the supervisor exits with
/// errc::child_start_failed.
caf::actor spawn_supervisor(caf::actor_system& sys, supervisor_config cfg);

/// A child_spec that starts a nested supervisor (shutdown = infinite_grace, permanent).
child_spec supervisor_child(supervisor_config cfg);

} // namespace troupe::runtime

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::runtime::child_spec)
