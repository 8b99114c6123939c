// Logging for troupe: spdlog loggers per component, stamped with the actor clock.
//
// A simulated run's log is only useful if its timestamps are virtual: "t=183.2s: instance 3
// restarted" must mean 183.2 s into the simulation, not the wall time of the laptop replaying
// it. So every line carries the time of the world that is current (set by `world`): virtual
// seconds since start in sim mode, UTC wall time in real mode. Without a world, lines carry
// wall time. Loggers write to stderr so that reports on stdout stay machine-readable.
#pragma once

#include "runtime/time.hpp"

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <string_view>

namespace caf {
class actor_clock;
}

namespace troupe::runtime::log {

/// The logger for `component` (e.g. "supervisor", "world"), created on first use with the
/// troupe pattern and the process-wide level. Thread-safe.
std::shared_ptr<spdlog::logger> get(std::string_view component);

/// Sets the level of every troupe logger, current and future ("trace" .. "off"). Returns false
/// and changes nothing for an unknown level name.
bool set_level(std::string_view level);

/// What stamps the log lines of one thread: `clock` (virtual time relative to `origin` when
/// `is_virtual`), or wall time when `clock` is null.
struct clock_setting {
  const caf::actor_clock* clock = nullptr;
  bool is_virtual = false;
  time_point origin{};
};

/// Stamps the calling thread's log lines with `setting` and returns the previous setting, to be
/// restored later. Per thread, because a simulated world runs its actors on the thread that
/// drives it: worlds on different threads (`troupe swarm --jobs N`) each stamp their own lines
/// with their own virtual time. Called by `world` (set on creation, restored on destruction).
clock_setting set_clock(clock_setting setting);

/// The stamp the next line would carry, e.g. "t=12.500000s" or "2026-11-29T10:00:00.123Z".
std::string now_stamp();

} // namespace troupe::runtime::log
