// sim_driver: runs a simulated world's actors in virtual time.
//
// In the simulated world CAF's deterministic `test_coordinator` schedules every actor on the
// calling thread and its `test_actor_clock` holds every timer (delayed_send, request timeouts,
// `after`). Nothing moves unless someone drives it. The driver is that someone: it runs every
// ready message, then jumps the virtual clock to the earliest pending timer and fires it, and
// repeats until the world is quiet, a virtual deadline is reached, or it is told to stop.
// Because the order of jobs and timers is fully determined by the actors' own behaviour, the
// same inputs and seed give the same run, event for event.
#pragma once

#include "runtime/time.hpp"

#include <caf/fwd.hpp>
#include <compare>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include <optional>

namespace caf::scheduler {
class test_coordinator;
}

namespace troupe::runtime {

/// Why a call to sim_driver::run / run_until returned.
enum class stop_reason {
  /// No ready message and no pending timer: nothing can happen any more.
  quiescent,
  /// The next timer lies beyond the deadline; the clock stands at the deadline.
  deadline,
  /// request_stop() was called (from an actor or a progress callback).
  stopped,
};

const char* to_string(stop_reason r);

/// What a progress callback sees.
struct sim_progress {
  /// Virtual time since the driver was created.
  duration elapsed;
  /// Messages handled plus timers fired since the driver was created.
  std::uint64_t events;
  /// The deadline of the current run_until, if any (relative to the driver's start).
  std::optional<duration> deadline;
};

/// One row of a profile: how many events of one kind the driver ran, and their wall time.
/// `actor` is the receiving actor's name (its state's `name`), `message` the type of the
/// message's first element (an atom by its value); a fired timer is actor "clock", message
/// what it was and whom it reached ("delayed message for decode_engine", "request timeout for
/// request", "timeout for ..."). A delayed message is then counted a second time when its
/// receiver handles it.
struct sim_profile_row {
  std::string actor;
  std::string message;
  std::uint64_t count = 0;
  double wall_s = 0;
};

class sim_driver {
public:
  /// Drives `sys`, whose scheduler must be a test_coordinator (world_mode::sim).
  explicit sim_driver(caf::actor_system& sys);

  sim_driver(const sim_driver&) = delete;
  sim_driver& operator=(const sim_driver&) = delete;

  /// Runs until quiescence or request_stop(). A world with a periodic timer never becomes
  /// quiescent: use run_until for those.
  stop_reason run();

  /// Runs until quiescence, request_stop(), or until the next timer would fire after
  /// `deadline` (timers due exactly at the deadline fire). Unless stopped, the clock then
  /// stands at `deadline`, so that whatever the caller injects next happens at that instant;
  /// the result says whether work remains (deadline) or none does (quiescent). Can be called
  /// again to go on.
  stop_reason run_until(time_point deadline);

  /// run_until(now() + d).
  stop_reason run_for(duration d);

  /// Asks a running run / run_until to return after the current event. The request is
  /// consumed by that return; a later call runs normally.
  void request_stop() noexcept { stop_requested_ = true; }

  /// The virtual now.
  time_point now() const noexcept;

  /// Virtual time since the driver was created.
  duration elapsed() const noexcept { return now() - start_; }

  /// Messages handled plus timers fired so far.
  std::uint64_t events() const noexcept { return events_; }

  /// Starts (or stops) counting every event by actor and message type and timing it with the
  /// wall clock (a profile costs the run a few hundred nanoseconds per event, so it is off by
  /// default). Counting never changes what runs.
  void set_profiling(bool on) noexcept { profiling_ = on; }

  /// The events counted while profiling, most frequent first (ties by actor, then message).
  std::vector<sim_profile_row> profile() const;

  /// Calls `fn` whenever virtual time has advanced by at least `every` since the last call,
  /// and once more when a run returns. Replaces an earlier callback; an empty fn removes it.
  void on_progress(duration every, std::function<void(const sim_progress&)> fn);

private:
  stop_reason drive(std::optional<time_point> deadline);
  void report(std::optional<time_point> deadline);

  caf::scheduler::test_coordinator& sched_;
  time_point start_;
  std::uint64_t events_ = 0;
  bool stop_requested_ = false;
  duration progress_every_{0};
  time_point next_progress_;
  std::function<void(const sim_progress&)> progress_;
  bool profiling_ = false;
  /// Profile rows by (actor name, message type, atom value).
  struct profile_key {
    const char* actor;
    const void* type;
    std::uint64_t atom;
    auto operator<=>(const profile_key&) const = default;
  };
  std::map<profile_key, sim_profile_row> rows_;
  bool run_one_profiled();
};

} // namespace troupe::runtime
