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

/// Stamps log lines with `clock` (virtual time relative to `origin` when `is_virtual`).
/// Called by `world`; pass nullptr to go back to wall time.
void set_clock(const caf::actor_clock* clock, bool is_virtual, time_point origin);

/// The stamp the next line would carry, e.g. "t=12.500000s" or "2026-11-29T10:00:00.123Z".
std::string now_stamp();

} // namespace troupe::runtime::log
