// Time types of troupe: every duration and instant is CAF's, so that the actor clock (wall or
// virtual) is the only source of time.
#pragma once

#include <caf/actor_clock.hpp>
#include <caf/timespan.hpp>

#include <chrono>
#include <cstdint>

namespace troupe::runtime {

/// A span of time (nanosecond resolution), as the actor clock measures it.
using duration = caf::timespan;

/// An instant of the actor clock: wall time in the real world, virtual time in simulation.
using time_point = caf::actor_clock::time_point;

/// Seconds as a double, for reports and models.
inline double to_seconds(duration d) {
  return std::chrono::duration<double>(d).count();
}

/// A duration from seconds given as a double (rounded to the nanosecond).
inline duration from_seconds(double s) {
  return std::chrono::duration_cast<duration>(std::chrono::duration<double>(s));
}

} // namespace troupe::runtime
